"""A stable digest of an IR graph: the same graph gives the same hex string in every process.

:func:`graph_digest` hashes (SHA-256) everything the tuner and the passes read of a
:class:`~tflms.ir.graph.Graph`, in graph order (the simulator breaks ties by it):

- each op's name, type and device, its data inputs (``op:index``) and control inputs
  in their order, every attribute (the ``AttrValue`` protobufs serialized
  deterministically, by sorted key), and each output's dtype, shape, bytes and
  batch size;
- who reads each output and which ops wait for each op, in the graph's index order (the order
  its edits left; passes walk these lists);
- the function signature (inputs, captures, outputs, and the control outputs sorted:
  TensorFlow gives them in an order that varies between processes, and they are a set), the
  variables' sizes (``resource_bytes``), the function library and the version stamps.

It uses no Python ``hash()`` (salted per process) and no ``id()``, so the plan
cache (:mod:`tflms.tune.plancache`) can key a tuned plan by it across restarts.
Two graphs with equal digests are the same graph for every tflms pass; any edit
(an op, an edge, an attribute, a shape, a device) changes the digest.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from tflms.ir.graph import Graph, TensorRef

#: Bumped when what the digest covers changes, so old digests never match new ones.
DIGEST_VERSION = 1


class _Writer:
    """Length-prefixed fields into one SHA-256 (no two different field sequences hash the same bytes)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def bytes(self, data: bytes) -> None:
        self.h.update(struct.pack("<Q", len(data)))
        self.h.update(data)

    def text(self, value: str | None) -> None:
        self.bytes(b"\xff" if value is None else value.encode("utf-8"))

    def int(self, value: int | None) -> None:
        self.text(None if value is None else str(value))

    def texts(self, values: Any) -> None:
        values = list(values)
        self.int(len(values))
        for v in values:
            self.text(v)


def _proto_bytes(message: Any) -> bytes:
    if message is None:
        return b""
    return message.SerializeToString(deterministic=True)


def _attr_bytes(value: Any) -> bytes:
    """An attribute's bytes: a protobuf ``AttrValue`` serialized deterministically, anything else by its repr."""
    serialize = getattr(value, "SerializeToString", None)
    if serialize is not None:
        return serialize(deterministic=True)
    return repr(value).encode("utf-8")  # (hand-built test graphs: plain Python values)


def graph_digest(graph: Graph) -> str:
    """The SHA-256 hex digest of ``graph`` (see the module doc)."""
    w = _Writer()
    w.text(f"tflms-graph-digest-{DIGEST_VERSION}")
    w.int(len(graph))
    for op in graph:
        w.text(op.name)
        w.text(op.type)
        w.text(op.device)
        w.texts(ref.name for ref in op.inputs)
        w.texts(op.control_inputs)
        attrs = op.attrs or {}
        keys = sorted(attrs.keys())
        w.int(len(keys))
        for key in keys:
            w.text(key)
            w.bytes(_attr_bytes(attrs[key]))
        w.int(len(op.outputs))
        for info in op.outputs:
            w.text(info.dtype)
            w.text(None if info.shape is None else ",".join("?" if d is None else str(d) for d in info.shape))
            w.int(info.num_bytes)
            w.int(info.batch_size)
    # Who reads each output, and which ops wait for each op, in the graph's index order: passes walk these lists,
    # and an edit history that leaves the same ops but another order is another graph to them.
    for op in graph:
        for index in range(len(op.outputs)):
            readers = graph.consumers(TensorRef(op.name, index))
            w.int(len(readers))
            for reader, slot in readers:
                w.text(reader)
                w.int(slot)
        w.texts(graph.control_consumers(op.name))
    sig = graph.signature
    if sig is None:
        w.text(None)
    else:
        w.texts(sig.input_names)
        w.int(sig.num_captures)
        w.texts(sig.output_names)
        w.texts(sorted(sig.control_output_names))  # (a set: TensorFlow lists it in a per-process order)
    resource = sorted(graph.resource_bytes.items())
    w.int(len(resource))
    for name, size in resource:
        w.text(name)
        w.int(size)
    w.bytes(_proto_bytes(graph.library))
    w.bytes(_proto_bytes(graph.versions))
    return w.h.hexdigest()

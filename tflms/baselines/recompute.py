"""Baseline: gradient checkpointing (recomputation) of a Keras functional model.

:func:`checkpointed` returns a callable that runs a Keras functional model (a
``keras.Model`` built from ``keras.Input``s, e.g. ``keras.applications.*``) in
contiguous *segments*, each wrapped in ``tf.recompute_grad``: the forward pass
keeps only the tensors that cross segment boundaries; the backward pass re-runs
each segment, one at a time, to get its inner activations back (Chen et al. 2016,
*Training deep nets with sublinear memory cost*). Use it in place of the model
inside a ``tf.GradientTape`` training step.

Segments: the model's layer calls in Keras's execution order (deepest first, as
``Functional`` runs them), cut into ``num_segments`` runs of equal length
(default ``round(sqrt(n))`` for ``n`` layer calls, the classic sqrt(n) schedule).
(Runs of equal activation size were tried too: on ResNet-50 they keep more large
early boundary tensors and the simulated peak at batch 128 was 5.5 GiB instead of
3.9 GiB.)

A segment's inputs are the tensors it reads that earlier segments (or the model
inputs) produced; its outputs are the tensors it produces that later segments
read or the model returns. Skip connections (U-Net, DenseNet) simply become
extra boundary tensors.

Rules and limits (each reported by :meth:`CheckpointedModel.explain`):

- Keras 3 models only: a tf_keras (Keras 2) model raises :class:`~tflms.errors.KerasFlavourError`;
- only floating-point boundary tensors are arguments of ``tf.recompute_grad``;
  other inputs (token ids, masks) are captured by the segment's closure;
- a segment with no floating-point input, or with an output that is not
  floating-point, runs without recomputation (``recompute=False`` in the plan);
- the backward pass runs each checkpointed layer twice: layers with side effects
  do them twice (BatchNormalization in training updates its moving statistics
  twice per step), and layers that draw random numbers (Dropout) draw new ones
  when recomputed, so their gradients then differ from a step without
  checkpointing. Deterministic layers give the same loss and gradients.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from tflms._compat.flavour import KERAS_3, check_flavour
from tflms.errors import ConfigError, UnsupportedModelError


@dataclasses.dataclass(frozen=True)
class Segment:
    """One checkpointed run of layer calls."""

    index: int
    layers: tuple[str, ...]  # operation names, in execution order
    num_inputs: int  # boundary tensors read
    num_outputs: int  # boundary tensors produced
    recompute: bool  # False: runs as usual (see module doc)
    why_not: str = ""


class CheckpointedModel:
    """A Keras functional model run segment by segment under ``tf.recompute_grad``.

    Call it like the model: ``outputs = ckpt(inputs, training=True)``. The model's
    variables are used as they are (the same objects), so gradients with respect to
    ``model.trainable_variables`` flow as usual.
    """

    def __init__(self, model: Any, num_segments: int | None = None):
        check_flavour(model, KERAS_3, "tflms.baselines.recompute.checkpointed",
                      "It reads Keras 3's layer graph (node.operation, node.arguments), which tf_keras models lack: "
                      "build the model with Keras 3 (keras.applications has the same architectures), or wrap your "
                      "own segments in tf.recompute_grad")
        nodes = _execution_order(model)
        if not nodes:
            raise UnsupportedModelError(f"model {getattr(model, 'name', model)!r} has no layer calls to checkpoint")
        if num_segments is None:
            num_segments = max(1, round(math.sqrt(len(nodes))))
        if isinstance(num_segments, bool) or not isinstance(num_segments, int) or num_segments < 1:
            raise ConfigError(f"num_segments must be a positive int, got {num_segments!r}")
        num_segments = min(num_segments, len(nodes))
        self.model = model
        self._chunks: list[list[Any]] = _split(nodes, num_segments)
        model_outputs = {id(t) for t in model.outputs}
        produced_by: dict[int, int] = {id(t): -1 for t in model.inputs}
        for i, chunk in enumerate(self._chunks):
            for node in chunk:
                for t in node.outputs:
                    produced_by[id(t)] = i
        self._inputs: list[list[int]] = []
        self._outputs: list[list[int]] = []
        self._tensors: dict[int, Any] = {id(t): t for t in model.inputs}
        read_later: list[set[int]] = [set() for _ in self._chunks]
        for i, chunk in enumerate(self._chunks):
            seen: list[int] = []
            for node in chunk:
                for t in node.input_tensors:
                    self._tensors[id(t)] = t
                    src = produced_by.get(id(t))
                    if src is None:
                        raise UnsupportedModelError(f"layer {node.operation.name!r} reads a tensor no earlier layer "
                                                    "produced; only models built from keras.Input are supported")
                    if src != i and id(t) not in seen:
                        seen.append(id(t))
                        if src >= 0:
                            read_later[src].add(id(t))
                for t in node.outputs:
                    self._tensors[id(t)] = t
            self._inputs.append(seen)
        for i, chunk in enumerate(self._chunks):
            outs = [id(t) for node in chunk for t in node.outputs
                    if id(t) in read_later[i] or id(t) in model_outputs]
            self._outputs.append(list(dict.fromkeys(outs)))
        self.segments = tuple(self._plan(i) for i in range(len(self._chunks)))

    def _plan(self, i: int) -> Segment:
        chunk = self._chunks[i]
        why = ""
        if not any(_is_float(self._tensors[t].dtype) for t in self._inputs[i]):
            why = "no floating-point input"
        elif not all(_is_float(self._tensors[t].dtype) for t in self._outputs[i]):
            why = "an output is not floating-point"
        return Segment(index=i, layers=tuple(n.operation.name for n in chunk), num_inputs=len(self._inputs[i]),
                       num_outputs=len(self._outputs[i]), recompute=not why, why_not=why)

    def __call__(self, inputs: Any, training: bool | None = True) -> Any:
        import tensorflow as tf  # noqa: PLC0415
        from keras import tree  # noqa: PLC0415

        flat = tree.flatten(inputs)
        if len(flat) != len(self.model.inputs):
            raise ConfigError(f"the model takes {len(self.model.inputs)} inputs, got {len(flat)}")
        values: dict[int, Any] = {}
        for ref, value in zip(self.model.inputs, flat):
            values[id(ref)] = tf.cast(value, ref.dtype) if value.dtype != ref.dtype else value
        for i, chunk in enumerate(self._chunks):
            seg = self.segments[i]
            outputs = self._outputs[i]
            if not seg.recompute:
                local = dict(values)
                _run(chunk, local, training)
                values.update((t, local[t]) for t in outputs)
                continue
            arg_ids = [t for t in self._inputs[i] if _is_float(self._tensors[t].dtype)]
            captured = {t: values[t] for t in self._inputs[i] if t not in arg_ids}

            def body(*args, _chunk=chunk, _arg_ids=arg_ids, _captured=captured, _outputs=outputs):
                local = dict(_captured)
                local.update(zip(_arg_ids, args))
                _run(_chunk, local, training)
                return [local[t] for t in _outputs]

            results = tf.recompute_grad(body)(*[values[t] for t in arg_ids])
            values.update(zip(outputs, results))
        result = [values[id(t)] for t in self.model.outputs]
        return tree.pack_sequence_as(self.model._outputs_struct, result)  # noqa: SLF001 - the model's output nesting

    def explain(self) -> str:
        """One line per segment: its layers, boundary tensors and whether it is recomputed."""
        lines = [f"{len(self.segments)} segments over {sum(len(s.layers) for s in self.segments)} layer calls "
                 f"of {self.model.name!r}",
                 f"{'seg':>4} {'layers':>6} {'in':>4} {'out':>4}  recompute  first .. last"]
        for s in self.segments:
            lines.append(f"{s.index:>4} {len(s.layers):>6} {s.num_inputs:>4} {s.num_outputs:>4}  "
                         f"{'yes' if s.recompute else 'no (' + s.why_not + ')':<9}  {s.layers[0]} .. {s.layers[-1]}")
        return "\n".join(lines)


def checkpointed(model: Any, num_segments: int | None = None) -> CheckpointedModel:
    """``model`` run with gradient checkpointing in ``num_segments`` segments (default sqrt of its layer calls)."""
    return CheckpointedModel(model, num_segments)


def _is_float(dtype: Any) -> bool:
    name = getattr(dtype, "name", dtype)
    return isinstance(name, str) and ("float" in name or name == "bfloat16")


def _execution_order(model: Any) -> list[Any]:
    """The model's layer-call nodes in the order ``Functional`` runs them."""
    by_depth = getattr(model, "_nodes_by_depth", None)
    if by_depth is None or not getattr(model, "inputs", None):
        raise UnsupportedModelError(f"{type(model).__name__} is not a Keras functional model (built from "
                                    "keras.Input); subclassed models have no layer graph to segment")
    nodes = []
    for depth in sorted(by_depth, reverse=True):
        for node in by_depth[depth]:
            if node.operation is not None and not node.is_input:
                nodes.append(node)
    return nodes


def _split(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """``items`` cut into ``parts`` contiguous runs whose lengths differ by at most one."""
    bounds = [round(k * len(items) / parts) for k in range(parts + 1)]
    return [list(items[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


def _run(chunk: Sequence[Any], values: dict[int, Any], training: bool | None) -> None:
    from keras import tree  # noqa: PLC0415

    for node in chunk:
        args, kwargs = node.arguments.fill_in(values)
        op = node.operation
        if training is not None and getattr(op, "_call_has_training_arg", False):
            kwargs["training"] = training
        outputs = op(*args, **kwargs)
        for ref, value in zip(node.outputs, tree.flatten(outputs)):
            values[id(ref)] = value

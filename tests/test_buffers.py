"""Where each tensor starts (``tflms.sim.buffers._Buffers``): the tensors placed by their op's type alone are marked
once per origin (``IndexedGraph.origin``) and kept for its copies; a plan's copies, with ops appended, inputs replaced
and ops the order leaves out, are placed as a net built whole is (one whose ops are all appended)."""

from __future__ import annotations

import random

import pytest

from tflms.ir.graph import TensorInfo
from tflms.sim.buffers import _Buffers
from tflms.sim.indexed import ACCEL, HOST, IndexedGraph, Origin, positions
from tflms.sim.records import SimOptions

_INFO = TensorInfo("float32", (4, 4), 64)
#: types placed by their type, by their inputs, and neither (a buffer of its own)
_TYPES = ("Const", "ReadVariableOp", "Placeholder", "_Arg", "Identity", "Reshape", "IdentityN", "Snapshot", "Sum",
          "Relu", "MatMul", "AddV2")


def _add(rng: random.Random, net: IndexedGraph, name: str) -> None:
    op_type = rng.choice(_TYPES)
    tensors = len(net.t_op)
    inputs = [] if op_type in ("Const", "Placeholder", "_Arg") or not tensors else sorted(
        rng.sample(range(tensors), min(tensors, rng.randint(1, 2))))
    net.add_op(name, op_type, rng.choice((ACCEL, ACCEL, HOST)), inputs, [], [_INFO] * rng.choice((1, 1, 2)))


def _rebuilt(net: IndexedGraph) -> IndexedGraph:
    """``net``'s ops and edges in a net of its own, every op appended (nothing kept from an origin)."""
    whole = IndexedGraph()
    for i, name in enumerate(net.names):
        whole.add_op(name, net.types[i], net.dev[i], list(net.inputs[i]), [],
                     [net.t_info[t] for t in range(net.out_start[i], net.out_start[i] + net.n_out[i])])
    return whole


def _placed(bufs: _Buffers, net: IndexedGraph, order: list[int]) -> tuple:
    """What the later stages read of ``bufs``: every tensor's owner and whether its op is in the order, the copies
    between devices of the order, and the resident and variable-read marks of the order's tensors."""
    mine = [t for i in order for t in range(net.out_start[i], net.out_start[i] + net.n_out[i])]
    return (bufs.buffer_of, bufs.in_order, [bufs.is_transfer[i] for i in order], bufs.unknown,
            [bufs.resident[t] for t in mine], [bufs.variable_reads[t] for t in mine])


@pytest.mark.parametrize("seed", range(200))
def test_a_copys_buffers_from_its_origins_marks_are_those_of_the_net_built_whole(seed):
    rng = random.Random(seed)
    base = IndexedGraph()
    for i in range(rng.randint(1, 30)):
        _add(rng, base, f"op{i}")
    base.origin = Origin(len(base.names))  # (as ``IndexedGraph.from_graph`` makes it)
    for resident_inputs in (True, False, True):  # the marks of each option kept apart
        options = SimOptions(resident_inputs=resident_inputs)
        for _ in range(3):  # plans one after another: the origin's marks are kept
            net = base.copy()
            for k in range(rng.randint(0, 5)):
                _add(rng, net, f"new{k}")
            for c in rng.sample(range(len(base.names)), rng.randint(0, min(3, len(base.names)))):
                earlier = net.out_start[c]  # (a reader rewired to other tensors made before it)
                if earlier and net.inputs[c]:
                    net.inputs[c] = sorted(rng.sample(range(earlier), min(earlier, len(net.inputs[c]))))
            order = [i for i in range(len(net.names)) if rng.random() < 0.85]  # (ids are topological here)
            order = [i for i in order if all(net.t_op[t] in order for t in net.inputs[i])]
            got = _placed(_Buffers(net, order, options, positions(order, len(net.names))), net, order)
            whole = _rebuilt(net)
            assert got == _placed(_Buffers(whole, order, options, positions(order, len(whole.names))), whole, order)
    assert len(base.origin.memo) == 2

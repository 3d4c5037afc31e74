"""The simulator's clocks (tflms.sim.clock, tflms.sim.fusion): serial, graph (overlapped launches, grappler's GPU
fusions) and xla (XLA:GPU's fusions), worked out by hand on tiny graphs."""

from __future__ import annotations

import dataclasses

import pytest

from tflms.errors import BudgetError, ConfigError
from tflms.sim import HardwareProfile, SimOptions, simulate
from tflms.sim.clock import XLA_MIN_KERNEL_S
from tflms.testing import GraphBuilder

T = (4, 4)  # 64-byte float32 tensors
HOST = "/device:CPU:0"


def bytes_profile(launch_s: float = 0.0) -> HardwareProfile:
    """Free FLOPs, 64 bytes of memory traffic per second: an element-wise op on 64-byte tensors takes 2 s."""
    return HardwareProfile("bytes", memory_bytes=1 << 20, peak_flops=1e12, memory_gbps=64e-9, link_gbps=64e-9,
                           link_latency_s=0, launch_overhead_s=launch_s, compute_efficiency=1, link_efficiency=1)


def flops_profile(launch_s: float) -> HardwareProfile:
    """16 FLOP/s (a 4x4 element-wise op takes 1 s of work), free memory traffic, launches of ``launch_s``."""
    return HardwareProfile("flops", memory_bytes=1 << 20, peak_flops=16, memory_gbps=1e9, link_gbps=1e9,
                           link_latency_s=0, launch_overhead_s=launch_s, compute_efficiency=1, link_efficiency=1)


def buffers(result) -> set[str]:
    """The tensors that own an accelerator buffer in a simulation."""
    return {name for name, *_ in result.buffer_lifetimes}


def run(graph, profile, clock, **options):
    return simulate(graph, profile, options=SimOptions(clock=clock, **options))


def relu_chain(n: int = 3):
    b = GraphBuilder()
    prev = b.op("x", "Placeholder", shape=T)
    for k in range(n):
        prev = b.op(f"r{k}", "Relu", [prev], shape=T)
    return b


# ---------------------------------------------------------------- modes


def test_auto_is_serial_on_a_cpu_profile_and_graph_on_a_gpu_profile():
    graph = relu_chain().graph
    gpu = flops_profile(0.5)
    assert run(graph, gpu, "auto").clock == "graph"
    assert run(graph, dataclasses.replace(gpu, host_kernels=True), "auto").clock == "serial"
    from tflms.measure import EMULATION_PROFILE
    assert EMULATION_PROFILE.host_kernels  # the emulated accelerator's kernels run in the executor's threads
    assert simulate(graph, gpu).summary()["clock"] == "graph"


def test_an_unknown_clock_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="clock must be one of 'auto', 'serial', 'graph', 'xla', 'xla-clusters', got 'fast'"):
        SimOptions(clock="fast")


# ---------------------------------------------------------------- graph clock: launches overlap


def test_serial_clock_adds_every_launch_to_the_step():
    result = run(relu_chain().graph, flops_profile(1.0), "serial")
    assert result.step_time_s == pytest.approx(3 * (1 + 1))
    assert result.kernels == 3


def test_graph_clock_hides_launches_behind_longer_kernels():
    # launches of 0.5 s, kernels of 1 s: the host issues r1 at 1.0 while r0 runs (0.5-1.5), and so on; only the
    # first launch shows.
    result = run(relu_chain().graph, flops_profile(0.5), "graph")
    assert result.step_time_s == pytest.approx(0.5 + 3 * 1.0)
    assert result.compute_time_s == pytest.approx(3.5)
    assert result.compute_bound


def test_graph_clock_is_launch_bound_on_kernels_shorter_than_their_launch():
    # launches of 2 s, kernels of 1 s: each kernel waits for its launch (issued at 2, 4, 6), the GPU idles between.
    result = run(relu_chain().graph, flops_profile(2.0), "graph")
    assert result.step_time_s == pytest.approx(3 * 2.0 + 1.0)
    # the step's compute time counts the waits for launches: no copy schedule can make it shorter
    assert result.compute_time_s == pytest.approx(result.step_time_s)
    assert result.compute_bound


@pytest.mark.parametrize("transfer_order", ["release", "fifo"])
def test_both_copy_queue_models_time_launches_alike(transfer_order):
    result = run(relu_chain().graph, flops_profile(2.0), "graph", transfer_order=transfer_order)
    assert result.step_time_s == pytest.approx(7.0)


# ---------------------------------------------------------------- graph clock: grappler's GPU remapper


def conv_bias_relu(*, bias_type="BiasAdd", filter_hw=(3, 3), dtype="float32", control=False, extra_reader=False):
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=(2, 8, 8, 4), dtype=dtype)
    w = b.op("w", "Const", shape=(*filter_hw, 4, 8), dtype=dtype)
    bias = b.op("bias", "Const", shape=(8,), dtype=dtype)
    conv = b.op("conv", "Conv2D", [x, w], shape=(2, 8, 8, 8), dtype=dtype)
    add = b.op("add", bias_type, [conv, bias], shape=(2, 8, 8, 8), dtype=dtype)
    b.op("relu", "Relu", [add], shape=(2, 8, 8, 8), dtype=dtype, control=["add"] if control else ())
    if extra_reader:
        b.op("other", "Neg", [add], shape=(2, 8, 8, 8), dtype=dtype)
    return b.graph


def test_graph_clock_fuses_conv_bias_relu_as_grapplers_remapper_does_on_a_gpu():
    profile = flops_profile(0.0)
    fused, plain = run(conv_bias_relu(), profile, "graph"), run(conv_bias_relu(), profile, "serial")
    assert (plain.kernels, fused.kernels) == (3, 1)
    # the fused kernel writes the Relu's output; unfused, the bias add and the Relu forward the convolution's buffer
    assert (buffers(fused), buffers(plain)) == ({"relu:0"}, {"conv:0"})
    assert fused.peak_bytes == plain.peak_bytes
    # the fused kernel costs what the convolution costs
    conv_s = next(op.end_s - op.start_s for op in plain.ops if op.name == "conv")
    assert fused.step_time_s == pytest.approx(conv_s)


@pytest.mark.parametrize("variant", [dict(bias_type="AddV2"), dict(filter_hw=(1, 1)), dict(dtype="float16"),
                                     dict(control=True), dict(extra_reader=True)],
                         ids=["keras3-addv2", "1x1-filter", "float16", "control-edge", "two-readers"])
def test_graph_clock_leaves_what_the_remapper_does_not_match(variant):
    graph = conv_bias_relu(**variant)
    result = run(graph, flops_profile(0.0), "graph")
    assert result.kernels == run(graph, flops_profile(0.0), "serial").kernels


# ---------------------------------------------------------------- xla clock


def test_xla_fuses_an_element_wise_chain_into_one_kernel_priced_by_its_boundary():
    b = relu_chain(3)
    b.op("d", "AddV2", ["r0", "r2"], shape=T)  # r0 read twice, inside the same fusion
    serial, xla = run(b.graph, bytes_profile(), "serial"), run(b.graph, bytes_profile(), "xla")
    assert (serial.kernels, xla.kernels) == (4, 1)
    # one kernel reads x and writes d: 128 bytes, 2 s (serial: 3 Relu at 2 s, the add at 3 s)
    assert xla.step_time_s == pytest.approx(2.0)
    assert serial.step_time_s == pytest.approx(3 * 2 + 3)
    # nothing but x and d reaches memory (serial: r0 lives until d, beside r1/r2)
    assert (xla.peak_bytes, serial.peak_bytes) == (128, 192)


def test_xla_fusions_take_no_more_than_the_shortest_kernel():
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=(1,))
    b.op("y", "Relu", ["x"], shape=(1,))
    assert run(b.graph, bytes_profile(), "xla").step_time_s >= XLA_MIN_KERNEL_S


@pytest.mark.parametrize("readers, fused", [(3, True), (4, False)])
def test_xla_duplicates_a_producer_into_several_fusions_only_where_that_moves_fewer_bytes(readers, fused):
    # p = x * y feeds ``readers`` reductions: fused into each, every copy reads x and y (2 x 64 bytes) instead of
    # p (64); with 3 readers that is 384 bytes either way, with 4 it is 512 against 448.
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("y", "Placeholder", shape=T)
    b.op("p", "Mul", ["x", "y"], shape=T)
    for k in range(readers):
        b.op(f"s{k}", "Sum", ["p"], shape=(4, 1 + k))
    result = run(b.graph, bytes_profile(), "xla")
    assert result.kernels == readers + (0 if fused else 1)
    assert ("p:0" in buffers(result)) is not fused


def test_xla_duplicates_a_widening_cast_into_all_its_readers_however_many():
    """Keras's batch norm in mixed_bfloat16: the cast of a bfloat16 tensor to float32 has five readers (four in the
    forward pass, one in the backward). Fused into each, every copy reads the bfloat16 input (5 x 32 bytes) instead of
    the float32 output written once and read five times (32 + 64 + 5 x 64): XLA fuses it into all five, whatever their
    count, and no float32 buffer exists (the clock once stopped at four copies)."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T, dtype="bfloat16")
    b.op("c", "Cast", ["x"], shape=T)
    for k in range(5):
        b.op(f"s{k}", "Sum", ["c"], shape=(4, 1 + k))
    result = run(b.graph, bytes_profile(), "xla")
    assert result.kernels == 5 and "c:0" not in buffers(result)


def test_xla_library_calls_read_their_operands_from_memory():
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("a", "Relu", ["x"], shape=T)
    b.op("m", "MatMul", ["a", "a"], shape=T)
    result = run(b.graph, bytes_profile(), "xla")
    assert result.kernels == 2
    assert "a:0" in buffers(result)


def test_xla_metadata_readers_do_not_keep_a_tensor_out_of_a_fusion():
    b = relu_chain(2)
    b.op("shape", "Shape", ["r0"], shape=(2,), dtype="int32")
    result = run(b.graph, bytes_profile(), "xla")
    assert result.kernels == 1
    assert "r0:0" not in buffers(result)


def test_xla_computes_dropouts_random_numbers_inside_the_kernel_that_reads_them():
    """Keras 3's dropout: u = stateless_uniform(shape, key, counter), mask = u >= rate, y = select(mask, x * s, 0).
    XLA:GPU expands the Philox generator into element-wise ops before it fuses, so u never reaches memory: one kernel
    reads x and writes y and the mask (kept for the gradient). The graph clock runs TensorFlow's own kernel, which
    writes u."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("shape", "Const", shape=(2,), dtype="int32")
    b.op("key", "Placeholder", shape=(1,), dtype="uint64")
    b.op("counter", "Placeholder", shape=(2,), dtype="uint64")
    b.op("alg", "Const", shape=(), dtype="int32")
    b.op("u", "StatelessRandomUniformV2", ["shape", "key", "counter", "alg"], shape=T)
    b.op("rate", "Const", shape=(), dtype="float32")
    b.op("mask", "GreaterEqual", ["u", "rate"], shape=T, dtype="bool")
    b.op("s", "Mul", ["x", "rate"], shape=T)
    b.op("zero", "Const", shape=(), dtype="float32")
    b.op("y", "SelectV2", ["mask", "s", "zero"], shape=T)
    b.op("keep", "Identity", ["mask"], shape=T, dtype="bool")  # the gradient's reader: the mask reaches memory
    xla, graph = run(b.graph, bytes_profile(), "xla"), run(b.graph, bytes_profile(), "graph")
    assert "u:0" not in buffers(xla) and "u:0" in buffers(graph)
    assert xla.kernels == 1 and graph.kernels > 1


def erfc_of_x() -> GraphBuilder:
    """x, a constant c, and erfc(x * c): the start of Keras 3's exact GELU on TensorFlow."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("c", "Const", shape=(), dtype="float32")
    b.op("neg", "Mul", ["x", "c"], shape=T)
    b.op("erfc", "Erfc", ["neg"], shape=T)
    return b


def test_xla_fuses_the_exact_gelu_of_keras_3_into_one_kernel():
    """Keras 3's GELU on TensorFlow (``approximate=False``): tf.nn.gelu builds 0.5 * x * erfc(-x / sqrt(2)). tf2xla
    lowers ``Erfc`` to element-wise ops, so the chain is one kernel reading x and writing y; TensorFlow's own Erfc is
    a cwise kernel that may write into its input's buffer. Before, ``Erfc`` was none of those: a kernel of its own
    that wrote its output, on every clock."""
    b = erfc_of_x()
    b.op("half", "Mul", ["x", "c"], shape=T)
    b.op("y", "Mul", ["half", "erfc"], shape=T)
    xla, serial = run(b.graph, bytes_profile(), "xla"), run(b.graph, bytes_profile(), "serial")
    assert xla.kernels == 1 and "erfc:0" not in buffers(xla)
    assert xla.step_time_s == pytest.approx((64 + 4 + 64) / 64)  # x and c in, y out
    assert serial.kernels == 4
    # serial: erfc writes into neg's buffer (neg has no other reader), as TensorFlow's UnaryOp forwards its input
    assert serial.buffer_owner["erfc:0"] == "neg:0"


def test_a_machine_whose_xla_duplicates_no_erfc_writes_it_once_for_both_its_readers():
    """XLA:CPU never duplicates an expensive instruction into a second fusion (the emulated accelerator's
    ``xla_no_duplicate``): the zoo BERT's Erfc, read by the forward product and by its gradient, was its own buffer
    in XLA's dump while the clock fused it away (a transient 8 MiB under what the executor measured). On a GPU
    profile it is duplicated into both readers; a single reader takes it either way."""
    from tflms.measure import EMULATION_PROFILE
    from tflms.measure.emulation import EMULATION_XLA_NO_DUPLICATE
    b = erfc_of_x()
    b.op("y", "Mul", ["x", "erfc"], shape=T)
    b.op("s", "Sum", ["y", "c"], shape=())
    b.op("g", "Mul", ["erfc", "c"], shape=T)  # a second fusion reading it (the gradient's)
    b.op("t", "Sum", ["g", "c"], shape=())
    gpu = bytes_profile()
    cpu = dataclasses.replace(gpu, xla_no_duplicate=("Erfc",))
    assert "erfc:0" not in buffers(run(b.graph, gpu, "xla"))
    assert "erfc:0" in buffers(run(b.graph, cpu, "xla"))
    assert "Erfc" in EMULATION_PROFILE.xla_no_duplicate and set(EMULATION_XLA_NO_DUPLICATE) >= {"Exp", "RealDiv"}
    single = GraphBuilder()
    single.op("x", "Placeholder", shape=T)
    single.op("c", "Const", shape=(), dtype="float32")
    single.op("erfc", "Erfc", ["x"], shape=T)
    single.op("y", "Mul", ["x", "erfc"], shape=T)
    assert "erfc:0" not in buffers(run(single.graph, cpu, "xla"))
    with pytest.raises(ConfigError, match="xla_no_duplicate"):
        dataclasses.replace(gpu, xla_no_duplicate="Erfc")


def test_a_copy_to_the_host_is_a_fusion_boundary():
    b = relu_chain(2)
    b.graph.add_op("out", "Identity", inputs=[b.graph.op("r0").output(0)], device=HOST,
                   outputs=b.graph.op("r0").outputs)
    result = run(b.graph, bytes_profile(), "xla")
    assert result.kernels == 2  # r0 is written for the copy; r1 reads it back
    assert "r0:0" in buffers(result)


def test_xla_folds_a_convolutions_bias_add_into_its_library_call():
    graph = conv_bias_relu(bias_type="AddV2")  # a Keras 3 bias: an add of a channel vector
    serial, xla = run(graph, flops_profile(0.0), "serial"), run(graph, flops_profile(0.0), "xla")
    assert (serial.kernels, xla.kernels) == (3, 2)  # conv + bias in cuDNN, the Relu a fusion of its own
    assert "conv:0" not in buffers(xla) and "conv:0" in buffers(serial)


def sibling_sums(dependent: bool):
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("s1", "Sum", ["x"], shape=(4, 1))
    b.op("sq", "Sub" if dependent else "Square", ["x", "s1"] if dependent else ["x"], shape=T)
    b.op("s2", "Sum", ["sq"], shape=(4, 1))
    return b.graph


def test_xla_reads_a_tensor_once_for_sibling_reductions():
    result = run(sibling_sums(dependent=False), bytes_profile(), "xla")
    assert result.kernels == 1
    # one pass over x (64 bytes) and two 16-byte outputs
    assert result.step_time_s == pytest.approx((64 + 16 + 16) / 64)


def test_xla_keeps_a_reduction_that_reads_another_in_a_kernel_of_its_own():
    result = run(sibling_sums(dependent=True), bytes_profile(), "xla")
    assert result.kernels == 2
    assert result.step_time_s == pytest.approx((64 + 16) / 64 + (64 + 16 + 16) / 64)


# ---------------------------------------------------------------- the tuner's floors on the graph clock


def test_the_any_order_floor_counts_the_launches_no_order_avoids():
    from tflms.sim.bounds import any_order_time_bound
    graph = relu_chain(4).graph
    profile = flops_profile(2.0)  # launch-bound: kernels of 1 s, launches of 2 s
    sim = run(graph, profile, "graph")
    floor = any_order_time_bound(graph, profile, 1 << 20, sim=sim)
    assert floor.floor_s == pytest.approx(4 * 2.0)  # four launches back to back; this order ends 1 s later
    assert sim.kernel_time_s == pytest.approx(4.0) and sim.compute_time_s == pytest.approx(9.0)


def test_a_clones_floor_is_its_kernel_or_its_launch_on_the_graph_clock():
    import types

    from tflms.tune.recompute_sets import compute_floor_s
    graph = relu_chain(3).graph
    profile = flops_profile(0.5)
    base = run(graph, profile, "graph")  # 0.5 + 3 x 1 s: kernels 3 s
    clone = types.SimpleNamespace(ops=("r0", "r1"))
    times = {"r0": 1.5, "r1": 0.6}  # prices with their 0.5 s launch: kernels of 1 s and 0.1 s
    floor = compute_floor_s(base, times, [clone], launch_s=0.5)
    assert floor == pytest.approx(max(3.0 + 1.1, 3.5 + 0.5 + 0.1), rel=1e-6)
    # serial: the prices, launches included, on top of the compute time
    assert compute_floor_s(base, times, [clone]) == pytest.approx(3.5 + 2.1, rel=1e-6)


def test_the_graph_clocks_one_pass_gives_the_two_passes_figures_in_every_plan_of_a_tune(monkeypatch):
    """``graph_kernels`` (each op's pair kept across a tune's simulations, those of the plans' origin as whole
    lists) against what it replaced,
    ``asynchronous`` of the ops' prices: every candidate of a tune that re-runs ops (clones appended under ids another
    plan gave other ops) and swaps them simulates to the same bytes and seconds."""
    from test_recompute import _residual_bn_32

    from tflms.passes.swaps import apply_swaps
    from tflms.sim import clock, get_profile
    from tflms.tune import tune

    graph = _residual_bn_32()[-1]
    profile = get_profile("v100-16gb-pcie3")
    base = simulate(graph, profile)
    assert base.clock == clock.CLOCK_GRAPH
    budget = base.resident_bytes + base.transient_peak_bytes // 2

    def figures():
        try:
            candidates = tune(graph, budget=budget, profile=profile,
                              strategies=["idle-time", "tflms-distance", "recompute"]).candidates
        except BudgetError as err:  # (every candidate was simulated all the same)
            candidates = err.candidates
        # and the rewritten graphs of a few with swaps, simulated from scratch: their copies between devices are
        # ops of the net the simulation starts from (``IndexedGraph.origin``), not ops a plan appended
        rewritten = [simulate(apply_swaps(graph, c.plan).graph, profile)
                     for c in candidates if c.plan is not None and c.plan.swaps][:3]
        return [(c.strategy, repr(c.params), c.sim.step_time_s, c.sim.peak_bytes, c.sim.stall_time_s, c.sim.kernels,
                 bytes(c.sim.details.start)) for c in candidates] + [
            (sim.step_time_s, sim.peak_bytes, sim.kernels, bytes(sim.details.start)) for sim in rewritten]

    one_pass = figures()
    assert {"recompute", "hybrid"} <= {s for s, *_ in one_pass}, sorted({s for s, *_ in one_pass})
    assert len(one_pass[-1]) == 4  # (a rewritten graph was simulated)

    def two_passes(net, order, is_transfer, costs, profile, position=None):
        priced = clock.op_durations(net, order, is_transfer, costs, profile)
        kernels = clock.Kernels(clock.CLOCK_GRAPH, priced, [0.0] * len(priced), sum(1 for d in priced if d > 0))
        return clock.asynchronous(kernels, net, profile, costs)

    monkeypatch.setattr(clock, "graph_kernels", two_passes)
    assert figures() == one_pass


def test_the_graph_clock_prices_no_op_of_the_origin_the_order_leaves_out_nor_a_copy_and_appended_ops_by_their_own():
    """``graph_kernels`` keeps the ops of the net a simulation starts from as whole lists (``IndexedGraph.origin``):
    an op the order leaves out, or one that copies between devices, is still no kernel, and an op a plan appends
    under an id is priced as itself, whatever the op that id held in an earlier plan, as the op-by-op clock does."""
    from tflms.sim import clock
    from tflms.sim.indexed import ACCEL, IndexedGraph, OpCosts

    graph = relu_chain(4).graph
    profile = flops_profile(0.25)
    base = IndexedGraph.from_graph(graph, HOST)
    costs = OpCosts(graph, profile)
    everything = list(range(len(base.names)))
    copies = [False] * len(base.names)
    full = clock.graph_kernels(base, everything, copies, costs, profile)
    assert full.kernels == 4 and full.duration[1:] == [1.0] * 4 and full.launch[1:] == [0.25] * 4  # (1 s of work)

    left_out = [i for i in everything if i != 2]
    as_copy = [i == 3 for i in everything]
    kernels = clock.graph_kernels(base, left_out, as_copy, costs, profile)
    assert kernels.kernels == 2
    assert (kernels.duration[2], kernels.launch[2], kernels.duration[3], kernels.launch[3]) == (0.0, 0.0, 0.0, 0.0)
    assert kernels.duration[4] == 1.0

    wide = GraphBuilder()
    wide.op("r", "Relu", [wide.op("x", "Placeholder", shape=(8, 8))], shape=(8, 8))  # 4 s of work

    def appended(src) -> IndexedGraph:
        net = base.copy()
        last = net.out_start[len(base.names) - 1]
        op = net.add_op("extra", "Identity" if src is None else src.type, ACCEL, [last], [], [net.t_info[last]])
        net.src_ops[op] = src
        return net

    # one id, in turn a narrow ReLU, a gate, a wide ReLU, the wide one as a copy (each another op to price)
    for src, copy, kernel in ((graph.op("r0"), False, 1.0), (None, False, 0.0), (wide.graph.op("r"), False, 4.0),
                              (wide.graph.op("r"), True, 0.0)):
        net = appended(src)
        order, is_copy = list(range(len(net.names))), [False] * (len(net.names) - 1) + [copy]
        plan_costs = OpCosts(graph, profile)  # (a plan's prices, the memos shared, as the tuner's evaluator has them)
        plan_costs._graph_clock, plan_costs._launches = costs.graph_clock_memo(), costs.launches_memo()
        kernels = clock.graph_kernels(net, order, is_copy, plan_costs, profile)
        two = clock.asynchronous(clock.serial_kernels(net, order, is_copy, OpCosts(graph, profile), profile), net,
                                 profile, OpCosts(graph, profile))
        assert (kernels.duration, kernels.launch, kernels.kernels) == (two.duration, two.launch, two.kernels)
        assert (kernels.duration[-1], kernels.kernels) == (kernel, 4 + (kernel > 0))

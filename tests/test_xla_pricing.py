"""The xla-clusters clock (tflms.sim.clusters, issue 47): a rewritten step that keeps XLA, priced cluster by cluster,
worked out by hand on tiny graphs; and the tuner's XLA path prices its candidates with it."""

from __future__ import annotations

import dataclasses

import pytest

from tflms.config import LMSConfig
from tflms.errors import ConfigError
from tflms.ir.graph import TensorRef
from tflms.passes.xla_clusters import cluster_for_xla
from tflms.pipeline import rewrite, rewrite_step
from tflms.sim import HardwareProfile, SimOptions, simulate
from tflms.sim.clusters import contracted_order, step_clusters
from tflms.testing import GraphBuilder, mlp_training_graph
from tflms.tune.tuner import tune

T = (4, 4)  # 64-byte float32 tensors
HOST = "/device:CPU:0"
GPU = "/device:GPU:0"


def bytes_profile() -> HardwareProfile:
    """Free FLOPs, 64 bytes per second of memory traffic and of link: an element-wise op on 64-byte tensors takes
    2 s, a 64-byte copy 1 s; no launches."""
    return HardwareProfile("bytes", memory_bytes=1 << 20, peak_flops=1e12, memory_gbps=64e-9, link_gbps=64e-9,
                           link_latency_s=0, launch_overhead_s=0, compute_efficiency=1, link_efficiency=1)


def run(graph, clock: str, profile=None):
    return simulate(graph, profile or bytes_profile(), options=SimOptions(clock=clock))


def spans(result) -> dict[str, tuple[float, float]]:
    return {r.name: (r.start_s, r.end_s) for r in result.ops}


def buffers(result) -> set[str]:
    return {name for name, *_ in result.buffer_lifetimes}


def swap_out(g, tensor: str) -> None:
    """Add ``lms/swap_out_<tensor>``: the copy of op ``tensor``'s output to the host."""
    g.add_op(f"lms/swap_out_{tensor}", "Identity", inputs=[TensorRef(tensor, 0)], device=HOST,
             outputs=g.op(tensor).outputs)


def swap_in(g, tensor: str, trigger: str | None = None, device: str = "") -> None:
    """Add ``lms/swap_in_<tensor>``: the copy back of ``lms/swap_out_<tensor>``, after ``trigger`` (a control input)."""
    g.add_op(f"lms/swap_in_{tensor}", "Identity", inputs=[TensorRef(f"lms/swap_out_{tensor}", 0)],
             control_inputs=[trigger] if trigger else [], device=device, outputs=g.op(tensor).outputs)


def swapped_chain():
    """x -> r0 -> r1 -> r2 -> d = r2 + r0, with r0 swapped out after r0 and back in after r1 (its trigger): the
    copies split the step into the clusters {r0}, {r1} and {r2, d}; r1 is read only by r2, which the whole-step xla
    clock fuses into d."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("r0", "Relu", ["x"], shape=T)
    g = b.graph
    swap_out(g, "r0")
    b.op("r1", "Relu", ["r0"], shape=T)
    swap_in(g, "r0", "r1")
    b.op("r2", "Relu", ["r1"], shape=T)
    b.op("d", "AddV2", ["r2", "lms/swap_in_r0"], shape=T)
    return g


def swapped_branch():
    """c = relu(x) feeds a chain p1 -> p2 and a branch a; a is swapped out and back in (trigger p2) for d = p2 + a.
    One cluster {c, p1, a, p2}, then {d}; in level order a runs before p2, so on the whole-step clock the swap-out
    copies while p2 runs."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("c", "Relu", ["x"], shape=T)
    b.op("p1", "Relu", ["c"], shape=T)
    b.op("p2", "Relu", ["p1"], shape=T)
    b.op("a", "Relu", ["c"], shape=T)
    g = b.graph
    swap_out(g, "a")
    swap_in(g, "a", "p2")
    b.op("d", "AddV2", ["p2", "lms/swap_in_a"], shape=T)
    return g


def clusters_of(g, unsupported=()) -> dict[str, int]:
    from tflms.sim.indexed import IndexedGraph
    from tflms.sim.order import _level_sorted
    net = IndexedGraph.from_graph(g, HOST)
    order = _level_sorted(net, [True] * len(net.names))
    position = [0] * len(order)
    for k, i in enumerate(order):
        position[i] = k
    cluster = step_clusters(net, order, position, [net.names[i].startswith("lms/swap_") for i in range(len(order))],
                            SimOptions(xla_unsupported=tuple(unsupported)))
    return {net.names[i]: cluster[i] for i in order}


# ---------------------------------------------------------------- which clusters


def test_the_clock_finds_the_clusters_the_pass_marks():
    for g, expected in ((swapped_chain(), [{"r0"}, {"r1"}, {"r2", "d"}]), (swapped_branch(), [{"c", "p1", "a", "p2"},
                                                                                               {"d"}])):
        found = clusters_of(g)
        groups = [{n for n, k in found.items() if k == c} for c in range(max(found.values()) + 1)]
        assert groups == expected
        assert all(found[n] == -1 for n in found if n == "x" or n.startswith("lms/"))
        marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True)
        assert [set(m) for _, m in marked.report.clusters] == expected
        # the marked graph is priced from its marks, as TensorFlow clusters it: the same step
        assert run(marked.graph, "xla-clusters").step_time_s == run(g, "xla-clusters").step_time_s


# ---------------------------------------------------------------- fusion within a cluster, never across


def test_fusion_stays_within_a_cluster():
    g = swapped_chain()
    whole, clustered = run(g, "xla"), run(g, "xla-clusters")
    # the whole step: r1 and r2 fuse into d (r0 is written for its copy); the clusters: r1 cannot fuse into r2
    assert (whole.kernels, clustered.kernels) == (2, 3)
    assert "r1:0" not in buffers(whole) and "r1:0" in buffers(clustered)
    assert "r2:0" not in buffers(clustered)  # r2 still fuses into d: both in the last cluster
    assert clustered.clock == "xla-clusters"


def test_no_boundary_prices_the_step_as_the_xla_clock():
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    for k in range(3):
        b.op(f"r{k}", "Relu", [f"r{k - 1}" if k else "x"], shape=T)
    b.op("d", "AddV2", ["r0", "r2"], shape=T)
    whole, clustered = run(b.graph, "xla"), run(b.graph, "xla-clusters")
    assert (clustered.step_time_s, clustered.kernels, clustered.peak_bytes) == (
        whole.step_time_s, whole.kernels, whole.peak_bytes) == (2.0, 1, 128)


# ---------------------------------------------------------------- timing: inputs before, outputs at the end


def test_a_swap_out_starts_when_its_producers_cluster_ends():
    g = swapped_branch()
    t = spans(run(g, "xla-clusters"))
    # c fuses into both readers (a, p2's fusion with p1): a's kernel 0-2 (reads x, writes a), p2's 2-4; the
    # swap-out of a waits for the cluster's end, 4, then copies 64 bytes in 1 s
    assert t["a"] == (0.0, 2.0) and t["p2"] == (2.0, 4.0)
    assert t["lms/swap_out_a"] == (4.0, 5.0)
    # on the whole-step clock it copies as soon as a is written
    assert spans(run(g, "xla"))["lms/swap_out_a"] == (2.0, 3.0)


def test_a_cluster_starts_only_when_all_its_inputs_exist():
    slow_link = dataclasses.replace(bytes_profile(), link_gbps=32e-9)  # a 64-byte copy takes 2 s
    t = spans(run(swapped_chain(), "xla-clusters", slow_link))
    # {r0} 0-2, its swap-out 2-4 and TensorFlow's _Recv back 4-6; {r1} 2-4. The cluster {r2, d} starts at 6,
    # although r2 reads only r1 (written at 4); its one kernel reads r1 and the swap-in and writes d: 3 s
    assert t["r1"] == (2.0, 4.0) and t["lms/swap_out_r0/_recv"] == (4.0, 6.0)
    assert t["r2"][0] == 6.0 and t["d"] == (6.0, 9.0)
    # an op by op clock would start r2 at 4 (graph clock: one kernel per op, no fusion)
    assert spans(run(swapped_chain(), "graph", slow_link))["r2"][0] == 4.0


def released_chain():
    """a = relu(x) (1 KiB) is swapped out after a and back in after t3 for d = a @ t3; its other reader m = -a feeds
    the product p = m @ w (256 B), and the products t1, t2, t3 follow; e = d + t1. The swap-out opens the segment of
    m, p, t1, t2 and t3; the release cut ends it after p, where the cluster holding a as an input ends."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=(16, 16))
    b.op("w", "Placeholder", shape=(16, 4))
    b.op("v", "Placeholder", shape=(4, 4))
    b.op("a", "Relu", ["x"], shape=(16, 16))
    g = b.graph
    swap_out(g, "a")
    b.op("m", "Neg", ["a"], shape=(16, 16))
    b.op("p", "MatMul", ["m", "w"], shape=(16, 4))
    for k, src in ((1, "p"), (2, "t1"), (3, "t2")):
        b.op(f"t{k}", "MatMul", [src, "v"], shape=(16, 4))
    swap_in(g, "a", "t3", device=HOST)
    b.op("d", "MatMul", ["lms/swap_in_a", "t3"], shape=(16, 4))
    b.op("e", "AddV2", ["d", "t1"], shape=(16, 4))
    return g


def test_a_release_cut_ends_the_cluster_that_holds_a_swapped_tensor_after_its_readers(monkeypatch):
    """A cluster holds its inputs until it ends. The swap-out of a ends a's segment, and its other reader m opens the
    next, which runs on to the swap-in's trigger t3: without the release cut that cluster holds a until t3, and the
    copy to the host frees nothing meanwhile. The cut after the first product that m feeds (p) ends it there: the
    pass and the clock cluster alike, the copy starts as early, and the step peaks lower."""
    import tflms.ir.xla_segments as xla_segments
    g = released_chain()
    expected = [{"a"}, {"m", "p"}, {"t1", "t2", "t3"}, {"d", "e"}]
    found = clusters_of(g)
    assert [{n for n, k in found.items() if k == c} for c in range(max(found.values()) + 1)] == expected
    marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True)
    assert [set(m) for _, m in marked.report.clusters] == expected
    cut = run(g, "xla-clusters")
    monkeypatch.setattr(xla_segments, "release_cuts", lambda *args, **kwargs: {})  # the rule without the cut
    found = clusters_of(g)
    assert [{n for n, k in found.items() if k == c} for c in range(max(found.values()) + 1)] == [
        {"a"}, {"m", "p", "t1", "t2", "t3"}, {"d", "e"}]
    plain = run(g, "xla-clusters")
    t, u = spans(cut), spans(plain)
    assert t["lms/swap_out_a"] == u["lms/swap_out_a"] == (32.0, 48.0)  # the copy to the host: as early

    def held(result, at: float) -> int:  # the device's bytes at time ``at``
        return [accel for time, accel, _ in result.timeline if time <= at][-1]
    # while t2 runs the cluster of t1..t3 holds p (256 B, which crosses the cut) instead of a (1 KiB)
    assert t["t2"] == (97.0, 106.0) and held(plain, 100.0) - held(cut, 100.0) == 1024 - 256
    assert cut.step_time_s == plain.step_time_s and cut.peak_bytes < plain.peak_bytes


def triggered_chain():
    """a = relu(x) (1 KiB) is swapped out after a and back in for d = a @ p, its trigger s = sum(u) inside the fused
    chain u = tanh(x), w = exp(u), p = w @ W; e = d + s. Cut right after s, u (1 KiB) crosses the cut; after the
    product p nothing XLA fuses does."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=(16, 16))
    b.op("W", "Placeholder", shape=(16, 16))
    b.op("a", "Relu", ["x"], shape=(16, 16))
    g = b.graph
    swap_out(g, "a")
    b.op("u", "Tanh", ["x"], shape=(16, 16))
    b.op("s", "Sum", ["u"], shape=(16,))
    swap_in(g, "a", "s")
    b.op("w", "Exp", ["u"], shape=(16, 16))
    b.op("p", "MatMul", ["w", "W"], shape=(16, 16))
    b.op("d", "MatMul", ["lms/swap_in_a", "p"], shape=(16, 16))
    b.op("e", "AddV2", ["d", "s"], shape=(16, 16))
    return g


def test_a_copy_backs_cut_moves_from_its_trigger_to_where_the_fewest_fused_bytes_cross(monkeypatch):
    """A cluster allocates its outputs when it starts, and a ready boundary ends its segment right after its trigger:
    the swap-in triggered by the reduction s cut the fused chain u -> w, and u was written and held across the cut.
    Moved to after the product p (the cheapest place before the copy's reader d), the cut leaves u and w fused: the
    pass and the clock cluster alike, u is never written, the step peaks lower, and w and p no longer wait in the
    reader's cluster for the copy."""
    import tflms.ir.xla_segments as xla_segments
    g = triggered_chain()
    expected = [{"a"}, {"u", "s", "w", "p"}, {"d", "e"}]
    found = clusters_of(g)
    assert [{n for n, k in found.items() if k == c} for c in range(max(found.values()) + 1)] == expected
    marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True)
    assert [set(m) for _, m in marked.report.clusters] == expected
    moved = run(g, "xla-clusters")
    monkeypatch.setattr(xla_segments, "trigger_cuts", lambda *args, **kwargs: {})  # the cut right after the trigger
    found = clusters_of(g)
    assert [{n for n, k in found.items() if k == c} for c in range(max(found.values()) + 1)] == [
        {"a"}, {"u", "s"}, {"w", "p", "d", "e"}]
    plain = run(g, "xla-clusters")
    assert "u:0" in buffers(plain) and "u:0" not in buffers(moved)
    assert moved.peak_bytes == plain.peak_bytes - 1024
    assert moved.step_time_s < plain.step_time_s


def test_a_copy_back_read_before_its_trigger_in_graph_order_keeps_its_cut():
    """No member lies between the trigger and the copy's first reader in graph order (the reader placed first):
    there is nowhere to move the cut, and the rule keeps it after the trigger."""
    from tflms.ir.xla_copy_cuts import trigger_cuts
    where = {"t": (5, 0), "r": (3, 0), "b": (6, 0), "u": (4, 0)}
    preds = {"t": ["u"], "r": ["b"], "b": ["t"], "u": []}
    succs = {"t": ["b"], "r": [], "b": ["r"], "u": ["t", "r"]}
    assert trigger_cuts(where, preds, succs, {"b": "tflms copy"}, {"b"}, lambda n: True, lambda n: 64) == {}


def land_cut_chain():
    """swapped_chain with r2 a product of r1 with itself (a library call: a kernel of its own, fused with nothing),
    e = relu(d) after d, and s = tanh(r1), f = e + s added last: without land cuts the clusters {r0}, {r1},
    {r2, d, e, s, f}; with them r2 runs alone while the copy lands and d, which reads the swap-in, starts
    {d, e, s, f}."""
    g = swapped_chain()
    g.op("r2").type = "MatMul"
    g.set_input("r2", 0, TensorRef("r1", 0))
    g.append_input("r2", TensorRef("r1", 0))
    b = GraphBuilder()
    b.graph = g
    b.op("e", "Relu", ["d"], shape=T)
    b.op("s", "Tanh", ["r1"], shape=T)
    b.op("f", "AddV2", ["e", "s"], shape=T)
    return g


def test_with_land_cuts_a_swap_ins_reader_starts_a_cluster_and_the_ops_before_it_hide_the_copy():
    slower_link = dataclasses.replace(bytes_profile(), link_gbps=16e-9)  # a 64-byte copy takes 4 s
    g = land_cut_chain()
    plain, cut = (simulate(g, slower_link, options=SimOptions(clock="xla-clusters", xla_land_cuts=cuts))
                  for cuts in (False, True))
    t, u = spans(plain), spans(cut)
    # {r0} 0-2, its swap-out 2-6 and TensorFlow's _Recv back 6-10; {r1} 2-4. Without cuts the product r2 waits with
    # its cluster for the copy; with them it runs at 4, while the copy lands
    assert t["lms/swap_out_r0/_recv"] == u["lms/swap_out_r0/_recv"] == (6.0, 10.0)
    assert t["r2"][0] == 10.0 and u["r2"][0] == 4.0 and u["r2"][1] <= 10.0
    assert u["d"][0] == u["s"][0] == 10.0  # d's cluster waits for the copy, s with it (it reads only r1)
    assert cut.step_time_s == plain.step_time_s - (u["r2"][1] - u["r2"][0])  # the product's time, hidden
    assert cut.kernels == plain.kernels
    assert cut.peak_bytes > plain.peak_bytes  # what it costs: r2 is held while the copy lands
    # the pass marks what the clock prices, with the option and without
    for cuts, expected in ((False, [{"r0"}, {"r1"}, {"r2", "d", "e", "s", "f"}]),
                           (True, [{"r0"}, {"r1"}, {"r2"}, {"d", "e", "s", "f"}])):
        marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True,
                                 land_cuts=cuts)
        assert [set(m) for _, m in marked.report.clusters] == expected
        assert marked.report.land_cuts == (("d",) if cuts else ())  # the report names the reader
        assert ("land cuts" in marked.report.to_dict()["why"]) is cuts
        options = SimOptions(clock="xla-clusters", xla_land_cuts=cuts)
        assert (simulate(marked.graph, slower_link, options=options).step_time_s
                == simulate(g, slower_link, options=options).step_time_s)


def test_a_swap_outs_reader_starts_no_cluster_even_with_land_cuts():
    """A synchronous swap-out holds its reader back on purpose (until the copy has freed the memory): the ops before
    the reader stay in its cluster."""
    g = swapped_chain()
    g.add_control_input("r1", "lms/swap_out_r0")  # r1 waits for the swap-out
    for cuts in (False, True):
        marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True,
                                 land_cuts=cuts)
        assert {"r1"} in [set(m) for _, m in marked.report.clusters]
        assert marked.report.land_cuts == (("d",) if cuts else ())  # d reads the swap-in; r1 no copy of a copy


def test_units_run_in_the_order_they_became_ready_as_the_executor_runs_them():
    # ops by id, each its own position in ``order``: 0 a source; cluster 0 = {1, 5}, its earliest op 1 reading 0 and
    # its last 5 reading 4; outside ops 2 <- 0, 3 <- 2 and 4 <- 3 (a chain), 6 <- 2. Op 6 is ready when 2 ends; the
    # cluster only when 4 ends, after it
    preds = [[], [0], [0], [2], [3], [1, 4], [2]]
    cluster = [-1, 0, -1, -1, -1, 0, -1]
    order = list(range(7))
    assert contracted_order(order, preds, order, cluster) == [0, 2, 3, 6, 4, 1, 5]
    # placed by its earliest op alone (the rule before), the cluster would have run ahead of 6: [0, 2, 3, 4, 1, 5, 6]
    # ties (ready together) go by position in ``order``
    assert contracted_order(order, [[], [0], [0], [0], [0], [0], [0]], order, [-1] * 7) == order


def lifetimes(result) -> dict[str, tuple[float, float]]:
    """Each device buffer's allocation and free, in seconds."""
    times = [when for when, *_ in result.timeline]
    return {name: (times[first + 1], times[last + 2] if last + 2 < len(times) else times[-1])
            for name, _, first, last in result.buffer_lifetimes}


def test_a_clusters_outputs_are_allocated_when_it_starts():
    g = swapped_branch()
    # p2 leaves its cluster (d reads it): allocated when the cluster starts (0), not when its kernel does (2); the whole
    # step fuses it into d
    assert lifetimes(run(g, "xla-clusters"))["p2:0"][0] == 0.0
    assert "p2:0" not in buffers(run(g, "xla"))


def test_a_cluster_holds_its_inputs_until_it_ends():
    # r0 swapped out and back in; then the cluster {m = r0' x r0', n = m x m}: two library calls, the second not
    # reading r0'
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("r0", "Relu", ["x"], shape=T)
    g = b.graph
    swap_out(g, "r0")
    swap_in(g, "r0")
    b.op("m", "MatMul", ["lms/swap_in_r0", "lms/swap_in_r0"], shape=T)
    b.op("n", "MatMul", ["m", "m"], shape=T)
    clustered, whole = run(g, "xla-clusters"), run(g, "xla")
    recv = "lms/swap_out_r0/_recv:0"  # the swap-in's buffer: TensorFlow's copy back (the Identity is a view of it)
    assert lifetimes(clustered)[recv][1] == spans(clustered)["n"][1]  # held until the cluster's last kernel ends
    assert lifetimes(whole)[recv][1] == spans(whole)["m"][1]  # freed after its last reader on the whole-step clock
    assert clustered.peak_bytes > whole.peak_bytes


def test_a_cluster_allocates_its_results_and_never_takes_over_an_input_buffer():
    # d (in the cluster {r2, d}) is the swap-in's last reader, an add of the same size: TensorFlow's executor would
    # let it write into the swap-in's buffer, but _XlaRun gives XLA no input to reuse, so d is a buffer of its own
    clustered = run(swapped_chain(), "xla-clusters")
    assert "d:0" in buffers(clustered)
    assert clustered.buffer_owner.get("d:0", "d:0") == "d:0"
    assert "lms/swap_out_r0/_recv:0" in buffers(clustered)


def test_a_machine_whose_xla_copies_a_kernel_holds_the_copy_for_that_kernel():
    # m = x @ w in the cluster {m, n}; a machine whose XLA copies MatMul's kernel (input 1, as XLA:CPU copies a
    # backward-input convolution's) holds 64 more bytes while m runs, and only then
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("w", "Placeholder", shape=T)
    b.op("m", "MatMul", ["x", "w"], shape=T)
    b.op("n", "MatMul", ["m", "m"], shape=T)
    g = b.graph
    plain, copying = bytes_profile(), dataclasses.replace(bytes_profile(), xla_kernel_copies=("MatMul",))
    base, copied = run(g, "xla-clusters", plain), run(g, "xla-clusters", copying)
    assert copied.peak_bytes == base.peak_bytes + 64  # each product copies its kernel, one at a time
    held = {name: (first, last) for name, size, first, last in copied.buffer_lifetimes if size == 64}
    assert "w:0" in held and "m:0" in held  # labelled by the kernel it copies
    assert copied.timeline[held["w:0"][0] + 1][0] == spans(copied)["m"][0]
    assert run(g, "xla", copying).peak_bytes == run(g, "xla", plain).peak_bytes  # the whole-step clock copies none


def test_a_kernel_outside_the_clusters_holds_its_scratch_while_it_runs():
    """The emulated accelerator's max-pool gradient runs TensorFlow's CPU kernel outside its clusters, which allocates
    a copy of the pooled output and an int64 argmax per pooled element while it runs
    (``HardwareProfile.xla_outside_scratch``). g = MaxPoolGrad(x, p, d) between two clusters: a profile with the
    scratch holds 64 + 8 x 16 = 192 bytes more from g's start to its end, labelled by p; inside a cluster (the type
    compiled) it holds none, nor does a profile without it."""
    from tflms.measure.emulation import EMULATION_PROFILE
    assert ("MaxPoolGrad", 1, 1.0, 8.0) in EMULATION_PROFILE.xla_outside_scratch
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("a", "Relu", ["x"], shape=T)
    b.op("p", "Relu", ["a"], shape=T)
    b.op("d", "Relu", ["p"], shape=T)
    b.op("g", "MaxPoolGrad", ["a", "p", "d"], shape=T)
    b.op("n", "Relu", ["g"], shape=T)
    g = b.graph
    plain = bytes_profile()
    scratch = dataclasses.replace(plain, xla_outside_scratch=(("MaxPoolGrad", 1, 1.0, 8.0),))
    left_out = SimOptions(clock="xla-clusters", xla_unsupported=("MaxPoolGrad",))
    base = simulate(g, plain, options=left_out)
    held = simulate(g, scratch, options=left_out)
    assert held.peak_bytes == base.peak_bytes + 192
    lifetimes = [(first, last) for name, size, first, last in held.buffer_lifetimes if size == 192]
    assert len(lifetimes) == 1
    first, last = lifetimes[0]
    assert (held.timeline[first + 1][0], held.timeline[last + 1][0]) == spans(held)["g"]
    inside = SimOptions(clock="xla-clusters")
    assert simulate(g, scratch, options=inside).peak_bytes == simulate(g, plain, options=inside).peak_bytes
    with pytest.raises(ConfigError, match="xla_outside_scratch"):
        dataclasses.replace(plain, xla_outside_scratch=(("MaxPoolGrad", -1, 1.0, 8.0),))


def momentum_step(*, ordered: bool = True):
    """A Keras SGD momentum update, by hand: slot ``m <- m * c - g`` (``AssignVariableOp``), then ``w += read(m)``
    (``AssignAddVariableOp``), the read ordered after the slot's write by a control edge (as TensorFlow's automatic
    control dependencies order them), where ``ordered``; ``g = x @ x`` is the gradient."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("m", "Placeholder", shape=(), dtype="resource")
    b.op("w", "Placeholder", shape=(), dtype="resource")
    b.op("c", "Const", shape=())
    b.op("g", "MatMul", ["x", "x"], shape=T)
    b.op("m_old", "ReadVariableOp", ["m"], shape=T)
    b.op("m_scaled", "Mul", ["m_old", "c"], shape=T)
    b.op("m_new", "Sub", ["m_scaled", "g"], shape=T)
    b.op("assign_m", "AssignVariableOp", ["m", "m_new"], shape=None, num_outputs=0)
    b.op("m_read", "ReadVariableOp", ["m"], control=["assign_m"] if ordered else (), shape=T)
    b.op("update_w", "AssignAddVariableOp", ["w", "m_read"], shape=None, num_outputs=0)
    return b.graph


def test_a_write_and_a_later_read_of_a_variable_run_in_two_clusters():
    """A cluster reads its variables when it starts and writes them when it ends, so TensorFlow never clusters a write
    with a read a path orders after it (resource_operation_safety_analysis.cc): the slot's update and the variable's
    update that reads it run as two clusters, in the pass and on the clock alike."""
    marked = cluster_for_xla(momentum_step(), accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True)
    expected = [{"c", "g", "m_scaled", "m_new", "assign_m"}, {"m_read", "update_w"}]
    assert [set(m) for _, m in marked.report.clusters] == expected
    found = clusters_of(momentum_step())
    assert [{n for n, k in found.items() if k == c} for c in range(2)] == expected
    # unordered, the read is a free one (outside every cluster) and nothing keeps the updates apart
    free = cluster_for_xla(momentum_step(ordered=False), accelerator_device=GPU, host_device=HOST,
                           has_xla_kernel=lambda t: True)
    assert [set(m) for _, m in free.report.clusters] == [{"c", "g", "m_scaled", "m_new", "assign_m"}, {"update_w"}]


def test_resource_order_a_read_after_a_write_or_modify_moves_on_and_anything_before_a_write_stays():
    from tflms.ir.xla_segments import MODIFY, READ, WRITE, segment_rule
    # a chain of resource ops, each ordered after the one before: w1 (write), w2 (write), r (read), a (modify),
    # q (read), then p (plain)
    chain = ["w1", "w2", "r", "a", "q", "p"]
    preds = {n: [chain[k - 1]] if k else [] for k, n in enumerate(chain)}
    succs = {n: [chain[k + 1]] if k + 1 < len(chain) else [] for k, n in enumerate(chain)}
    kinds = {"w1": WRITE, "w2": WRITE, "r": READ, "a": MODIFY, "q": READ}
    _, _, segment, clusters, _ = segment_rule(chain, {n: k for k, n in enumerate(chain)}, preds, succs, {},
                                           lambda n: False, kinds)
    # write -> write is safe; write -> read is not; read -> modify is safe; modify -> read is not
    assert [segment[n] for n in chain] == [0, 0, 1, 1, 2, 2]
    assert [list(c) for c in clusters] == [["w1", "w2"], ["r", "a"], ["q", "p"]]
    # without kinds, one segment
    _, _, plain, _, _ = segment_rule(chain, {n: k for k, n in enumerate(chain)}, preds, succs, {}, lambda n: False)
    assert set(plain.values()) == {0}


def test_a_cluster_writes_each_updated_variable_to_a_buffer_of_its_own_until_it_ends():
    """XlaCompileOp compiles with may_alias_resource_update=false: the new value of a variable a cluster updates is a
    result buffer, allocated when the cluster starts and given to the variable when it ends. A step compiled whole
    (XlaLaunch, the xla clock) updates in place."""
    g = momentum_step()
    clustered, whole = run(g, "xla-clusters"), run(g, "xla")
    t, life = spans(clustered), lifetimes(clustered)
    # the slot's new value (m_scaled and m_new fuse into its update) lives through the first cluster, named by its
    # handle; the variable's (w + m_read) through the second
    first_end, second_end = t["assign_m"][1], t["update_w"][1]
    assert life["m:0"] == (0.0, first_end)
    assert life["w:0"] == (first_end, second_end)
    assert "m_new:0" not in buffers(clustered)
    assert not {"m:0", "w:0"} & buffers(whole)
    assert clustered.transient_peak_bytes == whole.transient_peak_bytes + 64


BIG = (1024, 1024)  # 4 MiB float32 tensors: UpdateSplit's parts write at least 4 MiB each


def momentum_model(n: int = 4):
    """``n`` variables, each with its gradient ``g_i = h @ h`` (``h = relu(x)``: the gradients share one cluster) and
    the momentum update of :func:`momentum_step`, on 4 MiB tensors."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=BIG)
    b.op("h", "Relu", ["x"], shape=BIG)
    b.op("c", "Const", shape=())
    for i in range(n):
        b.op(f"m{i}", "Placeholder", shape=(), dtype="resource")
        b.op(f"w{i}", "Placeholder", shape=(), dtype="resource")
        b.op(f"g{i}", "MatMul", ["h", "h"], shape=BIG)
        b.op(f"m_old{i}", "ReadVariableOp", [f"m{i}"], shape=BIG)
        b.op(f"m_scaled{i}", "Mul", [f"m_old{i}", "c"], shape=BIG)
        b.op(f"m_new{i}", "Sub", [f"m_scaled{i}", f"g{i}"], shape=BIG)
        b.op(f"assign_m{i}", "AssignVariableOp", [f"m{i}", f"m_new{i}"], shape=None, num_outputs=0)
        b.op(f"m_read{i}", "ReadVariableOp", [f"m{i}"], control=[f"assign_m{i}"], shape=BIG)
        b.op(f"update_w{i}", "AssignAddVariableOp", [f"w{i}", f"m_read{i}"], shape=None, num_outputs=0)
    return b.graph


def test_the_updates_split_into_parts_each_one_cluster_in_the_pass_and_on_the_clock():
    """update_parts=2: the slots' updates (16 MiB) go into two parts of two, each with the Mul and Sub that feed only
    it, and so do the variables' (after the resource split); the gradients stay where they were. A NoOp joins each
    part's updates, which share no edge, into one cluster; the clock finds the same clusters on the unmarked graph."""
    g = momentum_model()
    marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True,
                             update_parts=2)
    clusters = [set(m) for _, m in marked.report.clusters]
    slots = [{"c", "m_scaled0", "m_new0", "assign_m0", "m_scaled1", "m_new1", "assign_m1"},
             {"m_scaled2", "m_new2", "assign_m2", "m_scaled3", "m_new3", "assign_m3"}]
    variables = [{"m_read0", "update_w0", "m_read1", "update_w1"}, {"m_read2", "update_w2", "m_read3", "update_w3"}]
    assert clusters == [{"h", "g0", "g1", "g2", "g3"}, *slots, *variables]
    assert marked.report.to_dict()["update_parts"] == 4
    joins = [op for op in marked.graph if op.type == "NoOp"]
    assert [op.name for op in joins] == [f"lms/xla_update_join_{k}" for k in (1, 2, 3, 4)]
    assert all(j.name in marked.graph.op(f"assign_m{i}").control_inputs for j, i in ((joins[0], 0), (joins[0], 1),
                                                                                      (joins[1], 2), (joins[1], 3)))
    # the clock: the same clusters from the marks (the joins are edges) and from the rule on the unmarked graph
    options = SimOptions(clock="xla-clusters", xla_update_parts=2)
    from_marks, from_rule = simulate(marked.graph, bytes_profile(), options=options), simulate(
        g, bytes_profile(), options=options)
    assert from_marks.peak_bytes == from_rule.peak_bytes and from_marks.kernels == from_rule.kernels
    # one part: no join; the slots' updates share the gradients' cluster, and the variables' updates (which nothing
    # joins here) run as a cluster each
    whole = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True)
    assert [len(m) for _, m in whole.report.clusters] == [18, 2, 2, 2, 2]
    assert not any(op.type == "NoOp" for op in whole.graph) and not whole.report.update_parts


def test_in_parts_the_slot_update_holds_only_its_own_new_values():
    """One cluster computes h, the four gradients and the four new slots, all at once (36 MiB). In two parts, the
    gradients' cluster holds h and the gradients (20 MiB), the first part the gradients and two new slots (24 MiB),
    the second the two gradients left and two new slots."""
    g = momentum_model()
    one = simulate(g, bytes_profile(), options=SimOptions(clock="xla-clusters"))
    two = simulate(g, bytes_profile(), options=SimOptions(clock="xla-clusters", xla_update_parts=2))
    mib = 1 << 20
    assert (one.transient_peak_bytes, two.transient_peak_bytes) == (36 * mib, 24 * mib)


def test_the_pipeline_splits_the_updates_only_where_the_step_does_not_fit():
    from tflms.pipeline.hardware import update_parts_for
    g, profile = momentum_model(), bytes_profile()
    options = SimOptions(clock="xla-clusters")
    peak = simulate(g, profile, options=options).peak_with_margin_bytes
    assert update_parts_for(options, g, profile, peak) is options
    split = update_parts_for(options, g, profile, peak - 1)
    assert split.xla_update_parts > 1 and simulate(g, profile, options=split).peak_with_margin_bytes < peak


# ---------------------------------------------------------------- the tuner's XLA path


def test_the_tuner_prices_every_candidate_on_the_clustered_clock():
    graph = mlp_training_graph(4)
    profile = "h100-80gb-pcie5"
    options = SimOptions(clock="xla-clusters")
    base = simulate(graph, profile, options=options)
    budget = int(base.peak_bytes * 0.96)
    result = tune(graph, budget=budget, profile=profile, sim_options=options, strategies=["tflms-distance"])
    assert result.baseline.clock == "xla-clusters"
    assert {c.sim.clock for c in result.candidates} == {"xla-clusters"}
    assert result.best.sim.peak_with_margin_bytes <= budget
    # the incremental evaluator's figure is the full simulation's of the rewritten graph
    again = simulate(result.graph, profile, options=options)
    assert again.step_time_s == pytest.approx(result.best.sim.step_time_s, rel=1e-12)
    assert again.peak_bytes == result.best.sim.peak_bytes
    # and the winner is the fastest fitting candidate at that price
    fitting = [c for c in result.candidates if c.fits]
    assert result.best.sim.step_time_s == min(c.sim.step_time_s for c in fitting)


def test_on_the_xla_clocks_the_tune_judges_segments_chosen_by_bytes():
    """A six-layer MLP at 80% of its peak: on the XLA clocks the recompute search judges segment plans whose
    checkpoints are chosen by bytes beside the evenly spaced ones, and one of them is the fit; on the graph clock,
    where they would take the hybrid search's places, it judges none (they run there only with recompute="only")."""
    from tflms.errors import BudgetError
    graph = mlp_training_graph(6, batch=256)
    profile = "h100-80gb-pcie5"
    for clock in ("xla-clusters", "xla", "graph"):
        options = SimOptions(clock=clock)
        budget = int(simulate(graph, profile, options=options).peak_bytes * 0.8)
        try:
            result = tune(graph, budget=budget, profile=profile, sim_options=options, strategies=["recompute"])
            candidates = result.candidates
        except BudgetError as err:
            result, candidates = None, err.candidates
        balanced = [c for c in candidates if "balanced" in c.params]
        if clock == "graph":
            assert not balanced
            continue
        assert len(balanced) >= 2, clock
        assert result is not None and "balanced" in result.best.params, (clock, result and result.best.params)
        evenly = [c for c in candidates if "segments" in c.params and "balanced" not in c.params]
        assert evenly and not any(c.fits for c in evenly), clock


def test_the_pipeline_keeps_xla_priced_by_its_clusters():
    # a batch at which the activations outweigh the clusters' new variable values, and a budget under XLA alone's peak
    graph = mlp_training_graph(4, batch=256)
    profile = "h100-80gb-pcie5"
    peak = simulate(graph, profile, options=SimOptions(clock="xla")).peak_bytes
    config = LMSConfig(budget_bytes=int(peak * 0.96), profile=profile, enforce_order=False)
    out = rewrite_step(graph, config, build=False, xla=True)
    assert out.report.tuning["clock"] == "xla-clusters"
    assert out.report.xla_clusters["kept"]
    plain = rewrite_step(graph, config, build=False)
    assert "clock" not in plain.report.tuning  # the path without XLA is unchanged


def _pipeline_on_the_mlp(monkeypatch, fraction: float):
    """The pipeline's XLA rewrite of the test MLP at ``fraction`` of XLA alone's peak: its output, each tune it ran as
    ``(land cuts, clones last, winning strategy or None)``, and each marking as ``(land cuts, clones last)``."""
    import tflms.passes.xla_clusters as xla_clusters
    import tflms.tune.xla_cuts as xla_cuts
    from tflms.errors import BudgetError
    graph = mlp_training_graph(4, batch=256)
    profile = "h100-80gb-pcie5"
    peak = simulate(graph, profile, options=SimOptions(clock="xla")).peak_bytes
    asked, marked = [], []
    real_tune, real_pass = xla_cuts.tune_xla, xla_clusters.cluster_for_xla

    def tune_xla(run, options, **kwargs):
        def logged(o):
            way = (o.xla_land_cuts, o.xla_clones_last)
            try:
                found = run(o)
            except BudgetError:
                asked.append((*way, None))
                raise
            asked.append((*way, found.best.strategy))
            return found
        return real_tune(logged, options, **kwargs)

    def cluster_for_xla(*args, **kwargs):
        marked.append((kwargs.get("land_cuts"), kwargs.get("clones_last")))
        return real_pass(*args, **kwargs)
    monkeypatch.setattr(xla_cuts, "tune_xla", tune_xla)
    monkeypatch.setattr(xla_clusters, "cluster_for_xla", cluster_for_xla)
    config = LMSConfig(budget_bytes=int(peak * fraction), profile=profile, enforce_order=False)
    return rewrite_step(graph, config, build=False, xla=True), asked, marked


def test_the_pipeline_tunes_again_with_land_cuts_where_its_winner_swaps_and_marks_what_it_chose(monkeypatch):
    """Where the tune's winner swaps, the pipeline tunes again with land cuts and keeps the faster winner; the report
    says which, and the pass marks the clusters with the same rule."""
    # at 96% of XLA alone's peak the plan without cuts is faster, at 93% the one with them
    for fraction, cuts in ((0.96, False), (0.93, True)):
        out, asked, marked = _pipeline_on_the_mlp(monkeypatch, fraction)
        # a winner that swaps (and does not recompute): tuned again with the cuts, the clones' order not judged
        assert out.report.plan.swaps and [a[:2] for a in asked] == [(False, False), (True, False)]
        assert out.report.tuning["xla_land_cuts"] is cuts and marked == [(cuts, False)]


def test_where_only_the_clones_ordered_last_fit_the_pipeline_tunes_that_way_and_marks_it(monkeypatch):
    """At 86% of XLA alone's peak nothing fits the test MLP with its clones where they are needed, with or without land
    cuts; ordered last, a hybrid does. The pipeline tunes each way, reports the winner's, and the pass marks the
    clusters that way. (At 90%, where this test ran until four recompute misses got swaps, a hybrid with the clones
    where needed fits too.)"""
    out, asked, marked = _pipeline_on_the_mlp(monkeypatch, 0.86)
    assert asked[:2] == [(False, False, None), (True, False, None)]  # the clones where needed: nothing fits
    assert [a[:2] for a in asked[2:]] == [(False, True), (True, True)] and "hybrid" in {a[2] for a in asked[2:]}
    assert out.report.plan.swaps and out.report.plan.recomputes
    chosen = (out.report.tuning["xla_land_cuts"], out.report.tuning["xla_clones_last"])
    assert chosen[1] is True and marked == [chosen]
    clusters = out.report.xla_clusters
    assert clusters["clones_last"] is True and "clones are ordered last" in clusters["why"]


def test_the_clustered_price_is_deterministic():
    g = rewrite(mlp_training_graph(3), LMSConfig(swapout_threshold=1, swapin_ahead=1)).graph
    a, b = run(g, "xla-clusters", "h200-141gb"), run(g, "xla-clusters", "h200-141gb")
    assert (a.step_time_s, a.peak_bytes, a.kernels, tuple(a.ops)) == (b.step_time_s, b.peak_bytes, b.kernels,
                                                                        tuple(b.ops))
    # each copy splits the step: more kernels than the whole step compiled at once, and a slower step
    whole = run(g, "xla", "h200-141gb")
    assert a.kernels > whole.kernels and a.step_time_s > whole.step_time_s


# ---------------------------------------------------------------- the bench's tflms-xla (tools/bench.py --xla-targets)


def _tools_on_path() -> None:
    """The bench's library (``tools/benchlib``) importable, as ``tools/bench.py`` finds it."""
    import pathlib
    import sys
    tools = str(pathlib.Path(__file__).resolve().parent.parent / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)


def test_the_bench_prices_tflms_xla_on_the_clustered_clock_against_plain_xla_and_checkpointing():
    _tools_on_path()
    from benchlib.models import Steps
    from benchlib.xla import METHOD, run_xla_targets, targets
    record = run_xla_targets(Steps(), "mlp-tiny", "h100-80gb-pcie5", None, 3)
    maxima = record["maxima"]
    assert maxima[METHOD] >= maxima["checkpoint-segments"] > maxima["none"]
    for at in (record["tflms_xla_at_checkpoint_max"], record["tflms_xla_at_its_max"]):
        assert at["clock"] == "xla-clusters" and at["peak_with_margin_bytes"] <= record["budget_bytes"]
    assert record["tflms_xla_at_checkpoint_max"]["batch"] == maxima["checkpoint-segments"]
    assert record["tflms_xla_at_its_max"]["batch"] == maxima[METHOD]
    assert record["simulated"] and record["targets"] == targets(record)
    first = record["targets"]["overhead_half_of_checkpointing"]
    assert first["met"] == (first["tflms_xla"] <= first["checkpoint"] / 2)
    # the cut bound at checkpointing's maximum: no plan the bench found there beats it
    bound = record["cut_bound_at_checkpoint_max"]
    assert bound["batch"] == maxima["checkpoint-segments"] and bound["simulated"]
    # (below 0 where re-runs fused into their readers would spare reads: tflms.tune.cut_bound, "What a fused re-run
    # saves")
    assert bound["any"] <= bound["recompute"] and bound["any"] <= first["tflms_xla"] + 1e-9
    assert bound["any"] <= first["checkpoint"] + 1e-9


def test_where_target_2_fails_at_the_maximum_the_bench_finds_the_largest_batch_where_it_holds():
    """Issue 47's "give the nearest target that can be": a search from checkpointing's maximum towards tflms-xla's,
    each probe a full tune (here a stand-in whose samples/s fall past batch 3000), ends on a batch that holds with
    the next one tried above it failing, within a sixteenth of the gap; the report says so."""
    import types
    _tools_on_path()
    from benchlib.xla import METHOD, markdown, targets, throughput_met_max
    probed = []

    def full(size):
        probed.append(size)
        return {"batch": size, "samples_per_s": 900.0 if size <= 3000 else 90.0, "strategy": "recompute",
                "params": {"kept": "7"}, "overhead": 0.2}
    record = {"model": "m", "profile": "p", "maxima": {"none": 400, "checkpoint-segments": 1600, METHOD: 5400},
              "none_at_max": {"samples_per_s": 1200.0}, "checkpoint_at_its_max": {"batch": 1600, "overhead": 0.3},
              "tflms_xla_at_checkpoint_max": full(1600), "tflms_xla_at_its_max": full(5400)}
    probed.clear()
    record["targets"] = targets(record)
    assert record["targets"]["throughput_half_of_plain_xla"]["met"] is False
    ev = types.SimpleNamespace(model="m", profile=types.SimpleNamespace(name="p"))
    found = throughput_met_max(ev, record, full=full)
    assert 1600 not in probed and 5400 not in probed and len(probed) == 4  # (the two ends were known)
    assert found["batch"] <= 3000 < found["upper"] and found["upper"] - found["batch"] <= (5400 - 1600) / 16 + 1
    assert found["ratio"] == pytest.approx(900.0 / 1200.0) and found["tried"][str(found["upper"])] == 90.0
    record["throughput_met_max"] = found
    row = markdown([record], "bench")[-1]
    assert row.startswith(f"| m | p | {found['batch']} | 900.0 | 0.75 | recompute")
    assert row.endswith(f"| {found['upper']} |")


def test_the_bench_runs_tflms_xla_at_a_given_batch():
    """``bench.py --xla-targets --at MODEL=SIZE``: no search, one JSON record with tflms-xla's full tune and
    checkpointing under XLA at that batch, both against the plain XLA step there."""
    import json
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "tools" / "bench.py"), "--xla-targets", "--at", "mlp-tiny=4096",
                           "--profiles", "h100-80gb-pcie5", "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert (record["model"], record["batch"], record["simulated"]) == ("mlp-tiny", 4096, True)
    tuned = record["tflms-xla"]
    assert tuned["batch"] == 4096 and tuned["clock"] == "xla-clusters"
    assert tuned["peak_with_margin_bytes"] <= record["budget_bytes"]
    assert tuned["overhead"] == pytest.approx(tuned["step_s"] / tuned["plain_xla_step_s"] - 1.0)
    assert record["checkpoint"]["overhead"] > -1.0 and isinstance(record["checkpoint"]["fits"], bool)
    assert record["cut_bound"]["batch"] == 4096 and record["cut_bound"]["any_status"] in ("optimal", "node limit")
    assert record["cut_bound"]["any"] <= tuned["overhead"] + 1e-9
    # the step the pipeline runs: held to the budget, or the next fit that can be (where the winner cannot)
    from tflms.passes.order import GUARANTEE_ANY_ORDER, GUARANTEE_NONE, GUARANTEE_PINNED
    assert tuned["guarantee"] in (GUARANTEE_PINNED, GUARANTEE_ANY_ORDER, GUARANTEE_NONE) and tuned["guarantee_why"]
    assert "tuned" not in tuned or (tuned["tuned"]["step_s"] <= tuned["step_s"]
                                    and tuned["guarantee"] != GUARANTEE_NONE)


def test_the_budget_guarantee_never_pins_an_order_that_cuts_the_clusters_over_the_budget(monkeypatch):
    """On the xla-clusters clock the guarantee's pinning edges are cluster boundaries (issue 47, item 5's finding:
    ResNet-50 at 64x64, batch 16, 324.1 MB as tuned, 418.4 MB once pinned). A pinned step that no longer fits is not
    pinned, and the record says why; on other clocks, and where it still fits, level order is pinned as before."""
    import dataclasses

    from tflms.passes import order as order_pass
    from tflms.passes.result import PassResult
    from tflms.profiles import get_profile
    from tflms.sim.clock import CLOCK_SERIAL, CLOCK_XLA_CLUSTERS
    from tflms.sim.simulator import SimOptions, simulate
    from tflms.testing import mlp_training_graph

    profile = get_profile("v100-16gb-pcie3")
    graph = mlp_training_graph(4, batch=32, width=256)
    heavier = mlp_training_graph(4, batch=64, width=256)  # stands in for a pinned step whose clusters need more
    options = SimOptions(clock=CLOCK_XLA_CLUSTERS)
    fits = simulate(graph, profile, options=options).peak_with_margin_bytes
    over = simulate(heavier, profile, options=options).peak_with_margin_bytes
    assert over > fits
    report = order_pass.pin_level_order(graph, options=options).report
    monkeypatch.setattr(order_pass, "pin_level_order",
                        lambda g, options=None: PassResult(heavier, changed=True, report=report))
    budget = fits  # the unpinned step fits exactly; the any-order bound is above it, so the guarantee would pin

    kept, record = order_pass.hold_to_budget(graph, None, budget_bytes=budget, options=options, profile=profile)
    assert kept is graph and record["guarantee"] == order_pass.GUARANTEE_NONE
    assert record["pinned_peak_bytes"] == over and "cut the step's XLA clusters" in record["guarantee_why"]
    # the serial clock has no clusters to cut: pinned as before
    serial = dataclasses.replace(options, clock=CLOCK_SERIAL)
    pinned, record = order_pass.hold_to_budget(graph, None, budget_bytes=budget, options=serial, profile=profile)
    assert pinned is heavier and record["guarantee"] == order_pass.GUARANTEE_PINNED
    # without a profile to simulate on, nothing is checked (the old behaviour)
    pinned, _ = order_pass.hold_to_budget(graph, None, budget_bytes=budget, options=options)
    assert pinned is heavier


def test_a_pinned_step_waits_for_each_swap_out_where_its_simulation_has_it_end():
    """Pinning level order orders compute, not when a copy to the host ends; a late copy keeps its buffer beside the
    next cluster's (issue 47, item 5: BERT's pinned plan in the executor). On the xla-clusters clock the guarantee adds,
    for each swap-out, an edge to the first cluster (or large op outside them) that its simulation starts after the
    copy ends, among the units the pinning orders: the simulated step is unchanged."""
    from tflms.analysis.cto import analyze_graph
    from tflms.config import LMSConfig
    from tflms.passes import order as order_pass
    from tflms.passes.swaps import apply_swaps
    from tflms.policies.tflms_rules import plan_swaps
    from tflms.profiles import get_profile
    from tflms.sim.clock import CLOCK_SERIAL, CLOCK_XLA_CLUSTERS
    from tflms.sim.simulator import SimOptions, kernel_reads, simulate
    from tflms.testing import mlp_training_graph

    profile = get_profile("h100-80gb-pcie5")
    plain = mlp_training_graph(6, batch=1024, width=1024)
    plan = plan_swaps(analyze_graph(plain), LMSConfig(swapout_threshold=1, swapin_ahead=1),
                      accelerator_device="/device:GPU:0")
    options = SimOptions(clock=CLOCK_XLA_CLUSTERS)
    pinned = order_pass.pin_level_order(apply_swaps(plain, plan).graph, options=options)
    graph, chain = pinned.graph, pinned.report.edges
    before = simulate(graph, profile, options=options)
    held, edges = order_pass._wait_for_swap_outs(graph, options, profile, chain)
    swap_outs = {op.name for op in before.ops if op.stream == "d2h"}
    assert swap_outs and edges and {a for a, _ in edges} <= swap_outs
    start = {op.name: op.start_s for op in before.ops}
    end = {op.name: op.end_s for op in before.ops}
    first = kernel_reads(graph, profile, options).cluster_first
    units = {first.get(name, name) for edge in chain for name in edge}
    for copy, waits in edges:
        assert copy in held.op(waits).control_inputs and start[waits] >= end[copy]
        assert waits in units  # the first op of a unit the pinning orders, so every later unit waits too
    after = simulate(held, profile, options=options)
    assert after.peak_with_margin_bytes <= before.peak_with_margin_bytes
    assert after.step_time_s <= before.step_time_s * (1 + 1e-9)
    # elsewhere (no clusters), nothing is added
    assert order_pass._wait_for_swap_outs(graph, SimOptions(clock=CLOCK_SERIAL), profile, chain) == (graph, [])
    assert order_pass._wait_for_swap_outs(graph, options, None, chain) == (graph, [])


# ---------------------------------------------------------------- recompute gates: barriers inside the clusters


def recomputed_chain():
    """x -> a -> b -> t (the trigger) and d = t + b, with b recomputed for d: its clone reads a through a gate (an
    Identity of a with t as control input)."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    b.op("a", "Relu", ["x"], shape=T)
    b.op("b", "Relu", ["a"], shape=T)
    b.op("t", "Relu", ["b"], shape=T)
    g = b.graph
    gate = "lms/recompute_gate_a_0_after_t"
    g.add_op(gate, "Identity", inputs=[TensorRef("a", 0)], control_inputs=["t"], outputs=g.op("a").outputs)
    b.op("lms/recompute_b", "Relu", [gate], shape=T)
    b.op("d", "AddV2", ["t", "lms/recompute_b"], shape=T)
    return g


def test_a_recompute_gate_is_a_barrier_inside_the_cluster_and_the_clone_fuses_into_its_reader():
    """By hand (64 B/s of memory traffic, 64-byte tensors): one cluster. The barrier reads a and t, so both are
    written to memory: a's kernel (read x, write a: 2 s), t's with b fused in (read a, write t: 2 s), and d's with the
    clone fused in (read t and a, write d: 3 s). b and the clone get no buffer."""
    g = recomputed_chain()
    found = clusters_of(g)
    assert {n for n, k in found.items() if k == 0} == {"a", "b", "t", "lms/recompute_gate_a_0_after_t",
                                                     "lms/recompute_b", "d"}
    result = run(g, "xla-clusters")
    assert (result.kernels, result.step_time_s) == (3, 7.0)
    assert {"a:0", "t:0"} <= buffers(result) and not {"b:0", "lms/recompute_b:0"} & buffers(result)
    marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True)
    assert marked.report.num_clusters == 1 and marked.graph.op("lms/recompute_gate_a_0_after_t").type == \
        "XlaOptimizationBarrier"
    # the marked graph (a barrier of a and t:0, no control edge) is priced as the candidate was
    again = run(marked.graph, "xla-clusters")
    assert (again.kernels, again.step_time_s, again.peak_bytes) == (3, 7.0, result.peak_bytes)


def test_a_gate_between_two_clones_of_one_trigger_is_seen_through_and_the_chain_fuses():
    """x -> a -> b -> c -> t, d = t + c, with b and c recomputed for d: c's clone reads b's through a second gate with
    the same trigger, which adds no wait (b's clone waits behind the barrier of a and t), so it stays an Identity
    (tflms.ir.xla_gates.gates_seen_through) and both clones fuse into d. By hand (64 B/s, 64-byte tensors): a's
    kernel (2 s), t's with b and c fused in (read a, write t: 2 s), d's with both clones (read t and a, write d: 3 s):
    7 s in 3 kernels, where a barrier there would write b's clone (2 s more) and d would read it instead of a."""
    b = GraphBuilder()
    b.op("x", "Placeholder", shape=T)
    for name, src in (("a", "x"), ("b", "a"), ("c", "b"), ("t", "c")):
        b.op(name, "Relu", [src], shape=T)
    g = b.graph
    first, second = "lms/recompute_gate_a_0_after_t", "lms/recompute_gate_lms/recompute_b_0_after_t"
    g.add_op(first, "Identity", inputs=[TensorRef("a", 0)], control_inputs=["t"], outputs=g.op("a").outputs)
    b.op("lms/recompute_b", "Relu", [first], shape=T)
    g.add_op(second, "Identity", inputs=[TensorRef("lms/recompute_b", 0)], control_inputs=["t"],
             outputs=g.op("a").outputs)
    b.op("lms/recompute_c", "Relu", [second], shape=T)
    b.op("d", "AddV2", ["t", "lms/recompute_c"], shape=T)
    result = run(g, "xla-clusters")
    assert (result.kernels, result.step_time_s) == (3, 7.0)
    assert not {"lms/recompute_b:0", "lms/recompute_c:0"} & buffers(result)
    marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True)
    assert marked.report.num_clusters == 1
    assert marked.graph.op(first).type == "XlaOptimizationBarrier"
    assert marked.graph.op(second).type == "Identity" and marked.graph.op(second).control_inputs == ["t"]
    again = run(marked.graph, "xla-clusters")  # the marked graph is priced as the candidate was
    assert (again.kernels, again.step_time_s, again.peak_bytes) == (3, 7.0, result.peak_bytes)
    # with another trigger (c) the second gate is a wait of its own, a barrier: it reads c, so c is written (b fused
    # into it: read a, write c, 2 s) and t reads it (2 s); b's clone is a kernel (read a, write it: 2 s) and d reads
    # t and it (3 s): 11 s in 5 kernels
    g.remove_control_input(second, "t")
    g.add_control_input(second, "c")
    split = run(g, "xla-clusters")
    assert (split.kernels, split.step_time_s) == (5, 11.0)
    marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True)
    assert marked.graph.op(second).type == "XlaOptimizationBarrier"


def gradient_chain(grad_type: str = "ReluGrad"):
    """x -> a -> b (forward); g = ReluGrad(b, a), a gradient op; m = MatMul(g, g), a library call; t = Neg(m), the
    trigger (a cast in Keras's batch norm, a negation here), which XLA fuses into d = t + b; b recomputed for d, its
    clone behind a gate of a triggered by t.
    ``grad_type``: g's type instead (``AddV2``: nothing of the chain descends from a gradient op)."""
    bd = GraphBuilder()
    bd.op("x", "Placeholder", shape=T)
    bd.op("a", "Relu", ["x"], shape=T)
    bd.op("b", "Relu", ["a"], shape=T)
    bd.op("g", grad_type, ["b", "a"], shape=T)
    bd.op("m", "MatMul", ["g", "g"], shape=T)
    bd.op("t", "Neg", ["m"], shape=T)
    g = bd.graph
    g.add_op("lms/recompute_gate_a_0_after_t", "Identity", inputs=[TensorRef("a", 0)], control_inputs=["t"],
             outputs=g.op("a").outputs)
    bd.op("lms/recompute_b", "Relu", ["lms/recompute_gate_a_0_after_t"], shape=T)
    bd.op("d", "AddV2", ["t", "lms/recompute_b"], shape=T)
    return g


def test_a_barrier_waits_on_what_its_fused_trigger_reads_where_that_reaches_memory_anyway():
    """The trigger t is an element-wise op XLA fuses into d. A barrier reading t would write it to memory (Keras's
    batch norm in mixed_bfloat16: a float32 copy of each incoming gradient); it reads m instead, the product t's
    fused chain reads, which reaches memory anyway and descends from the gradient op g
    (tflms.ir.xla_gates.barrier_read). The pass and the clock agree: t is no kernel of its own, and the marked
    graph is priced as the candidate was. Where nothing the chain reads descends from a gradient op, so might run
    before the backward pass, the barrier reads t itself, which then is a kernel of its own. Kernels: a's, g's (b fused
    in), m's and d's (t and the clone fused in), and t's where the barrier reads it."""
    gate = "lms/recompute_gate_a_0_after_t"
    g = gradient_chain()
    result = run(g, "xla-clusters")
    assert result.kernels == 4 and "m:0" in buffers(result)
    marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True)
    barrier = marked.graph.op(gate)
    assert marked.report.num_clusters == 1
    assert barrier.type == "XlaOptimizationBarrier" and barrier.inputs == [TensorRef("a", 0), TensorRef("m", 0)]
    assert not barrier.control_inputs
    again = run(marked.graph, "xla-clusters")
    assert (again.kernels, again.step_time_s, again.peak_bytes) == (result.kernels, result.step_time_s,
                                                                    result.peak_bytes)
    assert marked.graph.topological_order()  # no cycle
    # the control: g an AddV2, nothing descends from a gradient op: the barrier reads the trigger, which is written
    forward = gradient_chain("AddV2")
    assert run(forward, "xla-clusters").kernels == 5
    barrier = cluster_for_xla(forward, accelerator_device=GPU, host_device=HOST,
                              has_xla_kernel=lambda t: True).graph.op(gate)
    assert barrier.inputs == [TensorRef("a", 0), TensorRef("t", 0)]


def test_a_barrier_reads_its_trigger_where_a_product_reads_the_trigger_too():
    """XLA fuses a producer into all its consumers or none: with a product reading the trigger t as well, t is written
    whatever d does, so the barrier reads t itself and makes nothing more reach memory (the attention output's
    gradient, transposed for the products that read it). By t's type alone it read m, and t read m from memory.
    The pass and the clock agree."""
    from tflms.ir.xla_gates import fuses_into_readers
    assert fuses_into_readers([("d", "AddV2"), ("s", "Shape"), ("lms/recompute_gate_a_0_after_t", "Identity")])
    assert fuses_into_readers([("d", "AddV2"), ("lms/recompute_b", "Relu"), ("v", "Reshape"), ("r", "Sum")])
    assert not fuses_into_readers([("d", "AddV2"), ("p", "MatMul")])
    gate = "lms/recompute_gate_a_0_after_t"
    g = gradient_chain()
    g.add_op("p", "MatMul", inputs=[TensorRef("t", 0), TensorRef("t", 0)], outputs=g.op("t").outputs)
    result = run(g, "xla-clusters")
    marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True)
    barrier = marked.graph.op(gate)
    assert barrier.type == "XlaOptimizationBarrier" and barrier.inputs == [TensorRef("a", 0), TensorRef("t", 0)]
    again = run(marked.graph, "xla-clusters")
    assert (again.kernels, again.step_time_s, again.peak_bytes) == (result.kernels, result.step_time_s,
                                                                    result.peak_bytes)


def test_without_barriers_a_recompute_gate_splits_the_clusters():
    g = recomputed_chain()
    options = SimOptions(clock="xla-clusters", xla_unsupported=("XlaOptimizationBarrier",))
    result = simulate(g, bytes_profile(), options=options)
    split = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST,
                            has_xla_kernel=lambda t: t != "XlaOptimizationBarrier").report
    assert [set(m) for _, m in split.clusters] == [{"a", "b", "t"}, {"lms/recompute_b", "d"}]
    found = clusters_of(g, unsupported=("XlaOptimizationBarrier",))  # the clock agrees
    assert [{n for n, k in found.items() if k == c} for c in (0, 1)] == [{"a", "b", "t"}, {"lms/recompute_b", "d"}]
    assert found["lms/recompute_gate_a_0_after_t"] == -1
    assert result.kernels == 3 and result.clock == "xla-clusters"


def test_a_shape_argument_keeps_an_identity_gate_inside_the_cluster():
    """A gated tensor XLA may need at compile time (an int32 shape) would stop being a constant behind a barrier: its
    gate stays an Identity, inside the cluster, since the clone reads a float input through a barrier too."""
    g = recomputed_chain()
    g.add_op("shape", "Const", outputs=[dataclasses.replace(g.op("a").outputs[0], dtype="int32", shape=(2,),
                                                            num_bytes=8)])
    gate = "lms/recompute_gate_shape_0_after_t"
    g.add_op(gate, "Identity", inputs=[TensorRef("shape", 0)], control_inputs=["t"], outputs=g.op("shape").outputs)
    g.add_op("lms/recompute_r", "Reshape", inputs=[TensorRef("lms/recompute_gate_a_0_after_t", 0), TensorRef(gate, 0)],
             outputs=g.op("a").outputs)
    g.add_op("e", "AddV2", inputs=[TensorRef("d", 0), TensorRef("lms/recompute_r", 0)], outputs=g.op("a").outputs)
    marked = cluster_for_xla(g, accelerator_device=GPU, host_device=HOST, has_xla_kernel=lambda t: True)
    assert marked.report.num_clusters == 1
    assert marked.graph.op(gate).type == "Identity" and marked.graph.op(gate).control_inputs == ["t"]
    assert marked.graph.op("lms/recompute_gate_a_0_after_t").type == "XlaOptimizationBarrier"
    assert set(clusters_of(g).values()) == {0, -1}  # the clock agrees: one cluster (the placeholder is out)


def test_the_recompute_floor_counts_no_clone_on_the_xla_clocks():
    """A clone fused into its reader's kernel costs no kernel of its own, so the floor that spares a recompute plan's
    simulation (tflms.tune.recompute_sets.compute_floor_s) counts none there: the plain step's compute time."""
    import types

    from tflms.tune.recompute_sets import compute_floor_s
    g = recomputed_chain()
    plain = g.copy()
    plain.set_input("d", 1, TensorRef("b", 0))
    for name in ("lms/recompute_b", "lms/recompute_gate_a_0_after_t"):
        plain.remove_op(name)
    base, recomputed = run(plain, "xla-clusters"), run(g, "xla-clusters")
    clone = types.SimpleNamespace(ops=("b",))
    floor = compute_floor_s(base, {"b": 2.0}, [clone])
    assert floor == pytest.approx(base.compute_time_s, rel=1e-6) and floor <= recomputed.compute_time_s
    serial = run(plain, "serial")
    assert compute_floor_s(serial, {"b": 2.0}, [clone]) == pytest.approx(serial.compute_time_s + 2.0, rel=1e-6)


def test_keeping_an_op_is_credited_with_the_re_runs_upstream_that_only_rebuild_it():
    """An attention layer re-run for its backward pass: the scores' product, the softmax (its gradient reads its
    output) and dropout's select (the next product's weight gradient reads it). Keeping the softmax's output spares
    the product too; keeping the select spares its scaling and mask, never the softmax, whose clone the backward pass
    reads. An op that another re-run op still reads is not spared."""
    import types

    from tflms.tune.recompute_sets import kept_savings
    b = GraphBuilder()
    T = (8, 8)
    for name in ("q", "k", "rate", "zero", "u"):
        b.op(name, "Placeholder", shape=T)
    b.op("scores", "MatMul", ["q", "k"], shape=T)
    b.op("y", "Softmax", ["scores"], shape=T)
    b.op("mask", "GreaterEqual", ["u", "rate"], shape=T, dtype="bool")
    b.op("scaled", "Mul", ["y", "rate"], shape=T)
    b.op("dropped", "SelectV2", ["mask", "scaled", "zero"], shape=T)
    b.op("side", "Neg", ["scores"], shape=T)  # a second re-run reader of the scores, in another decision
    rerun = {"scores": 3.0, "y": 5.0, "mask": 0.0, "scaled": 0.0, "dropped": 5.0, "side": 1.0}
    attention = types.SimpleNamespace(ops=("scores", "y", "mask", "scaled", "dropped"),
                                      tensors=(TensorRef("y"), TensorRef("dropped")))
    saved = kept_savings(b.graph, [attention], rerun)
    assert saved == {"scores": 3.0, "y": 8.0, "mask": 0.0, "scaled": 0.0, "dropped": 5.0}
    side = types.SimpleNamespace(ops=("scores", "side"), tensors=(TensorRef("side"),))
    shared = kept_savings(b.graph, [attention, side], rerun)
    assert shared["y"] == 5.0 and shared["side"] == 1.0  # the scores' clone is still read by the other re-run


def test_the_relaxation_ranks_a_re_run_by_what_its_clones_kernels_take_where_xla_fuses_them():
    """The relaxation keeps the recomputed ops whose re-run costs most per byte freed. Dropout re-run for its
    backward pass: its random numbers and mask fuse into the select that reads them, whose output a product reads
    (so it reaches memory). By price alone the mask is the dearest per byte (a kernel for a bool); by what the
    clones' kernels take on the XLA clock it costs nothing, and the select everything. Elsewhere each clone is a
    kernel of its own."""
    import types

    from tflms.ir.names import CLONE_PREFIX
    from tflms.policies.recompute import clone_name
    from tflms.sim.cost import op_time_s
    from tflms.tune.recompute_sets import rerun_times
    profile = HardwareProfile("h", memory_bytes=1 << 30, peak_flops=1e12, memory_gbps=1.0, link_gbps=1.0,
                              link_latency_s=0, launch_overhead_s=0, compute_efficiency=1, link_efficiency=1)
    b = GraphBuilder()
    T = (64, 64)
    b.op("x", "Placeholder", shape=T)
    b.op("w", "Placeholder", shape=T)
    b.op("shape", "Const", shape=(2,), dtype="int32")
    b.op("key", "Placeholder", shape=(1,), dtype="uint64")
    b.op("counter", "Placeholder", shape=(2,), dtype="uint64")
    b.op("alg", "Const", shape=(), dtype="int32")
    b.op("rate", "Const", shape=(), dtype="float32")
    b.op("zero", "Const", shape=(), dtype="float32")
    c = CLONE_PREFIX
    b.op(c + "u", "StatelessRandomUniformV2", ["shape", "key", "counter", "alg"], shape=T)
    b.op(c + "mask", "GreaterEqual", [c + "u", "rate"], shape=T, dtype="bool")
    b.op(c + "s", "Mul", ["x", "rate"], shape=T)
    b.op(c + "y", "SelectV2", [c + "mask", c + "s", "zero"], shape=T)
    b.op("grad_w", "MatMul", [c + "y", "w"], shape=T)  # the weight gradient reads the re-run dropout
    times = {op: op_time_s(b.graph, b.graph.op(c + op), profile) for op in ("u", "mask", "s", "y")}
    assert times["mask"] / 4096 > times["y"] / (4 * 4096)  # by price, the mask is dearest per byte
    # the clones of one decision re-running u, mask, s and y (the graph names them as the rewrite does)
    decision = types.SimpleNamespace(ops=tuple(times), clones=tuple(clone_name(op) for op in times))
    assert decision.clones == tuple(c + op for op in times)
    xla = rerun_times(simulate(b.graph, profile, options=SimOptions(clock="xla")), [decision])
    assert xla.get("u", 0) == xla.get("mask", 0) == xla.get("s", 0) == 0 and xla["y"] > 0
    serial = rerun_times(simulate(b.graph, profile, options=SimOptions(clock="serial")), [decision])
    assert all(serial[op] > 0 for op in times)

"""How far the execution order alone goes: ResNet-50, level order vs tflms.schedule.

For each batch: the simulated peak in CTO level order and in the schedule (no swaps, and
with a TFLMS distance plan applied, ``--threshold``), the peak TensorFlow could still reach
with only the order edges (level order of the graph with the edges), the swap-only bound
per sample, the number of order edges and the time to schedule. Simulated figures.

    PYTHONPATH=$PWD python tools/schedule_report.py --batches 64,256,400 [--profile v100-16gb-pcie3]
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tflms.schedule.edges import DEFAULT_MIN_BYTES  # noqa: E402

GIB, MIB = 2**30, 2**20


def trace_resnet50():
    import keras
    import tensorflow as tf

    from tflms.demo import make_train_step
    from tflms.ir.tf_io import load_graph
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer, from_logits=False))
    specs = (tf.TensorSpec((None, 224, 224, 3), tf.float32), tf.TensorSpec((None,), tf.int32))
    return load_graph(step.get_concrete_function(*specs)), (model, optimizer, step)


def report(graph, profile: str, label: str) -> dict:
    from tflms.schedule import add_order_edges, order_edges, ordered_ops, schedule_with_report
    from tflms.sim import simulate
    t0 = time.perf_counter()
    result = schedule_with_report(graph, profile=profile)
    schedule_s = time.perf_counter() - t0
    order = list(result.order)
    t0 = time.perf_counter()
    edges = order_edges(graph, order)
    edges_s = time.perf_counter() - t0
    level = simulate(graph, profile)
    scheduled = simulate(graph, profile, order=order)
    enforced = simulate(add_order_edges(graph, edges), profile)  # TF free to pick any order the edges allow
    exact = order_edges(graph, order, fusion_safe=False)  # also ordering ops grappler may fuse (not bitwise-safe)
    exact_peak = simulate(add_order_edges(graph, exact), profile).peak_bytes
    return {"graph": label, "ops": len(graph), "level_peak_gib": level.peak_bytes / GIB,
            "schedule_peak_gib": scheduled.peak_bytes / GIB, "edges_level_peak_gib": enforced.peak_bytes / GIB,
            "chosen": result.chosen, "model_peaks_gib": {k: v / GIB for k, v in result.peaks.items()},
            "level_step_s": level.step_time_s, "schedule_step_s": scheduled.step_time_s,
            "ordered_ops": len(ordered_ops(graph, order)), "edges": len(edges), "schedule_s": schedule_s,
            "edges_s": edges_s, "exact_edges": len(exact), "exact_edges_level_peak_gib": exact_peak / GIB}


def bitwise_check(batch: int, steps: int, min_bytes: int = DEFAULT_MIN_BYTES) -> dict:
    """Train ResNet-50 ``steps`` steps plain, plain again (control) and with the order edges; compare bytes."""
    import numpy as np
    import tensorflow as tf

    from tflms.ir import tf_io
    from tflms.ir.tf_io import load_graph
    from tflms.schedule import add_order_edges, order_edges, schedule_order
    from tflms.testing import bitwise_diff, snapshot
    rng = np.random.RandomState(0)
    data = [(tf.constant(rng.standard_normal((batch, 224, 224, 3)).astype("float32")),
             tf.constant(rng.randint(0, 1000, size=(batch,)).astype("int32"))) for _ in range(steps)]
    out, edges = {}, 0
    for variant in ("plain", "plain-again", "ordered"):
        base, (model, optimizer, step) = trace_resnet50()
        fn = step
        if variant == "ordered":
            g = base.with_batch_size(batch)
            e = order_edges(g, schedule_order(g), min_bytes=min_bytes)
            edges = len(e)
            specs = (tf.TensorSpec((None, 224, 224, 3), tf.float32), tf.TensorSpec((None,), tf.int32))
            fn = tf_io.to_concrete_function(add_order_edges(load_graph(step.get_concrete_function(*specs)), e),
                                            step.get_concrete_function(*specs))
        out[variant] = snapshot(model, optimizer, losses=[fn(x, y) for x, y in data])
    differing = bitwise_diff(out["plain"], out["ordered"])
    return {"batch": batch, "steps": steps, "min_bytes": min_bytes, "edges": edges,
            "control_equal": not bitwise_diff(out["plain"], out["plain-again"]),
            "ordered_equal": not differing, "differing": len(differing)}


def synthetic(n_pairs: int):
    from tflms.schedule import order_edges, schedule_order
    from tflms.testing import GraphBuilder
    b = GraphBuilder()
    x = b.op("x", "Placeholder", shape=(256, 256))
    smalls = []
    for i in range(n_pairs):
        big = b.op(f"big{i}", "Pad", [x], shape=(512, 512))
        smalls.append(b.op(f"small{i}", "Sum", [big], shape=(256, 256)))
    b.op("total", "AddN", smalls, shape=(256, 256))
    t0 = time.perf_counter()
    order = schedule_order(b.graph)
    t1 = time.perf_counter()
    edges = order_edges(b.graph, order, fusion_safe=False)
    return {"ops": len(b.graph), "schedule_s": t1 - t0, "edges_s": time.perf_counter() - t1, "edges": len(edges)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="64,256,400")
    parser.add_argument("--profile", default="v100-16gb-pcie3")
    parser.add_argument("--threshold", type=int, default=1, help="swapout_threshold of the distance plan")
    parser.add_argument("--synthetic", type=int, default=50000, help="pairs of the synthetic graph (0: skip)")
    parser.add_argument("--bitwise", type=int, default=0, metavar="BATCH",
                        help="also train ResNet-50 at this batch with and without the order edges (CPU)")
    parser.add_argument("--bitwise-min-bytes", type=int, default=DEFAULT_MIN_BYTES,
                        help="min_bytes of the order edges in the bitwise check (1: order every op it can)")
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args()
    from tflms.analysis.cto import analyze_graph
    from tflms.config import LMSConfig
    from tflms.passes.swaps import apply_swaps
    from tflms.policies.tflms_rules import plan_swaps
    from tflms.sim.bounds import swap_only_bound
    from tflms.sim import get_profile
    from tflms.sim.bounds import step_time_bound, time_bound_ratio
    budget = get_profile(args.profile).memory_bytes
    base, keep_alive = trace_resnet50()
    records = []
    for batch in [int(b) for b in args.batches.split(",")]:
        graph = base.with_batch_size(batch)
        bound = swap_only_bound(graph)
        plan = plan_swaps(analyze_graph(graph), LMSConfig(swapout_threshold=args.threshold, swapin_ahead=1),
                          accelerator_device="/device:GPU:0")
        tb = None
        for label, g in (("no swaps", graph), (f"distance plan t={args.threshold}", apply_swaps(graph, plan).graph)):
            rec = report(g, args.profile, label)
            if tb is None:  # the bound of swap-only rewrites that keep the schedule of the unswapped step
                from tflms.schedule import schedule_order
                tb = step_time_bound(graph, args.profile, budget, order=schedule_order(graph, profile=args.profile))
            rec.update(time_bound_s=tb.bound_s, min_swap_gib=tb.min_swap_bytes / GIB,
                       time_bound_ratio=(time_bound_ratio(rec["schedule_step_s"], tb.bound_s)
                                         if tb.feasible and rec["schedule_peak_gib"] * GIB <= budget else None))
            rec.update(batch=batch, swap_only_bound_gib=bound.bound_bytes / GIB,
                       bound_working_set_mib_per_sample=bound.working_set_bytes / MIB / batch,
                       bound_op=bound.op, resident_gib=bound.resident_bytes / GIB)
            records.append(rec)
            print(f"batch {batch:4d} {label:22s} ops {rec['ops']:6d}  peak level {rec['level_peak_gib']:6.2f} "
                  f"schedule {rec['schedule_peak_gib']:6.2f} ({rec['chosen']}) edges-only "
                  f"{rec['edges_level_peak_gib']:6.2f} GiB | step {rec['level_step_s']:.3f}/"
                  f"{rec['schedule_step_s']:.3f} s | ordered {rec['ordered_ops']}"
                  f" edges {rec['edges']} (exact {rec['exact_edges']}: {rec['exact_edges_level_peak_gib']:.2f} GiB)"
                  f" | schedule {rec['schedule_s']:.2f} s edges {rec['edges_s']:.2f} s | bound "
                  f"{rec['swap_only_bound_gib']:.2f} GiB ({rec['bound_working_set_mib_per_sample']:.2f} MiB/sample at "
                  f"{rec['bound_op']}) | time bound at {budget / GIB:.0f} GiB {rec['time_bound_s']:.3f} s (>= "
                  f"{rec['min_swap_gib']:.2f} GiB each way), ratio "
                  f"{'-' if rec['time_bound_ratio'] is None else format(rec['time_bound_ratio'], '.2f')}",
                  flush=True)
    if args.synthetic:
        syn = synthetic(args.synthetic)
        print(f"synthetic: {syn['ops']} ops scheduled in {syn['schedule_s']:.2f} s, {syn['edges']} edges in "
              f"{syn['edges_s']:.2f} s")
        records.append({"graph": "synthetic", **syn})
    if args.bitwise:
        bw = bitwise_check(args.bitwise, 2, args.bitwise_min_bytes)
        print(f"bitwise: batch {bw['batch']}, {bw['steps']} steps, min_bytes {bw['min_bytes']}, {bw['edges']} edges: "
              f"plain vs plain {bw['control_equal']}, ordered vs plain {bw['ordered_equal']} "
              f"({bw['differing']} arrays differ)")
        records.append({"graph": "bitwise", **bw})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    del keep_alive


if __name__ == "__main__":
    main()

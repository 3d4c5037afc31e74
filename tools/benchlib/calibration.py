"""The compute model against a published training throughput (see tools/calibrate_compute.py)."""

from __future__ import annotations

#: (profile, published images/s, how the figure applies to the profile, source)
PUBLISHED = (
    ("v100-16gb-nvlink2", 412.0, "V100 SXM2 16GB, as published",
     "NVIDIA DeepLearningExamples TF ResNet-50 v1.5, DGX-1 1x V100 16G, batch 128, FP32+XLA"),
    ("v100-16gb-pcie3", 412.0 * 14.0 / 15.7, "412 img/s x 14/15.7 (PCIe V100 peak FLOP/s)",
     "same, scaled to the V100 PCIe's peak FLOP/s"),
)


def breakdown(graph, profile) -> dict:
    """Predicted compute seconds of the step's ops, split by which roofline term wins."""
    from tflms.ir.op_types import FREE_OPS
    from tflms.sim.cost import op_compute_s, op_memory_s
    flop_s = mem_s = launch_s = 0.0
    for op in graph.ops:
        if op.type in FREE_OPS:
            continue
        compute = op_compute_s(graph, op, profile)  # a contraction at its dtype's math mode (issue 28)
        memory = op_memory_s(graph, op, profile)
        launch_s += profile.launch_overhead_s
        if compute >= memory:
            flop_s += compute
        else:
            mem_s += memory
    return {"flop_bound_s": flop_s, "memory_bound_s": mem_s, "launch_s": launch_s}


def calibration_rows(steps, batch: int = 128) -> list[dict]:
    """Predicted vs published ResNet-50 images/s for each profile in :data:`PUBLISHED` (simulated)."""
    from tflms.profiles import get_profile
    from tflms.sim import simulate
    graph, _ = steps.graph("resnet50", "plain", batch)
    rows = []
    for name, published, applies, source in PUBLISHED:
        profile = get_profile(name)
        sim = simulate(graph, profile)
        parts = breakdown(graph, profile)
        predicted = batch / sim.step_time_s
        flop_only = batch / (parts["flop_bound_s"] + parts["launch_s"])
        rows.append({"profile": name, "batch": batch, "simulated_step_s": sim.step_time_s,
                     "predicted_img_s": predicted, "published_img_s": published, "ratio": predicted / published,
                     "flop_bound_s": parts["flop_bound_s"], "memory_bound_s": parts["memory_bound_s"],
                     "launch_s": parts["launch_s"], "img_s_if_memory_bound_ops_were_free": flop_only,
                     "ratio_if_memory_bound_ops_were_free": flop_only / published,
                     "published_applies": applies, "source": source})
    return rows


def calibration_markdown(rows: list[dict]) -> list[str]:
    lines = ["| profile | predicted img/s | published img/s | predicted / published | FLOP-bound ops | "
             "memory-bound ops | img/s if memory-bound ops were free (ratio) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['profile']} | {r['predicted_img_s']:.0f} | {r['published_img_s']:.0f} | {r['ratio']:.2f} | "
                     f"{r['flop_bound_s'] * 1e3:.0f} ms | {r['memory_bound_s'] * 1e3:.0f} ms | "
                     f"{r['img_s_if_memory_bound_ops_were_free']:.0f} "
                     f"({r['ratio_if_memory_bound_ops_were_free']:.2f}) |")
    lines.append("")
    lines += [f"- {r['profile']}: published figure {r['published_applies']}; {r['source']}." for r in rows]
    return lines

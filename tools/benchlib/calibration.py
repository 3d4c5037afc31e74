"""The compute model against published training throughputs (see tools/calibrate_compute.py)."""

from __future__ import annotations

import dataclasses

#: The DeepLearningExamples README every figure below is read from (its last change: commit 9de48bc, 2023-04-17).
DLE_RN50_TF = ("NVIDIA DeepLearningExamples, TensorFlow/Classification/ConvNets/resnet50v1.5/README.md "
               "(https://github.com/NVIDIA/DeepLearningExamples/blob/master/TensorFlow/Classification/ConvNets/"
               "resnet50v1.5/README.md), TensorFlow 20.06-tf1-py3 NGC container, 1 GPU")


@dataclasses.dataclass(frozen=True)
class Published:
    """One published training throughput and the bench step it is compared with.

    ``model``: the bench model (``benchlib.models.MODELS``) whose unchanged step is simulated, at ``batch``
    (the published run's batch per GPU) on ``profile``. ``memory_gbps``: the published GPU's HBM bandwidth
    where it differs from the profile's (the profile is then simulated with it, and the row says so).
    """

    profile: str
    img_s: float
    applies: str
    source: str
    model: str = "resnet50"
    batch: int = 128
    precision: str = "FP32 + XLA"
    memory_gbps: float | None = None


#: FP32 on the V100s (no TF32 there): the calibration docs/results.md has shown since issue 10.
PUBLISHED = (
    Published("v100-16gb-nvlink2", 412.0, "V100 SXM2 16GB, as published",
              "NVIDIA DeepLearningExamples TF ResNet-50 v1.5, DGX-1 1x V100 16G, batch 128, FP32+XLA"),
    Published("v100-16gb-pcie3", 412.0 * 14.0 / 15.7, "412 img/s x 14/15.7 (PCIe V100 peak FLOP/s)",
              "same, scaled to the V100 PCIe's peak FLOP/s"),
)

#: Tensor-core math (issue 28): Keras mixed_float16 (bench model ``resnet50-amp-fp16``) against NVIDIA's AMP
#: figures, and the float32 step priced at TF32 against the TF32 figure. The A100 figures are a DGX A100
#: **40GB** (A100 SXM4 40GB: the 80GB SXM4's tensor-core and FP32 peaks, 1,555 GB/s HBM2 instead of 2,039 GB/s,
#: NVIDIA A100 datasheet), so each A100 reference is simulated on a100-80gb-sxm4 as it is and at 1,555 GB/s.
#: No DeepLearningExamples TensorFlow ResNet-50 figure for an H100 exists (the TF1 models were retired in
#: April 2023; TensorFlow2/Classification/ConvNets has EfficientNets only): no H100 row.
A100_40GB_HBM_GBPS = 1555.0
_A100_TABLE = "table 'Training performance: NVIDIA DGX A100 (8x A100 40GB)', 1 GPU, batch 256"
_V100_TABLE = "table 'Training performance: NVIDIA DGX-1 (8x V100 16G)', 1 GPU, batch 256 (AMP)"
PUBLISHED_TENSOR_CORES = (
    Published("a100-80gb-sxm4", 2375.0, "A100 SXM4 40GB, compared with the 80GB SXM4 profile as it is",
              f"{DLE_RN50_TF}, {_A100_TABLE}, mixed precision + XLA: 2375 img/s",
              model="resnet50-amp-fp16", batch=256, precision="AMP + XLA"),
    Published("a100-80gb-sxm4", 2375.0, "A100 SXM4 40GB, the 80GB SXM4 profile at the 40GB part's 1,555 GB/s",
              f"{DLE_RN50_TF}, {_A100_TABLE}, mixed precision + XLA: 2375 img/s",
              model="resnet50-amp-fp16", batch=256, precision="AMP + XLA", memory_gbps=A100_40GB_HBM_GBPS),
    Published("a100-80gb-sxm4", 909.0, "A100 SXM4 40GB, the 80GB SXM4 profile at the 40GB part's 1,555 GB/s",
              f"{DLE_RN50_TF}, {_A100_TABLE}, TF32 + XLA: 909 img/s",
              model="resnet50", batch=256, precision="TF32 + XLA", memory_gbps=A100_40GB_HBM_GBPS),
    Published("v100-16gb-nvlink2", 1270.0, "V100 SXM2 16GB, as published",
              f"{DLE_RN50_TF}, {_V100_TABLE}, mixed precision + XLA: 1270 img/s",
              model="resnet50-amp-fp16", batch=256, precision="AMP + XLA"),
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


def op_type_breakdown(graph, profile, top: int = 10) -> dict:
    """Where the step's predicted time goes, by op type: the ``top`` op types whose memory-bound ops (the roofline's
    memory term wins) cost most, as ``[(op type, ops, seconds)]``, the bytes per batch those ops read and write, and
    the contractions counted by ``(op type, dtype)``."""
    import collections

    from tflms.ir.op_types import CONTRACTION_OPS, FREE_OPS
    from tflms.sim.cost import op_bytes, op_compute_s, op_dtype, op_memory_s
    seconds, count, contractions = collections.Counter(), collections.Counter(), collections.Counter()
    memory_bytes = 0
    for op in graph.ops:
        if op.type in FREE_OPS:
            continue
        if op.type in CONTRACTION_OPS:
            contractions[f"{op.type} {op_dtype(graph, op)}"] += 1
        memory = op_memory_s(graph, op, profile)
        if memory > op_compute_s(graph, op, profile):
            seconds[op.type] += memory
            count[op.type] += 1
            memory_bytes += op_bytes(graph, op)
    ranked = sorted(seconds, key=lambda t: (-seconds[t], t))[:top]
    return {"memory_bound_by_type": [(t, count[t], seconds[t]) for t in ranked],
            "memory_bound_bytes": memory_bytes, "contractions": dict(sorted(contractions.items()))}


def op_type_markdown(rows: list[dict]) -> list[str]:
    """One line per calibration row that has ``op_types`` (:func:`calibration_rows`): where its time goes."""
    lines = []
    for r in rows:
        parts = r["op_types"]
        top = ", ".join(f"{t} {n} ops {s * 1e3:.1f} ms" for t, n, s in parts["memory_bound_by_type"])
        lines.append(f"- {r['profile']}, {r['model']} ({r['batch']}): contractions "
                     f"{', '.join(f'{k}: {v}' for k, v in parts['contractions'].items())}; memory-bound ops move "
                     f"{parts['memory_bound_bytes'] / r['batch'] / 1e9:.2f} GB per sample, the costliest: {top}.")
    return lines


def predicted_vs_published(batch: int, step_time_s: float, published_img_s: float) -> tuple[float, float]:
    """``(predicted images/s, predicted / published)`` for a simulated step of ``batch`` samples that takes
    ``step_time_s``: the images/s is ``batch / step_time_s``. Raises ``ValueError`` on a non-positive input."""
    if batch < 1 or not step_time_s > 0 or not published_img_s > 0:
        raise ValueError(f"predicted_vs_published: batch >= 1, step time and published images/s > 0; got {batch}, "
                         f"{step_time_s!r} s, {published_img_s!r} img/s")
    predicted = batch / step_time_s
    return predicted, predicted / published_img_s


def reference_profile(ref: Published):
    """The profile ``ref`` is simulated on: its profile, at ``ref.memory_gbps`` where that is given."""
    from tflms.profiles import get_profile
    profile = get_profile(ref.profile)
    if ref.memory_gbps is None:
        return profile
    return dataclasses.replace(profile, name=f"{profile.name}@{ref.memory_gbps:g}GB/s", memory_gbps=ref.memory_gbps)


def calibration_rows(steps, batch: int | None = None, published=PUBLISHED, by_op_type: bool = False) -> list[dict]:
    """Predicted vs published ResNet-50 images/s for each reference in ``published`` (simulated).

    ``batch``: simulate every reference at this batch instead of its published run's (``Published.batch``).
    ``by_op_type``: each row also has ``op_types`` (:func:`op_type_breakdown`).
    """
    from tflms.sim import simulate
    from tflms.sim.cost import op_math_mode
    rows = []
    for ref in published:
        size = batch or ref.batch
        graph, _ = steps.graph(ref.model, "plain", size)
        profile = reference_profile(ref)
        sim = simulate(graph, profile)
        parts = breakdown(graph, profile)
        predicted, ratio = predicted_vs_published(size, sim.step_time_s, ref.img_s)
        flop_only, flop_only_ratio = predicted_vs_published(size, parts["flop_bound_s"] + parts["launch_s"],
                                                            ref.img_s)
        modes = sorted({m for m in (op_math_mode(graph, op, profile) for op in graph.ops) if m is not None})
        rows.append({"profile": profile.name, "model": ref.model, "batch": size, "precision": ref.precision,
                     "math_modes": modes, "simulated_step_s": sim.step_time_s,
                     "predicted_img_s": predicted, "published_img_s": ref.img_s, "ratio": ratio,
                     "flop_bound_s": parts["flop_bound_s"], "memory_bound_s": parts["memory_bound_s"],
                     "launch_s": parts["launch_s"], "img_s_if_memory_bound_ops_were_free": flop_only,
                     "ratio_if_memory_bound_ops_were_free": flop_only_ratio,
                     "published_applies": ref.applies, "source": ref.source})
        if by_op_type:
            rows[-1]["op_types"] = op_type_breakdown(graph, profile)
    return rows


def calibration_markdown(rows: list[dict]) -> list[str]:
    lines = ["| profile | step (batch) | published run | contractions at | predicted img/s | published img/s | "
             "predicted / published | FLOP-bound ops | memory-bound ops | "
             "img/s if memory-bound ops were free (ratio) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['profile']} | {r['model']} ({r['batch']}) | {r['precision']} | "
                     f"{', '.join(r['math_modes']).upper()} | {r['predicted_img_s']:.0f} | "
                     f"{r['published_img_s']:.0f} | {r['ratio']:.2f} | "
                     f"{r['flop_bound_s'] * 1e3:.0f} ms | {r['memory_bound_s'] * 1e3:.0f} ms | "
                     f"{r['img_s_if_memory_bound_ops_were_free']:.0f} "
                     f"({r['ratio_if_memory_bound_ops_were_free']:.2f}) |")
    lines.append("")
    lines += [f"- {r['profile']}, {r['model']}: published figure {r['published_applies']}; {r['source']}."
              for r in rows]
    return lines

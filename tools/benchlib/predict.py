"""tflms's prediction of one whole training step on a GPU profile, in one clock mode (issue 46, item 3).

``tools/gpu_step.py --predict`` prints it as one JSON object; the checks compare it with the steps that tool measures
(Keras 3 on XLA through JAX, PyTorch). The step is the bench's own (``benchlib.models``): ResNet-50 or BERT-base, in
float32 or under Keras's ``mixed_bfloat16``, traced by TensorFlow on the CPU and simulated (never run).
"""

from __future__ import annotations

from typing import Any

#: (model, dtype) of the prediction interface -> the bench's model name.
BENCH_NAMES = {("resnet50", "float32"): "resnet50", ("resnet50", "bfloat16"): "resnet50-amp-bf16",
               ("bert-base", "float32"): "bert-base", ("bert-base", "bfloat16"): "bert-base-amp-bf16"}
MODES = ("xla", "graph")


def predict(steps, model: str, dtype: str, batch: int, profile: str, mode: str) -> dict[str, Any]:
    """The simulated step of ``model`` in ``dtype`` at ``batch`` on ``profile`` under clock ``mode`` (a record).

    ``step_ms`` and ``peak_bytes`` are the simulation's; ``contractions_ms`` is a lower bound of the step under the
    same profile (its convolutions and products alone, one after another); ``resident_bytes`` one of the peak
    (weights, optimizer slots, the batch).
    """
    from tflms.errors import ConfigError
    from tflms.ir.op_types import CONTRACTION_OPS
    from tflms.sim import SimOptions, get_profile, simulate
    from tflms.sim.cost import op_time_s

    if (model, dtype) not in BENCH_NAMES:
        raise ConfigError(f"no prediction for model {model!r} in {dtype!r}; choose a model from "
                          f"{sorted({m for m, _ in BENCH_NAMES})} and a dtype from {sorted({d for _, d in BENCH_NAMES})}")
    if mode not in MODES:
        raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    hw = get_profile(profile)
    name = BENCH_NAMES[(model, dtype)]
    graph, _ = steps.graph(name, "plain", batch)
    sim = simulate(graph, hw, options=SimOptions(clock=mode))
    ran = {op.name for op in sim.ops}
    contractions_s = sum(op_time_s(graph, op, hw) - hw.launch_overhead_s
                         for op in graph if op.type in CONTRACTION_OPS and op.name in ran)
    return {"model": model, "dtype": dtype, "bench_model": name, "batch": batch, "profile": hw.name, "mode": mode,
            "simulated": True, "step_ms": sim.step_time_s * 1e3, "peak_bytes": sim.peak_bytes,
            "samples_per_s": batch / sim.step_time_s if sim.step_time_s else None,
            "contractions_ms": contractions_s * 1e3, "resident_bytes": sim.resident_bytes, "kernels": sim.kernels,
            "ops": len(graph)}

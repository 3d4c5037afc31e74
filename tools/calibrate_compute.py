"""How far the simulator's compute model is from a published training throughput.

Simulates one ResNet-50 training step (Keras ``ResNet50``, 224x224x3, 1000 classes,
SGD with momentum, FP32, no swapping) at the published run's batch on each profile
that has a published FP32 figure for its GPU, and prints predicted images/s beside
the published one and their ratio. It also splits the predicted step into
FLOP-bound ops (the roofline's compute term wins) and memory-bound ops, and shows
what the prediction would be if every memory-bound op cost nothing (an upper
bound on what fusing them, as XLA and cuDNN's fused batch norm do, could give).

Published reference (the one figure used; FP32 training, one GPU):

- NVIDIA DeepLearningExamples, TensorFlow ResNet-50 v1.5, README "Training
  performance: NVIDIA DGX-1 (8x V100 16G)": 1 GPU, batch 128, FP32 + XLA,
  412 img/s (TensorFlow 20.06-tf1-py3 NGC container). That is an SXM2 V100
  (15.7 TFLOP/s); the PCIe V100 profile (14 TFLOP/s) is compared with the same
  figure scaled by its peak FLOP/s.

The step tflms sees is not NVIDIA's step: Keras 3 builds batch normalization from
separate Mul/Mean/BroadcastTo ops (no FusedBatchNormV3) and nothing is compiled
with XLA, so a GPU running this very graph would also be slower than 412 img/s.
The ratio says how the model compares with a tuned run, not that the profile is
off by that factor; docs/results.md discusses it.

    python tools/calibrate_compute.py [--json] [--batch 128]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

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
    from tflms.sim.cost import op_bytes, op_flops
    flop_s = mem_s = launch_s = 0.0
    for op in graph.ops:
        if op.type in FREE_OPS:
            continue
        compute = op_flops(graph, op) / profile.effective_flops
        memory = op_bytes(graph, op) / profile.effective_memory_bytes_per_s
        launch_s += profile.launch_overhead_s
        if compute >= memory:
            flop_s += compute
        else:
            mem_s += memory
    return {"flop_bound_s": flop_s, "memory_bound_s": mem_s, "launch_s": launch_s}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128, help="batch size (the published run's: 128)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)

    from benchlib.models import Steps
    from tflms.profiles import get_profile
    from tflms.sim import simulate
    graph, _ = Steps().graph("resnet50", "plain", args.batch)
    rows = []
    for name, published, applies, source in PUBLISHED:
        profile = get_profile(name)
        sim = simulate(graph, profile)
        parts = breakdown(graph, profile)
        predicted = args.batch / sim.step_time_s
        flop_only = args.batch / (parts["flop_bound_s"] + parts["launch_s"])
        rows.append({"profile": name, "batch": args.batch, "simulated_step_s": sim.step_time_s,
                     "predicted_img_s": predicted, "published_img_s": published, "ratio": predicted / published,
                     "flop_bound_s": parts["flop_bound_s"], "memory_bound_s": parts["memory_bound_s"],
                     "launch_s": parts["launch_s"], "img_s_if_memory_bound_ops_were_free": flop_only,
                     "ratio_if_memory_bound_ops_were_free": flop_only / published,
                     "published_applies": applies, "source": source})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"ResNet-50 training step, batch {args.batch}, FP32, simulated (no swapping) vs published\n")
    print("| profile | predicted img/s | published img/s | predicted / published | FLOP-bound ops | "
          "memory-bound ops | img/s if memory-bound ops were free (ratio) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['profile']} | {r['predicted_img_s']:.0f} | {r['published_img_s']:.0f} | {r['ratio']:.2f} | "
              f"{r['flop_bound_s'] * 1e3:.0f} ms | {r['memory_bound_s'] * 1e3:.0f} ms | "
              f"{r['img_s_if_memory_bound_ops_were_free']:.0f} ({r['ratio_if_memory_bound_ops_were_free']:.2f}) |")
    print()
    for r in rows:
        print(f"{r['profile']}: published {r['published_applies']}; {r['source']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

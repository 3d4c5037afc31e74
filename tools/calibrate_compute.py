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

With ``--tensor-cores``: the same for tensor-core math (issue 28), from the same README
(``benchlib.calibration.PUBLISHED_TENSOR_CORES``): the Keras mixed_float16 step
(bench model ``resnet50-amp-fp16``, loss scaling) at batch 256 against "mixed
precision + XLA" on one A100 40GB (DGX A100, 2375 img/s) and one V100 16G (DGX-1,
1270 img/s), and the float32 step priced at TF32 against "TF32 + XLA" on the A100
(909 img/s). The A100 rows run on a100-80gb-sxm4 as it is and at the 40GB part's
1,555 GB/s HBM. No published TensorFlow ResNet-50 figure for an H100 was found.

The step tflms sees is not NVIDIA's step: Keras 3 builds batch normalization from
separate Mul/Mean/BroadcastTo ops (no FusedBatchNormV3) and nothing is compiled
with XLA, so a GPU running this very graph would also be slower than 412 img/s.
The ratio says how the model compares with a tuned run, not that the profile is
off by that factor; docs/results.md discusses it.

    python tools/calibrate_compute.py [--json] [--batch 128] [--tensor-cores] [--by-op-type]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=None,
                        help="batch size (default: each published run's, 128 for FP32, 256 for AMP and TF32)")
    parser.add_argument("--tensor-cores", action="store_true",
                        help="the mixed-precision (AMP) and TF32 references instead of the FP32 ones")
    parser.add_argument("--by-op-type", action="store_true",
                        help="also each step's contractions by dtype and its costliest memory-bound op types")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)

    from benchlib.calibration import (PUBLISHED, PUBLISHED_TENSOR_CORES, calibration_markdown, calibration_rows,
                                      op_type_markdown)
    from benchlib.models import Steps
    rows = calibration_rows(Steps(), args.batch, PUBLISHED_TENSOR_CORES if args.tensor_cores else PUBLISHED,
                            by_op_type=args.by_op_type)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    what = "AMP (mixed_float16) and TF32" if args.tensor_cores else "FP32"
    print(f"ResNet-50 training step, {what}, simulated (no swapping) vs published\n")
    print("\n".join(calibration_markdown(rows)))
    if args.by_op_type:
        print("\n" + "\n".join(op_type_markdown(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""vDNN's headline result, like for like: VGG-16 at vDNN's over-subscription.

Rhu et al. (MICRO 2016) trained VGG-16 at batch 256, a step that needs 28 GB, on a
12 GB Titan X over PCIe 3 with 18% performance loss against a GPU with enough
memory: the step needed 2.33x the card's memory. This tool finds, on a profile, the
VGG-16 batch whose simulated no-swap peak is that multiple of the profile's memory
(bisection on the simulated peak), then simulates at that batch:

- ``enough memory``: the plain step on the same GPU with unlimited memory (the
  paper's baseline);
- ``vdnn_conv`` and ``vdnn_all``: vDNN's layer-wise offload policies
  (tflms.policies.vdnn), judged against the profile's memory with the benchmark's
  headroom;
- ``tflms-best``: the tuner with every tflms strategy and the enforced order.

and prints each one's fit, predicted step time and loss against ``enough memory``,
beside the swap-only memory bound (tflms.sim.bounds) at that batch. Where a method
does not fit at the paper's over-subscription, it also bisects for the largest
batch at which it fits and prints the over-subscription and loss there. Simulated
figures; the paper's is measured on other hardware.

    python tools/vdnn_like_for_like.py [--profile v100-16gb-pcie3] [--oversubscription 2.33] [--json]
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
    parser.add_argument("--profile", default="v100-16gb-pcie3")
    parser.add_argument("--oversubscription", type=float, default=None,
                        help="no-swap peak over the GPU's memory (vDNN's VGG-16: 28/12 = 2.33)")
    from benchlib.common import HEADROOM
    parser.add_argument("--headroom", type=float, default=HEADROOM,
                        help=f"as tools/bench.py: peak x (1 + headroom) (default {HEADROOM})")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from benchlib.models import Steps
    from benchlib.vdnn import PAPER_OVERSUBSCRIPTION, like_for_like, like_for_like_markdown
    out = like_for_like(Steps(), args.profile, args.oversubscription or PAPER_OVERSUBSCRIPTION, args.headroom)
    print(json.dumps(out, indent=2) if args.json else "\n".join(like_for_like_markdown(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

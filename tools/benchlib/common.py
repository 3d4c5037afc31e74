"""What the benchmark compares, its search settings, and progress output (see ``tools/bench.py``)."""

from __future__ import annotations

import sys
import time

METHODS = ("none", "tflms-distance", "tflms-best", "grappler", "recompute")
ALL_MODELS = ("resnet50", "vgg16", "unet3d", "densenet121", "inception_v3", "bert-base", "mlp-tiny")
FULL_MODELS = ("resnet50", "vgg16", "unet3d", "densenet121", "bert-base")
FULL_PROFILES = ("v100-16gb-pcie3", "v100-16gb-nvlink2")
QUICK_MODELS = ("resnet50", "unet3d")
QUICK_PROFILES = ("v100-16gb-pcie3", "h100-80gb-pcie5")
#: Bisection steps after the doubling phase in quick mode (None = until exact).
QUICK_BISECT_STEPS = 3
#: Resolutions probed for the 3D U-Net are multiples of this (2 ** its depth).
UNET_RESOLUTION_STEP = 16
#: The doubling search gives up (reporting a lower bound) past this size.
SEARCH_LIMIT = 1 << 22
#: Quick mode answers "does tflms-distance fit?" with these tuner candidates only (the most aggressive
#: swapping: every forward tensor with a consumer more than one level away; asynchronous and fully
#: synchronous). A fit is exact (the tuner tries them too); a miss may hide a fitting candidate of the
#: tuner's full ladder (on ResNet-50 no candidate had a lower peak). --full runs the tuner's search.
QUICK_DISTANCE_PROBES = ({"swapout_threshold": 1, "swapin_ahead": 1, "swapin_groupby": 0, "sync_mode": 0},
                         {"swapout_threshold": 1, "swapin_ahead": 1, "swapin_groupby": 0, "sync_mode": 3})
#: tflms strategies of the tflms-best method besides the distance rules (tried when those fail).
IDLE_STRATEGIES = ("idle-time", "idle-time-no-overhead")
#: Headroom: every method's peak is judged as ``peak * (1 + HEADROOM)`` against the budget
#: (``SimOptions.margin_fraction``), the swap-only bound the same way: room for what the simulator
#: cannot see (kernel workspaces, allocator fragmentation). ``--headroom`` overrides it.
HEADROOM = 0.05
#: The row of the swap-only memory bound (tflms.sim.bounds.swap_only_bound) beside the methods.
BOUND = "swap-only-bound"
#: Figures from the papers, quoted from their abstracts; not measured here.
#: (source, setting, reported figure, our model to set beside it, which of our numbers: "ratio", or
#: "vdnn-like-for-like": the figure at vDNN's over-subscription, from tools/vdnn_like_for_like.py).
REPORTED = (
    ("TFLMS (Le et al., ISMM 2019)", "ResNet-50", "4.9x larger mini-batch with LMS", "resnet50", "ratio"),
    ("TFLMS (Le et al., ISMM 2019)", "3D U-Net", "5.6x larger image resolution with LMS", "unet3d", "ratio"),
    ("vDNN (Rhu et al., MICRO 2016)", "VGG-16, batch 256 (28 GB) on a 12 GB Titan X",
     "trains with 18% performance loss vs. a GPU with enough memory", "vgg16", "vdnn-like-for-like"),
    ("vDNN (Rhu et al., MICRO 2016)", "AlexNet / OverFeat / GoogLeNet",
     "average GPU memory usage reduced by up to 89% / 91% / 95%", "", ""),
    ("Zhang et al. (SINGA), arXiv:1903.06631", "several CNNs",
     "swapping reduces memory by up to 34.2% without communication overhead", "", ""),
    ("CSwap+ (Chen et al., TPDS 2022)", "six memory-intensive DNNs on V100",
     "up to 50.9% (sparse) / 46.1% (dense) less tensor swapping latency than vDNN", "", ""),
)


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

"""What the benchmark compares, its search settings, and progress output (see ``tools/bench.py``)."""

from __future__ import annotations

import json
import sys
import time

from tflms.budget import DEFAULT_MARGIN_FRACTION

METHODS = ("none", "tflms-distance", "tflms-best", "grappler", "checkpoint-segments", "keras-remat",
           "keras-remat-activations")
#: Methods judged as a step of their own, traced from a differently built model (``benchlib.models.Steps``
#: variants of the same names): segment checkpointing (tflms.baselines.recompute) and Keras's RematScope.
TRACED_METHODS = ("checkpoint-segments", "keras-remat", "keras-remat-activations")
#: The ``keras.RematScope`` mode each keras-remat method builds its model under.
KERAS_REMAT_MODES = {"keras-remat": "full", "keras-remat-activations": "activations"}
#: Method names of earlier runs (docs/results.json, docs/regressions.md) -> today's: "recompute" names the
#: tuner's plan action alone since issue 27, the segment-checkpointing baseline is "checkpoint-segments".
RENAMED_METHODS = {"recompute": "checkpoint-segments"}
ALL_MODELS = ("resnet50", "vgg16", "unet3d", "densenet121", "inception_v3", "bert-base", "mlp-tiny", "resnet50-amp-fp16",
              "bert-base-amp-bf16")
FULL_MODELS = ("resnet50", "vgg16", "unet3d", "densenet121", "bert-base")
FULL_PROFILES = ("v100-16gb-pcie3", "v100-16gb-nvlink2")
QUICK_MODELS = ("resnet50", "unet3d")
QUICK_PROFILES = ("v100-16gb-pcie3", "h100-80gb-pcie5")
#: Bisection steps after the doubling phase in quick mode (None = until exact).
QUICK_BISECT_STEPS = 3
#: Poolings of the benchmark's 3D U-Net; each side of its volume is halved this many times.
UNET_DEPTH = 4
#: The 3D U-Net's volume sides are multiples of this (2 ** its depth, so the skips line up).
UNET_RESOLUTION_STEP = 2 ** UNET_DEPTH
#: The doubling search gives up (reporting a lower bound) past this size (a batch, or a U-Net size index:
#: unet_shape(SEARCH_LIMIT) is far beyond any accelerator, so only batch models can meet it).
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
#: cannot see (kernel workspaces, allocator fragmentation). ``--headroom`` overrides it. The library's own
#: margin on a GPU's or profile's memory, one figure for both (tflms/budget.py; docs/guide.md, "The budget").
HEADROOM = DEFAULT_MARGIN_FRACTION
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


def unet_shape(index: int) -> tuple[int, int, int]:
    """The 3D U-Net volume ``(D, H, W)`` of size index ``index`` >= 1, in increasing voxel order.

    Sides are multiples of ``UNET_RESOLUTION_STEP`` (s) that differ by at most one step:
    ``n^3 < (n+1)*n*n < (n+1)*(n+1)*n < (n+1)^3`` (in units of s), so three indices per cube
    instead of one: ``n, extra = divmod(index + 2, 3)``, the first ``extra`` axes get ``n + 1``.
    Index 1 is s^3, 2 is 2s x s x s, 4 is (2s)^3, and 3n - 2 is (ns)^3. Voxels strictly
    increase with the index, so the doubling and bisection search stays valid, and doubling
    the index about doubles each side, as the cubic index did.
    """
    if index < 1:
        raise ValueError(f"unet_shape: the size index must be >= 1 (index 1 is {UNET_RESOLUTION_STEP}^3), got {index}")
    n, extra = divmod(index + 2, 3)
    return tuple(UNET_RESOLUTION_STEP * (n + 1 if axis < extra else n) for axis in range(3))


def unet_index(shape) -> int:
    """The size index of a volume ``(D, H, W)`` of :func:`unet_shape` (its inverse)."""
    step = UNET_RESOLUTION_STEP
    sides = tuple(shape)
    n = min(sides) // step if sides else 0
    extra = sum(side == (n + 1) * step for side in sides)
    if (len(sides) != 3 or n < 1 or any(side % step for side in sides)
            or sides != tuple((n + 1) * step if axis < extra else n * step for axis in range(3))):
        raise ValueError(f"unet_index: {sides} is not a benchmark volume: three sides, multiples of {step}, the "
                         f"larger ones first and at most {step} above the others (e.g. {unet_shape(5)})")
    return 3 * n - 2 + extra


def shape_label(shape) -> str:
    """``"192^3"`` for a cube, ``"208x192x192"`` otherwise."""
    sides = tuple(shape)
    return f"{sides[0]}^3" if len(set(sides)) == 1 else "x".join(map(str, sides))


def voxels(shape) -> int:
    d, h, w = shape
    return d * h * w


def method_name(name: str) -> str:
    """Today's name of a bench method, given today's or an earlier run's (:data:`RENAMED_METHODS`)."""
    return RENAMED_METHODS.get(name, name)


def read_records(path) -> list[dict]:
    """The records of a ``tools/bench.py --json`` run (e.g. docs/results.json), methods under today's names."""
    with open(path) as f:
        records = json.load(f)
    return [{**r, "method": method_name(r["method"])} if "method" in r else r for r in records]


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

"""Benchmark suite: the largest batch each memory-saving method reaches, side by side.

For each model and hardware profile the training step is traced (custom
``tf.GradientTape`` step, never run) and judged by the tflms simulator:

    none            the step as traced: no swapping, no recomputation
    tflms-distance  tflms with TFLMS's distance rules only (tune(strategies=["tflms-distance"]))
    tflms-best      tflms with every tuner strategy (distance rules, idle-time, idle-time-no-overhead)
    grappler        TensorFlow grappler's own swapping (RewriterConfig.SWAPPING_HEURISTICS) on a
                    virtual GPU with the profile's memory (tflms.baselines.grappler_swap)
    recompute       gradient checkpointing: the same Keras model run in sqrt(n) segments under
                    tf.recompute_grad (tflms.baselines.recompute), traced as its own step

Reported per model, profile and method: the largest batch that fits the profile's
memory (for ``unet3d``: the largest cubic resolution at batch 1), the predicted
step-time overhead at a *common batch* (the smallest of the maxima that exceed
``none``'s: a batch every method that extends the batch can run), the wall time of
the rewrite/tune that produced the graph at the common batch, and its op count.

Search: doubling from a known fit until a size does not fit, then bisection.
``none`` starts at 1, ``tflms-distance``/``grappler``/``recompute`` at ``none``'s
maximum (trying ``none``'s first miss next), ``tflms-best`` at ``tflms-distance``'s
(a size ``none`` fits is fitted by tflms without tuning: the tuner would keep the
unchanged step). ``--full`` answers a tflms-distance size with
``tune(strategies=["tflms-distance"], first_fit=True)``; quick mode simulates the
tuner's two most aggressive distance candidates instead (``QUICK_DISTANCE_PROBES``:
a fit is exact, a miss may hide another fitting candidate). tflms-best sizes the
distance rules miss run ``tune(strategies=IDLE_STRATEGIES, first_fit=True)``. One
full tune with every strategy runs at the common batch; ``tflms-distance``'s choice
and wall time are read off it (the tuner evaluates the distance candidates first).
Quick mode bisects ``QUICK_BISECT_STEPS`` times: the reported maximum fits, and
``max_batch_upper`` (the smallest size found not to fit) is at most 1/8 above it;
``--full`` bisects until they are adjacent. Afterwards every maximum is read off all
probes of the run (a size ``none`` fits counts for the tflms methods).

The 3D U-Net's size is its resolution: the step is re-traced for every resolution
probed (multiples of ``UNET_RESOLUTION_STEP``, batch 1), each trace cached for the run.
Batch models are traced once with an unknown batch dimension and re-sized in the IR.

Usage (from the repo root)::

    python tools/bench.py                       # quick: QUICK_MODELS on QUICK_PROFILES (< 10 min on 2 cores)
    python tools/bench.py --full                # FULL_MODELS on FULL_PROFILES, exact search (hours)
    python tools/bench.py --models resnet50,bert-base --profiles h100-80gb-pcie5
    python tools/bench.py --models mlp-tiny --json   # seconds (tiny MLP, 64 MiB budget); records on stdout

Without ``--json`` the Markdown report goes to stdout and to ``--results``
(default ``docs/results.md``), memory timelines to ``--plots`` (default
``docs/plots/<model>_<profile>.png``, needs matplotlib: ``pip install -e ".[plot]"``).
With ``--json`` the records go to stdout and nothing is written unless ``--results``
or ``--plots`` is given. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = pathlib.Path(__file__).resolve().parent.parent
METHODS = ("none", "tflms-distance", "tflms-best", "grappler", "recompute")
ALL_MODELS = ("resnet50", "vgg16", "unet3d", "densenet121", "inception_v3", "bert-base", "mlp-tiny")
FULL_MODELS = ("resnet50", "vgg16", "unet3d", "densenet121", "bert-base")
FULL_PROFILES = ("v100-16gb-pcie3", "h100-80gb-pcie5")
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
#: Figures from the papers, quoted from their abstracts; not measured here.
#: (source, setting, reported figure, our model to set beside it, which of our numbers: "ratio" or "overhead").
REPORTED = (
    ("TFLMS (Le et al., ISMM 2019)", "ResNet-50", "4.9x larger mini-batch with LMS", "resnet50", "ratio"),
    ("TFLMS (Le et al., ISMM 2019)", "3D U-Net", "5.6x larger image resolution with LMS", "unet3d", "ratio"),
    ("vDNN (Rhu et al., MICRO 2016)", "VGG-16, batch 256 (28 GB) on a 12 GB Titan X",
     "trains with 18% performance loss vs. a GPU with enough memory", "vgg16", "overhead"),
    ("vDNN (Rhu et al., MICRO 2016)", "AlexNet / OverFeat / GoogLeNet",
     "average GPU memory usage reduced by up to 89% / 91% / 95%", "", ""),
    ("Zhang et al. (SINGA), arXiv:1903.06631", "several CNNs",
     "swapping reduces memory by up to 34.2% without communication overhead", "", ""),
    ("CSwap+ (Chen et al., TPDS 2022)", "six memory-intensive DNNs on V100",
     "up to 50.9% (sparse) / 46.1% (dense) less tensor swapping latency than vDNN", "", ""),
)


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- models

def _load_unet_module():
    spec = importlib.util.spec_from_file_location("tflms_example_unet3d", REPO / "examples" / "unet3d.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bert_layers():
    """Keras layers of the BERT-like encoder (defined lazily: importing keras is slow)."""
    import keras
    from keras import ops

    class SelfAttention(keras.layers.Layer):
        """Multi-head self-attention from Dense layers and batched matmuls.

        (keras.layers.MultiHeadAttention uses Einsum, whose FLOPs the tflms cost
        model does not know; these ops are MatMul / BatchMatMulV2.)
        """

        def __init__(self, hidden, heads, dropout, **kwargs):
            super().__init__(**kwargs)
            self.hidden, self.heads = hidden, heads
            self.query, self.key = keras.layers.Dense(hidden, name="query"), keras.layers.Dense(hidden, name="key")
            self.value, self.out = keras.layers.Dense(hidden, name="value"), keras.layers.Dense(hidden, name="output")
            self.dropout = keras.layers.Dropout(dropout)

        def call(self, x, training=None):
            seq, head_dim = x.shape[1], self.hidden // self.heads

            def heads(t):
                return ops.transpose(ops.reshape(t, (-1, seq, self.heads, head_dim)), (0, 2, 1, 3))

            q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
            probs = ops.softmax(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * head_dim ** -0.5, axis=-1)
            context = ops.matmul(self.dropout(probs, training=training), v)
            return self.out(ops.reshape(ops.transpose(context, (0, 2, 1, 3)), (-1, seq, self.hidden)))

    class PositionEmbedding(keras.layers.Layer):
        def __init__(self, seq_len, hidden, **kwargs):
            super().__init__(**kwargs)
            self.table = self.add_weight(shape=(seq_len, hidden), initializer="random_normal", name="table")

        def call(self, x):
            return x + self.table

    class FirstToken(keras.layers.Layer):
        def call(self, x):
            return x[:, 0]

    return SelfAttention, PositionEmbedding, FirstToken


def build_bert(*, layers=12, hidden=768, heads=12, ffn=3072, vocab=30522, seq_len=512, dropout=0.1, classes=2):
    """A BERT-base-like encoder (Devlin et al. 2019 sizes) with a [CLS] classifier head."""
    import keras
    SelfAttention, PositionEmbedding, FirstToken = _bert_layers()
    ids = keras.Input((seq_len,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(vocab, hidden, name="token_embedding")(ids)
    x = PositionEmbedding(seq_len, hidden, name="position_embedding")(x)
    x = keras.layers.Dropout(dropout)(keras.layers.LayerNormalization(epsilon=1e-12, name="embedding_norm")(x))
    for i in range(layers):
        a = keras.layers.Dropout(dropout)(SelfAttention(hidden, heads, dropout, name=f"layer{i}_attention")(x))
        x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"layer{i}_attention_norm")(
            keras.layers.Add()([x, a]))
        f = keras.layers.Dense(ffn, activation="gelu", name=f"layer{i}_ffn_in")(x)
        f = keras.layers.Dropout(dropout)(keras.layers.Dense(hidden, name=f"layer{i}_ffn_out")(f))
        x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"layer{i}_ffn_norm")(keras.layers.Add()([x, f]))
    pooled = keras.layers.Dense(hidden, activation="tanh", name="pooler")(FirstToken(name="cls")(x))
    return keras.Model(ids, keras.layers.Dense(classes, name="classifier")(pooled), name="bert_base")


@dataclasses.dataclass
class ModelSpec:
    """How to build a model's training step. ``kind``: "batch" or "resolution" (batch 1, cubic input)."""

    name: str
    kind: str
    description: str
    build: Callable[[], tuple[Any, Any, Any]]  # -> (keras model, optimizer, loss_fn)
    specs: Callable[[int | None], tuple[Any, Any]]  # resolution (or None) -> (x spec, y spec), batch unknown
    budget_bytes: int | None = None  # judged against this instead of the profile's memory (unless --budget)


def _image_specs(side: int, channels: int = 3):
    import tensorflow as tf
    return lambda _: (tf.TensorSpec((None, side, side, channels), tf.float32), tf.TensorSpec((None,), tf.int32))


def _classifier(app: str, side: int):
    def build():
        import keras
        model = getattr(keras.applications, app)(weights=None, input_shape=(side, side, 3), classes=1000)
        return (model, keras.optimizers.SGD(0.01, momentum=0.9),
                keras.losses.SparseCategoricalCrossentropy(from_logits=False))
    return build


def _unet():
    import keras
    model = _load_unet_module().build_unet3d(channels=4, classes=4, base_filters=32, depth=4)
    return model, keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy()


def _unet_specs(resolution):
    return _load_unet_module().input_specs(resolution, channels=4)


def _bert():
    import keras
    return (build_bert(), keras.optimizers.Adam(1e-4),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _bert_specs(_):
    import tensorflow as tf
    return tf.TensorSpec((None, 512), tf.int32), tf.TensorSpec((None,), tf.int32)


def _mlp_tiny():
    import keras
    inputs = keras.Input((256,))
    x = inputs
    for i in range(4):
        x = keras.layers.Dense(512, activation="relu", name=f"dense{i}")(x)
    model = keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="mlp_tiny")
    return (model, keras.optimizers.SGD(0.01, momentum=0.9),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _mlp_specs(_):
    import tensorflow as tf
    return tf.TensorSpec((None, 256), tf.float32), tf.TensorSpec((None,), tf.int32)


MODELS = {
    "resnet50": ModelSpec("resnet50", "batch", "Keras ResNet-50, 224x224x3, 1000 classes, SGD momentum",
                          _classifier("ResNet50", 224), _image_specs(224)),
    "vgg16": ModelSpec("vgg16", "batch", "Keras VGG-16, 224x224x3, 1000 classes, SGD momentum",
                       _classifier("VGG16", 224), _image_specs(224)),
    "densenet121": ModelSpec("densenet121", "batch", "Keras DenseNet-121, 224x224x3, 1000 classes, SGD momentum",
                             _classifier("DenseNet121", 224), _image_specs(224)),
    "inception_v3": ModelSpec("inception_v3", "batch", "Keras Inception-v3, 299x299x3, 1000 classes, SGD momentum",
                              _classifier("InceptionV3", 299), _image_specs(299)),
    "unet3d": ModelSpec("unet3d", "resolution", "3D U-Net (examples/unet3d.py), 4 levels, 32 base filters, "
                        "4 channels, 4 classes, batch 1, Adam", _unet, _unet_specs),
    "bert-base": ModelSpec("bert-base", "batch", "BERT-base-like encoder (12 x 768, 12 heads, FFN 3072, "
                           "sequence 512, vocab 30522), [CLS] classifier, Adam", _bert, _bert_specs),
    "mlp-tiny": ModelSpec("mlp-tiny", "batch", "4 x Dense(512) MLP for tests (budget 64 MiB), SGD momentum",
                          _mlp_tiny, _mlp_specs, budget_bytes=64 * 2**20),
}


class Steps:
    """Builds each model once and caches the traced IR graph of each (variant, resolution)."""

    def __init__(self) -> None:
        self._built: dict[str, tuple] = {}
        self._graphs: dict[tuple, tuple[Any, float]] = {}
        self.trace_s = 0.0

    def _functions(self, name: str):
        if name not in self._built:
            import keras
            import tensorflow as tf

            from tflms.baselines.recompute import checkpointed
            keras.utils.set_random_seed(0)
            model, optimizer, loss_fn = MODELS[name].build()
            ckpt = checkpointed(model)

            def make(forward):
                @tf.function
                def step(x, y):
                    with tf.GradientTape() as tape:
                        loss = loss_fn(y, forward(x, training=True))
                    grads = tape.gradient(loss, model.trainable_variables)
                    optimizer.apply_gradients(zip(grads, model.trainable_variables))
                    return loss
                return step

            # The model and optimizer must outlive the traces: a tf.function only holds weak references.
            self._built[name] = (model, optimizer, ckpt, {"plain": make(model), "recompute": make(ckpt)})
        return self._built[name]

    def checkpointing(self, name: str):
        return self._functions(name)[2]

    def graph(self, name: str, variant: str, size: int):
        """The IR graph of ``name``'s step (``variant`` plain or recompute) at ``size``, and its trace seconds."""
        from tflms.ir import tf_io
        spec = MODELS[name]
        resolution = size * UNET_RESOLUTION_STEP if spec.kind == "resolution" else None
        key = (name, variant, resolution)
        if key not in self._graphs:
            step = self._functions(name)[3][variant]
            t0 = time.perf_counter()
            concrete = step.get_concrete_function(*spec.specs(resolution))
            graph = tf_io.from_concrete_function(concrete)
            seconds = time.perf_counter() - t0
            self.trace_s += seconds
            say(f"{name}: traced the {variant} step{f' at {resolution}^3' if resolution else ''}: "
                f"{len(graph)} ops in {seconds:.1f} s")
            self._graphs[key] = (graph, seconds)
        graph, seconds = self._graphs[key]
        return graph.with_batch_size(1 if resolution else size), seconds


# ----------------------------------------------------------------------------- methods

@dataclasses.dataclass
class Probe:
    fits: bool
    sim: Any = None  # SimResult of the graph judged (None when answered without simulating)
    ops: int = 0
    seconds: float = 0.0


@dataclasses.dataclass
class MethodResult:
    method: str
    max_size: int = 0
    upper: int | None = None  # smallest size known not to fit
    probes: list = dataclasses.field(default_factory=list)
    search_s: float = 0.0
    overhead: float | None = None  # at the common size; None = does not fit there
    rewrite_s: float = 0.0
    ops: int = 0
    sim: Any = None  # at the common size
    detail: str = ""
    common: int = 0  # the common size the overhead refers to


class Evaluator:
    """Answers "does ``size`` fit with ``method``?" for one model on one profile, caching every answer."""

    def __init__(self, steps: Steps, model: str, profile, budget_bytes: int, exact: bool):
        self.steps, self.model, self.profile, self.budget = steps, model, profile, budget_bytes
        self.exact = exact  # tflms-distance probes: the tuner's whole search (True) or QUICK_DISTANCE_PROBES
        self.cache: dict[tuple[str, int], Probe] = {}

    def fits(self, method: str, size: int) -> bool:
        key = (method, size)
        if key not in self.cache:
            t0 = time.perf_counter()
            probe = getattr(self, "_" + method.replace("-", "_"))(size)
            probe.seconds = time.perf_counter() - t0
            self.cache[key] = probe
            say(f"{self.model} {self.profile.name} {method}: {self.label(size)} "
                f"{'fits' if probe.fits else 'does not fit'}"
                f"{f' (peak {probe.sim.peak_with_margin_bytes / 2**30:.2f} GiB)' if probe.sim is not None else ''}"
                f" [{probe.seconds:.1f} s]")
        return self.cache[key].fits

    def label(self, size: int) -> str:
        if MODELS[self.model].kind == "resolution":
            return f"resolution {size * UNET_RESOLUTION_STEP}^3"
        return f"batch {size}"

    def _none(self, size):
        from tflms.sim import simulate
        graph, _ = self.steps.graph(self.model, "plain", size)
        sim = simulate(graph, self.profile)
        return Probe(sim.peak_with_margin_bytes <= self.budget, sim, len(graph))

    def _tune(self, size, strategies):
        from tflms.errors import BudgetError
        from tflms.tune.tuner import tune
        graph, _ = self.steps.graph(self.model, "plain", size)
        try:
            result = tune(graph, budget=self.budget, profile=self.profile, strategies=strategies, first_fit=True)
        except BudgetError:
            return Probe(False)
        return Probe(True, result.best.sim, len(result.graph))

    def _tflms_distance(self, size):
        if self.fits("none", size):
            return Probe(True)
        if self.exact:
            return self._tune(size, ["tflms-distance"])
        from tflms.analysis.cto import analyze_graph
        from tflms.config import LMSConfig
        from tflms.passes.swaps import apply_swaps
        from tflms.policies.tflms_rules import plan_swaps
        from tflms.sim import simulate
        graph, _ = self.steps.graph(self.model, "plain", size)
        analysis = analyze_graph(graph)
        best = None
        for params in QUICK_DISTANCE_PROBES:
            plan = plan_swaps(analysis, LMSConfig(**params), accelerator_device="/device:GPU:0")
            rewritten = apply_swaps(graph, plan).graph
            sim = simulate(rewritten, self.profile)
            if best is None or sim.peak_with_margin_bytes < best.sim.peak_with_margin_bytes:
                best = Probe(sim.peak_with_margin_bytes <= self.budget, sim, len(rewritten))
            if best.fits:
                break
        return best

    def _tflms_best(self, size):
        if self.fits("tflms-distance", size):
            return Probe(True)
        return self._tune(size, list(IDLE_STRATEGIES))

    def _grappler(self, size):
        from tflms.baselines.grappler_swap import grappler_swap
        from tflms.sim import simulate
        graph, _ = self.steps.graph(self.model, "plain", size)
        result = grappler_swap(graph, self.profile, budget=self.budget)
        sim = simulate(result.graph, self.profile)
        return Probe(sim.peak_with_margin_bytes <= self.budget, sim, len(result.graph))

    def _recompute(self, size):
        from tflms.sim import simulate
        graph, _ = self.steps.graph(self.model, "recompute", size)
        sim = simulate(graph, self.profile)
        return Probe(sim.peak_with_margin_bytes <= self.budget, sim, len(graph))


def search_max(fits: Callable[[int], bool], start: int, bisect_steps: int | None,
               next_try: int | None = None) -> tuple[int, int | None]:
    """``(largest size found to fit, smallest size found not to)``.

    From ``start``: if it fits, try ``next_try`` (when larger) and then double until a
    size does not fit; if it does not, halve until one does. Then bisect
    ``bisect_steps`` times (``None``: until the two are adjacent).
    """
    start = max(1, start)
    if fits(start):
        low, high = start, None
        if next_try is not None and next_try > start:
            if fits(next_try):
                low = next_try
            else:
                high = next_try
        while high is None:
            if low * 2 > SEARCH_LIMIT:
                return low, None
            if fits(low * 2):
                low *= 2
            else:
                high = low * 2
    else:
        low, high = 0, start
        while high > 1:
            if fits(high // 2):
                low = high // 2
                break
            high //= 2
        if low == 0:
            return 0, high
    steps = 0
    while high - low > 1 and (bisect_steps is None or steps < bisect_steps):
        mid = (low + high) // 2
        steps += 1
        if fits(mid):
            low = mid
        else:
            high = mid
    return low, high


def run_model_profile(steps: Steps, model: str, profile_name: str, budget: int | None,
                      bisect_steps: int | None) -> dict[str, MethodResult]:
    from tflms.baselines.grappler_swap import grappler_swap
    from tflms.errors import BudgetError
    from tflms.passes.swaps import apply_swaps
    from tflms.sim import get_profile, simulate
    from tflms.tune.tuner import tune

    profile = get_profile(profile_name)
    budget_bytes = budget or MODELS[model].budget_bytes or profile.memory_bytes
    ev = Evaluator(steps, model, profile, budget_bytes, exact=bisect_steps is None)
    results: dict[str, MethodResult] = {}
    # Where each search starts, and the first larger size it tries (the previous method's first miss).
    plan = {"none": ("none", False), "tflms-distance": ("none", True), "tflms-best": ("tflms-distance", True),
            "grappler": ("none", True), "recompute": ("none", True)}
    for method in METHODS:
        t0 = time.perf_counter()
        if method == "none":
            start, next_try = 1, None
        else:
            ref = results[plan[method][0]]
            start, next_try = ref.max_size, ref.upper
        low, high = search_max(lambda s: ev.fits(method, s), start, bisect_steps, next_try)
        res = MethodResult(method, low, high, [(s, p.fits) for (m, s), p in ev.cache.items() if m == method],
                           time.perf_counter() - t0)
        results[method] = res
        say(f"{model} {profile_name} {method}: largest {ev.label(low)}"
            f"{f' (< {ev.label(high)})' if high is not None else ''} in {res.search_s:.1f} s")
    # Searches with different starts end at different granularities: probe the unchanged step at every
    # size another method probed inside none's open interval, then read every maximum off all probes
    # (a size none fits is fitted by tflms-distance, one tflms-distance fits by tflms-best).
    none = results["none"]
    for size in sorted({s for (_, s) in ev.cache}):
        if none.max_size < size and (none.upper is None or size < none.upper):
            ev.fits("none", size)
    implied = {"none": (), "tflms-distance": ("none",), "tflms-best": ("none", "tflms-distance"),
               "grappler": (), "recompute": ()}
    for method, r in results.items():
        known = {}
        for (m, size), probe in ev.cache.items():
            if m == method or (m in implied[method] and probe.fits):
                known[size] = known.get(size, False) or probe.fits
        fitting = [size for size, ok in known.items() if ok]
        r.max_size = max(fitting, default=0)
        failing = [size for size, ok in known.items() if not ok and size > r.max_size]
        r.upper = min(failing) if failing else (r.upper if r.upper and r.upper > r.max_size else None)
        r.probes = sorted(known.items())
    # The common size: the smallest maximum among the methods that certainly extend none's.
    extended = [r.max_size for r in results.values() if r.method != "none"
                and (none.upper is None or r.max_size >= none.upper)]
    common = max(1, min(extended) if extended else none.max_size)
    say(f"{model} {profile_name}: maxima " + ", ".join(f"{m} {ev.label(r.max_size)}" for m, r in results.items()))
    say(f"{model} {profile_name}: common {ev.label(common)}; full tune and rewrites there")
    plain, _ = steps.graph(model, "plain", common)
    baseline = simulate(plain, profile)

    def fits_overhead(sim):
        if sim is None or sim.peak_with_margin_bytes > budget_bytes:
            return None
        return sim.step_time_s / baseline.step_time_s - 1.0

    for r in results.values():
        r.common = common
        r.detail = ev.label(common)
    none.ops, none.sim, none.overhead = len(plain), baseline, fits_overhead(baseline)

    # One full tune with every strategy. The tuner runs the distance search first, so the candidates it
    # reports before the first idle-time one are exactly what tune(strategies=["tflms-distance"]) would
    # evaluate: its wall time is the time of the last of them, its choice the fastest of them that fits.
    t0 = time.perf_counter()
    stamps: list[tuple[float, str]] = []
    try:
        tuned = tune(plain, budget=budget_bytes, profile=profile,
                     progress=lambda msg: stamps.append((time.perf_counter() - t0, msg)))
    except BudgetError as err:
        tuned, error = None, str(err)
    total = time.perf_counter() - t0
    best, dist = results["tflms-best"], results["tflms-distance"]
    best.rewrite_s = total
    distance_stamps = [t for t, msg in stamps if msg.startswith("tflms-distance ")]
    dist.rewrite_s = distance_stamps[-1] if distance_stamps else total
    if tuned is None:
        best.detail += f"; {error[:120]}"
        dist.detail += "; nothing fits"
    else:
        best.overhead, best.ops, best.sim = fits_overhead(tuned.best.sim), len(tuned.graph), tuned.best.sim
        best.detail += f"; chose {tuned.strategy} {tuned.best.params}"
        choices = [c for c in tuned.candidates if c.fits and c.strategy in ("none", "tflms-distance")]
        if choices:
            pick = min(choices, key=lambda c: (c.sim.step_time_s, c.swapped_bytes))
            graph = plain if pick.plan is None else apply_swaps(plain, pick.plan).graph
            dist.overhead, dist.ops, dist.sim = fits_overhead(pick.sim), len(graph), pick.sim
            dist.detail += f"; chose {pick.strategy} {pick.params}"
        else:
            dist.detail += "; nothing fits"
    say(f"{model} {profile_name}: full tune in {total:.1f} s ({len(stamps)} candidates): "
        f"distance {'-' if dist.overhead is None else f'{100 * dist.overhead:+.1f}%'}, "
        f"best {'-' if best.overhead is None else f'{100 * best.overhead:+.1f}%'}")

    r = results["grappler"]
    swapped = grappler_swap(plain, profile, budget=budget_bytes)
    r.sim = simulate(swapped.graph, profile)
    r.rewrite_s, r.ops, r.overhead = swapped.total_s, len(swapped.graph), fits_overhead(r.sim)
    r.detail += f"; {len(swapped.swaps)} swaps of {swapped.swapped_bytes / 2**30:.2f} GiB"
    r = results["recompute"]
    graph, trace_s = steps.graph(model, "recompute", common)
    r.sim = simulate(graph, profile)
    r.rewrite_s, r.ops, r.overhead = trace_s, len(graph), fits_overhead(r.sim)
    r.detail += f"; {len(steps.checkpointing(model).segments)} segments"
    return results


# ----------------------------------------------------------------------------- output

def records_for(model: str, profile: str, results: dict[str, MethodResult]) -> list[dict]:
    unit = 1 if MODELS[model].kind == "batch" else UNET_RESOLUTION_STEP
    out = []
    for method in METHODS:
        r = results[method]
        out.append({
            "model": model, "profile": profile, "method": method,
            "max_batch": r.max_size * unit,
            "overhead_pct": None if r.overhead is None else round(100 * r.overhead, 2),
            "rewrite_s": round(r.rewrite_s, 3),
            "ops": r.ops,
            "unit": "batch" if unit == 1 else "resolution (cubic side, batch 1)",
            "max_batch_upper": None if r.upper is None else r.upper * unit,
            "common_batch": r.common * unit,
            "search_s": round(r.search_s, 2),
            "peak_bytes_at_common": None if r.sim is None else r.sim.peak_with_margin_bytes,
            "step_ms_at_common": None if r.sim is None else round(1e3 * r.sim.step_time_s, 3),
            "probes": [[s * unit, f] for s, f in sorted(r.probes)],
            "detail": r.detail,
        })
    return out


def _ratio(record: dict, base: dict) -> str:
    if not base["max_batch"]:
        return "-"
    ratio = record["max_batch"] / base["max_batch"]
    if record["unit"] != "batch":  # resolution: compare voxels
        return f"{ratio ** 3:.2f}x vox"
    return f"{ratio:.2f}x"


def markdown(records: list[dict], *, command: str, mode: str, elapsed_s: float, plots: dict[str, str]) -> str:
    import tensorflow as tf
    models = list(dict.fromkeys(r["model"] for r in records))
    profiles = list(dict.fromkeys(r["profile"] for r in records))
    by = {(r["model"], r["profile"], r["method"]): r for r in records}
    lines = [
        "# Benchmark results: tflms beside the alternatives",
        "",
        "Produced by",
        "",
        f"    {command}",
        "",
        f"on {datetime.date.today().isoformat()} ({mode} mode, {elapsed_s / 60:.1f} min wall time; "
        f"{os.cpu_count()} CPU cores, Python {platform.python_version()}, TensorFlow {tf.__version__}). "
        "Every number below is **predicted by the tflms simulator** (`tflms.sim.simulate`) from the traced "
        "training step and the hardware profile; nothing ran on a GPU. The papers' figures at the end are "
        "**reported** by their authors, not measured here.",
        "",
        "## Methods",
        "",
        "| method | what runs |",
        "|---|---|",
        "| `none` | the traced step unchanged |",
        "| `tflms-distance` | tflms, TFLMS's distance rules only: `tune(..., strategies=[\"tflms-distance\"])` "
        "(swap-out threshold, swap-in ahead/group-by, sync mode searched by simulation) |",
        "| `tflms-best` | tflms, every tuner strategy (`tflms.tune.tuner.STRATEGIES`: distance rules, "
        "idle-time, idle-time-no-overhead); the fastest fitting rewrite wins |",
        "| `grappler` | TensorFlow grappler's memory optimizer alone, `RewriterConfig.SWAPPING_HEURISTICS`, via "
        "`tf_optimizer.OptimizeGraph` on a virtual cluster whose GPU has the profile's memory, FLOP/s and memory "
        "bandwidth (`tflms.baselines.grappler_swap`); its `_CopyFromGpuToHost`/`_CopyFromHostToGpu` pairs are "
        "read back into the IR and simulated as device-to-host / host-to-device copies |",
        "| `recompute` | gradient checkpointing of the same Keras model: sqrt(n) equal segments of its layer calls, "
        "each under `tf.recompute_grad` (`tflms.baselines.recompute`), traced as its own step |",
        "",
        "Columns: **max** is the largest batch that fits the profile's memory (for `unet3d`: the largest cubic "
        "resolution at batch 1; its ratio is in voxels); **overhead** is the predicted step time at the *common "
        "batch* relative to the unchanged step on a GPU with unlimited memory (the common batch is the smallest "
        "of the maxima that exceed `none`'s, so every method that extends the batch runs there; `-` = does not "
        "fit there); **rewrite s** is the wall time of the tune or rewrite that produced the graph at the common "
        "batch (tflms: one full tune; grappler: export + OptimizeGraph + read-back; recompute: tracing the "
        "checkpointed step); **ops** is that graph's size.",
        "",
    ]
    for profile in profiles:
        lines += [f"## {profile}", "",
                  "| model | common | " + " | ".join(f"{m} max (x none)" for m in METHODS) + " |",
                  "|---|---|" + "---|" * len(METHODS)]
        for model in models:
            if (model, profile, "none") not in by:
                continue
            base = by[(model, profile, "none")]
            cells = []
            for m in METHODS:
                r = by[(model, profile, m)]
                cell = f"{r['max_batch']}{'+' if r['max_batch_upper'] is None else ''}"
                cells.append(cell if m == "none" else f"{cell} ({_ratio(r, base)})")
            lines.append(f"| {model} | {base['common_batch']} | " + " | ".join(cells) + " |")
        lines += ["", "| model | method | max | upper | overhead at common | peak at common | rewrite s | ops | "
                  "search s | detail |", "|---|---|---|---|---|---|---|---|---|---|"]
        for model in models:
            for m in METHODS:
                r = by.get((model, profile, m))
                if r is None:
                    continue
                overhead = "-" if r["overhead_pct"] is None else f"{r['overhead_pct']:+.1f}%"
                peak = "-" if r["peak_bytes_at_common"] is None else f"{r['peak_bytes_at_common'] / 2**30:.2f} GiB"
                lines.append(f"| {model} | {m} | {r['max_batch']} | {r['max_batch_upper'] or '-'} | {overhead} | "
                             f"{peak} | {r['rewrite_s']:.1f} | {r['ops']} | {r['search_s']:.1f} | {r['detail']} |")
        lines.append("")
    lines += ["## Reported by the papers (not measured here)", "",
              "| source | setting | reported | ours (tflms-best, simulated) |", "|---|---|---|---|"]
    for source, setting, figure, model, kind in REPORTED:
        ours = []
        for profile in profiles:
            r, base = by.get((model, profile, "tflms-best")), by.get((model, profile, "none"))
            if r and base and kind == "ratio":
                ours.append(f"{profile}: {_ratio(r, base)} ({base['max_batch']} -> {r['max_batch']})")
            elif r and kind == "overhead":
                overhead = "does not fit" if r["overhead_pct"] is None else f"{r['overhead_pct']:+.1f}%"
                ours.append(f"{profile}: {overhead} at batch {r['common_batch']}")
        lines.append(f"| {source} | {setting} | {figure} (reported) | {'; '.join(ours) or 'n/a'} |")
    lines += ["", "The papers ran on other hardware (TFLMS: POWER9 + V100 over NVLink; vDNN: Titan X over PCIe 3) "
              "with their own batch-size steps and allocators; compare trends, not digits.", ""]
    if plots:
        lines += ["## Memory timelines", "",
                  "Accelerator memory over one simulated step at the common batch: the unchanged step (`none`, which "
                  "may exceed the budget there) against each method; the dashed line is the budget.", ""]
        for key, path in plots.items():
            lines.append(f"![{key}]({path})")
        lines.append("")
    lines += ["## How the numbers were produced", "",
              "- Search: doubling from a known fit until a size does not fit, then bisection. `none` starts at 1; "
              "`tflms-distance`, `grappler` and `recompute` start at `none`'s maximum, `tflms-best` at "
              "`tflms-distance`'s (sizes the unchanged step fits are fitted by tflms without tuning); each tries "
              "the previous method's first miss before doubling. "
              + (f"Quick mode bisects {QUICK_BISECT_STEPS} times: a maximum is a size that fits, and **upper** "
                 "(the smallest size found not to fit) is at most 1/8 above it." if mode == "quick"
                 else "Full mode bisects until **upper** (the smallest size found not to fit) = max + 1.")
              + " Every maximum is then read off all probes of the run (a size `none` fits counts for the tflms "
              "methods, one `tflms-distance` fits for `tflms-best`), and `none` is probed at the other methods' "
              "sizes inside its last interval, so that all methods are compared at the same resolution.",
              "- tflms probes (does anything fit at this size?): "
              + ("`tflms-distance` simulates the tuner's two most aggressive distance candidates (swap-out "
                 "threshold 1, asynchronous and fully synchronous): a fit is exact (the tuner tries them too), a "
                 "miss could hide another fitting candidate, so the maximum is a lower bound; "
                 if mode == "quick" else "`tflms-distance` runs `tune(strategies=[\"tflms-distance\"], "
                 "first_fit=True)`; ")
              + f"`tflms-best` runs `tune(strategies={json.dumps(list(IDLE_STRATEGIES))}, first_fit=True)` "
              "where the distance rules miss. One full tune with every strategy runs at the common batch; the "
              "tuner evaluates the distance candidates first, so `tflms-distance`'s choice and wall time are "
              "read off the same run (its fastest fitting distance candidate, the time of its last one).",
              f"- The 3D U-Net is re-traced at every probed resolution (multiples of {UNET_RESOLUTION_STEP}, "
              "batch 1); each trace is cached for the run. Batch models are traced once with an unknown batch "
              "dimension and re-sized in the IR (`Graph.with_batch_size`).",
              "- grappler decides from its own static memory estimate, not the simulator's: it counts every output "
              "as a fresh allocation (no buffer forwarding), so it is larger where grappler knows every shape, "
              "and it counts a dimension its shape inference cannot resolve as 1, so it is far smaller there "
              "(BERT's attention tensors: 6.9 GiB estimated vs 56 GiB simulated at batch 67, and no swaps). It "
              "swaps only consumers that run after its estimated peak, only tensors live for over 1 ms of its "
              "virtual time, and runs one swapping pass (`SwappingPass` never reports an update, so its 25-pass "
              "loop stops after one). Its choice can differ from run to run by a few swaps (seen on the 3D U-Net: "
              "45 or 46 swaps at 160^3), probably from iterating hash maps keyed by node pointers.",
              "- Recomputation runs each checkpointed layer twice: BatchNormalization updates its moving "
              "statistics twice per step and Dropout (BERT) draws new masks when recomputed.",
              ""]
    return "\n".join(lines)


def plot_timelines(path: pathlib.Path, model: str, profile: str, results: dict[str, MethodResult],
                   budget_bytes: int, label: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib is not installed: no plots (pip install -e \".[plot]\")")
        return False
    fig, ax = plt.subplots(figsize=(9, 4.2))
    styles = {"none": ("black", 1.6), "tflms-distance": ("tab:green", 1.0), "tflms-best": ("tab:blue", 1.2),
              "grappler": ("tab:orange", 1.0), "recompute": ("tab:purple", 1.0)}
    same = results["tflms-best"].sim is not None and results["tflms-best"].sim is results["tflms-distance"].sim
    for method in METHODS:
        sim = results[method].sim
        if sim is None or (method == "tflms-distance" and same):
            continue
        t = [1e3 * p[0] for p in sim.timeline]
        gib = [p[1] / 2**30 for p in sim.timeline]
        color, width = styles[method]
        ax.step(t, gib, where="post", color=color, linewidth=width,
                label=f"{method}{' = tflms-distance' if method == 'tflms-best' and same else ''} "
                      f"(peak {sim.peak_bytes / 2**30:.1f} GiB, step {1e3 * sim.step_time_s:.0f} ms)")
    ax.axhline(budget_bytes / 2**30, color="red", linestyle="--", linewidth=1, label="budget")
    ax.set_xlabel("simulated time in the step (ms)")
    ax.set_ylabel("accelerator memory (GiB)")
    ax.set_title(f"{model} on {profile} at {label} (simulated)")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="every model on every profile, exact bisection")
    parser.add_argument("--models", help=f"comma-separated, from {', '.join(ALL_MODELS)}")
    parser.add_argument("--profiles", help="comma-separated hardware profiles")
    parser.add_argument("--budget", help="accelerator budget for every profile instead of its memory (e.g. 64MiB)")
    parser.add_argument("--bisect-steps", type=int, default=None,
                        help=f"bisection steps after doubling (quick default {QUICK_BISECT_STEPS}; --full: exact)")
    parser.add_argument("--json", action="store_true", help="print JSON records instead of the Markdown report")
    parser.add_argument("--results", help="write the Markdown report here (default docs/results.md without --json)")
    parser.add_argument("--plots", help="directory for timeline PNGs (default docs/plots without --json)")
    args = parser.parse_args(argv)

    from tflms.sim import get_profile
    from tflms.units import parse_bytes

    models = args.models.split(",") if args.models else list(FULL_MODELS if args.full else QUICK_MODELS)
    profiles = args.profiles.split(",") if args.profiles else list(FULL_PROFILES if args.full else QUICK_PROFILES)
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(ALL_MODELS)}")
    for p in profiles:
        get_profile(p)
    budget = parse_bytes(args.budget, what="--budget") if args.budget else None
    bisect_steps = args.bisect_steps if args.bisect_steps is not None else (None if args.full else QUICK_BISECT_STEPS)
    mode = "full" if bisect_steps is None else "quick"
    results_path = args.results or (None if args.json else str(REPO / "docs" / "results.md"))
    plots_dir = args.plots or (None if args.json else str(REPO / "docs" / "plots"))

    t_start = time.perf_counter()
    steps = Steps()
    records, plots = [], {}
    for model in models:
        for profile in profiles:
            say(f"=== {model} on {profile}")
            results = run_model_profile(steps, model, profile, budget, bisect_steps)
            recs = records_for(model, profile, results)
            records += recs
            if plots_dir:
                path = pathlib.Path(plots_dir) / f"{model}_{profile}.png"
                common = recs[0]["common_batch"]
                label = f"batch {common}" if recs[0]["unit"] == "batch" else f"resolution {common}^3, batch 1"
                if plot_timelines(path, model, profile, results, budget or MODELS[model].budget_bytes or get_profile(profile).memory_bytes,
                                  label):
                    try:
                        rel = os.path.relpath(path, pathlib.Path(results_path).parent if results_path else REPO)
                    except ValueError:
                        rel = str(path)
                    plots[f"{model} on {profile}"] = rel
    elapsed = time.perf_counter() - t_start
    say(f"done in {elapsed:.0f} s ({steps.trace_s:.0f} s tracing)")
    command = "python tools/bench.py" + ("" if argv is None and len(sys.argv) == 1 else " " + shlex.join(
        sys.argv[1:] if argv is None else argv))
    if args.json:
        print(json.dumps(records, indent=2))
    report = markdown(records, command=command, mode=mode, elapsed_s=elapsed, plots=plots)
    if not args.json:
        print(report)
    if results_path:
        pathlib.Path(results_path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(results_path).write_text(report + "\n")
        say(f"wrote {results_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

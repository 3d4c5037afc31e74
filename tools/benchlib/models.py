"""The benchmark models (Keras applications, a 3D U-Net, a BERT-like encoder, a tiny MLP) and their traced steps.

The builders (:class:`ModelSpec` ``build`` and ``sized``, :func:`build_bert`, :func:`dtype_policy_scope`) import
Keras alone, never TensorFlow: tools/gpu_step.py runs them under Keras 3's JAX backend on a GPU machine that has no
TensorFlow. The input specs and :class:`Steps` (the traced steps) are TensorFlow's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from .common import KERAS_REMAT_MODES, UNET_DEPTH, say, shape_label, unet_shape, voxels


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
    """How to build a model's training step.

    ``kind``: "batch", or "resolution": batch 1, a volume ``(D, H, W)`` per size index
    (:func:`benchlib.common.unet_shape`).
    """

    name: str
    kind: str
    description: str
    build: Callable[[], tuple[Any, Any, Any]]  # -> (keras model, optimizer, loss_fn)
    specs: Callable[[tuple[int, int, int] | None], tuple[Any, Any]]  # volume (or None) -> (x, y specs), batch unknown
    budget_bytes: int | None = None  # judged against this instead of the profile's memory (unless --budget)
    #: Keras dtype policy the model is built and its step traced under (``keras.config.set_dtype_policy``, restored
    #: afterwards: :func:`dtype_policy_scope`); ``None``: the global policy as it is (float32).
    dtype_policy: str | None = None
    #: ``sized(**sizes)`` -> a ``build`` of the same model, optimizer and loss at other sizes (``side=`` for the
    #: image classifiers, :func:`build_bert`'s keywords for BERT); ``sized()`` builds what ``build`` does. ``None``:
    #: the model has one size. tools/gpu_step.py's dry run builds the bench's models small with it.
    sized: Callable[..., Callable[[], tuple[Any, Any, Any]]] | None = None


@contextlib.contextmanager
def dtype_policy_scope(policy: str | None):
    """Keras's global dtype policy set to ``policy`` inside the block, the previous one restored after it (also
    when the block raises); ``None`` changes nothing. Layers take the policy when they are constructed, and
    TensorFlow traces a step's ops when ``get_concrete_function`` runs: both run inside the scope."""
    if policy is None:
        yield
        return
    import keras
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _image_specs(side: int, channels: int = 3):
    def specs(_):
        import tensorflow as tf  # here, not when MODELS is defined: the builders run without TensorFlow
        return tf.TensorSpec((None, side, side, channels), tf.float32), tf.TensorSpec((None,), tf.int32)
    return specs


def _classifier(app: str, side: int):
    def build():
        import keras
        model = getattr(keras.applications, app)(weights=None, input_shape=(side, side, 3), classes=1000)
        return (model, keras.optimizers.SGD(0.01, momentum=0.9),
                keras.losses.SparseCategoricalCrossentropy(from_logits=False))
    return build


def _sized_classifier(app: str, side: int):
    """``sized`` of a Keras application: ``side=`` other than the bench's ``side``."""
    return lambda *, side=side: _classifier(app, side)


def _unet():
    import keras

    from tflms.models import build_unet3d
    model = build_unet3d(channels=4, classes=4, base_filters=32, depth=UNET_DEPTH)
    return model, keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy()


def _unet_specs(shape):
    from tflms.models import unet3d_input_specs
    return unet3d_input_specs(shape, channels=4, depth=UNET_DEPTH)


def _sized_bert(**sizes):
    """``sized`` of bert-base: :func:`build_bert`'s keywords (the bench's defaults where none is given)."""
    def build():
        import keras
        return (build_bert(**sizes), keras.optimizers.Adam(1e-4),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return build


_bert = _sized_bert()


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


def _mixed_precision(base_build, policy: str):
    """``base_build`` for a model built under ``policy``. Under ``mixed_float16`` the optimizer is wrapped in
    ``keras.optimizers.LossScaleOptimizer`` and the loss scaled by it (``optimizer.scale_loss``), as Keras's own
    ``Model.compile``/``train_step`` do; ``mixed_bfloat16`` needs no loss scaling (float32's exponent range)."""
    def build():
        import keras
        model, optimizer, loss_fn = base_build()
        if policy != "mixed_float16":
            return model, optimizer, loss_fn
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)

        def scaled_loss(y_true, y_pred):
            return optimizer.scale_loss(loss_fn(y_true, y_pred))
        return model, optimizer, scaled_loss
    return build


#: Mixed-precision rows (issue 28): name -> (the float32 model it is built from, Keras dtype policy).
MIXED_PRECISION = {"resnet50-amp-fp16": ("resnet50", "mixed_float16"),
                   "resnet50-amp-bf16": ("resnet50", "mixed_bfloat16"),
                   "bert-base-amp-bf16": ("bert-base", "mixed_bfloat16")}

MODELS = {
    "resnet50": ModelSpec("resnet50", "batch", "Keras ResNet-50, 224x224x3, 1000 classes, SGD momentum",
                          _classifier("ResNet50", 224), _image_specs(224),
                          sized=_sized_classifier("ResNet50", 224)),
    "vgg16": ModelSpec("vgg16", "batch", "Keras VGG-16, 224x224x3, 1000 classes, SGD momentum",
                       _classifier("VGG16", 224), _image_specs(224),
                       sized=_sized_classifier("VGG16", 224)),
    "densenet121": ModelSpec("densenet121", "batch", "Keras DenseNet-121, 224x224x3, 1000 classes, SGD momentum",
                             _classifier("DenseNet121", 224), _image_specs(224),
                             sized=_sized_classifier("DenseNet121", 224)),
    "inception_v3": ModelSpec("inception_v3", "batch", "Keras Inception-v3, 299x299x3, 1000 classes, SGD momentum",
                              _classifier("InceptionV3", 299), _image_specs(299),
                              sized=_sized_classifier("InceptionV3", 299)),
    "unet3d": ModelSpec("unet3d", "resolution", "3D U-Net (tflms.models.build_unet3d), 4 levels, 32 base filters, "
                        "4 channels, 4 classes, batch 1, Adam", _unet, _unet_specs),
    "bert-base": ModelSpec("bert-base", "batch", "BERT-base-like encoder (12 x 768, 12 heads, FFN 3072, "
                           "sequence 512, vocab 30522), [CLS] classifier, Adam", _bert, _bert_specs,
                           sized=_sized_bert),
    "mlp-tiny": ModelSpec("mlp-tiny", "batch", "4 x Dense(512) MLP for tests (budget 64 MiB), SGD momentum",
                          _mlp_tiny, _mlp_specs, budget_bytes=64 * 2**20),
}


def mixed_precision_spec(base: ModelSpec, name: str, policy: str) -> ModelSpec:
    """``base`` built and traced under the Keras dtype policy ``policy`` (e.g. ``mixed_float16``), named ``name``."""
    sized = base.sized and (lambda **sizes: _mixed_precision(base.sized(**sizes), policy))
    return dataclasses.replace(base, name=name, build=_mixed_precision(base.build, policy), dtype_policy=policy,
                               sized=sized,
                               description=f"{base.description}; Keras mixed precision {policy}"
                                           + (" (loss scaling)" if policy == "mixed_float16" else ""))


MODELS.update({name: mixed_precision_spec(MODELS[base], name, policy)
               for name, (base, policy) in MIXED_PRECISION.items()})


def size_label(name: str, size: int) -> str:
    """``size`` of model ``name`` as the report shows it: the batch, or the volume (``208x192x192``, ``192^3``).

    Size 0 (nothing fits) is ``"0"`` for every model.
    """
    return shape_label(unet_shape(size)) if MODELS[name].kind == "resolution" and size else str(size)


def size_amount(name: str, size: int) -> int:
    """What ratios of ``name``'s sizes compare: the batch, or the volume's voxels (batch 1); 0 for size 0."""
    return voxels(unet_shape(size)) if MODELS[name].kind == "resolution" and size else size


def parse_sizes(text: str) -> dict[str, int]:
    """``"vgg16=256,unet3d=160^3"`` -> ``{"vgg16": 256, "unet3d": <size index of 160^3>}`` (``bench.py --at``).

    A batch model takes a positive batch; ``unet3d`` a volume of the benchmark's sequence, ``160^3`` or
    ``208x192x192`` (:func:`benchlib.common.unet_index`). Raises ``ValueError`` naming the bad item.
    """
    from .common import unet_index
    sizes: dict[str, int] = {}
    for item in text.split(","):
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not name or not value:
            raise ValueError(f"--at: {item!r} is not MODEL=SIZE (e.g. vgg16=256 or unet3d=160^3)")
        if name not in MODELS:
            raise ValueError(f"--at: unknown model {name!r} in {item!r}; choose from {', '.join(MODELS)}")
        if name in sizes:
            raise ValueError(f"--at: model {name!r} given twice ({item!r}); one size per model")
        if MODELS[name].kind == "resolution":
            try:
                sides = (int(value[:-2]),) * 3 if value.endswith("^3") else tuple(int(v) for v in value.split("x"))
                sizes[name] = unet_index(sides)
            except ValueError as err:
                raise ValueError(f"--at: {item!r}: {name}'s size is a volume such as 160^3 or 208x192x192 "
                                 f"({err})") from None
        else:
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"--at: {item!r}: {name}'s size is a batch, a whole number >= 1")
            sizes[name] = int(value)
    return sizes


#: The steps :class:`Steps` traces: the model as built, and one per method judged as its own step.
VARIANTS = ("plain", "checkpoint-segments", *KERAS_REMAT_MODES)


class VariantError(RuntimeError):
    """A step variant (a model built under ``keras.RematScope``, the checkpointed model) that could not be built or
    traced. ``line`` is what the bench reports instead of a number: the error's type and first telling line."""

    def __init__(self, model: str, variant: str, line: str):
        super().__init__(f"{model}: the {variant} step failed: {line}")
        self.model, self.variant, self.line = model, variant, line


def error_line(err: BaseException) -> str:
    """``"ValueError: <first telling line>"``: the line of ``err``'s message a report row can show.

    TensorFlow prefixes errors raised while tracing with ``in user code:`` and a traceback, and Keras wraps a
    layer's error in ``Exception encountered when calling ...``, the original message set in bold (ANSI): the
    bold text's first line when there is one, else the first line that is neither preamble nor traceback.
    """
    import re
    text = str(err)
    bold = re.search(r"\x1b\[1m(.*?)\x1b\[0m", text, re.S)
    if bold and bold.group(1).strip():
        line = bold.group(1).strip().splitlines()[0]
    else:
        lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()]
        lines = [ln for ln in lines if ln and ln != "in user code:" and not ln.startswith("File ")]
        line = lines[0] if lines else "(no message)"
    return f"{type(err).__name__}: {line.strip()}"


class Steps:
    """Builds each model once per variant and caches the traced IR graph of each (variant, volume).

    Variants: ``plain`` (the model as built), ``checkpoint-segments`` (the same model run in sqrt(n)
    segments under ``tf.recompute_grad``, tflms.baselines.recompute) and, per :data:`KERAS_REMAT_MODES`,
    ``keras-remat``/``keras-remat-activations``: the model built again, from the same seed, under
    ``keras.RematScope(mode=...)`` (Keras decides at layer construction which calls it rematerializes).
    A variant other than ``plain`` that fails to build or trace raises :class:`VariantError`, cached.
    """

    def __init__(self) -> None:
        self._built: dict[str, tuple] = {}
        self._remat: dict[tuple[str, str], tuple] = {}
        self._graphs: dict[tuple, tuple[Any, float]] = {}
        self._failed: dict[tuple, VariantError] = {}
        self.trace_s = 0.0

    def _functions(self, name: str):
        if name not in self._built:
            import keras
            import tensorflow as tf

            from tflms.baselines.recompute import checkpointed
            from tflms.testing import make_train_step
            keras.utils.set_random_seed(0)
            with dtype_policy_scope(MODELS[name].dtype_policy):
                model, optimizer, loss_fn = MODELS[name].build()
                ckpt = checkpointed(model)

            def make(forward):
                return tf.function(make_train_step(model, optimizer, loss_fn, forward=forward))

            # The model and optimizer must outlive the traces: a tf.function only holds weak references.
            self._built[name] = (model, optimizer, ckpt, {"plain": make(model), "checkpoint-segments": make(ckpt)})
        return self._built[name]

    def _remat_step(self, name: str, variant: str):
        """The training step of ``name`` built under ``keras.RematScope(mode=KERAS_REMAT_MODES[variant])``."""
        if (name, variant) not in self._remat:
            import keras
            import tensorflow as tf

            from tflms.testing import make_train_step
            keras.utils.set_random_seed(0)
            with dtype_policy_scope(MODELS[name].dtype_policy), keras.RematScope(mode=KERAS_REMAT_MODES[variant]):
                model, optimizer, loss_fn = MODELS[name].build()
            self._remat[(name, variant)] = (model, optimizer,
                                            tf.function(make_train_step(model, optimizer, loss_fn)))
        return self._remat[(name, variant)][2]

    def checkpointing(self, name: str):
        return self._functions(name)[2]

    def _step(self, name: str, variant: str):
        return self._remat_step(name, variant) if variant in KERAS_REMAT_MODES else self._functions(name)[3][variant]

    def graph(self, name: str, variant: str, size: int):
        """The IR graph of ``name``'s step (``variant``: see the class) at ``size``, and its trace seconds.

        ``size``: the batch, or for a resolution model the size index of its volume (:func:`unet_shape`).
        Raises :class:`VariantError` (the same one again on later calls) when a variant other than ``plain``
        cannot be built or traced.
        """
        from tflms.ir import tf_io
        spec = MODELS[name]
        shape = unet_shape(size) if spec.kind == "resolution" else None
        if variant not in VARIANTS:
            raise ValueError(f"Steps.graph: unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
        key = (name, variant, shape)
        if key in self._failed:
            raise self._failed[key]
        if key not in self._graphs:
            t0 = time.perf_counter()
            try:
                with dtype_policy_scope(spec.dtype_policy):
                    step = self._step(name, variant)
                    concrete = step.get_concrete_function(*spec.specs(shape))
                graph = tf_io.from_concrete_function(concrete)
            except Exception as err:  # noqa: BLE001 - any failure of a variant is a result the bench reports
                if variant == "plain":
                    raise
                failure = VariantError(name, variant, error_line(err))
                self._failed[key] = failure
                say(f"{name}: the {variant} step{f' at {shape_label(shape)}' if shape else ''} failed: "
                    f"{failure.line}")
                raise failure from err
            seconds = time.perf_counter() - t0
            self.trace_s += seconds
            say(f"{name}: traced the {variant} step{f' at {shape_label(shape)}' if shape else ''}: "
                f"{len(graph)} ops in {seconds:.1f} s")
            self._graphs[key] = (graph, seconds)
        graph, seconds = self._graphs[key]
        return graph.with_batch_size(1 if shape else size), seconds

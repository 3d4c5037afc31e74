"""A small model zoo: Keras models that exercise what grappler rewrites, built from a seed.

Each builder takes ``seed`` (``keras.utils.set_random_seed`` before any layer is
made, so two calls give bitwise-identical initial weights) and small sizes, and
returns an uncompiled functional ``keras.Model`` whose output is ``classes``
logits:

- ``mlp``: Dense + ReLU layers (MatMul + BiasAdd + Relu: a remapper fusion);
- ``cnn``: Conv2D with bias + ReLU blocks (Conv2D + BiasAdd + Relu: fused);
- ``residual``: ResNet-style blocks (conv, conv, Add with the skip, ReLU);
- ``add_tree``: branches summed by a many-input ``Add`` (an add tree the
  arithmetic optimizer turns into ``AddN``);
- ``layernorm_gelu``: Dense + LayerNormalization + Dense(gelu) with a residual;
- ``mha_block``: ``MultiHeadAttention`` + ``Add`` + ``LayerNormalization`` +
  ``Dense(gelu)`` on a float sequence;
- ``bert``: a BERT-style encoder: token + position embeddings, several
  post-LN transformer layers, attention masked by the padding (token id 0),
  a tanh pooler on the first token;
- ``bert_dropout_bn``: the same with BERT's dropout (0.1: Keras 3's seeded, stateless random
  masks) and a BatchNormalization on the pooled output (moving statistics updated every step);
- ``accumulated``: a 1x1 Conv2D + ReLU read by several activations that are
  added: at 256x256 and batch 4 the sum and the map's gradient are ``AddN`` s of
  64 MiB tensors, big enough (on a CPU device) for grappler's memory optimizer
  to turn them into ``TemporaryVariable`` accumulators with three activations.

:func:`make_batches` makes fixed data for any of them (integer tokens with
padding for ``bert``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np


def _keras(seed: int):
    import keras
    keras.utils.set_random_seed(seed)
    return keras


def mlp(*, seed: int = 0, input_dim: int = 32, width: int = 64, depth: int = 3, classes: int = 5):
    keras = _keras(seed)
    inputs = keras.Input((input_dim,), name="x")
    h = inputs
    for i in range(depth):
        h = keras.layers.Dense(width, activation="relu", name=f"dense_{i}")(h)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(h), name="zoo_mlp")


def cnn(*, seed: int = 0, size: int = 16, channels: int = 3, filters: tuple[int, ...] = (8, 16), classes: int = 5):
    keras = _keras(seed)
    inputs = keras.Input((size, size, channels), name="x")
    h = inputs
    for i, f in enumerate(filters):
        h = keras.layers.Conv2D(f, 3, padding="same", activation="relu", name=f"conv_{i}")(h)
        h = keras.layers.MaxPooling2D(name=f"pool_{i}")(h)
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(h), name="zoo_cnn")


def residual(*, seed: int = 0, size: int = 16, channels: int = 3, filters: int = 8, blocks: int = 2,
             classes: int = 5):
    keras = _keras(seed)
    inputs = keras.Input((size, size, channels), name="x")
    h = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name="stem")(inputs)
    for i in range(blocks):
        r = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"block{i}_conv1")(h)
        r = keras.layers.Conv2D(filters, 3, padding="same", name=f"block{i}_conv2")(r)
        h = keras.layers.Add(name=f"block{i}_add")([h, r])
        h = keras.layers.ReLU(name=f"block{i}_relu")(h)
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(h), name="zoo_residual")


def residual_bn(*, seed: int = 0, size: int = 16, channels: int = 3, filters: int = 8, blocks: int = 2,
                classes: int = 10):
    """Residual blocks of conv (no bias) + BatchNormalization + ReLU, a max pool, a Dense head.

    The CNN the tuner's regression cases and the incremental-analysis tests trace
    (not in :data:`MODEL_BUILDERS`: its layer and model names are Keras defaults
    or ``b{i}_*``, as those tests have always had them).
    """
    keras = _keras(seed)
    layers = keras.layers
    inputs = keras.Input((size, size, channels))
    h = layers.Conv2D(filters, 3, padding="same", name="stem")(inputs)
    for blk in range(blocks):
        y = layers.ReLU(name=f"b{blk}_relu")(layers.BatchNormalization(name=f"b{blk}_bn")(
            layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"b{blk}_conv")(h)))
        h = layers.Add(name=f"b{blk}_add")([h, y])
    h = layers.MaxPooling2D(name="pool")(h)
    return keras.Model(inputs, layers.Dense(classes, name="logits")(layers.GlobalAveragePooling2D(name="gap")(h)))


def add_tree(*, seed: int = 0, input_dim: int = 16, width: int = 32, branches: int = 4, classes: int = 5):
    keras = _keras(seed)
    inputs = keras.Input((input_dim,), name="x")
    stem = keras.layers.Dense(width, activation="relu", name="stem")(inputs)
    parts = [keras.layers.Dense(width, name=f"branch_{i}")(stem) for i in range(branches)]
    h = keras.layers.Add(name="sum")(parts + [stem])
    h = keras.layers.ReLU(name="relu")(h)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(h), name="zoo_add_tree")


def layernorm_gelu(*, seed: int = 0, input_dim: int = 16, width: int = 32, depth: int = 2, classes: int = 5):
    keras = _keras(seed)
    inputs = keras.Input((input_dim,), name="x")
    h = keras.layers.Dense(width, name="proj")(inputs)
    for i in range(depth):
        f = keras.layers.Dense(2 * width, activation="gelu", name=f"ff{i}_up")(h)
        f = keras.layers.Dense(width, name=f"ff{i}_down")(f)
        h = keras.layers.LayerNormalization(name=f"ln_{i}")(keras.layers.Add(name=f"add_{i}")([h, f]))
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(h), name="zoo_layernorm_gelu")


def _transformer_layer(keras, h, mask, *, width: int, heads: int, ff: int, name: str, dropout: float = 0.0):
    """Post-LN transformer layer (as in BERT): attention, Add, LayerNorm, Dense(gelu), Dense, Add, LayerNorm;
    with ``dropout``, BERT's dropouts: on the attention probabilities and on each residual branch."""
    a = keras.layers.MultiHeadAttention(heads, width // heads, dropout=dropout, name=f"{name}_mha")(
        h, h, attention_mask=mask)
    if dropout:
        a = keras.layers.Dropout(dropout, name=f"{name}_attn_dropout")(a)
    h = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{name}_ln1")(keras.layers.Add(name=f"{name}_add1")([h, a]))
    f = keras.layers.Dense(ff, activation="gelu", name=f"{name}_ff_up")(h)
    f = keras.layers.Dense(width, name=f"{name}_ff_down")(f)
    if dropout:
        f = keras.layers.Dropout(dropout, name=f"{name}_ff_dropout")(f)
    h = keras.layers.Add(name=f"{name}_add2")([h, f])
    return keras.layers.LayerNormalization(epsilon=1e-6, name=f"{name}_ln2")(h)


def mha_block(*, seed: int = 0, length: int = 8, width: int = 16, heads: int = 2, classes: int = 5):
    keras = _keras(seed)
    inputs = keras.Input((length, width), name="x")
    h = _transformer_layer(keras, inputs, None, width=width, heads=heads, ff=2 * width, name="block")
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(h), name="zoo_mha_block")


def _position_embedding_layer(keras):
    class PositionEmbedding(keras.layers.Layer):
        """Adds a learned (length, width) position table to a (batch, length, width) input."""

        def build(self, input_shape):
            self.table = self.add_weight(shape=tuple(input_shape[1:]), initializer="glorot_uniform", name="table")

        def call(self, x):
            return x + self.table

    return PositionEmbedding


def bert(*, seed: int = 0, vocab: int = 64, length: int = 12, width: int = 32, heads: int = 4, layers: int = 2,
         classes: int = 5, dropout: float = 0.0, pooler_bn: bool = False):
    """BERT-style encoder on token ids (0 = padding: masked out of every attention); ``dropout`` as BERT's
    (0.1 there), ``pooler_bn``: a BatchNormalization on the pooled output (moving statistics to update)."""
    keras = _keras(seed)
    from keras import ops
    tokens = keras.Input((length,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(vocab, width, name="token_embedding")(tokens)
    h = _position_embedding_layer(keras)(name="position_embedding")(h)
    h = keras.layers.LayerNormalization(epsilon=1e-6, name="embedding_ln")(h)
    keep = ops.not_equal(tokens, 0)  # (batch, length): real tokens
    mask = ops.logical_and(ops.expand_dims(keep, 1), ops.expand_dims(keep, 2))  # (batch, query, key)
    mask = ops.logical_or(mask, ops.expand_dims(ops.eye(length, dtype="bool"), 0))  # padded queries see themselves
    for i in range(layers):
        h = _transformer_layer(keras, h, mask, width=width, heads=heads, ff=4 * width, name=f"layer{i}",
                               dropout=dropout)
    pooled = keras.layers.Dense(width, activation="tanh", name="pooler")(h[:, 0, :])
    if pooler_bn:
        pooled = keras.layers.BatchNormalization(name="pooler_bn")(pooled)
    return keras.Model(tokens, keras.layers.Dense(classes, name="logits")(pooled), name="zoo_bert")


def accumulated(*, seed: int = 0, size: int = 256, filters: int = 64,
                activations: tuple[str, ...] = ("tanh", "sigmoid", "softplus"), classes: int = 5):
    keras = _keras(seed)
    inputs = keras.Input((size, size, 3), name="x")
    h = keras.layers.Conv2D(filters, 1, activation="relu", name="conv")(inputs)
    h = keras.layers.Add(name="sum")([keras.layers.Activation(a, name=f"act_{a}")(h) for a in activations])
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(h), name="zoo_accumulated")


MODEL_BUILDERS: dict[str, Callable[..., Any]] = {
    "mlp": mlp, "cnn": cnn, "residual": residual, "add_tree": add_tree, "layernorm_gelu": layernorm_gelu,
    "mha_block": mha_block, "bert": bert, "accumulated": accumulated,
    "bert_dropout_bn": functools.partial(bert, dropout=0.1, pooler_bn=True)}


def build_model(name: str, *, seed: int = 0, **sizes: Any):
    """A zoo model by name (see the module doc), built from ``seed``."""
    try:
        builder = MODEL_BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; choose one of {sorted(MODEL_BUILDERS)}") from None
    return builder(seed=seed, **sizes)


def make_batches(model: Any, *, batch_size: int = 4, steps: int = 2, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """``steps`` fixed ``(x, y)`` batches for ``model`` (one input; labels are class ids for its logits).

    Float inputs are standard normal; integer inputs are token ids in
    ``[1, vocab)`` (``vocab`` from the model's ``Embedding``) with each row padded
    with zeros after a random length of at least 1.
    """
    rng = np.random.default_rng(seed)
    (spec,) = model.inputs
    shape = tuple(spec.shape[1:])
    classes = int(model.outputs[0].shape[-1])
    integer = "int" in str(spec.dtype)
    vocab = next((layer.input_dim for layer in model.layers if hasattr(layer, "input_dim")), 2)
    batches = []
    for _ in range(steps):
        if integer:
            x = rng.integers(1, vocab, size=(batch_size, *shape)).astype(np.int32)
            for row in x:
                row[int(rng.integers(1, shape[0] + 1)):] = 0
        else:
            x = rng.standard_normal((batch_size, *shape)).astype(np.float32)
        y = rng.integers(0, classes, size=(batch_size,)).astype(np.int32)
        batches.append((x, y))
    return batches

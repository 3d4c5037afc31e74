"""Lossy 8-bit block quantization (``int8-block``): int8 codes and one float32 scale per block."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

import numpy as np
import tensorflow as tf

from tflms.compress.codecs.arrays import abs_as_float64
from tflms.compress.codecs.base import DENSE_FLOAT_DTYPES, Codec, ShapeLike, check_size, shape_arg, unpack_parts
from tflms.errors import ConfigError


INT8_LEVELS = 127
"""Quantization levels on each side of zero in an ordinary block (symmetric int8)."""
INT8_SPECIAL_LEVELS = 126
"""Levels in a block holding NaN or Inf, which frees the codes below."""
INT8_CODE_POS_INF = 127
"""Code of +Inf in a special block."""
INT8_CODE_NEG_INF = -127
"""Code of -Inf in a special block."""
INT8_CODE_NAN = -128
"""Code of NaN in a special block (never used by ordinary blocks)."""
INT8_REL_SLACK = 2.0**-14
"""Relative slack on the half-step bound for float32 rounding of scale (2**-23), quotient and product."""
INT8_MIN_SCALE = 2.0**-126
"""Smallest normal float32: blocks whose scale would be below it are stored as zeros (no subnormal scales)."""
INT8_ABS_ERROR = 2.0**-119
"""Absolute error floor, 128 * 2**-126: above the max |x| of any block stored as zeros."""
INT8_MAX_SCALE = 2.6793883890187504e36
"""Largest float32 ``s`` with ``127 * s <= float32 max``: caps the scale so decoding never overflows to Inf."""
INT8_SCALE_DTYPE = tf.float32
"""dtype of the per-block scales."""


@dataclasses.dataclass(frozen=True)
class BlockInt8Codec(Codec):
    """Lossy 8-bit block quantization with one float32 scale per ``block_size`` elements.

    Parts: ``(q: int8[n], scales: float32[ceil(n / block_size)])``, both of
    fixed size (no data-dependent shapes, so no device-host sync on a GPU).
    A block with a NaN or Inf is *special*: its scale is stored negated (sign
    bit set), its finite values use 126 levels, and the codes 127, -127 and
    -128 stand for +Inf, -Inf and NaN (payload not kept). Error bound for
    finite elements: ``max(m / (2 L) * (1 + 2**-14), 2**-119, |x| - L * INT8_MAX_SCALE)``
    with ``m`` the block's max finite |x| and ``L`` its levels (127, or 126
    if special); the last term only bites for float64 values beyond float32.
    """

    block_size: int = 64

    name: ClassVar[str] = "int8-block"
    lossless: ClassVar[bool] = False
    supported_dtypes: ClassVar[tuple[tf.DType, ...]] = DENSE_FLOAT_DTYPES

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ConfigError(
                f"BlockInt8Codec: block_size must be a positive int, got {self.block_size!r}; the default is 64")

    def encode(self, x: tf.Tensor) -> tuple[tf.Tensor, ...]:
        x = tf.convert_to_tensor(x)
        dtype = self.check_dtype(x.dtype)
        flat = tf.reshape(x, [-1])
        blocks = _to_blocks(flat, self.block_size)
        finite = tf.math.is_finite(blocks)
        clean = tf.where(finite, blocks, tf.zeros([], dtype))
        block_max = tf.reduce_max(tf.abs(clean), axis=1)
        special = tf.logical_not(tf.reduce_all(finite, axis=1))
        levels = tf.where(special, tf.constant(INT8_SPECIAL_LEVELS, dtype), tf.constant(INT8_LEVELS, dtype))
        # Multiply by reciprocal constants explicitly: graph mode rewrites division by a constant this way,
        # and eager and tf.function must give the same bits.
        step = tf.where(special, block_max * tf.constant(1.0 / INT8_SPECIAL_LEVELS, dtype),
                        block_max * tf.constant(1.0 / INT8_LEVELS, dtype))
        step = tf.cast(step, INT8_SCALE_DTYPE)
        step = tf.where(step >= INT8_MIN_SCALE, tf.minimum(step, INT8_MAX_SCALE), tf.zeros([], INT8_SCALE_DTYPE))
        inverse = tf.math.divide_no_nan(tf.ones([], dtype), tf.cast(step, dtype))[:, None]
        levels = levels[:, None]
        q = tf.minimum(tf.maximum(tf.round(clean * inverse), -levels), levels)
        code = tf.where(blocks > 0, tf.constant(INT8_CODE_POS_INF, dtype),
                        tf.where(blocks < 0, tf.constant(INT8_CODE_NEG_INF, dtype), tf.constant(INT8_CODE_NAN, dtype)))
        q = tf.cast(tf.where(finite, q, code), tf.int8)
        scale = tf.where(special, -step, step)  # a special block with step 0 stores -0.0: read the sign bit
        return tf.reshape(q, [-1])[: tf.size(flat)], scale

    def decode(self, parts: Sequence[tf.Tensor], shape: ShapeLike, dtype: tf.DType) -> tf.Tensor:
        dtype = self.check_dtype(dtype)
        q, scale = unpack_parts(self, parts, 2)
        size = tf.size(q)
        levels = _to_blocks(tf.cast(q, dtype), self.block_size)
        scale = tf.convert_to_tensor(scale, INT8_SCALE_DTYPE)
        special = tf.bitcast(scale, tf.int32) < 0
        values = levels * tf.cast(tf.abs(scale), dtype)[:, None]
        coded = tf.logical_and(special[:, None], tf.abs(levels) >= INT8_CODE_POS_INF)
        nonfinite = tf.where(levels < INT8_CODE_NEG_INF, tf.constant(np.nan, dtype), levels * np.inf)
        values = tf.where(coded, nonfinite, values)
        return tf.reshape(tf.reshape(values, [-1])[:size], shape_arg(shape))

    def part_bytes(self, num_elements: int, dtype: Any, nonzero_fraction: float = 1.0) -> tuple[int, ...]:
        num_elements, _ = check_size(self, num_elements, dtype, nonzero_fraction)
        num_blocks = -(-num_elements // self.block_size)
        return num_elements * tf.int8.size, num_blocks * INT8_SCALE_DTYPE.size

    def error_bound(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        magnitude = abs_as_float64(x).reshape(-1)
        finite = np.isfinite(magnitude)
        pad = (-magnitude.size) % self.block_size
        blocks = np.pad(np.where(finite, magnitude, 0.0), (0, pad)).reshape(-1, self.block_size)
        special = ~np.pad(finite, (0, pad), constant_values=True).reshape(-1, self.block_size).all(axis=1)
        levels = np.where(special, INT8_SPECIAL_LEVELS, INT8_LEVELS).astype(np.float64)
        half_step = blocks.max(axis=1, initial=0.0) / (2 * levels) * (1 + INT8_REL_SLACK)
        per_element = np.repeat(half_step, self.block_size)[: magnitude.size]
        with np.errstate(invalid="ignore"):
            saturated = magnitude - np.repeat(levels * INT8_MAX_SCALE, self.block_size)[: magnitude.size]
            bound = np.maximum(np.maximum(per_element, INT8_ABS_ERROR), saturated)
        return np.where(finite, bound, 0.0).reshape(x.shape)


def _to_blocks(flat: tf.Tensor, block_size: int) -> tf.Tensor:
    """Zero-pad a 1-D tensor to whole blocks and reshape it to ``[num_blocks, block_size]``."""
    pad = tf.math.floormod(-tf.size(flat), block_size)
    return tf.reshape(tf.pad(flat, [[0, pad]]), [-1, block_size])

"""Lossy 16-bit float storage (``fp16``, ``bf16``): a down-cast that saturates instead of overflowing."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

import numpy as np
import tensorflow as tf

from tflms.compress.codecs.arrays import abs_as_float64
from tflms.compress.codecs.base import DENSE_FLOAT_DTYPES, Codec, ShapeLike, check_size, shape_arg, unpack_parts
from tflms.errors import ConfigError

FP16_MAX = 65504.0
"""Largest finite float16; larger finite inputs saturate to it."""
FP16_REL_ERROR = 2.0**-11
"""Unit roundoff of float16 (11-bit significand): relative error bound for normal values."""
FP16_ABS_ERROR = 2.0**-25
"""Half the smallest float16 subnormal (2**-24): absolute error bound below the normal range."""
FP16_ABS_ERROR_FROM_FLOAT64 = 2.0**-25 + 2.0**-38
"""Absolute bound for float64 input: TF casts float64 -> float32 -> float16 (double rounding)."""

BF16_MAX = float(np.float32(3.3895313892515355e38))
"""Largest finite bfloat16, (2 - 2**-7) * 2**127; larger finite inputs saturate to it."""
BF16_REL_ERROR = 2.0**-8
"""Unit roundoff of bfloat16 (8-bit significand): relative error bound for normal values."""
BF16_ABS_ERROR = 2.0**-126
"""Smallest normal float32: inputs below it may be flushed to zero by CPU kernels."""


@dataclasses.dataclass(frozen=True)
class _CastCodec(Codec):
    """Lossy down-cast to a 16-bit float; shared by fp16 and bf16.

    With ``saturate`` (the default) finite values beyond the storage format's
    maximum are stored as that maximum; without it they overflow to +-Inf
    (one cast, several times faster, safe when ``measure`` reports no
    out-of-range values).
    """

    saturate: bool = True

    supported_dtypes: ClassVar[tuple[tf.DType, ...]] = DENSE_FLOAT_DTYPES
    lossless: ClassVar[bool] = False
    storage_dtype: ClassVar[tf.DType]
    max_finite: ClassVar[float]
    rel_error: ClassVar[float]

    def __post_init__(self) -> None:
        if not isinstance(self.saturate, bool):
            raise ConfigError(f"{type(self).__name__}: saturate must be True or False, got {self.saturate!r}")

    def encode(self, x: tf.Tensor) -> tuple[tf.Tensor, ...]:
        x = tf.convert_to_tensor(x)
        self.check_dtype(x.dtype)
        if self.saturate:
            limit = tf.constant(self.max_finite, x.dtype)
            # NaN and +-Inf bypass the clip, whatever its NaN semantics on the device.
            x = tf.where(tf.math.is_finite(x), tf.clip_by_value(x, -limit, limit), x)
        return (tf.cast(x, self.storage_dtype),)

    def decode(self, parts: Sequence[tf.Tensor], shape: ShapeLike, dtype: tf.DType) -> tf.Tensor:
        dtype = self.check_dtype(dtype)
        (stored,) = unpack_parts(self, parts, 1)
        return tf.reshape(tf.cast(stored, dtype), shape_arg(shape))

    def part_bytes(self, num_elements: int, dtype: Any, nonzero_fraction: float = 1.0) -> tuple[int, ...]:
        num_elements, _ = check_size(self, num_elements, dtype, nonzero_fraction)
        return (num_elements * self.storage_dtype.size,)

    @property
    def cost_key(self) -> str:
        return self.name if self.saturate else f"{self.name}-nosat"

    def error_bound(self, x: np.ndarray) -> np.ndarray:
        """``max(rel * |x|, abs)``; ``|x| - max_finite`` when saturated; inf where an overflow makes Inf."""
        x = np.asarray(x)
        magnitude = abs_as_float64(x)
        with np.errstate(invalid="ignore"):
            bound = np.maximum(self.rel_error * magnitude, self._abs_error(x.dtype))
            beyond = magnitude - self.max_finite
            bound = np.maximum(bound, beyond if self.saturate else np.where(beyond > 0, np.inf, 0.0))
        return np.where(np.isfinite(magnitude), bound, 0.0)

    def _abs_error(self, dtype: np.dtype) -> float:
        raise NotImplementedError

    def _out_of_range_fraction(self, x: np.ndarray) -> float:
        if x.size == 0:
            return 0.0
        magnitude = abs_as_float64(x)
        return float(np.count_nonzero(np.isfinite(magnitude) & (magnitude > self.max_finite)) / x.size)


@dataclasses.dataclass(frozen=True)
class Float16Codec(_CastCodec):
    """Lossy float16 storage: ``|err| <= max(2**-11 |x|, 2**-25)`` for ``|x| <= 65504``; saturates beyond."""

    name: ClassVar[str] = "fp16"
    storage_dtype: ClassVar[tf.DType] = tf.float16
    max_finite: ClassVar[float] = FP16_MAX
    rel_error: ClassVar[float] = FP16_REL_ERROR

    def _abs_error(self, dtype: np.dtype) -> float:
        return FP16_ABS_ERROR_FROM_FLOAT64 if np.dtype(dtype) == np.float64 else FP16_ABS_ERROR


@dataclasses.dataclass(frozen=True)
class BFloat16Codec(_CastCodec):
    """Lossy bfloat16 storage: ``|err| <= max(2**-8 |x|, 2**-126)``; saturates beyond the bf16 maximum."""

    name: ClassVar[str] = "bf16"
    storage_dtype: ClassVar[tf.DType] = tf.bfloat16
    max_finite: ClassVar[float] = BF16_MAX
    rel_error: ClassVar[float] = BF16_REL_ERROR

    def _abs_error(self, dtype: np.dtype) -> float:
        return BF16_ABS_ERROR

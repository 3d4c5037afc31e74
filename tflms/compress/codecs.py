"""Tensor codecs built from ordinary TensorFlow ops.

A codec turns one tensor into a few smaller tensors (the *parts*, which are
what a compressed swap copies device -> host) and back. Because ``encode`` and
``decode`` only build TF ops, they run eagerly, inside a ``tf.function`` and on
whatever device the tensor lives on, and they work with an unknown leading
dimension.

The codecs and their guarantees (``x`` an element of the input, ``y`` the same
element after ``decode(encode(x))``; each bound is on the exact ``|y - x|``
and holds on every device, including CPU kernels that flush subnormals):

``zvc`` -- :class:`ZeroValueCodec`, lossless (cDMA zero-value compression)
    A bit mask (1 bit per element, MSB first, as ``np.packbits``) plus the
    non-zero values. "Zero" means *all bits zero*, so ``-0.0`` is kept as a
    value and every element, including NaN payloads, Inf and subnormals,
    round-trips bit for bit. Works for float16, bfloat16, float32, float64 and
    the integer dtypes. Size: ``ceil(n/8) + nnz * itemsize`` bytes.

``fp16`` -- :class:`Float16Codec`, lossy, float32/float64 input
    Cast to float16 and back (round to nearest even); 2 bytes per element.
    ``|y - x| <= max(2**-11 * |x|, 2**-25)`` for ``|x| <= 65504`` (relative
    bound for fp16-normal values, absolute bound in the fp16 subnormal range;
    float64 input is cast through float32 by TF, which adds at most 2**-38 to
    the absolute part). Finite values beyond +-65504 *saturate* to +-65504
    instead of overflowing to Inf (an Inf activation would turn the gradients
    into NaN); their error is ``|x| - 65504``, and ``measure`` reports the
    out-of-range fraction so a planner can refuse the codec.
    ``Float16Codec(saturate=False)`` is a bare cast (overflow to Inf), which
    is several times faster on CPU. NaN stays NaN (the payload is not kept),
    +-Inf and the sign of zero are kept.

``bf16`` -- :class:`BFloat16Codec`, lossy, float32/float64 input
    Cast to bfloat16 and back. ``|y - x| <= max(2**-8 * |x|, 2**-126)``; the
    absolute part covers inputs below the float32 normal range, which CPU
    kernels may flush to zero. Values beyond the bfloat16 maximum saturate
    like ``fp16``. NaN stays NaN, +-Inf and the sign of zero are kept.

``int8-block`` -- :class:`BlockInt8Codec`, lossy, float32/float64 input
    Per block of ``block_size`` consecutive elements (row-major order):
    ``scale = max|block| / 127`` (float32), ``q = round(x / scale)`` as int8,
    decoded as ``q * scale``. ``|y - x| <= max(m / 254 * (1 + 2**-14), 2**-119)``
    with ``m = max|block|``: half a quantization step, a 2**-14 relative slack
    for the float32 rounding of the scale, quotient and product, and an
    absolute floor because blocks whose scale would be subnormal (below
    2**-126, so ``m < 2**-119``) are stored as zeros. NaN and +-Inf are kept
    without data-dependent shapes: a block holding one is *special*, its
    scale is stored negated, its finite values get 126 levels (bound
    ``m / 252 * (1 + 2**-14)``, ``m`` over the finite values) and the codes
    127 / -127 / -128 mean +Inf / -Inf / NaN (the NaN payload is not kept).
    The scale is capped so ``127 * scale`` stays finite in float32; float64
    values beyond that (about 3.4e38) saturate. The sign of zero is not kept.
    Size: ``n + 4 * ceil(n / block_size)`` bytes.

``decode(parts, shape, dtype)`` takes the shape of ``x``: a fully known
``tf.TensorShape`` or list of ints, or a 1-D integer tensor such as
``tf.shape(x)`` when a dimension is unknown while tracing. The shape is not
one of the parts: it is metadata that stays on the device side.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import sys
from typing import Any, ClassVar, Sequence

import numpy as np
import tensorflow as tf

from tflms.errors import ConfigError

__all__ = [
    "BFloat16Codec",
    "BlockInt8Codec",
    "Codec",
    "CodecDtypeError",
    "CODEC_NAMES",
    "Float16Codec",
    "ZeroValueCodec",
    "encoded_nbytes",
    "finite_range",
    "get_codec",
    "nonzero_fraction",
    "require_lossless_allowed",
]

BITS_PER_BYTE = 8
"""Mask bits packed into one uint8 (MSB first, like ``np.packbits``)."""

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

_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
_INT_DTYPES = (tf.int8, tf.uint8, tf.int16, tf.uint16, tf.int32, tf.uint32, tf.int64, tf.uint64)
_DENSE_FLOAT_DTYPES = (tf.float32, tf.float64)
# Signed integer of each item size, for comparing bit patterns with zero.
_BITS_DTYPE_BY_SIZE = {1: tf.int8, 2: tf.int16, 4: tf.int32, 8: tf.int64}
_MASK_WEIGHTS = tuple(1 << (BITS_PER_BYTE - 1 - i) for i in range(BITS_PER_BYTE))
_MASK_SHIFTS = tuple(BITS_PER_BYTE - 1 - i for i in range(BITS_PER_BYTE))
# Word-at-a-time mask tricks on a uint64 holding 8 flag bytes (each 0 or 1, flag j in byte j, which needs a
# little-endian bitcast). The partial products never overlap, so there are no carries:
#   (word * _GATHER_BITS) >> 56                      packs the 8 flags MSB first (flag 0 -> bit 7);
#   ((byte * _GATHER_BITS) >> 7) & _BYTE_ONES        spreads a packed byte back to 8 flag bytes;
#   word * _BYTE_ONES                                puts the inclusive prefix count of flags 0..j in byte j.
_GATHER_BITS = 0x8040201008040201
_BYTE_ONES = 0x0101010101010101
_WORD_SHIFT_TOP_BYTE = 56
_LITTLE_ENDIAN = sys.byteorder == "little"
_INT32_INDEX_LIMIT = 2**31 - 1


class CodecDtypeError(ConfigError):
    """A codec was given a tensor whose dtype it does not support."""


ShapeLike = Any  # tf.TensorShape | Sequence[int] | 1-D integer tf.Tensor


def encoded_nbytes(parts: Sequence[tf.Tensor | np.ndarray]) -> int:
    """Total bytes of the encoded ``parts`` (what a swap would copy); shapes must be known."""
    total = 0
    for part in parts:
        dtype = tf.as_dtype(part.dtype)
        shape = tf.TensorShape(part.shape)
        if not shape.is_fully_defined():
            raise ConfigError(
                f"encoded_nbytes: part of shape {shape} has an unknown dimension; call it on eager tensors")
        total += shape.num_elements() * dtype.size
    return total


class Codec(abc.ABC):
    """A tensor codec: ``decode(encode(x), shape, dtype)`` rebuilds ``x`` (exactly if ``lossless``).

    Subclasses are frozen dataclasses; ``name`` and ``lossless`` are class
    attributes. ``encode``/``decode`` build TF ops; ``compressed_bytes``
    predicts sizes for the cost model; ``error_bound`` and ``measure`` work on
    numpy arrays. See the module docstring for each codec's error bound.
    """

    name: ClassVar[str]
    lossless: ClassVar[bool]
    supported_dtypes: ClassVar[tuple[tf.DType, ...]]
    #: Indices of parts whose size depends on the data (unknown until the tensor is encoded).
    data_dependent_parts: ClassVar[tuple[int, ...]] = ()

    @abc.abstractmethod
    def encode(self, x: tf.Tensor) -> tuple[tf.Tensor, ...]:
        """Return the compressed parts of ``x`` (TF ops; graph-mode safe)."""

    @abc.abstractmethod
    def decode(self, parts: Sequence[tf.Tensor], shape: ShapeLike, dtype: tf.DType) -> tf.Tensor:
        """Rebuild a tensor of ``shape`` and ``dtype`` from ``parts``."""

    @abc.abstractmethod
    def part_bytes(self, num_elements: int, dtype: Any, nonzero_fraction: float = 1.0) -> tuple[int, ...]:
        """Predicted bytes of each part, in :meth:`encode`'s order.

        ``nonzero_fraction`` is the fraction of elements whose bit pattern is
        not all zeros; only the parts listed in :attr:`data_dependent_parts`
        depend on it (the zero-value codec's values), the others have fixed
        sizes.
        """

    def compressed_bytes(self, num_elements: int, dtype: Any, nonzero_fraction: float = 1.0) -> int:
        """Predicted bytes of all the parts for a tensor of ``num_elements`` of ``dtype``."""
        return sum(self.part_bytes(num_elements, dtype, nonzero_fraction))

    @property
    def cost_key(self) -> str:
        """The name under which cost models list this codec's speed (parameters that change it included)."""
        return self.name

    def out_of_range_fraction(self, x: np.ndarray) -> float:
        """Fraction of ``x``'s finite values beyond the storage format's range (saturated or overflowed)."""
        return self._out_of_range_fraction(np.asarray(x))

    def check_dtype(self, dtype: Any) -> tf.DType:
        """Return ``dtype`` as a ``tf.DType``, or raise :class:`CodecDtypeError` if unsupported."""
        try:
            tf_dtype = tf.as_dtype(dtype)
        except TypeError as err:
            raise CodecDtypeError(f"codec {self.name!r}: {dtype!r} is not a dtype") from err
        if tf_dtype not in self.supported_dtypes:
            names = ", ".join(d.name for d in self.supported_dtypes)
            raise CodecDtypeError(
                f"codec {self.name!r} does not support dtype {tf_dtype.name}; supported: {names}. "
                f"Use 'zvc' (lossless, any numeric dtype) or leave this tensor uncompressed.")
        return tf_dtype

    def error_bound(self, x: np.ndarray) -> np.ndarray:
        """Per-element bound on ``|decode(encode(x)) - x|`` as float64 (zeros for lossless codecs).

        Non-finite elements get bound 0: they must come back as the same
        class (NaN as NaN, Inf as the same Inf).
        """
        return np.zeros(np.shape(x), np.float64)

    def measure(self, x: np.ndarray) -> dict[str, Any]:
        """Encode and decode ``x`` eagerly and report measured figures.

        Keys: ``codec``, ``lossless``, ``dtype``, ``num_elements``,
        ``original_bytes``, ``encoded_bytes``, ``predicted_bytes`` (from
        :meth:`compressed_bytes` at the measured ``nonzero_fraction``),
        ``ratio`` (original / encoded bytes; inf for empty parts),
        ``nonzero_fraction`` and ``sparsity`` (fraction of all-zero-bits
        elements), ``nonfinite_fraction``, ``bitwise_exact``,
        ``max_abs_error`` (over elements compared by value; inf if a NaN or
        Inf changed), ``value_min``/``value_max`` (finite values; NaN if
        none), ``max_error_bound``, ``within_bound`` and
        ``out_of_range_fraction`` (finite values beyond the storage format's
        range: saturated, or overflowed to Inf with ``saturate=False``).
        """
        array = np.asarray(x)
        dtype = self.check_dtype(array.dtype)
        tensor = tf.constant(array, dtype=dtype)
        parts = self.encode(tensor)
        decoded = self.decode(parts, tensor.shape, dtype).numpy()
        num_elements = int(array.size)
        original_bytes = num_elements * dtype.size
        encoded = encoded_nbytes(parts)
        nonzero = _nonzero_fraction(array)
        error = _abs_error(array, decoded)
        bound = self.error_bound(array)
        finite = array[_finite_mask(array)]
        return {
            "codec": self.name,
            "lossless": self.lossless,
            "dtype": dtype.name,
            "num_elements": num_elements,
            "original_bytes": original_bytes,
            "encoded_bytes": encoded,
            "predicted_bytes": self.compressed_bytes(num_elements, dtype, nonzero),
            "ratio": original_bytes / encoded if encoded else math.inf,
            "nonzero_fraction": nonzero,
            "sparsity": 1.0 - nonzero,
            "nonfinite_fraction": _nonfinite_fraction(array),
            "bitwise_exact": _bitwise_equal(array, decoded),
            "max_abs_error": float(error.max()) if error.size else 0.0,
            "value_min": float(finite.min()) if finite.size else math.nan,
            "value_max": float(finite.max()) if finite.size else math.nan,
            "max_error_bound": float(bound.max()) if bound.size else 0.0,
            "within_bound": bool(np.all(error <= bound)),
            "out_of_range_fraction": self._out_of_range_fraction(array),
        }

    def _out_of_range_fraction(self, x: np.ndarray) -> float:
        del x
        return 0.0


@dataclasses.dataclass(frozen=True)
class ZeroValueCodec(Codec):
    """Lossless zero-value compression: packed non-zero bit mask + the non-zero values.

    Parts: ``(mask: uint8[ceil(n/8)], values: dtype[nnz])``. An element is
    zero when all its bits are zero, so ``-0.0`` is stored as a value and the
    round trip is bit-exact for every element. The values part has a
    data-dependent size (on a GPU, encoding waits for the device to count
    the non-zeros), which is inherent to zero-value compression.
    """

    name: ClassVar[str] = "zvc"
    lossless: ClassVar[bool] = True
    supported_dtypes: ClassVar[tuple[tf.DType, ...]] = _FLOAT_DTYPES + _INT_DTYPES
    data_dependent_parts: ClassVar[tuple[int, ...]] = (1,)

    def encode(self, x: tf.Tensor) -> tuple[tf.Tensor, ...]:
        x = tf.convert_to_tensor(x)
        dtype = self.check_dtype(x.dtype)
        flat = tf.reshape(x, [-1])
        bits_dtype = _BITS_DTYPE_BY_SIZE[dtype.size]
        bits = flat if dtype == bits_dtype else tf.bitcast(flat, bits_dtype)
        nonzero = tf.not_equal(bits, tf.zeros([], bits.dtype))
        values = tf.gather(flat, tf.reshape(tf.where(nonzero), [-1]))
        return _pack_bits(nonzero), values

    def decode(self, parts: Sequence[tf.Tensor], shape: ShapeLike, dtype: tf.DType) -> tf.Tensor:
        dtype = self.check_dtype(dtype)
        mask, values = _unpack_parts(self, parts, 2)
        num_elements = _num_elements(shape)
        nonzero, rank, count = _flag_ranks(mask, num_elements)
        # A gather, not a scatter: every output element reads its value, zeros read an appended +0.
        # (tf.scatter_nd would also *add* into zeros and turn -0.0 into +0.0.)
        values_and_zero = tf.concat([tf.convert_to_tensor(values, dtype), tf.zeros([1], dtype)], axis=0)
        flat = tf.gather(values_and_zero, tf.where(nonzero, rank, count))
        return tf.reshape(flat, _shape_arg(shape))

    def part_bytes(self, num_elements: int, dtype: Any, nonzero_fraction: float = 1.0) -> tuple[int, ...]:
        num_elements, dtype = _check_size(self, num_elements, dtype, nonzero_fraction)
        nonzero = int(round(nonzero_fraction * num_elements))
        return -(-num_elements // BITS_PER_BYTE), nonzero * dtype.size


@dataclasses.dataclass(frozen=True)
class _CastCodec(Codec):
    """Lossy down-cast to a 16-bit float; shared by fp16 and bf16.

    With ``saturate`` (the default) finite values beyond the storage format's
    maximum are stored as that maximum; without it they overflow to +-Inf
    (one cast, several times faster, safe when ``measure`` reports no
    out-of-range values).
    """

    saturate: bool = True

    supported_dtypes: ClassVar[tuple[tf.DType, ...]] = _DENSE_FLOAT_DTYPES
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
        (stored,) = _unpack_parts(self, parts, 1)
        return tf.reshape(tf.cast(stored, dtype), _shape_arg(shape))

    def part_bytes(self, num_elements: int, dtype: Any, nonzero_fraction: float = 1.0) -> tuple[int, ...]:
        num_elements, _ = _check_size(self, num_elements, dtype, nonzero_fraction)
        return (num_elements * self.storage_dtype.size,)

    @property
    def cost_key(self) -> str:
        return self.name if self.saturate else f"{self.name}-nosat"

    def error_bound(self, x: np.ndarray) -> np.ndarray:
        """``max(rel * |x|, abs)``; ``|x| - max_finite`` when saturated; inf where an overflow makes Inf."""
        x = np.asarray(x)
        magnitude = _magnitude(x)
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
        magnitude = _magnitude(x)
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
    supported_dtypes: ClassVar[tuple[tf.DType, ...]] = _DENSE_FLOAT_DTYPES

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
        q, scale = _unpack_parts(self, parts, 2)
        size = tf.size(q)
        levels = _to_blocks(tf.cast(q, dtype), self.block_size)
        scale = tf.convert_to_tensor(scale, INT8_SCALE_DTYPE)
        special = tf.bitcast(scale, tf.int32) < 0
        values = levels * tf.cast(tf.abs(scale), dtype)[:, None]
        coded = tf.logical_and(special[:, None], tf.abs(levels) >= INT8_CODE_POS_INF)
        nonfinite = tf.where(levels < INT8_CODE_NEG_INF, tf.constant(np.nan, dtype), levels * np.inf)
        values = tf.where(coded, nonfinite, values)
        return tf.reshape(tf.reshape(values, [-1])[:size], _shape_arg(shape))

    def part_bytes(self, num_elements: int, dtype: Any, nonzero_fraction: float = 1.0) -> tuple[int, ...]:
        num_elements, _ = _check_size(self, num_elements, dtype, nonzero_fraction)
        num_blocks = -(-num_elements // self.block_size)
        return num_elements * tf.int8.size, num_blocks * INT8_SCALE_DTYPE.size

    def error_bound(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        magnitude = _magnitude(x).reshape(-1)
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


_CODECS: dict[str, type[Codec]] = {
    ZeroValueCodec.name: ZeroValueCodec,
    Float16Codec.name: Float16Codec,
    BFloat16Codec.name: BFloat16Codec,
    BlockInt8Codec.name: BlockInt8Codec,
}
CODEC_NAMES: tuple[str, ...] = tuple(_CODECS)
"""Names accepted by :func:`get_codec`."""


def get_codec(name: str) -> Codec:
    """Return the codec called ``name`` (one of :data:`CODEC_NAMES`) with default parameters."""
    codec_type = _CODECS.get(name) if isinstance(name, str) else None
    if codec_type is None:
        raise ConfigError(f"unknown codec {name!r}; valid names: {', '.join(CODEC_NAMES)}")
    return codec_type()


def require_lossless_allowed(codec: Codec, allow_lossy: bool) -> Codec:
    """Return ``codec`` unless it is lossy and ``allow_lossy`` is false, which raises :class:`ConfigError`."""
    if not codec.lossless and not allow_lossy:
        lossless = ", ".join(n for n, c in _CODECS.items() if c.lossless)
        raise ConfigError(
            f"codec {codec.name!r} is lossy (it changes activation values); pass allow_lossy=True to accept "
            f"that, or use a lossless codec: {lossless}")
    return codec


# ---------------------------------------------------------------- TF helpers


def _unpack_parts(codec: Codec, parts: Sequence[tf.Tensor], count: int) -> tuple[tf.Tensor, ...]:
    parts = tuple(parts)
    if len(parts) != count:
        raise ConfigError(
            f"codec {codec.name!r}: decode expects the {count} parts that encode returned, got {len(parts)}")
    return parts


def _num_elements(shape: ShapeLike) -> int | tf.Tensor:
    """Element count of ``shape``: a Python int when static, else an int64 scalar tensor."""
    if isinstance(shape, (tf.Tensor, tf.Variable)) or tf.is_tensor(shape):
        return tf.reduce_prod(tf.cast(shape, tf.int64))
    static = tf.TensorShape(shape)
    if not static.is_fully_defined():
        raise ConfigError(
            f"decode: shape {static} has unknown dimensions; pass the dynamic shape instead, "
            f"e.g. tf.shape(x) captured next to encode(x)")
    return static.num_elements()


def _shape_arg(shape: ShapeLike) -> Any:
    if tf.is_tensor(shape):
        return shape
    return tf.TensorShape(shape).as_list()


def _pack_bits(flags: tf.Tensor, little_endian: bool = _LITTLE_ENDIAN) -> tf.Tensor:
    """Pack a 1-D bool tensor into uint8, MSB first (as ``np.packbits``), zero-padded to whole bytes."""
    bits = tf.cast(flags, tf.uint8)
    groups = tf.reshape(tf.pad(bits, [[0, tf.math.floormod(-tf.size(bits), BITS_PER_BYTE)]]), [-1, BITS_PER_BYTE])
    if little_endian:
        words = tf.bitcast(groups, tf.uint64)
        packed = tf.bitwise.right_shift(words * tf.constant(_GATHER_BITS, tf.uint64),
                                        tf.constant(_WORD_SHIFT_TOP_BYTE, tf.uint64))
        return tf.cast(packed, tf.uint8)
    return tf.reduce_sum(groups * tf.constant(_MASK_WEIGHTS, tf.uint8), axis=1)


def _flag_words(packed: tf.Tensor) -> tf.Tensor:
    """uint64 words holding the flags of each packed byte as 8 bytes of 0 or 1 (little-endian order)."""
    spread = tf.bitwise.right_shift(tf.cast(packed, tf.uint64) * tf.constant(_GATHER_BITS, tf.uint64),
                                    tf.constant(BITS_PER_BYTE - 1, tf.uint64))
    return tf.bitwise.bitwise_and(spread, tf.constant(_BYTE_ONES, tf.uint64))


def _unpack_bits(packed: tf.Tensor, num_elements: int | tf.Tensor,
                 little_endian: bool = _LITTLE_ENDIAN) -> tf.Tensor:
    """Inverse of :func:`_pack_bits`: the first ``num_elements`` flags as bool."""
    if little_endian:
        flag_bytes = tf.bitcast(_flag_words(packed), tf.uint8)
    else:
        shifts = tf.constant(_MASK_SHIFTS, tf.uint8)
        flag_bytes = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.reshape(packed, [-1, 1]), shifts),
                                            tf.ones([], tf.uint8))
    return tf.cast(tf.reshape(flag_bytes, [-1])[:num_elements], tf.bool)


def _flag_ranks(packed: tf.Tensor, num_elements: int | tf.Tensor,
                little_endian: bool = _LITTLE_ENDIAN) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Unpack flags and rank them: ``(flags, rank, count)``.

    ``rank[i]`` is the number of set flags before element ``i`` (where a set
    element's value sits in the packed values) and ``count`` the total.
    Indices are int32 when the size is statically below 2**31, else int64.
    """
    index_dtype = (tf.int32 if isinstance(num_elements, int) and num_elements <= _INT32_INDEX_LIMIT
                   else tf.int64)
    if not little_endian:
        flags = _unpack_bits(packed, num_elements, little_endian=False)
        rank = tf.cumsum(tf.cast(flags, index_dtype), exclusive=True)
        return flags, rank, tf.reduce_sum(tf.cast(flags, index_dtype))
    words = _flag_words(packed)
    inclusive = words * tf.constant(_BYTE_ONES, tf.uint64)  # byte j: flags set among 0..j (<= 8, no carry)
    per_byte = tf.cast(tf.bitwise.right_shift(inclusive, tf.constant(_WORD_SHIFT_TOP_BYTE, tf.uint64)),
                       index_dtype)
    base = tf.cumsum(per_byte, exclusive=True)  # a scan over n/8 entries, not n
    within = tf.cast(tf.bitcast(inclusive - words, tf.uint8), index_dtype)  # [num_bytes, 8]
    rank = tf.reshape(within + base[:, None], [-1])[:num_elements]
    flags = tf.cast(tf.reshape(tf.bitcast(words, tf.uint8), [-1])[:num_elements], tf.bool)
    return flags, rank, tf.reduce_sum(per_byte)


def _to_blocks(flat: tf.Tensor, block_size: int) -> tf.Tensor:
    """Zero-pad a 1-D tensor to whole blocks and reshape it to ``[num_blocks, block_size]``."""
    pad = tf.math.floormod(-tf.size(flat), block_size)
    return tf.reshape(tf.pad(flat, [[0, pad]]), [-1, block_size])


def _check_size(codec: Codec, num_elements: int, dtype: Any, nonzero_fraction: float) -> tuple[int, tf.DType]:
    if isinstance(num_elements, bool) or not isinstance(num_elements, (int, np.integer)) or num_elements < 0:
        raise ConfigError(f"codec {codec.name!r}: num_elements must be an int >= 0, got {num_elements!r}")
    if not 0.0 <= float(nonzero_fraction) <= 1.0:
        raise ConfigError(
            f"codec {codec.name!r}: nonzero_fraction must be in [0, 1], got {nonzero_fraction!r}")
    return int(num_elements), codec.check_dtype(dtype)


# ------------------------------------------------------------- numpy helpers


def _bit_view(x: np.ndarray) -> np.ndarray:
    """The raw bit patterns of ``x`` as unsigned integers (bfloat16 included, via its itemsize)."""
    x = np.asarray(x)
    x = x if x.flags.c_contiguous else x.copy(order="C")  # np.ascontiguousarray would make 0-d arrays 1-d
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def _nonzero_fraction(x: np.ndarray) -> float:
    if x.size == 0:
        return 0.0
    return float(np.count_nonzero(_bit_view(x)) / x.size)


def nonzero_fraction(x: np.ndarray) -> float:
    """Fraction of the elements of ``x`` whose bits are not all zero (what zero-value compression keeps)."""
    return _nonzero_fraction(np.asarray(x))


def finite_range(x: np.ndarray) -> tuple[float, float, float]:
    """``(min, max, nonfinite fraction)`` of ``x``'s finite values (``nan`` bounds if there are none)."""
    array = np.asarray(x)
    finite = array[_finite_mask(array)]
    if not finite.size:
        return math.nan, math.nan, _nonfinite_fraction(array)
    return float(finite.min()), float(finite.max()), _nonfinite_fraction(array)


def _as_float64(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # casting a signalling NaN raises the invalid flag
        return np.asarray(x).astype(np.float64)


def _magnitude(x: np.ndarray) -> np.ndarray:
    return np.abs(_as_float64(x))


def _finite_mask(x: np.ndarray) -> np.ndarray:
    if not tf.as_dtype(x.dtype).is_floating:
        return np.ones(x.shape, bool)
    return np.isfinite(_as_float64(x))


def _nonfinite_fraction(x: np.ndarray) -> float:
    if x.size == 0:
        return 0.0
    return float(np.count_nonzero(~_finite_mask(x)) / x.size)


def _bitwise_equal(x: np.ndarray, y: np.ndarray) -> bool:
    return x.shape == y.shape and x.dtype == y.dtype and bool(np.array_equal(_bit_view(x), _bit_view(y)))


def _abs_error(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``|y - x|`` in float64; 0 where both are NaN or the same Inf, inf where a non-finite changed."""
    a = _as_float64(x)
    b = _as_float64(y)
    same_nonfinite = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
    with np.errstate(invalid="ignore"):
        error = np.abs(b - a)
    error = np.where(same_nonfinite, 0.0, error)
    return np.where(np.isnan(error) | (~np.isfinite(a) & ~same_nonfinite), np.inf, error)

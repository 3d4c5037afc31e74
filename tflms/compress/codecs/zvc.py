"""Zero-value compression (``zvc``, lossless): a packed bit mask of the non-zero elements plus their values."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, ClassVar, Sequence

import tensorflow as tf

from tflms.compress.codecs.base import (
    FLOAT_DTYPES,
    INT_DTYPES,
    Codec,
    ShapeLike,
    check_size,
    shape_arg,
    unpack_parts,
)
from tflms.errors import ConfigError

BITS_PER_BYTE = 8
"""Mask bits packed into one uint8 (MSB first, like ``np.packbits``)."""

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
    supported_dtypes: ClassVar[tuple[tf.DType, ...]] = FLOAT_DTYPES + INT_DTYPES
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
        mask, values = unpack_parts(self, parts, 2)
        num_elements = _num_elements(shape)
        nonzero, rank, count = _flag_ranks(mask, num_elements)
        # A gather, not a scatter: every output element reads its value, zeros read an appended +0.
        # (tf.scatter_nd would also *add* into zeros and turn -0.0 into +0.0.)
        values_and_zero = tf.concat([tf.convert_to_tensor(values, dtype), tf.zeros([1], dtype)], axis=0)
        flat = tf.gather(values_and_zero, tf.where(nonzero, rank, count))
        return tf.reshape(flat, shape_arg(shape))

    def part_bytes(self, num_elements: int, dtype: Any, nonzero_fraction: float = 1.0) -> tuple[int, ...]:
        num_elements, dtype = check_size(self, num_elements, dtype, nonzero_fraction)
        nonzero = int(round(nonzero_fraction * num_elements))
        return -(-num_elements // BITS_PER_BYTE), nonzero * dtype.size


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

"""The :class:`Codec` base class, its errors, and the TF helpers every codec's ``decode`` uses."""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar, Sequence

import numpy as np
import tensorflow as tf

from tflms.compress.codecs.arrays import abs_error, bitwise_equal, finite_mask, nonfinite_fraction, nonzero_fraction
from tflms.errors import ConfigError

#: dtypes each codec family accepts: every float, every integer, the floats wider than 16 bits.
FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
INT_DTYPES = (tf.int8, tf.uint8, tf.int16, tf.uint16, tf.int32, tf.uint32, tf.int64, tf.uint64)
DENSE_FLOAT_DTYPES = (tf.float32, tf.float64)


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
        nonzero = nonzero_fraction(array)
        error = abs_error(array, decoded)
        bound = self.error_bound(array)
        finite = array[finite_mask(array)]
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
            "nonfinite_fraction": nonfinite_fraction(array),
            "bitwise_exact": bitwise_equal(array, decoded),
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


def unpack_parts(codec: Codec, parts: Sequence[tf.Tensor], count: int) -> tuple[tf.Tensor, ...]:
    """``parts`` as a tuple, or ConfigError naming the codec unless there are exactly ``count``."""
    parts = tuple(parts)
    if len(parts) != count:
        raise ConfigError(
            f"codec {codec.name!r}: decode expects the {count} parts that encode returned, got {len(parts)}")
    return parts


def shape_arg(shape: ShapeLike) -> Any:
    """``shape`` in the form ``tf.reshape`` takes: the tensor itself, or a list of ints."""
    if tf.is_tensor(shape):
        return shape
    return tf.TensorShape(shape).as_list()


def check_size(codec: Codec, num_elements: int, dtype: Any, nonzero_fraction: float) -> tuple[int, tf.DType]:
    """Validate :meth:`Codec.part_bytes` arguments; return ``(num_elements, dtype as tf.DType)``."""
    if isinstance(num_elements, bool) or not isinstance(num_elements, (int, np.integer)) or num_elements < 0:
        raise ConfigError(f"codec {codec.name!r}: num_elements must be an int >= 0, got {num_elements!r}")
    if not 0.0 <= float(nonzero_fraction) <= 1.0:
        raise ConfigError(
            f"codec {codec.name!r}: nonzero_fraction must be in [0, 1], got {nonzero_fraction!r}")
    return int(num_elements), codec.check_dtype(dtype)

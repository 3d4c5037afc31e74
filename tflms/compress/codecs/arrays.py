"""numpy helpers for checking codecs: bit views, value statistics, exact errors (no TensorFlow ops)."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf


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
    finite = array[finite_mask(array)]
    if not finite.size:
        return math.nan, math.nan, nonfinite_fraction(array)
    return float(finite.min()), float(finite.max()), nonfinite_fraction(array)


def _as_float64(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # casting a signalling NaN raises the invalid flag
        return np.asarray(x).astype(np.float64)


def abs_as_float64(x: np.ndarray) -> np.ndarray:
    """``|x|`` as float64."""
    return np.abs(_as_float64(x))


def finite_mask(x: np.ndarray) -> np.ndarray:
    """Where ``x`` is finite (everywhere for integer dtypes)."""
    if not tf.as_dtype(x.dtype).is_floating:
        return np.ones(x.shape, bool)
    return np.isfinite(_as_float64(x))


def nonfinite_fraction(x: np.ndarray) -> float:
    """Fraction of the elements of ``x`` that are NaN or +-Inf."""
    if x.size == 0:
        return 0.0
    return float(np.count_nonzero(~finite_mask(x)) / x.size)


def bitwise_equal(x: np.ndarray, y: np.ndarray) -> bool:
    """Same shape, dtype and bytes (so -0.0 differs from 0.0 and equal NaNs match)."""
    return x.shape == y.shape and x.dtype == y.dtype and bool(np.array_equal(_bit_view(x), _bit_view(y)))


def abs_error(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``|y - x|`` in float64; 0 where both are NaN or the same Inf, inf where a non-finite changed."""
    a = _as_float64(x)
    b = _as_float64(y)
    same_nonfinite = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
    with np.errstate(invalid="ignore"):
        error = np.abs(b - a)
    error = np.where(same_nonfinite, 0.0, error)
    return np.where(np.isnan(error) | (~np.isfinite(a) & ~same_nonfinite), np.inf, error)

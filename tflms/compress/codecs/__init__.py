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

The modules: :mod:`~tflms.compress.codecs.base` (the :class:`Codec` base class and shared
helpers), one per codec family (:mod:`~tflms.compress.codecs.zvc`,
:mod:`~tflms.compress.codecs.cast`, :mod:`~tflms.compress.codecs.int8`),
:mod:`~tflms.compress.codecs.registry` (names) and :mod:`~tflms.compress.codecs.arrays`
(numpy checks). Every public name is importable from here.
"""

from __future__ import annotations

from tflms.compress.codecs.arrays import finite_range, nonzero_fraction
from tflms.compress.codecs.base import Codec, CodecDtypeError, ShapeLike, encoded_nbytes
from tflms.compress.codecs.cast import (
    BF16_ABS_ERROR,
    BF16_MAX,
    BF16_REL_ERROR,
    FP16_ABS_ERROR,
    FP16_ABS_ERROR_FROM_FLOAT64,
    FP16_MAX,
    FP16_REL_ERROR,
    BFloat16Codec,
    Float16Codec,
)
from tflms.compress.codecs.int8 import (
    INT8_ABS_ERROR,
    INT8_CODE_NAN,
    INT8_CODE_NEG_INF,
    INT8_CODE_POS_INF,
    INT8_LEVELS,
    INT8_MAX_SCALE,
    INT8_MIN_SCALE,
    INT8_REL_SLACK,
    INT8_SCALE_DTYPE,
    INT8_SPECIAL_LEVELS,
    BlockInt8Codec,
)
from tflms.compress.codecs.registry import CODEC_NAMES, get_codec, require_lossless_allowed
from tflms.compress.codecs.zvc import BITS_PER_BYTE, ZeroValueCodec

__all__ = [
    # the codecs and their registry
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
    # formats and error bounds, re-exported from the codec modules
    "BF16_ABS_ERROR", "BF16_MAX", "BF16_REL_ERROR", "BITS_PER_BYTE", "FP16_ABS_ERROR", "FP16_ABS_ERROR_FROM_FLOAT64",
    "FP16_MAX", "FP16_REL_ERROR", "INT8_ABS_ERROR", "INT8_CODE_NAN", "INT8_CODE_NEG_INF", "INT8_CODE_POS_INF",
    "INT8_LEVELS", "INT8_MAX_SCALE", "INT8_MIN_SCALE", "INT8_REL_SLACK", "INT8_SCALE_DTYPE", "INT8_SPECIAL_LEVELS",
    "ShapeLike",
]

"""Round trips and bounds of the TF-op codecs in tflms.compress.codecs.

Lossless codecs are checked bit for bit (``np.view`` of the raw patterns, so
NaN payloads and -0.0 count); lossy codecs against their documented
per-element bound, and each bound is checked to be nearly tight (half of it
would fail), so the assertion is not vacuous.
"""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings

from tflms.compress.codecs import (
    BF16_MAX,
    CODEC_NAMES,
    FP16_MAX,
    INT8_LEVELS,
    INT8_MAX_SCALE,
    BFloat16Codec,
    BlockInt8Codec,
    CodecDtypeError,
    Float16Codec,
    ZeroValueCodec,
    encoded_nbytes,
    get_codec,
    require_lossless_allowed,
)
from tflms.compress.codecs.zvc import _flag_ranks, _pack_bits, _unpack_bits
from tflms.errors import ConfigError

BF16 = tf.bfloat16.as_numpy_dtype
FLOAT_DTYPES = [np.dtype(np.float16), np.dtype(BF16), np.dtype(np.float32), np.dtype(np.float64)]
LOSSLESS_DTYPES = FLOAT_DTYPES + [np.dtype(np.int32), np.dtype(np.int8), np.dtype(np.int64), np.dtype(np.uint8)]
LOSSY_CODECS = [Float16Codec(), BFloat16Codec(), BlockInt8Codec(), BlockInt8Codec(block_size=7),
                Float16Codec(saturate=False)]
LOSSY_DTYPES = [np.dtype(np.float32), np.dtype(np.float64)]
# Ranks 0..4; sizes 1, 7, 13, 1001 (not multiples of 8 or of the int8 block) and 120.
SHAPES = [(), (7,), (13,), (1001,), (7, 13), (1, 7, 13), (2, 3, 4, 5)]
CASES = ["random", "relu", "all_zeros", "no_zeros", "special"]
# (exponent bits, mantissa bits) of each float format, to build special bit patterns.
FLOAT_LAYOUT = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}
RELU_ZVC_RATIO_FLOAT32 = 1 / (0.5 + 1 / 32)
"""Expected ZVC ratio for float32 ReLU(N(0,1)): half the values kept plus 1 mask bit per 32 data bits."""
RATIO_TOLERANCE = 0.01
TIGHTNESS = 0.5
"""A bound is meaningful if the worst observed error exceeds this fraction of it."""


def bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    a = a if a.flags.c_contiguous else a.copy(order="C")  # keeps 0-d arrays 0-d
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def from_bits(patterns: list[int], dtype: np.dtype) -> np.ndarray:
    return np.array(patterns, np.dtype(f"u{dtype.itemsize}")).view(dtype)


def special_values(dtype: np.dtype) -> np.ndarray:
    """-0.0, +-Inf, NaNs with payloads (quiet, signalling, negative), subnormals, extremes."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([0, 1, info.max, info.min, info.max - 1, 0, 0], dtype)
    exp_bits, mant_bits = FLOAT_LAYOUT[dtype.name]
    sign = 1 << (exp_bits + mant_bits)
    exp_all = ((1 << exp_bits) - 1) << mant_bits
    quiet = 1 << (mant_bits - 1)
    max_finite = exp_all - 1
    patterns = [
        0, sign,                              # +0.0, -0.0
        exp_all, sign | exp_all,              # +Inf, -Inf
        exp_all | quiet, exp_all | quiet | 5, sign | exp_all | quiet | 3,  # quiet NaNs with payloads
        exp_all | 1,                          # signalling NaN
        1, sign | 1, (1 << mant_bits) - 1,    # subnormals
        1 << mant_bits,                       # smallest normal
        max_finite, sign | max_finite,
        0, 0,
    ]
    return from_bits(patterns, dtype)


def make_input(case: str, dtype: np.dtype, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    size = math.prod(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        random = rng.integers(max(info.min, -1000), min(info.max, 1000), size=size, endpoint=True)
    else:
        random = rng.standard_normal(size) * 3.0
    if case == "random":
        flat = random
    elif case == "relu":
        flat = np.maximum(random, 0)
    elif case == "all_zeros":
        flat = np.zeros(size)
    elif case == "no_zeros":
        flat = np.where(random == 0, 1, random)
    elif case == "special":
        flat = random.astype(dtype)
        flat = np.zeros(size, dtype) if size == 0 else flat
        specials = special_values(dtype)
        flat[: min(size, specials.size)] = specials[:size]
        return flat.reshape(shape)
    else:
        raise AssertionError(case)
    out = flat.astype(dtype).reshape(shape)
    if case == "no_zeros":
        out = np.where(bits(out) == 0, np.ones([], dtype), out).astype(dtype)
    return out


def roundtrip_eager(codec, x: np.ndarray):
    tensor = tf.constant(x)
    parts = codec.encode(tensor)
    return codec.decode(parts, tensor.shape, tensor.dtype).numpy(), parts


def roundtrip_function(codec, x: np.ndarray) -> np.ndarray:
    """Inside a tf.function traced for this static shape."""

    @tf.function
    def run(t):
        return codec.decode(codec.encode(t), t.shape, t.dtype)

    return run(tf.constant(x)).numpy()


_DYNAMIC_CACHE: dict = {}


def roundtrip_dynamic(codec, x: np.ndarray) -> np.ndarray:
    """Inside a tf.function traced once with unknown rank and dims; decode gets tf.shape(x)."""
    key = (codec, x.dtype)
    if key not in _DYNAMIC_CACHE:
        spec = tf.TensorSpec(None, tf.as_dtype(x.dtype))

        @tf.function(input_signature=[spec])
        def run(t):
            return codec.decode(codec.encode(t), tf.shape(t), t.dtype)

        _DYNAMIC_CACHE[key] = run
    return _DYNAMIC_CACHE[key](tf.constant(x)).numpy()


def as_float64(a: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # casting a signalling NaN raises the invalid flag
        return a.astype(np.float64)


def abs_error(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.abs(as_float64(y) - as_float64(x))


def assert_lossy_ok(codec, x: np.ndarray, y: np.ndarray, where: str) -> None:
    assert y.dtype == x.dtype and y.shape == x.shape, where
    a, b = as_float64(x), as_float64(y)
    nan = np.isnan(a)
    assert np.array_equal(np.isnan(b), nan), f"{where}: NaN positions changed"
    inf = np.isinf(a)
    assert np.array_equal(b[inf], a[inf]), f"{where}: Inf changed to {b[inf]}"
    finite = ~nan & ~inf
    error = abs_error(x, y)[finite]
    bound = codec.error_bound(x)[finite]
    bad = np.flatnonzero(error > bound)
    assert bad.size == 0, (
        f"{where}: x={a[finite][bad[0]]!r} decoded {b[finite][bad[0]]!r}, error {error[bad[0]]!r} "
        f"> bound {bound[bad[0]]!r}")


# ------------------------------------------------------------------- lossless


@pytest.mark.parametrize("dtype", LOSSLESS_DTYPES, ids=lambda d: d.name)
def test_zvc_roundtrip_is_bitwise_exact(dtype):
    codec = ZeroValueCodec()
    for shape in SHAPES:
        for case in CASES:
            x = make_input(case, dtype, shape)
            where = f"zvc {dtype.name} {case} shape={shape}"
            eager, parts = roundtrip_eager(codec, x)
            for mode, y in (("eager", eager), ("dynamic tf.function", roundtrip_dynamic(codec, x))):
                assert y.dtype == x.dtype and y.shape == x.shape, f"{where} {mode}"
                assert np.array_equal(bits(y), bits(x)), (
                    f"{where} {mode}: bits differ at {np.flatnonzero(bits(y) != bits(x))[:5]}")
            nonzero = np.count_nonzero(bits(x))
            assert encoded_nbytes(parts) == codec.compressed_bytes(x.size, x.dtype, nonzero / max(x.size, 1)), where


@pytest.mark.parametrize("dtype", LOSSLESS_DTYPES, ids=lambda d: d.name)
def test_zvc_static_shape_tf_function_rank_0_to_4(dtype):
    codec = ZeroValueCodec()
    for shape in [(), (13,), (7, 13), (1, 7, 13), (2, 3, 4, 5)]:
        x = make_input("special", dtype, shape)
        y = roundtrip_function(codec, x)
        assert np.array_equal(bits(y), bits(x)), f"zvc {dtype.name} shape={shape} in tf.function"


def test_zvc_keeps_negative_zero_as_a_value_and_nan_payloads():
    codec = ZeroValueCodec()
    x = from_bits([0x00000000, 0x80000000, 0x7FC00001, 0xFFC12345, 0x7F800001, 0x00000001, 0, 0x3F800000],
                  np.dtype(np.float32))
    mask, values = codec.encode(tf.constant(x))
    # Only the two +0.0 entries are "zero": mask 0b01111101 (MSB first), 6 values stored.
    assert mask.numpy().tolist() == [0b01111101]
    assert bits(values.numpy()).tolist() == [0x80000000, 0x7FC00001, 0xFFC12345, 0x7F800001, 0x00000001, 0x3F800000]
    y, _ = roundtrip_eager(codec, x)
    assert bits(y).tolist() == bits(x).tolist()


def test_zvc_mask_matches_numpy_packbits_and_all_zero_tensor_has_no_values():
    codec = ZeroValueCodec()
    x = make_input("relu", np.dtype(np.float32), (1001,))
    mask, values = codec.encode(tf.constant(x))
    assert np.array_equal(mask.numpy(), np.packbits(bits(x) != 0))
    assert mask.shape == (126,)  # ceil(1001 / 8)
    zeros_mask, zeros_values = codec.encode(tf.zeros([13], tf.float32))
    assert zeros_mask.numpy().tolist() == [0, 0] and zeros_values.shape == (0,)


@settings(max_examples=60, deadline=None, database=None)
@given(hnp.arrays(np.uint32, hnp.array_shapes(min_dims=0, max_dims=4, max_side=9)))
def test_zvc_any_float32_bit_pattern_roundtrips(patterns):
    x = patterns.view(np.float32)
    y, _ = roundtrip_eager(ZeroValueCodec(), x)
    assert np.array_equal(bits(y), patterns)


def test_zvc_ratio_on_relu_of_normal_data_float32():
    x = np.maximum(np.random.default_rng(1).standard_normal(1 << 18).astype(np.float32), 0)
    report = ZeroValueCodec().measure(x)
    assert report["bitwise_exact"] and report["max_abs_error"] == 0.0
    assert report["encoded_bytes"] == report["predicted_bytes"]
    assert abs(report["nonzero_fraction"] - 0.5) < 0.005
    assert abs(report["ratio"] - RELU_ZVC_RATIO_FLOAT32) < RATIO_TOLERANCE, report["ratio"]


# ----------------------------------------------------------------------- lossy


@pytest.mark.parametrize("dtype", LOSSY_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("codec", LOSSY_CODECS, ids=repr)
def test_lossy_roundtrip_within_documented_bound(codec, dtype):
    for shape in SHAPES:
        for case in CASES:
            x = make_input(case, dtype, shape)
            where = f"{codec!r} {dtype.name} {case} shape={shape}"
            eager, parts = roundtrip_eager(codec, x)
            assert_lossy_ok(codec, x, eager, f"{where} eager")
            dynamic = roundtrip_dynamic(codec, x)
            assert_lossy_ok(codec, x, dynamic, f"{where} dynamic tf.function")
            assert np.array_equal(bits(dynamic), bits(eager)), f"{where}: tf.function differs from eager"
            assert encoded_nbytes(parts) == codec.compressed_bytes(x.size, x.dtype), where
            if case == "all_zeros":
                assert not np.any(eager), where


@pytest.mark.parametrize("codec", LOSSY_CODECS, ids=repr)
def test_lossy_static_shape_tf_function_rank_0_to_4(codec):
    for shape in [(), (13,), (7, 13), (1, 7, 13), (2, 3, 4, 5)]:
        x = make_input("random", np.dtype(np.float32), shape)
        y = roundtrip_function(codec, x)
        eager, _ = roundtrip_eager(codec, x)
        assert np.array_equal(bits(y), bits(eager)), f"{codec!r} shape={shape}"


def _log_uniform(rng, low_exp: float, high_exp: float, size: int, dtype) -> np.ndarray:
    magnitude = np.exp2(rng.uniform(low_exp, high_exp, size))
    return (magnitude * rng.choice([-1.0, 1.0], size)).astype(dtype)


@pytest.mark.parametrize("dtype", LOSSY_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize(
    "codec, low_exp, high_exp",
    [
        (Float16Codec(), -14, 15.99),     # fp16 normal range: relative bound 2**-11
        (Float16Codec(), -30, -14),       # fp16 subnormal range: absolute bound 2**-25
        (BFloat16Codec(), -120, 120),     # relative bound 2**-8
        (BlockInt8Codec(), -3, 3),        # half a quantization step of each block
        (BlockInt8Codec(block_size=7), -3, 3),
    ],
    ids=["fp16-normal", "fp16-subnormal", "bf16", "int8-block64", "int8-block7"],
)
def test_lossy_bound_holds_and_is_nearly_tight(codec, low_exp, high_exp, dtype):
    x = _log_uniform(np.random.default_rng(7), low_exp, high_exp, 20_000, dtype)
    y, _ = roundtrip_eager(codec, x)
    assert_lossy_ok(codec, x, y, f"{codec!r} {dtype.name}")
    error, bound = abs_error(x, y), codec.error_bound(x)
    assert error.max() > 0
    # A deliberately wrong (halved) bound must fail on this data, so the bound is not vacuous.
    assert np.any(error > bound * TIGHTNESS), f"{codec!r}: worst error is only {(error / bound).max():.3f} of the bound"


@pytest.mark.parametrize("dtype", LOSSY_DTYPES, ids=lambda d: d.name)
def test_int8_block_of_one_is_nearly_exact(dtype):
    """With one element per block every value is +-127 steps: only the float32 scale rounds."""
    codec = BlockInt8Codec(block_size=1)
    x = _log_uniform(np.random.default_rng(8), -100, 100, 5000, dtype)
    y, _ = roundtrip_eager(codec, x)
    assert_lossy_ok(codec, x, y, "int8 block_size=1")
    assert np.all(abs_error(x, y) <= 2.0**-22 * np.abs(as_float64(x)))


def test_int8_float32_maximum_does_not_overflow_to_inf():
    big = np.finfo(np.float32).max
    x = np.float32([big, -big, 1.0, -3e38])
    y, _ = roundtrip_eager(BlockInt8Codec(), x)
    assert np.all(np.isfinite(y)), y  # 127 * fl(max / 127) may round past the maximum: clipped back
    assert_lossy_ok(BlockInt8Codec(), x, y, "float32 max")


def test_fp16_relative_bound_is_the_textbook_one_for_normal_values():
    x = np.float32([1 + 2**-11, 1 + 3 * 2**-11, 1000.3, -2.0**-14 * 1.5])
    y, _ = roundtrip_eager(Float16Codec(), x)
    rel = abs_error(x, y) / np.abs(x.astype(np.float64))
    assert np.all(rel <= 2.0**-11)
    assert rel[0] == pytest.approx(2.0**-11 / (1 + 2.0**-11))  # a tie: rounded to even (1.0)


def test_fp16_relative_bound_survives_double_rounding_of_float64():
    """TF casts float64 -> float32 -> float16: just above a tie, the first rounding makes a tie."""
    x = np.float64([1 + 2**-11 + 2**-30])
    y, _ = roundtrip_eager(Float16Codec(), x)
    assert y[0] == 1.0  # correctly rounded it would be 1 + 2**-10
    assert abs_error(x, y)[0] == 2**-11 + 2**-30 <= Float16Codec().error_bound(x)[0]


@pytest.mark.parametrize("dtype", LOSSY_DTYPES, ids=lambda d: d.name)
def test_fp16_saturates_out_of_range_values_and_keeps_inf_nan_and_signed_zero(dtype):
    codec = Float16Codec()
    x = np.array([70000.0, -1e6, 65519.0, 65520.0, 65504.0, np.inf, -np.inf, np.nan, -0.0, 0.0], dtype)
    y, (stored,) = roundtrip_eager(codec, x)
    assert stored.dtype == tf.float16
    assert y[:5].tolist() == [FP16_MAX, -FP16_MAX, FP16_MAX, FP16_MAX, FP16_MAX]
    assert y[5] == np.inf and y[6] == -np.inf and np.isnan(y[7])
    assert np.signbit(y[8]) and not np.signbit(y[9])
    report = codec.measure(x)
    assert report["out_of_range_fraction"] == pytest.approx(4 / 10)  # 70000, -1e6, 65519, 65520
    assert report["within_bound"]  # saturated elements are bounded by |x| - 65504
    assert report["value_min"] == -1e6 and report["value_max"] == 70000.0


@pytest.mark.parametrize("codec", [Float16Codec(saturate=False), BFloat16Codec(saturate=False)], ids=repr)
def test_cast_without_saturation_overflows_to_inf(codec):
    big = 1e6 if codec.name == "fp16" else float(np.finfo(np.float32).max)
    x = np.float32([big, -big, 1.0, np.nan, np.inf, -0.0])
    y, _ = roundtrip_eager(codec, x)
    assert y[0] == np.inf and y[1] == -np.inf and np.isnan(y[3]) and y[4] == np.inf and np.signbit(y[5])
    report = codec.measure(x)
    assert report["out_of_range_fraction"] == pytest.approx(2 / 6) and report["max_error_bound"] == np.inf
    z = np.random.default_rng(2).standard_normal(999).astype(np.float32)
    assert np.array_equal(bits(roundtrip_eager(codec, z)[0]), bits(roundtrip_eager(type(codec)(), z)[0]))
    with pytest.raises(ConfigError, match="saturate"):
        type(codec)(saturate="no")


@pytest.mark.parametrize("dtype", LOSSY_DTYPES, ids=lambda d: d.name)
def test_bf16_saturates_and_keeps_inf_nan_and_signed_zero(dtype):
    codec = BFloat16Codec()
    big = float(np.finfo(np.float32).max) if dtype == np.float32 else 1e300
    x = np.array([big, -big, np.inf, -np.inf, np.nan, -0.0], dtype)
    y, _ = roundtrip_eager(codec, x)
    assert y[:2].tolist() == [BF16_MAX, -BF16_MAX]
    assert y[2] == np.inf and y[3] == -np.inf and np.isnan(y[4]) and np.signbit(y[5])


@pytest.mark.parametrize("dtype", LOSSY_DTYPES, ids=lambda d: d.name)
def test_int8_nonfinite_values_use_codes_in_a_special_block(dtype):
    codec = BlockInt8Codec(block_size=8)
    x = np.array([0.5, np.nan, -1.0, 0.3, 0, 0, 0, 0,           # special: NaN
                  1.0, np.inf, -np.inf, -0.5, 0, 0, 0, 0,        # special: +-Inf
                  1.0, -0.5, 0.25, 0, 0, 0, 0, 0,                # ordinary
                  np.nan], dtype)                                # special tail block, all non-finite
    q, scale = codec.encode(tf.constant(x))
    assert q.shape == (25,) and scale.shape == (4,)  # fixed sizes: no data-dependent shapes
    scale_bits = bits(scale.numpy())
    assert [bool(b >> 31) for b in scale_bits] == [True, True, False, True]  # sign bit marks special
    assert np.abs(scale.numpy()).tolist() == pytest.approx([1 / 126, 1 / 126, 1 / 127, 0.0], rel=2**-22)
    assert q.numpy().tolist() == [63, -128, -126, 38, 0, 0, 0, 0,
                                  126, 127, -127, -63, 0, 0, 0, 0,
                                  127, -64, 32, 0, 0, 0, 0, 0,
                                  -128]
    y, _ = roundtrip_eager(codec, x)
    assert np.isnan(y[1]) and np.isnan(y[24]) and y[9] == np.inf and y[10] == -np.inf
    assert_lossy_ok(codec, x, y, "int8 special blocks")
    # The ordinary block decodes exactly as it would without its neighbours.
    alone, _ = roundtrip_eager(codec, x[16:24])
    assert np.array_equal(bits(y[16:24]), bits(alone))
    assert encoded_nbytes((q, scale)) == codec.compressed_bytes(25, dtype)


def test_int8_nan_and_inf_do_not_poison_the_rest_of_their_block():
    codec = BlockInt8Codec()
    x = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    x[[5, 40]] = [np.nan, -np.inf]
    y, _ = roundtrip_eager(codec, x)
    finite = np.isfinite(x)
    assert np.all(np.isfinite(y[finite]))
    assert np.max(abs_error(x, y)[finite]) <= np.max(np.abs(x[finite])) / 252 * (1 + 2**-14)
    assert_lossy_ok(codec, x, y, "int8 NaN in block")


def test_int8_max_scale_keeps_decoding_finite():
    f32_max = float(np.finfo(np.float32).max)
    assert INT8_MAX_SCALE == float(np.float32(INT8_MAX_SCALE))
    assert INT8_LEVELS * INT8_MAX_SCALE <= f32_max
    assert INT8_LEVELS * float(np.nextafter(np.float32(INT8_MAX_SCALE), np.float32(np.inf))) > f32_max


def test_int8_float64_values_beyond_float32_range_saturate():
    codec = BlockInt8Codec()
    x = np.array([1e300, -1e39, 0.5, -0.25], np.float64)
    y, _ = roundtrip_eager(codec, x)
    assert y[0] == INT8_LEVELS * INT8_MAX_SCALE and y[1] == -y[0]
    assert_lossy_ok(codec, x, y, "int8 float64 huge")


def test_int8_block_layout_scales_and_tiny_blocks():
    codec = BlockInt8Codec(block_size=4)
    x = np.float32([0, 0, 0, 0, 1, -2, 0.5, 127, 1e-37, -1e-38, 0, 0, 3])
    q, scale = codec.encode(tf.constant(x))
    assert q.dtype == tf.int8 and q.shape == (13,)
    assert scale.dtype == tf.float32 and scale.shape == (4,)  # ceil(13 / 4)
    assert scale.numpy().tolist() == [0.0, 1.0, 0.0, np.float32(3) * np.float32(1 / INT8_LEVELS)]
    assert q.numpy().tolist()[4:8] == [1, -2, 0, 127]  # 0.5 is a tie: rounded to even
    assert q.numpy().tolist()[12] == 127
    y, _ = roundtrip_eager(codec, x)
    assert y[:4].tolist() == [0.0] * 4 and y[8:12].tolist() == [0.0] * 4  # tiny block stored as zeros
    assert_lossy_ok(codec, x, y, "int8 layout")


def test_lossy_measure_reports_range_and_error():
    x = np.random.default_rng(5).standard_normal(4096).astype(np.float32)
    for codec in LOSSY_CODECS:
        report = codec.measure(x)
        assert report["within_bound"] and not report["bitwise_exact"] and not report["lossless"]
        assert 0 < report["max_abs_error"] <= report["max_error_bound"]
        assert report["value_min"] == float(x.min()) and report["value_max"] == float(x.max())
        assert report["encoded_bytes"] == report["predicted_bytes"]
    assert Float16Codec().measure(x)["ratio"] == 2.0
    assert BlockInt8Codec().measure(x)["ratio"] == pytest.approx(4 / (1 + 4 / 64))


# ------------------------------------------------------------ API and errors


def test_get_codec_names_and_unknown_name():
    assert CODEC_NAMES == ("zvc", "fp16", "bf16", "int8-block")
    assert [type(get_codec(n)) for n in CODEC_NAMES] == [ZeroValueCodec, Float16Codec, BFloat16Codec,
                                                         BlockInt8Codec]
    assert get_codec("int8-block").block_size == 64
    with pytest.raises(ConfigError, match="zvc, fp16, bf16, int8-block"):
        get_codec("lz4")


def test_require_lossless_allowed():
    assert require_lossless_allowed(ZeroValueCodec(), allow_lossy=False) == ZeroValueCodec()
    assert require_lossless_allowed(Float16Codec(), allow_lossy=True) == Float16Codec()
    for name in ("fp16", "bf16", "int8-block"):
        with pytest.raises(ConfigError, match="allow_lossy=True.*zvc"):
            require_lossless_allowed(get_codec(name), allow_lossy=False)


def test_codecs_are_frozen_and_validated():
    codec = BlockInt8Codec()
    with pytest.raises(AttributeError):
        codec.block_size = 3  # type: ignore[misc]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="block_size"):
            BlockInt8Codec(block_size=bad)


def test_unsupported_dtypes_and_bad_sizes_raise_config_errors():
    with pytest.raises(CodecDtypeError, match="fp16.*int32.*zvc"):
        Float16Codec().encode(tf.constant([1, 2, 3]))
    with pytest.raises(CodecDtypeError):
        BlockInt8Codec().compressed_bytes(10, tf.float16)
    with pytest.raises(CodecDtypeError):
        ZeroValueCodec().encode(tf.constant([True]))
    with pytest.raises(ConfigError, match="nonzero_fraction"):
        ZeroValueCodec().compressed_bytes(10, tf.float32, 1.5)
    with pytest.raises(ConfigError, match="num_elements"):
        ZeroValueCodec().compressed_bytes(-1, tf.float32)
    assert issubclass(CodecDtypeError, ConfigError)


def test_decode_needs_a_known_or_dynamic_shape():
    codec = ZeroValueCodec()
    parts = codec.encode(tf.ones([3, 4]))
    with pytest.raises(ConfigError, match="tf.shape"):
        codec.decode(parts, tf.TensorShape([None, 4]), tf.float32)
    with pytest.raises(ConfigError, match="2 parts"):
        codec.decode(parts[:1], [3, 4], tf.float32)
    assert codec.decode(parts, tf.constant([3, 4]), tf.float32).shape == (3, 4)
    assert codec.decode(parts, [3, 4], tf.float32).shape == (3, 4)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_unknown_leading_dimension_in_tf_function(name):
    codec = get_codec(name)

    @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.float32)])
    def swap(x):
        parts = codec.encode(x)
        return codec.decode(parts, tf.shape(x), x.dtype)

    for rows in (1, 3, 13):
        x = make_input("relu", np.dtype(np.float32), (rows, 5), seed=rows)
        y = swap(tf.constant(x)).numpy()
        if codec.lossless:
            assert np.array_equal(bits(y), bits(x))
        else:
            assert_lossy_ok(codec, x, y, f"{name} rows={rows}")


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_compressed_bytes_formulas(name):
    codec = get_codec(name)
    expected = {
        "zvc": 125 + 500 * 4,  # ceil(1000 / 8) mask bytes + 500 float32 values
        "fp16": 2000,
        "bf16": 2000,
        "int8-block": 1000 + 16 * 4,  # one byte per element + ceil(1000 / 64) float32 scales
    }[name]
    assert codec.compressed_bytes(1000, tf.float32, nonzero_fraction=0.5) == expected
    assert codec.compressed_bytes(0, "float32") == 0


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_empty_tensors_roundtrip(name):
    codec = get_codec(name)
    for shape in [(0,), (2, 0, 3)]:
        x = np.zeros(shape, np.float32)
        y, parts = roundtrip_eager(codec, x)
        assert y.shape == shape and y.dtype == np.float32
        assert encoded_nbytes(parts) == codec.compressed_bytes(0, tf.float32) == 0
        assert roundtrip_dynamic(codec, x).shape == shape


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 1001])
def test_mask_helpers_word_tricks_match_the_portable_path(size):
    """The little-endian uint64 tricks against the byte-at-a-time fallback used on big-endian hosts."""
    flags = np.random.default_rng(size).random(size) < 0.5
    fast = _pack_bits(tf.constant(flags, tf.bool), little_endian=True)
    portable = _pack_bits(tf.constant(flags, tf.bool), little_endian=False)
    assert fast.numpy().tolist() == portable.numpy().tolist() == np.packbits(flags).tolist()
    for little_endian in (True, False):
        assert np.array_equal(_unpack_bits(fast, size, little_endian=little_endian).numpy(), flags)
        unpacked, rank, count = _flag_ranks(fast, size, little_endian=little_endian)
        assert np.array_equal(unpacked.numpy(), flags)
        assert rank.numpy().tolist() == (np.cumsum(flags) - flags).tolist()
        assert int(count) == int(flags.sum())

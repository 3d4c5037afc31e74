"""Compressed swaps: codecs that shrink a tensor before its device -> host copy.

The codecs are plain TensorFlow ops (see :mod:`tflms.compress.codecs` for the
formats and their error bounds); ``tools/bench_codecs.py`` measures their
throughput for the cost model.
"""

from __future__ import annotations

from tflms.compress.codecs import (
    CODEC_NAMES,
    BFloat16Codec,
    BlockInt8Codec,
    Codec,
    CodecDtypeError,
    Float16Codec,
    ZeroValueCodec,
    encoded_nbytes,
    get_codec,
    require_lossless_allowed,
)

__all__ = [
    "BFloat16Codec",
    "BlockInt8Codec",
    "CODEC_NAMES",
    "Codec",
    "CodecDtypeError",
    "Float16Codec",
    "ZeroValueCodec",
    "encoded_nbytes",
    "get_codec",
    "require_lossless_allowed",
]

"""Compressed swaps: codecs that shrink a tensor before its device -> host copy.

- :mod:`tflms.compress.codecs`: the codecs, plain TensorFlow ops (formats and error bounds);
- :mod:`tflms.compress.rewrite`: :func:`apply_compression`, the pass that inserts encode
  before each swap-out and decode after each swap-in (run after ``apply_plan``);
- :mod:`tflms.compress.profiling`: :func:`profile_tensors` measures real activations
  (sparsity, value range) without changing the model;
- :mod:`tflms.compress.policy`: :func:`decide_compression`, CSwap+'s per-tensor rule
  (compress only exposed copies, only when it is faster);
- :mod:`tflms.compress.calibrate`: codec throughputs measured on the user's device
  (``tflms calibrate``), saved as JSON, or assumed from a hardware profile.
"""

from __future__ import annotations

from tflms.compress.calibrate import CodecThroughputs, assumed_for, with_throughputs
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
from tflms.compress.policy import CompressionPolicyResult, decide_compression
from tflms.compress.profiling import ProfileReport, TensorStats, profile_tensors
from tflms.compress.rewrite import CompressedRewrite, CompressionChoice, apply_compression, compress_rewrite

__all__ = [
    "BFloat16Codec",
    "BlockInt8Codec",
    "CODEC_NAMES",
    "Codec",
    "CodecDtypeError",
    "CodecThroughputs",
    "CompressedRewrite",
    "CompressionChoice",
    "CompressionPolicyResult",
    "Float16Codec",
    "ProfileReport",
    "TensorStats",
    "ZeroValueCodec",
    "apply_compression",
    "assumed_for",
    "compress_rewrite",
    "decide_compression",
    "encoded_nbytes",
    "get_codec",
    "profile_tensors",
    "require_lossless_allowed",
    "with_throughputs",
]

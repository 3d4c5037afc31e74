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

import importlib

#: Public name -> the submodule that defines it. Imported on first use: the codecs are TensorFlow ops, and
#: ``tflms --help`` or ``tflms calibrate --help`` must not wait for TensorFlow to load.
_EXPORTS = {
    "CodecThroughputs": "calibrate", "assumed_for": "calibrate", "with_throughputs": "calibrate",
    "CODEC_NAMES": "codecs", "BFloat16Codec": "codecs", "BlockInt8Codec": "codecs", "Codec": "codecs",
    "CodecDtypeError": "codecs", "Float16Codec": "codecs", "ZeroValueCodec": "codecs", "encoded_nbytes": "codecs",
    "get_codec": "codecs", "require_lossless_allowed": "codecs",
    "CompressionPolicyResult": "policy", "decide_compression": "policy",
    "ProfileReport": "profiling", "TensorStats": "profiling", "profile_tensors": "profiling",
    "CompressedRewrite": "rewrite", "CompressionChoice": "rewrite", "apply_compression": "rewrite",
    "compress_rewrite": "rewrite",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tflms.compress' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tflms.compress.{module}"), name)

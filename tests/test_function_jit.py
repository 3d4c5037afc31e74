"""tflms.function and XLA: jit_compile=True keeps XLA as clusters between the copies (issue 47), never by compiling
the traced step whole (issue 46: that compiled the swaps to pass-throughs). tests/test_xla_clusters.py trains it."""

from __future__ import annotations

import tensorflow as tf

import tflms
from tflms.integrations.function import LMSFunction


def test_jit_compile_keeps_xla_by_clustering_not_by_compiling_the_step_whole():
    """A must-compile XLA function ignores op placement (tensorflow#124880): the step is traced without jit_compile,
    and the rewrite marks its clusters instead."""
    fn = tflms.function(lambda x: x * 2.0, jit_compile=True)
    assert isinstance(fn, LMSFunction) and fn.xla
    traced = fn.original_function.get_concrete_function(tf.TensorSpec([2], tf.float32))
    must = traced.function_def.attr.get("_XlaMustCompile")
    assert must is None or not must.b, "the traced step must not be compiled whole"
    for off in (False, None):
        assert not tflms.function(lambda x: x, jit_compile=off).xla
    assert not tflms.function(lambda x: x).xla
    assert tflms.function(lambda x: x, experimental_compile=True).xla  # jit_compile's old name

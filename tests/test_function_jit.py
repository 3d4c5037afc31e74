"""tflms.function and XLA (issue 46): a must-compile XLA step is refused until issue 47 clusters between swaps."""

from __future__ import annotations

import pytest

import tflms
from tflms.errors import ConfigError
from tflms.integrations.function import LMSFunction


def test_jit_compile_is_refused_since_xla_would_compile_the_swaps_away():
    """A must-compile XLA function ignores op placement (tensorflow#124880): the swaps would compile to pass-throughs
    while the report listed them."""
    with pytest.raises(ConfigError, match=r"jit_compile=True.*ignores where ops are placed.*pass-throughs.*issue 47"):
        tflms.function(lambda x: x, jit_compile=True)
    assert isinstance(tflms.function(lambda x: x, jit_compile=False), LMSFunction)
    assert isinstance(tflms.function(lambda x: x), LMSFunction)

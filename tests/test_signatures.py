"""The entry points name every LMSConfig field, with the guide's parameter reference in step (issue 29)."""

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import tflms
import tflms.keras
from tflms.config import LMSConfig, option_names

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
#: What each entry point takes besides LMSConfig's fields.
OWN = {
    "tflms.function": {"fn", "config", "verbose", "input_signature", "autograph", "jit_compile", "reduce_retracing",
                       "tf_function_options"},
    "tflms.keras.LMS": {"config", "verbose", "misspelt"},
}
ENTRY_POINTS = {"tflms.function": tflms.function, "tflms.keras.LMS": tflms.keras.LMS}


def _guide_parameters() -> set[str]:
    text = GUIDE.read_text()
    section = text.split("## Parameter reference", 1)[1].split("\n## ", 1)[0]
    names = set()
    for row in re.findall(r"^\| (`[^|]+) \|", section, flags=re.M):
        names.update(re.findall(r"`(\w+)`", row))
    return names


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_entry_points_name_every_config_field(name):
    params = inspect.signature(ENTRY_POINTS[name]).parameters
    assert set(params) - OWN[name] == set(option_names())
    for option in option_names():
        p = params[option]
        assert p.kind is inspect.Parameter.KEYWORD_ONLY or option == "budget", option
        assert p.default is None, f"{name}({option}=...) must default to None ('not given')"
        assert p.annotation is not inspect.Parameter.empty, f"{name}({option}) has no type"
    assert params["verbose"].default in (0, 1)


def test_guide_reference_lists_every_field_and_nothing_else():
    fields = {f.name for f in dataclasses.fields(LMSConfig)}
    assert _guide_parameters() - {"budget"} == fields  # the table says "`budget_bytes` (alias `budget`)"


def test_keyword_arguments_reach_the_config():
    base = LMSConfig(compress="zvc", min_swap_bytes="1MiB")
    lms = tflms.keras.LMS("2GiB", 0, config=base, swapin_ahead=3, exclude_types=["Relu"])
    assert (lms.config.budget_bytes, lms.config.swapin_ahead, lms.config.exclude_types) == (2 << 30, 3, ("Relu",))
    assert (lms.config.compress, lms.config.min_swap_bytes) == ("zvc", 1 << 20)  # not given: the base's
    step = tflms.function(lambda x: x, config=base, budget="1GiB", fit_by="bfc", reduce_retracing=True)
    assert (step.config.budget_bytes, step.config.fit_by, step.config.compress) == (1 << 30, "bfc", "zvc")
    assert step.original_function._reduce_retracing is True  # noqa: SLF001 - tf.function keeps its option here


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_misspelt_name_is_refused_with_the_closest_parameter(entry):
    with pytest.raises(tflms.ConfigError, match="swapin_aehad.*did you mean 'swapin_ahead'"):
        ENTRY_POINTS[entry](swapin_aehad=2)

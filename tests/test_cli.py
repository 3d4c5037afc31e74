"""The tflms command: help, demo, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tflms.cli import main


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "train a built-in model" in out


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "usage: tflms" in capsys.readouterr().out


def test_demo_json_reports_bitwise_identical_training(capsys):
    assert main(["demo", "--model", "mlp", "--steps", "2", "--batch-size", "16", "--json", "--min-swap-bytes", "0",
                 "--swapout-threshold", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["identical"] is True and result["mismatched_weights"] == []
    assert result["report"]["swaps"], "the demo must actually swap something"
    assert result["losses_plain"] == result["losses_tflms"]


def test_demo_table(capsys):
    assert main(["demo", "--model", "cnn", "--steps", "1", "--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "OK: all" in out and "bitwise identical" in out
    assert "trigger (lvl)" in out and "block0_relu" in out


def test_bad_option_value_is_a_clear_error(capsys):
    assert main(["demo", "--min-swap-bytes", "12 parsecs"]) == 2
    assert "unknown unit" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "tflms.cli", "--help"], capture_output=True, text=True, check=True)
    assert "tflms" in out.stdout


def test_calibrate_shows_documented_defaults(capsys):
    assert main(["calibrate", "--show-defaults", "--json"]) == 0
    out = capsys.readouterr().out
    assert "zvc" in out and "fp16" in out

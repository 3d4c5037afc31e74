"""The tflms command: help, demo, errors."""

from __future__ import annotations

import json
import re
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
    assert "estimate" in out and "exit status" in out and "130 or 143" in out
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    assert "h100-80gb-sxm5" in capsys.readouterr().out  # the profile names are listed


def test_help_lists_the_profiles_and_every_exit_status(capsys):
    """Issue 48, item 6: the profile names and the exit statuses are in ``tflms --help``, not only in cli.py."""
    from tflms.profiles import profile_names
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    epilog = out.split("hardware profiles", 1)[1]
    assert all(name in epilog for name in profile_names()) and "tools/gpu_probe.py" in epilog
    statuses = epilog.split("exit status:", 1)[1]
    for code, words in (("0", "done"), ("1", "demo only"), ("2", "an error tflms names"),
                        ("130 or 143", "interrupted by SIGINT or SIGTERM")):
        assert re.search(rf"^  {code} +{words}", statuses, re.M), (code, statuses)


def _flag_help(command: str, flag: str) -> str:
    from tflms.cli import build_parser
    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse has no accessor
    action = next(a for a in sub[command]._actions if flag in a.option_strings)  # noqa: SLF001
    return action.help


@pytest.mark.parametrize("command", ["rewrite", "analyze", "plan"])
def test_profile_and_batch_size_help_say_what_the_code_does(command):
    from tflms.profiles import profile_names
    profile = _flag_help(command, "--profile")
    assert all(name in profile for name in profile_names()) and "turns on the tuner" not in profile
    # unsized tensors: a memory verdict is refused (UnknownSizeError), the rules leave them unswapped
    batch = _flag_help(command, "--batch-size")
    assert "refused rather than counting those tensors as 0 bytes" in batch and "unswapped" in batch
    assert "5%" in _flag_help(command, "--budget").replace("%%", "%")


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
    # a row per swapped tensor under the table's header: "name:output  bytes  lvl ...", here an activation
    assert "trigger (lvl)" in out and re.search(r"^\S*block0_\S*:\d+ +[\d.]+ [KMG]?i?B +\d+ ", out, re.M), out
    # The default tunes; the demo model fits any accelerator, so the demo gives itself a budget below its peak.
    assert "budget: " in out and "of the step's predicted peak" in out and "--budget sets another" in out
    assert "tuning: " in out and "predicted peak " in out


def test_demo_help_states_its_budget():
    from tflms.cli import build_parser
    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse has no accessor
    text = " ".join(sub["demo"].format_help().split())
    assert "60% of its predicted peak" in text and "tunes for the accelerator's memory" in text


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


def _fresh_python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in __import__("os").environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_help_and_argument_errors_do_not_import_tensorflow():
    done = _fresh_python(
        "import sys\n"
        "from tflms import cli\n"
        "for argv in (['--help'], ['rewrite', '--help'], ['calibrate', '--help'], ['rewrite']):\n"
        "    try:\n"
        "        cli.build_parser().parse_args(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('tensorflow' in sys.modules)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.slow
def test_tensorflows_start_up_banner_is_filtered():
    from tflms.cli import STARTUP_NOISE
    done = _fresh_python("from tflms import cli\ncli.import_tensorflow_quietly()\nimport tensorflow\n")
    assert done.returncode == 0, done.stderr
    assert not [n for n in STARTUP_NOISE if n in done.stderr], done.stderr
    # The control: plain TensorFlow prints banner lines here. Which ones depends on the CPU (oneDNN's line only
    # where TensorFlow turns oneDNN on by default, e.g. not on AMD EPYC), so ask for any of them.
    control = _fresh_python("import tensorflow\n")
    assert [n for n in STARTUP_NOISE if n in control.stderr], "the banner this test filters is no longer printed"


def test_each_warning_is_said_once_and_the_loggers_are_restored(capsys, caplog):
    import logging

    from tflms import cli
    ours = logging.getLogger("tflms")
    before = ours.level
    with cli.quiet_logs("rewrite"):
        assert not ours.isEnabledFor(logging.WARNING)  # the report tables carry tflms's warnings
        record = logging.LogRecord("absl", logging.WARNING, __file__, 1, "Importing a function (f) with ops with "
                                   "unsaved custom gradients. Will likely fail if a gradient is requested.", (), None)
        assert not logging.getLogger("absl").filter(record)
    assert ours.level == before and logging.getLogger("absl").filter(record)
    with cli.quiet_logs("calibrate"):
        assert ours.isEnabledFor(logging.WARNING)  # calibrate prints no report: its warnings stay on

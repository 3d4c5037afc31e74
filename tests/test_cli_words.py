"""The CLI speaks flags: API keywords in messages become the command's flags (issue 14, item 9)."""

from __future__ import annotations

import pytest

from tflms.cli import main
from tflms.cli_words import FLAGS, speak_flags


@pytest.mark.parametrize("api, cli", [
    ("OUT_DIR x exists; pass replace=True (--replace) to replace it", "OUT_DIR x exists; pass --replace to replace it"),
    ("(table(wide=True) (--wide) or to_json() (--json) lists all)", "(--wide or --json lists all)"),
    ("give batch_size=N (--batch-size N) to size them", "give --batch-size N to size them"),
    ("swapout_threshold must be >= 1 levels, got 0", "--swapout-threshold must be >= 1 levels, got 0"),
    ("include_types: 'Conv2d' is not a TensorFlow op type", "--include-types: 'Conv2d' is not a TensorFlow op type"),
    ("compress='auto' measures sparsity (compress='zvc' is lossless)", "--compress auto measures sparsity "
                                                                        "(--compress zvc is lossless)"),
    ("name another with profile=... (--profile)", "name another with --profile"),
])
def test_api_words_become_flags(api, cli):
    assert speak_flags(api) == cli


def test_tensor_names_and_english_words_are_left_alone():
    text = "tensor model/batch_size:0 and batch_size:1 are over the budget"
    assert speak_flags(text) == text


def test_every_mapped_flag_exists_on_the_command():
    from tflms.cli import build_parser
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse keeps no public accessor
    known = {opt for name in ("rewrite", "demo")
             for a in sub[name]._actions for opt in a.option_strings}  # noqa: SLF001
    assert set(FLAGS.values()) <= known


def test_config_errors_name_the_flag(capsys):
    assert main(["demo", "--swapout-threshold", "0", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "--swapout-threshold must be >= 1" in err and "swapout_threshold" not in err


def test_demo_refuses_a_bad_op_type_before_the_plain_model_trains(capsys):
    assert main(["demo", "--include-types", "Conv2d", "--steps", "1", "--batch-size", "4"]) == 2
    err = capsys.readouterr().err
    assert "--include-types: 'Conv2d' is not a TensorFlow op type" in err and "Conv2D" in err
    assert "(plain)" not in err

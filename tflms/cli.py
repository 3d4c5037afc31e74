"""The ``tflms`` command.

Sub-commands:
  demo     train a built-in model with and without tflms, check the weights are
           bitwise identical, print the swap report.
  rewrite  IN_DIR OUT_DIR: rewrite the training functions of a SavedModel into a
           new SavedModel (written atomically; IN_DIR is never touched; an
           existing OUT_DIR only with --replace; --verify runs both models once
           and checks the results bit for bit).
  analyze  IN_DIR: print each function's ordering summary, swap report and
           simulated memory (peak, resident, alive at the peak); writes nothing.
  calibrate  measure codec throughputs on this device (JSON for the cost model).
  plan     IN_DIR: memory planning of each training step before and after the
           rewrite: lower bound, planned pool (offsets in --json), BFC and
           caching allocator models; writes nothing.
  estimate MODEL --batch N: the predicted peak, fit and largest batch with
           and without tflms (simulated; nothing is trained).

Exit statuses (``tflms --help`` lists them, from :data:`EXIT_STATUSES`): errors
tflms raises on purpose (bad paths, unknown functions, functions without a
training step, ...) exit with status 2 and a message naming the fix; with
--json, a {"error": ..., "type": ...} document is printed on stdout as well.
The demo exits with 1 when the weights differ. SIGINT (Ctrl-C) and SIGTERM stop
the command cleanly: temporary files are removed, one line says nothing was
written, and the status is 128 + the signal number (130, 143).

Only ``rewrite --verify`` executes the model's graph (with whatever side
effects its ops have); analyze, plan and rewrite without --verify only read it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Sequence

from tflms import interrupts
from tflms.cli_words import speak_flags
from tflms.config import RECOMPUTE_MODES, RULE_DEFAULTS, LMSConfig
from tflms.errors import ConfigError, TflmsError


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Flags for every :class:`LMSConfig` field (TFLMS names)."""
    group = parser.add_argument_group(
        "swap parameters (TFLMS semantics)",
        "Default: without --swapout-threshold, --swapin-ahead, --swapin-groupby, --sync-mode, --budget and "
        "--profile, tflms tunes for the accelerator's memory (this machine's GPU; without one, the chosen "
        "profile's memory, said in the report): a step that fits is left alone, one that does not gets the fastest "
        "rewrite that fits. Any of the four rule flags selects the TFLMS rules, the others at the defaults below.")
    defaults = RULE_DEFAULTS
    group.add_argument("--swapout-threshold", type=int, default=None,
                       help="swap a tensor to consumers more than this many levels away "
                            f"(default {defaults['swapout_threshold']} under the rules)")
    group.add_argument("--swapin-ahead", type=int, default=None,
                       help="trigger swap-ins this many levels before the consumer "
                            f"(default {defaults['swapin_ahead']} under the rules)")
    group.add_argument("--swapin-groupby", type=int, default=None,
                       help="consumers within this many levels share one swap-in "
                            f"(default {defaults['swapin_groupby']} under the rules)")
    group.add_argument("--sync-mode", type=int, default=None, choices=(0, 1, 2, 3),
                       help=f"0 async, 1 sync swap-out, 2 sync swap-in, 3 both (default {defaults['sync_mode']} "
                            "under the rules)")
    group.add_argument("--min-swap-bytes", default=str(LMSConfig().min_swap_bytes),
                       help="never swap smaller tensors; bytes or e.g. '1MiB' (default %(default)s)")
    group.add_argument("--include-types", nargs="*", default=[], metavar="OP_TYPE")
    group.add_argument("--exclude-types", nargs="*", default=[], metavar="OP_TYPE")
    group.add_argument("--include-scopes", nargs="*", default=[], metavar="SCOPE")
    group.add_argument("--exclude-scopes", nargs="*", default=[], metavar="SCOPE")
    group.add_argument("--host-device", default=LMSConfig().host_device)
    group.add_argument("--accelerator-device", default=None,
                       help="default: the first GPU, else the CPU (nothing is saved then)")
    group.add_argument("--enforce-order", action=argparse.BooleanOptionalAction, default=None,
                       help="pin a memory-aware execution order with control edges (default: when tuning, if it "
                            "lowers the predicted peak)")
    group.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=None,
                       help="price float32 contractions at TF32 (--tf32) or FP32 (--no-tf32) on GPUs with TF32 "
                            "(default: as TensorFlow's tensor_float_32_execution setting)")
    group.add_argument("--recompute", default=LMSConfig().recompute, choices=RECOMPUTE_MODES,
                       help="what the tuner may do besides swapping: auto re-runs forward ops in the backward pass "
                            "where that beats a copy; off swaps only; only recomputes only, with no host copies "
                            "(default %(default)s)")
    group.add_argument("--compress", default=None, choices=("zvc", "fp16", "bf16", "int8", "auto"),
                       help="compress swapped tensors before their copy: zvc is lossless (training stays "
                            "bitwise); fp16, bf16 and int8 are lossy; auto picks per tensor from sparsity measured "
                            "on real inputs (tflms.function and the Keras callback only). Default: no compression")


#: The demo's default budget, in percent of its predicted peak (also in tflms.demo; kept here so --help imports no TF).
DEMO_BUDGET_PERCENT = 60


def config_from_args(args: argparse.Namespace) -> LMSConfig:
    min_bytes = args.min_swap_bytes
    return LMSConfig(
        swapout_threshold=args.swapout_threshold, swapin_ahead=args.swapin_ahead,
        swapin_groupby=args.swapin_groupby, sync_mode=args.sync_mode,
        min_swap_bytes=int(min_bytes) if min_bytes.isdigit() else min_bytes,
        include_types=tuple(args.include_types), exclude_types=tuple(args.exclude_types),
        include_scopes=tuple(args.include_scopes), exclude_scopes=tuple(args.exclude_scopes),
        host_device=args.host_device, accelerator_device=args.accelerator_device, compress=args.compress,
        enforce_order=args.enforce_order, tf32=args.tf32, recompute=args.recompute)


def _progress(message: str) -> None:
    print(f"[tflms] {message}", file=sys.stderr, flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    from tflms.demo import run_demo
    config = config_from_args(args).replace(budget_bytes=args.budget)
    result = run_demo(args.model, steps=args.steps, batch_size=args.batch_size, config=config,
                      progress=None if args.json else _progress)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0 if result.identical else 1
    print(f"tflms demo: {result.model} model, batch {result.batch_size}, {result.steps} training steps")
    if result.budget_note:
        print(f"budget: {result.budget_note}")
    print()
    print(speak_flags(result.report.table(wide=args.wide)))
    print()
    for i, (a, b) in enumerate(zip(result.losses_plain, result.losses_tflms)):
        print(f"step {i + 1}: loss without tflms {a:.9g}   with tflms {b:.9g}")
    if result.identical:
        print(f"\nOK: all {result.num_weights} weights and optimizer variables are bitwise identical "
              f"with and without the rewrite.")
        return 0
    print(f"\nMISMATCH: {len(result.mismatched_weights)} of {result.num_weights} variables differ "
          f"(max |diff| {result.max_abs_diff:g}): {list(result.mismatched_weights)[:5]}")
    return 1


def add_wide_flag(parser: argparse.ArgumentParser, help: str | None = None) -> None:  # noqa: A002
    parser.add_argument("--wide", action="store_true",
                        help=help or "tables with every swapped tensor, full tensor names and every consumer level "
                                     "(and, in analyze, every tensor alive at the peak)")


def add_budget_flags(parser: argparse.ArgumentParser) -> None:
    """Flags for the tuner and for sizing: ``--budget``, ``--profile``, ``--batch-size``."""
    from tflms.budget import DEFAULT_MARGIN_FRACTION
    group = parser.add_argument_group("tuning and sizing")
    group.add_argument("--budget", default=None,
                       help="accelerator memory budget, e.g. '12GiB', that the tuner fits the step's predicted "
                            "peak in (it searches the swap parameters). Default, unless a rule flag is given: the "
                            f"accelerator's memory (with --profile, the profile's), with the predicted peak plus a {100 * DEFAULT_MARGIN_FRACTION:.0f}%% "
                            "margin within it; a budget "
                            "given gets no margin (docs/guide.md, 'The budget')")
    from tflms.profiles import DEFAULT_PROFILE, profile_names
    group.add_argument("--profile", "--profile-file", dest="profile", default=None,
                       help="hardware profile whose costs the tuner simulates, and whose memory is the budget when "
                            "--budget is not given: " + ", ".join(profile_names()) + ", or a JSON file ending in "
                            ".json (tools/gpu_probe.py's output). Default: the closest to this machine's GPU (its "
                            f"own memory is the budget), else {DEFAULT_PROFILE}. Tuning is the default already; "
                            "with a rule flag, --profile (like --budget) makes tflms tune instead of applying the rules")
    group.add_argument("--batch-size", type=int, default=None,
                       help="the size of the saved step's unknown batch (leading) dimension. Without it, whatever "
                            "predicts memory is refused rather than counting those tensors as 0 bytes: tuning (the "
                            "default, --budget, --profile) and the simulated memory of analyze and plan. With only "
                            "rule flags, rewrite leaves such tensors unswapped (reason unknown-shape)")
    group.add_argument("--fit-by", choices=("live", "bfc"), default="live",
                       help="judge fit by the live-bytes peak or by the BFC allocator model (default %(default)s)")
    group.add_argument("--plan-cache", default=None, metavar="DIR|on|off", help="reuse tuned plans from disk: a "
                       "directory, on or off (default on; docs/guide.md, 'The plan cache')")


def _savedmodel_config(args: argparse.Namespace) -> LMSConfig:
    cache = {"on": True, "off": False}.get(args.plan_cache, args.plan_cache)
    return config_from_args(args).replace(budget_bytes=args.budget, profile=args.profile, batch_size=args.batch_size,
                                          fit_by=args.fit_by, plan_cache=cache)


def _json_error(args: argparse.Namespace, run) -> int:
    """Run ``run()``; with --json, a TflmsError is also printed as a JSON document on stdout."""
    try:
        return run()
    except TflmsError as err:
        if getattr(args, "json", False):
            print(json.dumps({"error": speak_flags(str(err)), "type": type(err).__name__}, indent=2))
        raise


def cmd_rewrite(args: argparse.Namespace) -> int:
    from tflms.integrations.savedmodel import rewrite_saved_model

    def run() -> int:
        result = rewrite_saved_model(args.input, args.output, _savedmodel_config(args), functions=args.functions,
                                     replace=args.replace, verify=args.verify, xla=args.xla,
                                     progress=None if args.json else _progress)
        if args.json:
            print(json.dumps(result.to_dict(), indent=2))
            return 0
        print(speak_flags(result.table(wide=args.wide)))
        print(f"\nOK: wrote {result.output_dir}" + (" (replacing the previous model)" if result.replaced else ""))
        return 0

    return _json_error(args, run)


def cmd_analyze(args: argparse.Namespace) -> int:
    from tflms.integrations.savedmodel import analyze_saved_model

    def run() -> int:
        traces = analyze_saved_model(args.input, _savedmodel_config(args), functions=args.functions)
        if args.json:
            print(json.dumps({"input": os.path.realpath(args.input), "functions": [t.to_dict() for t in traces]},
                             indent=2))
        else:
            print(speak_flags("\n\n".join(t.table(wide=args.wide) for t in traces)))
        return 0

    return _json_error(args, run)


def cmd_estimate(args: argparse.Namespace) -> int:
    from tflms.estimate import estimate_batches

    def run() -> int:
        try:
            batches = [int(b) for b in str(args.batch).split(",")]
        except ValueError:
            raise ConfigError(f"--batch takes whole numbers separated by commas, got {args.batch!r}") from None
        results = estimate_batches(args.model, batch_sizes=batches, profile=args.profile, budget=args.budget,
                                   search_max_batch=not args.no_max_batch, progress=None if args.json else _progress,
                                   function=args.function)
        if args.json:
            records = [r.to_dict() for r in results]
            print(json.dumps(records[0] if len(records) == 1 else records, indent=2))
        else:
            print("\n\n".join(r.table() for r in results))
        return 0

    return _json_error(args, run)


def cmd_plan(args: argparse.Namespace) -> int:
    from tflms.integrations.savedmodel import analyze_saved_model
    from tflms.memplan.report import plan_step

    def run() -> int:
        traces = analyze_saved_model(args.input, _savedmodel_config(args), functions=args.functions)
        records = []
        for t in traces:
            record = {"function": t.function, "trace": t.trace, "signature": t.signature, "note": t.note}
            for variant, sim in (("original", t.original_memory), ("rewritten", t.rewritten_memory)):
                record[variant] = None if sim is None else plan_step(sim)
            records.append(record)
        if args.json:
            print(json.dumps({"input": os.path.realpath(args.input), "functions": [
                {**{k: v for k, v in r.items() if k not in ("original", "rewritten")},
                 **{v: (None if r[v] is None else r[v].to_dict()) for v in ("original", "rewritten")}}
                for r in records]}, indent=2))
            return 0
        for r in records:
            print(speak_flags(f"{r['function']} [{r['trace']}] {r['signature']}"
                              + (f"  ({r['note']})" if r["note"] else "")))
            for variant in ("original", "rewritten"):
                if r[variant] is not None:
                    print(f"  {variant}:")
                    print("    " + r[variant].table().replace("\n", "\n    "))
        return 0

    return _json_error(args, run)


#: The exit statuses of every command, for ``tflms --help`` (the module doc says the same).
EXIT_STATUSES = (
    ("0", "done (demo: the weights were bitwise identical with and without the rewrite)"),
    ("1", "demo only: some weights differed with and without the rewrite"),
    ("2", "an error tflms names (bad path, unknown function or profile, a budget nothing fits, a Keras model.export() "
          "directory, ...) or a bad command line; with --json the error is also printed as {\"error\": ..., "
          "\"type\": ...} on stdout"),
    ("130 or 143", "interrupted by SIGINT or SIGTERM: nothing half-written is left"),
)


def top_epilog(width: int = 79) -> str:
    """``tflms --help``'s closing text: the hardware profiles and the exit statuses (imports no TensorFlow)."""
    import textwrap

    from tflms.profiles import DEFAULT_PROFILE, profile_names
    names = ", ".join(profile_names()) + ", or a JSON file from tools/gpu_probe.py"
    lines = textwrap.wrap(f"hardware profiles (--profile; default: the closest to this machine's GPU, else "
                          f"{DEFAULT_PROFILE}):", width)
    lines += textwrap.wrap(names, width, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)
    lines += ["", "exit status:"]
    for code, meaning in EXIT_STATUSES:
        lines += textwrap.wrap(meaning, width, initial_indent=f"  {code:<11}", subsequent_indent=" " * 13,
                               break_on_hyphens=False)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tflms", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Large model support for TensorFlow 2: rewrite training graphs so that activations wait "
                    "in host memory between the forward and the backward pass.",
        epilog=top_epilog())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="train a built-in model with and without tflms and compare the weights",
                          description="Trace a built-in model's training step (no download, no GPU needed), "
                                      "train it for a few steps with and without the tflms rewrite, check that "
                                      "the weights are bitwise identical and print the swap report. The demo "
                                      "model fits any accelerator, so with no swap flag it tunes for a budget of "
                                      f"{DEMO_BUDGET_PERCENT}% of its predicted peak, to have something to swap "
                                      "(the output says so); --budget or the rule flags override that.")
    demo.add_argument("--model", choices=("cnn", "mlp"), default="cnn", help="built-in model (default %(default)s)")
    demo.add_argument("--steps", type=int, default=3, help="training steps (default %(default)s)")
    demo.add_argument("--batch-size", type=int, default=32, help="batch size (default %(default)s)")
    add_wide_flag(demo)
    demo.add_argument("--json", action="store_true", help="print the result as JSON")
    demo.add_argument("--budget", default=None,
                      help=f"accelerator memory budget (default: {DEMO_BUDGET_PERCENT}%% of the predicted peak)")
    add_config_flags(demo)
    demo.set_defaults(func=cmd_demo)

    rewrite = sub.add_parser(
        "rewrite", help="rewrite the training functions of a SavedModel into a new SavedModel",
        description="Load the SavedModel in IN_DIR (written by tf.saved_model.save), rewrite the traced graphs of "
                    "its training functions and save a new SavedModel in OUT_DIR: tf.saved_model.load(OUT_DIR) "
                    "then runs the rewritten functions on the restored variables. Functions without a training step, "
                    "variables and signatures are kept. IN_DIR is never written; OUT_DIR is written atomically: at "
                    "every instant it is absent, the previous model (--replace) or the complete new one, also when "
                    "tflms is killed. Nothing of the model is executed unless --verify is given.")
    rewrite.add_argument("input", metavar="IN_DIR", help="the SavedModel to read")
    rewrite.add_argument("output", metavar="OUT_DIR", help="where to write the rewritten SavedModel")
    rewrite.add_argument("--function", dest="functions", action="append", metavar="NAME",
                         help="rewrite this function (attribute path, e.g. 'train' or 'trainer.step'); repeat for "
                              "several (default: every function with a training step)")
    rewrite.add_argument("--replace", action="store_true",
                         help="replace an existing OUT_DIR holding a SavedModel (or empty): the complete new model "
                              "takes its place in one atomic exchange, with its permission modes")
    rewrite.add_argument("--verify", action="store_true",
                         help="before writing, run every rewritten function once in both models on example inputs "
                              "and check outputs and variables bit for bit (loads the model twice). This EXECUTES "
                              "the model's graph, side effects included (e.g. a tf.io.write_file in the step "
                              "writes its file, twice); without --verify nothing of the model is run")
    rewrite.add_argument("--xla", action="store_true",
                         help="keep XLA (issue 47): mark the rewritten functions' compute ops for XLA in clusters "
                              "between the swap copies, which stay outside them (TensorFlow clusters them when the "
                              "function runs); not with --verify, which checks bit for bit, and XLA's fusion rounds "
                              "differently from TensorFlow's kernels")
    add_wide_flag(rewrite)
    rewrite.add_argument("--json", action="store_true", help="print the result as one JSON document")
    add_budget_flags(rewrite)
    add_config_flags(rewrite)
    rewrite.set_defaults(func=cmd_rewrite)

    analyze = sub.add_parser(
        "analyze", help="show a SavedModel's functions: ordering, swap report, simulated memory",
        description="Print, for every traced signature of the SavedModel's functions, the categorized ordering "
                    "summary, the swap report for the given options and the simulated memory (peak, resident, "
                    "tensors alive at the peak) before and after the rewrite. Nothing is written.")
    analyze.add_argument("input", metavar="IN_DIR", help="the SavedModel to read")
    analyze.add_argument("--function", dest="functions", action="append", metavar="NAME",
                         help="analyze this function (repeat for several; default: all)")
    add_wide_flag(analyze)
    analyze.add_argument("--json", action="store_true", help="print the result as one JSON document")
    add_budget_flags(analyze)
    add_config_flags(analyze)
    analyze.set_defaults(func=cmd_analyze)

    plan = sub.add_parser(
        "plan", help="memory planning of a SavedModel's training steps: lower bound, planned pool, allocator models",
        description="For every traced training signature of the SavedModel: the lower bound of activation memory "
                    "(most bytes alive at once in the simulated schedule), the smallest single pool a static plan "
                    "needs (with per-tensor offsets in --json), and what TensorFlow's BFC allocator and a caching "
                    "allocator would reserve for the same allocation sequence; before and after the tflms rewrite. "
                    "Nothing is written.")
    plan.add_argument("input", metavar="IN_DIR", help="the SavedModel to read")
    plan.add_argument("--function", dest="functions", action="append", metavar="NAME",
                      help="plan this function (repeat for several; default: all)")
    add_wide_flag(plan, "accepted as by analyze; plan's tables list every figure (none is truncated)")
    plan.add_argument("--json", action="store_true", help="print the result, with per-tensor offsets, as JSON")
    add_budget_flags(plan)
    add_config_flags(plan)
    plan.set_defaults(func=cmd_plan)

    from tflms.profiles import DEFAULT_PROFILE, profile_names
    estimate = sub.add_parser(
        "estimate", help="will it fit? a model's predicted peak and largest batch, with and without tflms",
        description="Take the training step of MODEL: a Keras model's (a .keras file; a compiled model brings its "
                    "optimizer and loss, else Adam and sparse categorical cross-entropy are assumed and said), or the "
                    "first function of a SavedModel directory that computes gradients (--function names one; traced "
                    "with the batch dimension None). Predict with the simulator, at --batch: the peak, step time and "
                    "samples/s without tflms and with the rewrite the tuner picks, whether each fits the budget, and "
                    "the largest batch each way. Nothing is trained and no GPU is needed; every figure is simulated "
                    "on the profile. In Python, tflms.estimate.estimate also takes a tf.function or ConcreteFunction.")
    estimate.add_argument("model", metavar="MODEL", help="a .keras file (model.save('model.keras')) or a SavedModel "
                                                         "directory holding a training step")
    estimate.add_argument("--function", default=None, help="with a SavedModel: the training function's attribute "
                                                           "path (default: the first that computes gradients)")
    estimate.add_argument("--batch", required=True, metavar="N[,N...]", help="the batch size to predict, or several "
                          "(a range: a table each, or a JSON list; traced and searched once)")
    estimate.add_argument("--profile", default=None,
                          help="hardware profile: " + ", ".join(profile_names()) + f" (default: the closest to this "
                               f"machine's GPU, else {DEFAULT_PROFILE}), or a JSON file from tools/gpu_probe.py")
    estimate.add_argument("--budget", default=None, help="accelerator memory budget, e.g. '12GiB' (default: the "
                                                         "profile's memory)")
    estimate.add_argument("--no-max-batch", action="store_true", help="skip the largest-batch searches")
    estimate.add_argument("--json", action="store_true",
                          help="print one JSON object: peak_bytes_without, peak_bytes_with, fits_without, fits_with, "
                               "max_batch_without, max_batch_with, step times, samples/s, what was assumed")
    estimate.set_defaults(func=cmd_estimate)

    from tflms.compress.calibrate import CLI_DESCRIPTION, CLI_HELP, add_calibrate_arguments, cmd_calibrate
    add_calibrate_arguments(sub.add_parser("calibrate", help=CLI_HELP, description=CLI_DESCRIPTION)).set_defaults(
        func=cmd_calibrate)
    return parser


#: Lines TensorFlow's C++ start-up writes to stderr before any log level applies (absl logs before it is
#: initialized; TF_CPP_MIN_LOG_LEVEL is read too late for them). Dropped by the CLI unless TF_CPP_MIN_LOG_LEVEL=0.
STARTUP_NOISE = ("All log messages before absl::InitializeLog() is called", "oneDNN custom operations are on",
                 "cpu_feature_guard.cc", "To enable the following instructions", "rebuild TensorFlow with")


def _not_known_noise(record: logging.LogRecord) -> bool:
    """absl log filter: TensorFlow's note on loading a model whose custom gradients were not saved.

    tflms says what that means for the rewrite in its own report (CUSTOM_GRADIENTS_WARNING).
    """
    return "with ops with unsaved custom gradients" not in record.getMessage()


@contextlib.contextmanager
def quiet_logs(command: str):
    """Each message once: the report tables carry tflms's warnings, so its logger stays at errors.

    ``calibrate`` prints no report; its warnings stay on. Both loggers are as before afterwards
    (``main`` also runs in-process, from tests and notebooks).
    """
    absl, ours = logging.getLogger("absl"), logging.getLogger("tflms")
    level = ours.level
    absl.addFilter(_not_known_noise)
    if command != "calibrate":
        ours.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl.removeFilter(_not_known_noise)
        ours.setLevel(level)


def import_tensorflow_quietly() -> None:
    """Import TensorFlow and Keras with their start-up banner filtered out of stderr.

    Every other line they write while importing (a warning, an error) is passed on.
    """
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0" or "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            import keras  # noqa: F401 - imports TensorFlow too (the import is the point)
            import tensorflow  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                if not any(noise in line for noise in STARTUP_NOISE):
                    print(line, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    # Before anything imports TensorFlow: its C++ start-up lines (oneDNN, CPU features) are not the user's news.
    # TF_CPP_MIN_LOG_LEVEL=0 in the environment brings them back.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()  # imports no TensorFlow: --help and argument errors are instant
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    import_tensorflow_quietly()
    try:
        with interrupts.handled(), quiet_logs(args.command):
            return args.func(args)
    except TflmsError as err:
        print(f"tflms: error: {speak_flags(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (interrupts.Interrupted): cleanup has run
        name = err.signal_name if isinstance(err, interrupts.Interrupted) else "SIGINT"
        written = getattr(err, "written", None)
        print(f"tflms: interrupted by {name}: " + (f"the new output was complete and is in {written}" if written
                                                   else "stopped; nothing was written"), file=sys.stderr)
        return 128 + (err.signum if isinstance(err, interrupts.Interrupted) else signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())

"""Issue 45: every rewrite tflms hands back trains bitwise like the plain step, or it refuses with a BudgetError.

Part of the budget sweep (tools/budget_sweep.py runs all of it): each run in a fresh process per oneDNN setting. Those
cases (one test marked ``sweep``: about 9 minutes of one core) run with ``--sweep``, as CI runs them after the
README's test command (tests/conftest.py); the issue's own reproducer runs in that command.
"""

import pytest

from tflms.testing.sweep import ALLOWED

pytestmark = pytest.mark.slow

#: (oneDNN setting, kind, precision, entry): the issue's two reproducers' shapes with oneDNN on, one of each other
#: precision, and the same paths with oneDNN off.
CASES = [("1", "conv", "float32", "callback"), ("1", "conv", "mixed_bfloat16", "callback"),
         ("1", "residual_bn", "mixed_bfloat16", "function"), ("1", "attention", "mixed_float16", "function"),
         ("1", "dense_block", "float32", "function"),  # a swapped MaxPool output its gradient reads with oneDNN
         ("1", "residual_bn", "mixed_float16", "callback"),  # the update in the loss scale's branch, order edges
         ("0", "conv", "float32", "function"), ("0", "mlp_dropout", "mixed_bfloat16", "callback")]
#: Recompute alone (issue 49: recompute must be bitwise with oneDNN on as well as off), DenseNet's shapes.
RECOMPUTE_CASES = [("1", "dense_block", "float32", "callback"), ("0", "dense_block", "float32", "callback"),
                   ("1", "residual_bn", "float32", "function")]


def _swept():
    """Every case of :data:`CASES` and :data:`RECOMPUTE_CASES` run by tools/budget_sweep.py: ``(the tool, its
    results)``."""
    import importlib.util
    import pathlib
    import sys
    path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "budget_sweep.py"
    spec = importlib.util.spec_from_file_location("budget_sweep_under_test", path)
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool
    spec.loader.exec_module(tool)
    results = []
    for setting in ("1", "0"):
        for _, kind, precision, entry in [c for c in CASES if c[0] == setting]:
            results += tool.sweep([kind], [precision], [entry], [setting], [0.1])  # (and just below the best peak)
        for _, kind, precision, entry in [c for c in RECOMPUTE_CASES if c[0] == setting]:
            results += [{**r, "recompute": "only"} for r in
                        tool.sweep([kind], [precision], [entry], [setting], [0.1], recompute="only")]
    return tool, results


@pytest.mark.sweep
def test_the_sweep_trains_bitwise_or_refuses_recomputes_alone_and_rewrites_something_in_every_case():
    """One test, not three sharing a module fixture: pytest-xdist handed those to both workers, and each ran the
    sweep (1,023 s of CPU for one sweep's 500 s in CI's second step, 2026-12-02)."""
    tool, results = _swept()
    # every run is a bitwise fit or a budget error
    assert len(results) == len(CASES) + len(RECOMPUTE_CASES), tool.table(results)
    for r in results:
        assert "crashed" not in r, tool.table(results)
        assert r["control"], f"plain TensorFlow is not deterministic here: {r}"
        for run in r["runs"]:
            assert run["outcome"] in ALLOWED, tool.table(results)
    # recompute alone recomputes and trains bitwise with oneDNN on and off
    recomputed = [r for r in results if r.get("recompute") == "only"]
    assert {r["onednn"] for r in recomputed} == {"0", "1"}
    for r in recomputed:  # (a recompute-only plan inserts clones and gates, no copies)
        assert any(run["outcome"] == "bitwise" and run["strategy"] == "recompute" for run in r["runs"]), \
            tool.table(results)
    # budgets below the unchanged peak: a case where every run fits unchanged or is refused would check nothing
    for r in results:
        assert any(run["outcome"] == "bitwise" and run["inserted"] for run in r["runs"]), tool.table(results)


@pytest.mark.parametrize("budget", ["70MiB", "90MiB"])
def test_issue_45_reproducer_trains_bitwise_or_refuses(budget):
    # the exact model of the issue: only the ordered hybrid fit, and its step closed a cycle once oneDNN merged
    # a bias gradient with its filter gradient
    import tflms
    import tflms.keras
    from tflms.testing import differences, snapshot
    from tflms.testing.sweep import issue45_fit

    def fit(callbacks):
        model, ran = issue45_fit(callbacks, record=True)
        return snapshot(model, model.optimizer), ran

    plain, _ = fit([])
    lms = tflms.keras.LMS(budget=budget, verbose=0)
    try:
        state, ran = fit([lms])
    except tflms.BudgetError:
        return
    assert not differences(plain, state)
    inserted = lms.reports[-1].inserted_ops
    assert inserted and not ran.missing_after_optimization(inserted)


def test_issue_45_second_reproducer_mixed_bfloat16_with_the_rule_parameters_trains_bitwise():
    # TensorFlow refused the rewritten graph on oneDNN CPUs: grappler's bfloat16 _FusedConv2D, which its op definition
    # does not allow, could not be imported (tflms.ir.surrogates); with oneDNN off nothing is refused
    import keras
    import numpy as np

    import tflms.keras
    from tflms.testing import differences, record_run_metadata, snapshot

    def fit(callbacks):
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        try:
            keras.utils.set_random_seed(0)
            i = keras.Input((32, 32, 3))
            h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(i)
            m = keras.Model(i, keras.layers.Dense(10, dtype="float32")(keras.layers.GlobalAveragePooling2D()(h)))
        finally:
            keras.mixed_precision.set_global_policy("float32")
        m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        x = np.random.RandomState(0).randn(16, 32, 32, 3).astype("float32")
        with record_run_metadata() as ran:
            m.fit(x, np.zeros(16, "int32"), batch_size=16, verbose=0, callbacks=callbacks)
        return snapshot(m, m.optimizer), ran

    plain, _ = fit([])
    lms = tflms.keras.LMS(swapout_threshold=1, swapin_ahead=1, verbose=0)
    state, ran = fit([lms])
    inserted = lms.reports[-1].inserted_ops
    assert inserted and not ran.missing_after_optimization(inserted)
    assert not differences(plain, state)

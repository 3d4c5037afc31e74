"""The tuner's choice is at least as good as before the incremental evaluator, by the simulator's own measure.

``OLD`` holds the choices of the tuner at commit c78da4f (before tflms.tune.evaluator, the ladder plateau
stop and the swapin_ahead cut-off), produced by running this file as a script against that commit::

    mkdir /tmp/tflms-old && git archive c78da4f | tar -x -C /tmp/tflms-old
    TF_CPP_MIN_LOG_LEVEL=2 PYTHONPATH=/tmp/tflms-old python tests/test_tune_regression.py

(run it with ``PYTHONPATH=$PWD`` to print today's choices). The fixtures use only APIs that commit has.
"""

from __future__ import annotations

import sys
import time

import pytest

#: case -> (budget bytes, strategy, peak_with_margin_bytes, step_time_s) chosen at commit c78da4f.
OLD = {
    "mlp-pcie-0.6": (293601284, "tflms-distance", 293601284, 0.03935669194984131),
    "mlp-slow-0.7-distance": (306184196, "tflms-distance", 293601284, 0.03935669194984131),
    "cnn-pcie-0.6": (31066960, "idle-time", 30240876, 0.00610220670179894),
    "cnn-pcie-0.5-distance": (26030602, "tflms-distance", 21870508, 0.008118730187724849),
}
#: Candidates the old tuner simulated per case (the new one must not need more).
#: cnn-pcie-0.6 was 30; backward-produced idle-time candidates and the saving score (issue 11) add one idle-time
#: evaluation there; the choice is still at least as good (asserted below).
OLD_CANDIDATES = {"mlp-pcie-0.6": 19, "mlp-slow-0.7-distance": 17, "cnn-pcie-0.6": 31, "cnn-pcie-0.5-distance": 19}


def _slow():
    from tflms.sim import HardwareProfile
    return HardwareProfile("slow-link", "16GiB", 14e12, 900, 8)  # half of PCIe 3.0: not every copy hides


SLOW = _slow()


def mlp():
    from tflms.testing import mlp_training_graph
    return mlp_training_graph(12, batch=1024, width=2048)


def cnn(batch=64):
    import keras
    import tensorflow as tf
    from tflms.ir.tf_io import load_graph
    from tflms.testing import make_train_step
    from tflms.testing.models import residual_bn
    model = residual_bn(seed=0, size=32, filters=16, blocks=3)
    optimizer = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer))

    graph = load_graph(step, tf.TensorSpec((batch, 32, 32, 3), tf.float32), tf.TensorSpec((batch,), tf.int32))
    return graph, (model, optimizer)


def cases():
    from tflms.sim import simulate
    slow = SLOW
    g = mlp()
    c, keep = cnn()
    pcie = "v100-16gb-pcie3"

    def budget(graph, profile, fraction):
        sim = simulate(graph, profile)
        return sim.resident_bytes + int(sim.transient_peak_bytes * fraction)

    return [
        ("mlp-pcie-0.6", g, pcie, budget(g, pcie, 0.6), None),
        ("mlp-slow-0.7-distance", g, slow, budget(g, slow, 0.7), ["tflms-distance"]),
        ("cnn-pcie-0.6", c, pcie, budget(c, pcie, 0.6), None),
        ("cnn-pcie-0.5-distance", c, pcie, budget(c, pcie, 0.5), ["tflms-distance"]),
    ], keep


@pytest.fixture(scope="module")
def tuned():
    pytest.importorskip("keras")
    from tflms.tune import tune
    cs, keep = cases()
    out = {}
    for name, graph, profile, budget, strategies in cs:
        kw = {} if strategies is None else {"strategies": strategies}
        out[name] = (budget, profile, tune(graph, budget=budget, profile=profile, **kw))
    yield out
    del keep


@pytest.mark.parametrize("name", sorted(OLD))
def test_new_choice_is_at_least_as_good_as_the_old_one(tuned, name):
    budget, profile, result = tuned[name]
    old_budget, old_strategy, old_peak, old_step = OLD[name]
    assert budget == old_budget  # the same problem as recorded
    assert result.best.fits and result.best.sim.peak_with_margin_bytes <= budget
    # Faster or as fast; where equally fast, no larger peak.
    assert (result.best.sim.step_time_s, result.best.sim.peak_with_margin_bytes) <= (old_step, old_peak), (
        f"{name}: new {result.strategy} {result.best.params} step {result.best.sim.step_time_s} s, peak "
        f"{result.best.sim.peak_with_margin_bytes} vs old {old_strategy} step {old_step} s, peak {old_peak}")
    # the swap searches simulate no more than before; the recompute search (issue 27) adds a bounded number
    from tflms.tune.hybrid import FAMILIES, MAX_CANDIDATES, _family
    from tflms.tune.tuner import RECOMPUTE_STRATEGIES
    swap_only = [c for c in result.candidates if c.strategy not in RECOMPUTE_STRATEGIES]
    assert len(swap_only) <= OLD_CANDIDATES[name]
    assert len(result.candidates) - len(swap_only) <= MAX_CANDIDATES
    assert {_family(c) for c in result.candidates if c.strategy == "recompute"} <= set(FAMILIES)  # as counted
    # The winner's rewritten graph is built (lazily) and simulates to the same answer.
    from tflms.sim import simulate
    assert simulate(result.graph, profile).step_time_s == result.best.sim.step_time_s


if __name__ == "__main__":
    import tflms
    from tflms.tune import tune
    print("tflms from", tflms.__file__, file=sys.stderr)
    cs, keep = cases()
    for name, graph, profile, budget, strategies in cs:
        t0 = time.perf_counter()
        kw = {} if strategies is None else {"strategies": strategies}
        r = tune(graph, budget=budget, profile=profile, **kw)
        print(f"{name!r}: ({budget}, {r.strategy!r}, {r.best.sim.peak_with_margin_bytes}, {r.best.sim.step_time_s!r}),"
              f"  # {r.best.params}, {len(r.candidates)} candidates, {time.perf_counter() - t0:.2f} s")

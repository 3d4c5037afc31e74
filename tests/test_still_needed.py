"""``still_needed``: which ops a recompute plan's step runs, from the base step's answer (a reference count), against
the search from the roots it replaced, on random graphs without cycles and on a tune's plans."""

from __future__ import annotations

import random

import pytest

from tflms.sim.indexed import ACCEL, IndexedGraph, _needed, still_needed, successor_counts


def _random_net(rng: random.Random, n: int) -> IndexedGraph:
    """``n`` ops, each reading (by control edges: ``preds``) a few earlier ones."""
    net = IndexedGraph()
    for i in range(n):
        preds = sorted(set(rng.sample(range(i), min(i, rng.randint(0, 3)))))
        net.add_op(f"op{i}", "NoOp", ACCEL, [], preds, [])
    return net


@pytest.mark.parametrize("seed", range(300))
def test_still_needed_is_what_the_roots_need_after_appends_and_rewired_readers(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 40)
    base = _random_net(rng, n)
    roots = rng.sample(range(n), rng.randint(1, min(3, n)))
    alive = _needed(base, roots)
    count = successor_counts(base, alive)
    net = base.copy()
    for k in range(rng.randint(0, 6)):  # appended ops (clones, gates) reading any op before them
        i = len(net.names)
        net.add_op(f"new{k}", "NoOp", ACCEL, [], sorted(set(rng.sample(range(i), min(i, rng.randint(0, 3))))), [])
    changed = rng.sample(range(1, n), rng.randint(0, min(5, n - 1)))
    for c in changed:  # a base reader rewired: to earlier ops, or to an appended one where it comes first
        choices = list(range(c)) + [j for j in range(n, len(net.names)) if all(p < c for p in net.preds[j])]
        net.preds[c] = sorted(set(rng.sample(choices, min(len(choices), rng.randint(0, 3)))))
    got = still_needed(net, base.preds, alive, count, roots, changed + changed[:1])
    assert got == _needed(net, roots)
    assert alive == _needed(base, roots) and count == successor_counts(base, alive)  # (the base's are not changed)


def test_still_needed_revives_what_an_appended_op_reads_and_drops_what_nothing_reads():
    """A gate's trigger nothing needed before is run for it, with what it reads; an original whose only reader was
    rewired to its clone no longer runs, nor what only it read."""
    net = IndexedGraph()
    for name, preds in (("x", []), ("fw", [0]), ("mask", [1]), ("loss", [1]), ("bw", [2, 3]), ("idle", [0]),
                        ("idle2", [5])):
        net.add_op(name, "NoOp", ACCEL, [], preds, [])
    roots = [4]
    alive = _needed(net, roots)
    assert alive == [True] * 5 + [False, False]
    plan = net.copy()
    gate = plan.add_op("gate", "NoOp", ACCEL, [], [1, 6], [])  # its trigger, ``idle2``, was not needed
    clone = plan.add_op("mask/clone", "NoOp", ACCEL, [], [gate], [])
    plan.preds[4] = [clone, 3]  # the backward op reads the clone
    got = still_needed(plan, net.preds, alive, successor_counts(net, alive), roots, [4])
    assert got == _needed(plan, roots) == [True, True, False, True, True, True, True, True, True]

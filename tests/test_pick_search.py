"""Issue 45, item 4: the tuner's pick against a broader search (tools/pick_search.py), and a clone per reader.

At 90 MiB the tuner swapped issue 45's second convolution output out and back twice (+109.0%, simulated on
v100-16gb-pcie3); re-run once per backward reader, recompute alone fits at +20.2%. The broader search
(``broad_search``: every recompute set of the step's recomputable ops and the ranking's chains, a clone per tensor or
per reader, level order or the order pinned first, swaps of up to two tensors) finds nothing faster at 90 or 70 MiB.
"""

import importlib.util
import pathlib
import sys

import pytest

pytestmark = pytest.mark.slow

#: How far above the broader search's fastest fit the tuner's pick may be.
TOLERANCE = 0.02


@pytest.fixture(scope="module")
def tool():
    path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "pick_search.py"
    spec = importlib.util.spec_from_file_location("pick_search_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up there)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def issue45(tool):
    return tool.issue45_analysis()  # (the analysis the callback's pipeline tunes, the tune's keyword arguments)


def _recomputed_convolutions(analysis):
    from tflms.policies.recompute import _recomputable, output_bytes
    graph = analysis.graph
    convs = sorted((n for n in _recomputable(analysis) if graph.op(n).type == "_FusedConv2D"),
                   key=lambda n: analysis.levels[n])
    assert len(convs) == 3 and output_bytes(graph, convs[1]) == 32 << 20
    return convs[:2]  # the first two: the second's output is read by the third's filter gradient and its own ReLU's


def test_a_clone_per_reader_serves_each_backward_reader_of_a_tensor_from_its_own_clone(issue45):
    from tflms.ir.graph import TensorRef
    from tflms.policies.recompute import backward_readers, plan_recomputes
    analysis, _ = issue45
    ops = _recomputed_convolutions(analysis)
    split, _ = plan_recomputes(analysis, ops, split_readers=True)
    whole, _ = plan_recomputes(analysis, ops)
    for decisions in (split, whole):
        served = [(ref, r) for d in decisions for ref, rs in zip(d.tensors, d.readers) for r in rs]
        assert len(served) == len(set(served))  # every reader of a tensor served once
        for op in ops:
            ref = TensorRef(op, 0)
            assert sorted(r for t, r in served if t == ref) == sorted(backward_readers(analysis, ref))
    levels = analysis.levels
    # split: each clone's readers of a tensor are at one level; the control, one clone per tensor, serves two levels
    assert all(len({levels[r] for r in rs}) == 1 for d in split for rs in d.readers)
    assert any(len({levels[r] for r in rs}) > 1 for d in whole for rs in d.readers)
    assert max(d.copy for d in split) > 0 and all(d.copy == 0 for d in whole)


def test_the_pick_at_90_mib_recomputes_per_reader_and_is_the_broader_search_s_fastest(tool, issue45):
    analysis, kwargs = issue45
    result = tool.compare(analysis, kwargs, 90 << 20, max_swaps=1)
    pick, best = result["pick"], result["best"]
    assert pick is not None and best["what"]
    assert pick["step_time_s"] <= best["step_time_s"] * (1 + TOLERANCE), (pick, best)
    assert pick["peak_bytes"] <= 90 << 20
    assert "'readers': 1" in pick["what"] and "swaps" not in pick["what"]


def test_without_the_clone_per_reader_stage_the_pick_is_twice_as_slow_as_the_broader_search_s(tool, issue45,
                                                                                                 monkeypatch):
    # the control: what the tuner picked before (a 32 MiB tensor swapped out and back twice), which the check above
    # would refuse
    import tflms.tune.per_reader as per_reader
    monkeypatch.setattr(per_reader, "READER_SPLIT_PLANS", 0)
    analysis, kwargs = issue45
    result = tool.compare(analysis, kwargs, 90 << 20, max_swaps=1)
    assert result["pick"]["step_time_s"] > 1.5 * result["best"]["step_time_s"]


def test_the_pick_at_70_mib_is_within_the_tolerance_of_the_broader_search_s_fastest(tool, issue45):
    analysis, kwargs = issue45
    result = tool.compare(analysis, kwargs, 70 << 20, max_swaps=2)
    pick, best = result["pick"], result["best"]
    assert pick is not None and best["what"]
    assert pick["step_time_s"] <= best["step_time_s"] * (1 + TOLERANCE), (pick, best)

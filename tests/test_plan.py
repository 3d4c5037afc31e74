"""Tests of tflms.plan: lifetimes, static offset plans and allocator models.

Hand-made cases assert exact offsets and byte counts worked out in the comments;
hypothesis properties check the invariants on random lifetimes.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tflms.errors import ConfigError, TflmsError
from tflms.memplan import (
    STRATEGIES,
    BFCAllocatorModel,
    CachingAllocatorModel,
    InvalidPlanError,
    Lifetime,
    LifetimeError,
    OutOfMemoryError,
    Plan,
    best_plan,
    events,
    first_fit,
    greedy_by_breadth,
    greedy_by_size,
    live_bytes_profile,
    lower_bound,
    replay,
    validate,
)
from tflms.memplan.allocators import (
    BFC_MAX_INTERNAL_FRAGMENTATION_BYTES,
    CACHING_LARGE_BUFFER_BYTES,
    CACHING_SMALL_BUFFER_BYTES,
    bfc_bin_for_size,
    bfc_rounded_bytes,
    caching_round_size,
    caching_segment_size,
)
from tflms.memplan.lifetimes import ALLOC, FREE

U = 256
"""One alignment unit: the default plan alignment and BFC's kMinAllocationSize."""
KiB = 1 << 10
MiB = 1 << 20
BFC_FIRST_REGION = 2 * MiB
"""BFC's first region with allow_growth."""
CACHING_MIN_BLOCK = 512
"""PyTorch's kMinBlockSize."""

HYPOTHESIS_EXAMPLES = 60
"""Examples per property: enough to hit overlaps and ties, small enough for a < 30 s suite."""


def lt(name: str, size: int, first: int, last: int) -> Lifetime:
    return Lifetime(name, size, first, last)


# --------------------------------------------------------------------------------------------------
# Lifetimes
# --------------------------------------------------------------------------------------------------

# A needs 1 MiB at step 0, B 1 MiB at steps 0-1, C 1.5 MiB at step 1: live 2 MiB then 2.5 MiB.
ABC = [lt("A", 1 * MiB, 0, 0), lt("B", 1 * MiB, 0, 1), lt("C", 3 * MiB // 2, 1, 1)]
ABC_LOWER_BOUND = 5 * MiB // 2


def test_live_bytes_profile_and_lower_bound() -> None:
    assert live_bytes_profile(ABC).tolist() == [2 * MiB, ABC_LOWER_BOUND]
    assert live_bytes_profile(ABC, num_steps=4).tolist() == [2 * MiB, ABC_LOWER_BOUND, 0, 0]
    assert lower_bound(ABC) == ABC_LOWER_BOUND
    assert lower_bound([]) == 0
    assert live_bytes_profile([]).shape == (0,)
    with pytest.raises(LifetimeError, match="'B'"):
        live_bytes_profile(ABC, num_steps=1)


def test_events_free_before_alloc_ties_by_name() -> None:
    got = [(event.step, event.kind, event.name) for event in events(ABC)]
    assert got == [(0, ALLOC, "A"), (0, ALLOC, "B"), (1, FREE, "A"), (1, ALLOC, "C"),
                   (2, FREE, "B"), (2, FREE, "C")]


@pytest.mark.parametrize("args, fragment", [
    (("", 1, 0, 0), "non-empty"),
    (("t", -1, 0, 0), "negative"),
    (("t", 1, -1, 0), "negative"),
    (("t", 1, 3, 2), "before first"),
    (("t", 1.5, 0, 0), "must be an int"),
])
def test_lifetime_rejects_bad_fields(args: tuple, fragment: str) -> None:
    with pytest.raises(LifetimeError, match=fragment):
        Lifetime(*args)


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(LifetimeError, match="'x' appears twice"):
        lower_bound([lt("x", U, 0, 0), lt("x", U, 1, 1)])


# --------------------------------------------------------------------------------------------------
# Static plans: exact expectations
# --------------------------------------------------------------------------------------------------

# Five tensors where greedy-by-size is not optimal. Live per step: 5U, 7U, 5U, 7U, 5U.
FIVE = [lt("a", 4 * U, 0, 1), lt("b", 2 * U, 1, 2), lt("c", 2 * U, 2, 3), lt("d", 4 * U, 3, 4),
        lt("e", 1 * U, 0, 4)]
FIVE_LOWER_BOUND = 7 * U
FIVE_HEURISTIC_POOL = 9 * U


def test_greedy_by_size_exact_offsets() -> None:
    # Order a, d (4U; by name), b, c (2U), e (1U).
    # a -> 0. d does not meet a in time -> 0. b meets a [0,4U): no gap below -> 4U.
    # c meets d [0,4U) and b [4U,6U) -> 6U. e meets everything -> 8U; pool 9U.
    plan = greedy_by_size(FIVE)
    assert plan.offsets == {"a": 0, "b": 4 * U, "c": 6 * U, "d": 0, "e": 8 * U}
    assert plan.pool_bytes == FIVE_HEURISTIC_POOL
    assert plan.lower_bound_bytes == FIVE_LOWER_BOUND
    assert plan.fragmentation == pytest.approx(FIVE_HEURISTIC_POOL / FIVE_LOWER_BOUND - 1)
    validate(plan, FIVE)


def test_every_heuristic_misses_a_known_optimum() -> None:
    # A hand packing reaches the lower bound: e on top of a/b, c under d.
    optimum = Plan("hand", FIVE_LOWER_BOUND, {"a": 0, "b": 4 * U, "c": 0, "d": 2 * U, "e": 6 * U},
                   FIVE_LOWER_BOUND)
    validate(optimum, FIVE)
    for name, strategy in STRATEGIES.items():
        assert strategy(FIVE).pool_bytes == FIVE_HEURISTIC_POOL, name
    assert best_plan(FIVE).strategy == "greedy_by_size"  # first strategy wins ties


def test_greedy_by_breadth_exact_offsets() -> None:
    # Breadth 7U at steps 1 and 3 first; order a, b, e (step 1) then d, c (step 3).
    # a -> 0, b -> 4U, e -> 6U, d fits under e -> 0, c meets d, b, e -> 7U.
    plan = greedy_by_breadth(FIVE)
    assert plan.offsets == {"a": 0, "b": 4 * U, "c": 7 * U, "d": 0, "e": 6 * U}
    assert plan.pool_bytes == FIVE_HEURISTIC_POOL


# A short small tensor placed first at address 0 pushes the big ones up under first fit.
SMALL_FIRST = [lt("a_small", 1 * U, 0, 0), lt("b_long", 4 * U, 0, 2), lt("c_big", 4 * U, 1, 2)]
SMALL_FIRST_LOWER_BOUND = 8 * U


def test_first_fit_is_worse_than_greedy_by_size() -> None:
    # first fit: a_small -> 0, b_long above it -> U, c_big above b_long -> 5U: pool 9U.
    ff = first_fit(SMALL_FIRST)
    assert ff.offsets == {"a_small": 0, "b_long": 1 * U, "c_big": 5 * U}
    assert ff.pool_bytes == 9 * U
    # greedy by size: b_long -> 0, c_big -> 4U, a_small (meets only b_long) -> 4U: pool 8U.
    gs = greedy_by_size(SMALL_FIRST)
    assert gs.offsets == {"a_small": 4 * U, "b_long": 0, "c_big": 4 * U}
    assert gs.pool_bytes == SMALL_FIRST_LOWER_BOUND == gs.lower_bound_bytes
    assert best_plan(SMALL_FIRST).pool_bytes == SMALL_FIRST_LOWER_BOUND
    validate(ff, SMALL_FIRST)
    validate(gs, SMALL_FIRST)


# A chain: each tensor overlaps only its neighbours, so two slots suffice.
CHAIN = [lt("a", 2 * U, 0, 1), lt("b", 2 * U, 1, 2), lt("c", 2 * U, 2, 3)]
CHAIN_LOWER_BOUND = 4 * U


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_all_strategies_reach_the_lower_bound_on_a_chain(name: str) -> None:
    plan = STRATEGIES[name](CHAIN)
    assert plan.offsets == {"a": 0, "b": 2 * U, "c": 0}
    assert plan.pool_bytes == CHAIN_LOWER_BOUND == plan.lower_bound_bytes
    assert plan.fragmentation == 0.0
    assert plan.strategy == name


def test_alignment_pads_offsets() -> None:
    odd_bytes = 100  # not a multiple of any alignment used here
    pair = [lt("x", odd_bytes, 0, 0), lt("y", odd_bytes, 0, 0)]
    assert greedy_by_size(pair).offsets == {"x": 0, "y": U}
    assert greedy_by_size(pair).pool_bytes == U + odd_bytes
    assert greedy_by_size(pair, alignment=1).offsets == {"x": 0, "y": odd_bytes}
    assert greedy_by_size(pair, alignment=1).pool_bytes == 2 * odd_bytes
    with pytest.raises(ConfigError, match="alignment"):
        greedy_by_size(pair, alignment=0)


def test_zero_byte_tensors_take_no_space() -> None:
    items = [lt("empty", 0, 0, 3), lt("full", 4 * U, 0, 3)]
    for name, strategy in STRATEGIES.items():
        plan = strategy(items)
        assert plan.offsets == {"empty": 0, "full": 0}, name
        assert plan.pool_bytes == 4 * U


def test_empty_input() -> None:
    plan = best_plan([])
    assert (plan.pool_bytes, plan.offsets, plan.lower_bound_bytes, plan.fragmentation) == (0, {}, 0, 0.0)


def test_to_json_round_trips_and_is_sorted() -> None:
    text = greedy_by_size(FIVE).to_json()
    data = json.loads(text)
    assert data["pool_bytes"] == FIVE_HEURISTIC_POOL
    assert list(data["offsets"]) == sorted(data["offsets"])
    assert text == greedy_by_size(list(reversed(FIVE))).to_json()


def test_best_plan_rejects_unknown_strategy() -> None:
    with pytest.raises(ConfigError, match="'magic'"):
        best_plan(FIVE, strategies=["magic"])


@pytest.mark.parametrize("offsets, fragment", [
    ({"a": 0, "b": 4 * U, "c": 0, "d": 2 * U}, "no offset for tensor 'e'"),
    ({"a": 0, "b": 4 * U, "c": 0, "d": 2 * U, "e": 6 * U, "z": 0}, "'z', which has no lifetime"),
    ({"a": 0, "b": 4 * U, "c": 0, "d": 2 * U, "e": 6 * U + 1}, "not a non-negative multiple"),
    ({"a": 0, "b": 3 * U, "c": 0, "d": 2 * U, "e": 6 * U}, "'a' .* and 'b' .* overlap"),
])
def test_validate_rejects_bad_plans(offsets: dict[str, int], fragment: str) -> None:
    pool = 8 * U  # big enough that only the named fault trips
    with pytest.raises(InvalidPlanError, match=fragment):
        validate(Plan("bad", pool, offsets, FIVE_LOWER_BOUND), FIVE)


# --------------------------------------------------------------------------------------------------
# Static plans: properties
# --------------------------------------------------------------------------------------------------

MAX_TENSORS = 14
MAX_STEP = 12
MAX_SIZE_UNITS = 64
"""Sizes up to 64 alignment units, with odd byte counts mixed in."""


@st.composite
def lifetime_sets(draw: st.DrawFn) -> list[Lifetime]:
    count = draw(st.integers(min_value=0, max_value=MAX_TENSORS))
    result = []
    for index in range(count):
        first = draw(st.integers(min_value=0, max_value=MAX_STEP))
        last = draw(st.integers(min_value=first, max_value=MAX_STEP))
        size = draw(st.one_of(st.integers(min_value=0, max_value=MAX_SIZE_UNITS).map(lambda n: n * U),
                              st.integers(min_value=0, max_value=MAX_SIZE_UNITS * U)))
        result.append(lt(f"t{index:02d}", size, first, last))
    return result


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(lifetime_sets())
def test_every_strategy_gives_a_valid_plan_no_better_than_the_bound(items: list[Lifetime]) -> None:
    best = best_plan(items)
    validate(best, items)
    for name, strategy in STRATEGIES.items():
        plan = strategy(items)
        validate(plan, items)
        assert plan.pool_bytes >= lower_bound(items), name
        assert best.pool_bytes <= plan.pool_bytes, name


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(lifetime_sets(), st.randoms(use_true_random=False))
def test_plans_are_deterministic_and_ignore_input_order(items: list[Lifetime], rng) -> None:
    shuffled = list(items)
    rng.shuffle(shuffled)
    for name, strategy in STRATEGIES.items():
        assert strategy(items) == strategy(items), name
        assert strategy(items).to_json() == strategy(shuffled).to_json(), name
    assert best_plan(items) == best_plan(shuffled)


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(lifetime_sets())
def test_profile_matches_brute_force(items: list[Lifetime]) -> None:
    profile = live_bytes_profile(items)
    for step in range(profile.size):
        assert profile[step] == sum(x.size_bytes for x in items if x.first <= step <= x.last)


# --------------------------------------------------------------------------------------------------
# BFC allocator model: exact expectations
# --------------------------------------------------------------------------------------------------

def test_bfc_rounding_and_bins() -> None:
    assert [bfc_rounded_bytes(n) for n in (1, U, U + 1)] == [U, U, 2 * U]
    assert [bfc_bin_for_size(n) for n in (1, U, 2 * U - 1, 2 * U, 4 * KiB)] == [0, 0, 0, 1, 4]
    last_bin = 20
    assert bfc_bin_for_size(U << last_bin) == last_bin
    assert bfc_bin_for_size(U << (last_bin + 3)) == last_bin


def test_bfc_one_byte_takes_a_256_byte_chunk_of_a_2_mib_region() -> None:
    session = BFCAllocatorModel().open()
    assert session.allocate("t", 1) == 0
    assert session.chunk_bytes_of("t") == U
    assert session.regions() == [(0, BFC_FIRST_REGION)]
    assert session.free_chunks() == [(U, BFC_FIRST_REGION - U)]
    assert (session.peak_reserved_bytes, session.peak_allocated_bytes) == (BFC_FIRST_REGION, U)


def test_bfc_reuses_a_freed_chunk() -> None:
    request = 1000  # rounds to 1024
    session = BFCAllocatorModel().open()
    assert session.allocate("a", request) == 0
    assert session.allocate("fence", request) == 4 * U
    session.free("a")
    assert session.free_chunks() == [(0, 4 * U), (8 * U, BFC_FIRST_REGION - 8 * U)]
    assert session.allocate("b", request) == 0  # best fit: the 1 KiB hole, not the big tail


def test_bfc_coalesces_two_frees_for_a_larger_request() -> None:
    session = BFCAllocatorModel().open()
    for index, name in enumerate(["a", "b", "fence"]):
        assert session.allocate(name, KiB) == index * KiB
    session.free("a")
    session.free("b")
    assert session.free_chunks() == [(0, 2 * KiB), (3 * KiB, BFC_FIRST_REGION - 3 * KiB)]
    assert session.allocate("d", 2 * KiB) == 0
    session.free("d")
    session.free("fence")
    assert session.free_chunks() == [(0, BFC_FIRST_REGION)]  # everything merged back


def test_bfc_fragmentation_exceeds_the_bound_by_a_worked_amount() -> None:
    # Step 0: A and B fill the 2 MiB region. Step 1: A is freed, leaving a 1 MiB hole that
    # cannot hold C (1.5 MiB), so BFC grows by a second region of 4 MiB (the region size
    # doubled after the first). Reserved 6 MiB against 2.5 MiB live; a static plan needs 2.5 MiB.
    second_region = 2 * BFC_FIRST_REGION
    result = replay(BFCAllocatorModel(), ABC)
    assert result.peak_reserved_bytes == BFC_FIRST_REGION + second_region
    assert result.peak_allocated_bytes == ABC_LOWER_BOUND
    assert result.peak_live_bytes == ABC_LOWER_BOUND
    assert result.fragmentation == pytest.approx((BFC_FIRST_REGION + second_region) / ABC_LOWER_BOUND - 1)
    assert best_plan(ABC).pool_bytes == ABC_LOWER_BOUND


def test_bfc_region_doubling_and_unsplit_chunks() -> None:
    session = BFCAllocatorModel().open()
    # X = 5 MiB: the region size doubles 2 -> 4 -> 8 MiB to fit; it is not doubled again.
    # The 8 MiB chunk is not split (8 < 2 * 5 and 3 MiB < 128 MiB), so X holds all 8 MiB.
    assert session.allocate("X", 5 * MiB) == 0
    assert session.chunk_bytes_of("X") == 8 * MiB
    # Y = 4 MiB: no free chunk; a new 8 MiB region (current size), which then doubles to 16.
    # That chunk is split (8 >= 2 * 4): Y keeps 4 MiB and a 4 MiB tail stays free.
    assert session.allocate("Y", 4 * MiB) == 8 * MiB
    assert session.regions() == [(0, 8 * MiB), (8 * MiB, 8 * MiB)]
    # Z = 1 MiB goes into the best fit, the 4 MiB tail (split, since 4 >= 2 * 1).
    assert session.allocate("Z", 1 * MiB) == 12 * MiB
    assert session.curr_region_allocation_bytes == 16 * MiB
    assert session.peak_reserved_bytes == 16 * MiB
    assert session.peak_allocated_bytes == 8 * MiB + 4 * MiB + 1 * MiB


def test_bfc_splits_when_the_tail_reaches_128_mib() -> None:
    session = BFCAllocatorModel().open()
    # 200 MiB: a 256 MiB region, tail 56 MiB < 128 MiB and 256 < 400: not split.
    session.allocate("big1", 200 * MiB)
    assert session.chunk_bytes_of("big1") == 256 * MiB
    # 300 MiB: a 512 MiB region, tail 212 MiB >= 128 MiB: split although 512 < 600.
    session.allocate("big2", 300 * MiB)
    assert session.chunk_bytes_of("big2") == 300 * MiB
    assert 512 * MiB - 300 * MiB >= BFC_MAX_INTERNAL_FRAGMENTATION_BYTES
    assert session.peak_reserved_bytes == 256 * MiB + 512 * MiB


def test_bfc_coalesce_regions_lets_chunks_merge_across_regions() -> None:
    # a fills the 2 MiB region; b gets a 4 MiB region right after it; both are freed; c = 5 MiB.
    def run(coalesce: bool) -> tuple[int, int]:
        session = BFCAllocatorModel(coalesce_regions=coalesce).open()
        session.allocate("a", 2 * MiB)
        session.allocate("b", 4 * MiB)
        session.free("a")
        session.free("b")
        return session.allocate("c", 5 * MiB), session.peak_reserved_bytes

    # Merged regions form one free 6 MiB chunk that holds c.
    assert run(coalesce=True) == (0, 6 * MiB)
    # Separate regions leave 2 + 4 MiB chunks; c needs a third region of 8 MiB.
    assert run(coalesce=False) == (6 * MiB, 6 * MiB + 8 * MiB)


def test_bfc_without_growth_reserves_the_whole_limit() -> None:
    limit = 8 * MiB
    assert replay(BFCAllocatorModel(limit, allow_growth=False), [lt("t", 1, 0, 0)]).peak_reserved_bytes == limit
    with pytest.raises(ConfigError, match="needs memory_limit_bytes"):
        BFCAllocatorModel(allow_growth=False)


def test_bfc_out_of_memory_names_the_tensor_and_step() -> None:
    items = [lt("a", 2 * MiB, 0, 1), lt("b", 2 * MiB, 1, 1)]
    with pytest.raises(OutOfMemoryError, match="'b'.* at step 1") as caught:
        replay(BFCAllocatorModel("3MiB"), items)
    assert isinstance(caught.value, TflmsError)
    assert (caught.value.tensor, caught.value.reserved_bytes, caught.value.limit_bytes) == ("b", 2 * MiB, 3 * MiB)


def test_bfc_garbage_collection_frees_an_idle_region() -> None:
    # a (1 MiB) takes the first 2 MiB region and is freed. b (2.5 MiB) fits neither the idle
    # region nor the 1 MiB left under the 3 MiB limit, so the idle region is given back and a
    # region of min(4 MiB, 3 MiB) = 3 MiB is obtained; b gets all of it (3 < 2 * 2.5).
    limit = 3 * MiB
    items = [lt("a", 1 * MiB, 0, 0), lt("b", 5 * MiB // 2, 1, 1)]
    session = BFCAllocatorModel(limit).open()
    session.allocate("a", 1 * MiB)
    session.free("a")
    assert session.allocate("b", 5 * MiB // 2) == BFC_FIRST_REGION
    assert session.regions() == [(BFC_FIRST_REGION, limit)]
    assert session.chunk_bytes_of("b") == limit
    assert session.peak_reserved_bytes == limit
    with pytest.raises(OutOfMemoryError, match="'b'"):
        replay(BFCAllocatorModel(limit, garbage_collection=False), items)


def test_bfc_session_rejects_misuse() -> None:
    session = BFCAllocatorModel().open()
    session.allocate("a", 1)
    with pytest.raises(ConfigError, match="allocated twice"):
        session.allocate("a", 1)
    with pytest.raises(ConfigError, match="not allocated"):
        session.free("nope")
    assert session.allocate("empty", 0) is None
    session.free("empty")


# --------------------------------------------------------------------------------------------------
# Caching allocator model: exact expectations
# --------------------------------------------------------------------------------------------------

def test_caching_rounding_and_segment_sizes() -> None:
    assert [caching_round_size(n) for n in (1, CACHING_MIN_BLOCK, CACHING_MIN_BLOCK + 1)] == [
        CACHING_MIN_BLOCK, CACHING_MIN_BLOCK, 2 * CACHING_MIN_BLOCK]
    assert caching_segment_size(1 * MiB) == CACHING_SMALL_BUFFER_BYTES
    assert caching_segment_size(1 * MiB + CACHING_MIN_BLOCK) == CACHING_LARGE_BUFFER_BYTES
    assert caching_segment_size(10 * MiB) == 10 * MiB
    assert caching_segment_size(12 * MiB + CACHING_MIN_BLOCK) == 14 * MiB


def test_caching_one_byte_takes_512_bytes_of_a_small_segment() -> None:
    session = CachingAllocatorModel().open()
    assert session.allocate("t", 1) == 0
    assert session.block_bytes_of("t") == CACHING_MIN_BLOCK
    assert session.segments() == [("small", 0, CACHING_SMALL_BUFFER_BYTES)]
    assert session.free_blocks() == [("small", CACHING_MIN_BLOCK, CACHING_SMALL_BUFFER_BYTES - CACHING_MIN_BLOCK)]


def test_caching_replay_of_abc() -> None:
    # A, B (1 MiB each) are small: both fit one 2 MiB small segment. C (1.5 MiB) is large and
    # cannot use the small pool's free 1 MiB: it gets a 20 MiB segment. Reserved 22 MiB.
    result = replay(CachingAllocatorModel(), ABC)
    assert result.peak_reserved_bytes == CACHING_SMALL_BUFFER_BYTES + CACHING_LARGE_BUFFER_BYTES
    assert result.peak_allocated_bytes == ABC_LOWER_BOUND
    assert result.fragmentation == pytest.approx(
        (CACHING_SMALL_BUFFER_BYTES + CACHING_LARGE_BUFFER_BYTES) / ABC_LOWER_BOUND - 1)


def test_caching_large_split_needs_more_than_1_mib_left() -> None:
    session = CachingAllocatorModel().open()
    # 1.5 MiB from a new 20 MiB segment: 18.5 MiB left > 1 MiB, so split.
    session.allocate("a", 3 * MiB // 2)
    assert session.block_bytes_of("a") == 3 * MiB // 2
    session.free("a")
    assert session.free_blocks() == [("large", 0, CACHING_LARGE_BUFFER_BYTES)]
    # 19.5 MiB reuses the cached 20 MiB block; 0.5 MiB left is not > 1 MiB: no split.
    assert session.allocate("b", 39 * MiB // 2) == 0
    assert session.block_bytes_of("b") == CACHING_LARGE_BUFFER_BYTES
    assert session.peak_reserved_bytes == CACHING_LARGE_BUFFER_BYTES


def test_caching_coalesces_and_best_fits_within_a_segment() -> None:
    session = CachingAllocatorModel().open()
    for index, name in enumerate(["a", "b", "fence"]):
        assert session.allocate(name, 2 * MiB) == index * 2 * MiB
    session.free("a")
    session.free("b")
    assert session.free_blocks() == [("large", 0, 4 * MiB), ("large", 6 * MiB, 14 * MiB)]
    # 3 MiB best-fits the merged 4 MiB block; 1 MiB left is not > 1 MiB, so it keeps all 4 MiB.
    assert session.allocate("d", 3 * MiB) == 0
    assert session.block_bytes_of("d") == 4 * MiB


def test_caching_pools_are_separate() -> None:
    items = [lt("small", 4 * KiB, 0, 0), lt("large", 2 * MiB, 1, 1)]
    # The idle 2 MiB small segment cannot serve a large request: a 20 MiB segment is added.
    result = replay(CachingAllocatorModel(), items)
    assert result.peak_reserved_bytes == CACHING_SMALL_BUFFER_BYTES + CACHING_LARGE_BUFFER_BYTES


def test_caching_releases_idle_segments_before_running_out() -> None:
    # The small segment is idle when the 19 MiB request needs a 20 MiB segment under a
    # 20 MiB limit: the cache is emptied and the request succeeds.
    limit = CACHING_LARGE_BUFFER_BYTES
    items = [lt("s", 1 * KiB, 0, 0), lt("l", 19 * MiB, 1, 1)]
    assert replay(CachingAllocatorModel(limit), items).peak_reserved_bytes == limit
    with pytest.raises(OutOfMemoryError, match="'l'.* at step 1"):
        replay(CachingAllocatorModel(limit, release_cached_on_oom=False), items)


# --------------------------------------------------------------------------------------------------
# Allocator models: properties
# --------------------------------------------------------------------------------------------------

ALLOCATORS = [BFCAllocatorModel(), BFCAllocatorModel(coalesce_regions=True), CachingAllocatorModel()]


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(lifetime_sets())
def test_allocators_never_beat_the_bound_and_are_deterministic(items: list[Lifetime]) -> None:
    bound = lower_bound(items)
    for allocator in ALLOCATORS:
        result = replay(allocator, items)
        assert result.peak_reserved_bytes >= result.peak_allocated_bytes >= bound, allocator
        assert result.peak_live_bytes == bound
        assert result == replay(allocator, items)


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(lifetime_sets())
def test_bfc_chunks_tile_regions_and_merge_back(items: list[Lifetime]) -> None:
    session = BFCAllocatorModel().open()
    live: dict[str, int] = {}
    for event in events(items):
        if event.kind == ALLOC:
            session.allocate(event.name, event.lifetime.size_bytes)
            if event.lifetime.size_bytes:
                live[event.name] = event.lifetime.size_bytes
        else:
            session.free(event.name)
            live.pop(event.name, None)
        # Live chunks are disjoint and each is at least its rounded request.
        spans = sorted((session.address_of(n), session.chunk_bytes_of(n)) for n in live)
        for (start, size), (next_start, _) in zip(spans, spans[1:]):
            assert start + size <= next_start
        for name, size in live.items():
            assert session.chunk_bytes_of(name) >= bfc_rounded_bytes(size)
        # Free and live chunks together cover the regions exactly.
        covered = sum(size for _, size in session.free_chunks()) + sum(size for _, size in spans)
        assert covered == sum(size for _, size in session.regions())
    # Once everything is freed each region is a single free chunk again.
    assert session.free_chunks() == session.regions()

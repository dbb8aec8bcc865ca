"""NeuroShard search (hybrid/sharding/search.py) against an analytic fake cost model.

Every slice placed once and within the cap, splits that pay off on a hot
table, never worse than no split, a cache that counts honestly, determinism,
and a clear error when nothing fits.
"""
import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid.sharding import search as shard_search
from hybrid.sharding.search import neuroshard_search

SMALL = {"beam_n": 3, "beam_k": 2, "steps": 3, "grid_m": 4}   # search knobs small enough for hypothesis


@dataclass(frozen=True)
class FakeSlice:
    table: int
    kind: str
    part: int
    rows: int
    width: int
    distinct: int


def fake_slices(tables, dim):
    """tables: list of (rows, distinct). Column slices read every distinct row; row phases a share of them."""
    def slices(t, split):
        kind, k = split
        rows, distinct = tables[t]
        if kind == "whole":
            return [FakeSlice(t, kind, 0, rows, dim, distinct)]
        if kind == "columns":
            return [FakeSlice(t, kind, j, rows, dim // k, distinct) for j in range(k)]
        assert kind == "rows"
        return [FakeSlice(t, kind, j, len(range(j, rows, k)), dim, len(range(j, distinct, k))) for j in range(k)]
    return slices


def set_cost(pieces):
    return 0.01 + sum(0.001 * s.distinct + 1e-5 * s.distinct * s.width for s in pieces)


class Serving:
    """The fake serving model; records every set it is asked about."""

    def __init__(self):
        self.batches = []

    def __call__(self, sets):
        self.batches.append(list(sets))
        return [set_cost(s) for s in sets]

    @property
    def asked(self):
        return [s for b in self.batches for s in b]


def comm(nbytes):
    return 1e-6 * float(np.max(nbytes)) if len(nbytes) else 0.0


def search(tables, n_shards, dim=16, serving=None, **kw):
    return neuroshard_search(len(tables), n_shards, dim, slices=fake_slices(tables, dim),
                             serving=serving or Serving(), comm=comm, **kw)


def rank_sets(result, tables, n_shards, dim):
    """The slices on each rank, rebuilt from placements and splits (checking their consistency)."""
    slices = fake_slices(tables, dim)
    on = [[] for _ in range(n_shards)]
    for t, (split, place) in enumerate(zip(result.splits, result.placements)):
        pieces = slices(t, split)
        kind, k = split
        if kind == "whole":
            assert k == 1 and isinstance(place, int)
            ranks = [place]
        else:
            assert list(place) == [kind]
            ranks = place[kind]
        assert len(ranks) == len(pieces) == k
        assert all(0 <= r < n_shards for r in ranks)
        for r, piece in zip(ranks, pieces):
            on[r].append(piece)
    return on


def check_plan(result, tables, n_shards, dim, cap_rows):
    on = rank_sets(result, tables, n_shards, dim)
    for t, (rows, _) in enumerate(tables):
        mine = [s for rank in on for s in rank if s.table == t]
        kind, k = result.splits[t]
        if kind == "rows":
            assert sum(s.rows for s in mine) == rows and all(s.width == dim for s in mine)
            assert result.placements[t]["rows"] == list(range(n_shards)) and k == n_shards
        else:   # every row of the table, each column exactly once
            assert all(s.rows == rows for s in mine)
            assert k * mine[0].width == dim and sorted(s.part for s in mine) == list(range(k))
        if kind == "columns" and cap_rows is None:   # slices of a table on distinct ranks when nothing prevents it
            assert len(set(result.placements[t]["columns"])) == k
    if cap_rows is not None:
        for rank in on:
            assert sum(s.rows * s.width for s in rank) <= cap_rows * dim
    serving = [set_cost(rank) if rank else 0.0 for rank in on]
    nbytes = np.array([sum(2.0 * s.distinct * s.width * 4 for s in rank) for rank in on])
    assert result.serving_ms == pytest.approx(serving)
    assert result.comm_ms == pytest.approx(comm(nbytes))
    assert result.cost == pytest.approx(max(serving) + comm(nbytes))


@st.composite
def tasks(draw):
    n_shards = draw(st.integers(1, 5))
    dim = draw(st.sampled_from([4, 8, 16]))
    tables = []
    for _ in range(draw(st.integers(1, 7))):
        rows = draw(st.integers(1, 200))
        tables.append((rows, draw(st.integers(1, rows))))
    total, biggest = sum(r for r, _ in tables), max(r for r, _ in tables)
    # A cap at which greedy whole-table placement always fits (a table that fits nowhere would mean every
    # rank holds more than total / n_shards), or a tighter one that may be impossible.
    roomy = biggest + -(-total // n_shards)
    cap = draw(st.one_of(st.none(), st.integers(roomy, 2 * roomy), st.integers(1, roomy)))
    return tables, n_shards, dim, cap, cap is None or cap >= roomy, draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(tasks())
def test_every_slice_placed_once_within_the_cap(task):
    tables, n_shards, dim, cap, must_fit, row_wise = task
    try:
        result = search(tables, n_shards, dim, cap_rows=cap, row_wise=row_wise, **SMALL)
    except ValueError as err:
        assert not must_fit, err
        assert f"{cap} rows" in str(err)
        return
    check_plan(result, tables, n_shards, dim, cap)
    if not row_wise:
        assert all(kind != "rows" for kind, _ in result.splits)
    # The empty column plan is a candidate: never worse than the no-split inner loop (which may not fit).
    try:
        no_split = search(tables, n_shards, dim, cap_rows=cap, row_wise=row_wise, **{**SMALL, "steps": 0}).cost
    except ValueError:
        no_split = np.inf
    assert result.cost <= no_split


def best_whole_placement(tables, n_shards, dim):
    """Brute force: the lowest plan cost over every placement of whole tables."""
    whole = [[FakeSlice(t, "whole", 0, rows, dim, distinct)] for t, (rows, distinct) in enumerate(tables)]
    best = np.inf
    for ranks in itertools.product(range(n_shards), repeat=len(tables)):
        on = [[s for t, r in enumerate(ranks) if r == rank for s in whole[t]] for rank in range(n_shards)]
        nbytes = np.array([sum(2.0 * s.distinct * s.width * 4 for s in rank) for rank in on])
        best = min(best, max(set_cost(rank) if rank else 0.0 for rank in on) + comm(nbytes))
    return best


@pytest.mark.parametrize("n_shards", [2, 3])
def test_the_greedy_balances_predicted_cost(n_shards):
    """The inner loop alone comes near the best whole-table placement (brute force).

    Largest first, each to the rank cheapest after taking it, is LPT under an
    additive cost: within 4/3 of optimal in general; here 1.00 on 2 ranks and
    1.08 on 3 (LPT's classic miss). Ignoring the predicted costs (e.g. always
    the first rank with room) gives 1.44 and 1.75.
    """
    tables = [(5_000, d) for d in (800, 700, 600, 500, 400, 300, 200, 100)]
    no_split = search(tables, n_shards, 16, steps=0)
    check_plan(no_split, tables, n_shards, 16, None)
    assert no_split.cost <= 1.1 * best_whole_placement(tables, n_shards, 16)


def hot_task():
    return [(20_000, 8_000)] + [(2_000 + 300 * i, 100 + 20 * i) for i in range(5)]


@pytest.mark.parametrize("n_shards", [2, 3, 4])
@pytest.mark.parametrize("row_wise", [False, True])
def test_a_hot_table_is_split_and_beats_every_whole_table_placement(n_shards, row_wise):
    tables, dim = hot_task(), 16
    result = search(tables, n_shards, dim, row_wise=row_wise)
    check_plan(result, tables, n_shards, dim, None)
    assert result.splits[0] != ("whole", 1)
    assert row_wise or result.splits[0][0] == "columns"
    no_split = search(tables, n_shards, dim, row_wise=row_wise, steps=0)
    assert all(split == ("whole", 1) for split in no_split.splits)
    assert result.cost < no_split.cost
    # Better than the best whole-table placement, by brute force over all of them.
    assert result.cost < best_whole_placement(tables, n_shards, dim)


def test_dealing_every_table_is_a_candidate_beyond_the_steps_reach():
    tables, dim = [(4_000, 1_000)] * 7, 16  # 7 equally hot tables on 4 ranks: whole ones cannot balance
    result = search(tables, 4, dim, steps=1)  # one move deals one table; the candidate deals all seven
    check_plan(result, tables, 4, dim, None)
    assert result.splits == [("rows", 4)] * 7
    assert result.cost < search(tables, 4, dim, steps=1, row_wise=False).cost


def test_a_split_must_buy_at_least_the_minimum_gain():
    tables, dim = hot_task(), 16
    split = search(tables, 2, dim)
    no_split = search(tables, 2, dim, steps=0)
    gain = 1 - split.cost / no_split.cost
    assert gain > 0
    half = search(tables, 2, dim, min_gain=gain / 2)  # the big saving is taken, small ones after it may not be
    assert split.cost <= half.cost <= no_split.cost * (1 - gain / 2)
    assert sum(s != ("whole", 1) for s in half.splits) <= sum(s != ("whole", 1) for s in split.splits)
    assert all(s == ("whole", 1) for s in search(tables, 2, dim, min_gain=0.99).splits)


def test_the_cache_counts_every_call_and_the_search_is_deterministic(monkeypatch):
    lookups = []
    real = shard_search._ServingCache.costs

    def counting(self, keys):
        lookups.append(sum(1 for k in keys if k))   # the empty set is defined as 0, never a call
        return real(self, keys)

    monkeypatch.setattr(shard_search._ServingCache, "costs", counting)
    rng = np.random.default_rng(3)
    tables = [(int(r), int(rng.integers(1, r))) for r in rng.integers(50, 5_000, size=14)]
    runs = []
    for _ in range(2):
        lookups.clear()
        serving = Serving()
        result = search(tables, 3, 16, serving=serving, cap_rows=sum(r for r, _ in tables) // 2)
        asked = serving.asked
        assert result.evaluations == len(asked)
        assert result.evaluations + result.cache_hits == sum(lookups)
        # Each set reached the model at most once (as a multiset, in any order) and calls were batched.
        assert len({tuple(sorted(map(repr, s))) for s in asked}) == len(asked)
        assert len(serving.batches) < len(asked)
        assert result.cache_hits > result.evaluations
        runs.append(result)
    a, b = runs
    assert (a.placements, a.splits, a.cost, a.serving_ms, a.comm_ms, a.evaluations, a.cache_hits) == \
           (b.placements, b.splits, b.cost, b.serving_ms, b.comm_ms, b.evaluations, b.cache_hits)


def test_equal_slices_share_cache_entries_and_count_as_a_multiset():
    serving = Serving()
    cache = shard_search._ServingCache(serving)
    s = FakeSlice(0, "columns", 0, 10, 4, 5)
    a, b = cache.intern(s), cache.intern(FakeSlice(0, "columns", 0, 10, 4, 5))
    assert a == b
    c = cache.intern(FakeSlice(1, "whole", 0, 10, 8, 5))
    got = cache.costs([(a,), (a, a), (a, c), (a,), ()])
    assert got == pytest.approx([set_cost([s]), set_cost([s, s]), set_cost([s, FakeSlice(1, "whole", 0, 10, 8, 5)]),
                                 set_cost([s]), 0.0])
    assert (cache.evaluations, cache.hits, len(serving.batches)) == (3, 1, 1)
    cache.costs([(a, c)])
    assert (cache.evaluations, cache.hits, len(serving.batches)) == (3, 2, 1)


def test_an_oversized_table_is_split_to_fit():
    tables, dim = [(100, 50), (10, 5), (10, 5)], 8   # table 0 alone is 100 rows, the cap 60
    for row_wise in (False, True):
        result = search(tables, 2, dim, cap_rows=60, row_wise=row_wise)
        check_plan(result, tables, 2, dim, 60)
        assert result.splits[0] != ("whole", 1)


@pytest.mark.parametrize("tables, n_shards, cap, table", [
    ([(100, 10), (5, 5)], 2, 40, "table 0 "),         # halves (columns or rows) of 50 rows exceed 40
    ([(5, 5), (100, 10)], 1, 99, "table 1 "),         # one rank: no split at all
    ([(60, 10), (60, 10)], 2, 55, "tables need 960 values"),   # each fits split, not both: 960 > 2 x 55 x 8
])
def test_an_impossible_cap_raises(tables, n_shards, cap, table):
    with pytest.raises(ValueError, match=f"{cap} rows") as err:
        search(tables, n_shards, 8, cap_rows=cap)
    assert table in str(err.value)

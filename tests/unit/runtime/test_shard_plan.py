"""Shard plans: every row placed once, dense shards, lookups that agree with the layout; the baselines."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hybrid.cli import main
from hybrid.runtime.embedding_init import fill_initial_runs, initial_rows
from hybrid.runtime.shard_plan import Columns, Segment, ShardPlan, ShardPlanError
from hybrid.sharding.planners import PLANNERS, make_plan, shard_load


@st.composite
def table_plans(draw):
    n_shards = draw(st.integers(1, 5))
    sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=8))
    offsets = [0, *np.cumsum(sizes).tolist()]
    placements = []
    for _ in sizes:
        if draw(st.booleans()):
            placements.append(draw(st.integers(0, n_shards - 1)))
        else:
            placements.append(draw(st.permutations(range(n_shards)))[:draw(st.integers(1, n_shards))])
    return ShardPlan.from_tables(offsets, placements, n_shards, "drawn"), offsets, placements


@settings(max_examples=200, deadline=None)
@given(table_plans())
def test_every_row_has_one_place_and_every_shard_is_dense(case):
    plan, offsets, placements = case
    rows = np.arange(plan.n_rows)
    shard, local = plan.locate(rows)
    assert sorted(zip(shard.tolist(), local.tolist())) == [(s, i) for s in range(plan.n_shards)
                                                           for i in range(plan.sizes[s])]
    for s in range(plan.n_shards):
        assert np.array_equal(shard[plan.rows_of(s)], np.full(plan.sizes[s], s))
        assert np.array_equal(local[plan.rows_of(s)], np.arange(plan.sizes[s]))
    for t, where in enumerate(placements):  # a table's rows are on the shards it was placed on
        placed = set(shard[offsets[t]:offsets[t + 1]].tolist())
        assert placed <= ({where} if np.isscalar(where) else set(where))
    again = ShardPlan(plan.n_rows, plan.n_shards, plan.to_dict()["segments"])
    assert again.fingerprint == plan.fingerprint


@settings(max_examples=200, deadline=None)
@given(table_plans(), st.data())
def test_by_shard_gives_each_rank_its_rows_in_order_as_one_sided_operations_address_them(case, data):
    plan, _, _ = case
    rows = np.array(data.draw(st.lists(st.integers(0, plan.n_rows - 1), max_size=60, unique=True)), dtype=np.int64)
    only = data.draw(st.none() | st.integers(0, plan.n_shards - 1))
    shard, local = plan.locate(rows)
    found = plan.by_shard(rows, only)
    assert [s for s, _, _ in found] == sorted(set(shard.tolist()) & ({only} if only is not None else set(shard.tolist())))
    for s, positions, local_rows in found:
        assert np.array_equal(positions, np.flatnonzero(shard == s))  # the rows' own order: no staging needed
        assert local_rows == local[positions].tolist() and all(type(r) is int for r in local_rows)
    if len(rows):
        with pytest.raises(ShardPlanError, match="rows must be in"):
            plan.by_shard(np.append(rows, plan.n_rows))


def test_by_shard_refuses_a_plan_with_column_slices():
    sliced = ShardPlan.from_tables([0, 10, 30], [Columns((0, 1)), [1, 0]], 2, "sliced", dim=DIM)
    with pytest.raises(ShardPlanError, match="whole rows"):
        sliced.by_shard(np.arange(3))


def test_a_shard_filled_from_its_runs_holds_its_rows_initial_values():
    plan = ShardPlan.from_tables([0, 70_000, 70_050, 200_000], [[0, 1, 2], 1, [2, 0]], 3, "mixed")
    for s in range(3):
        shard = np.empty((plan.sizes[s], 4), np.float32)
        fill_initial_runs(shard, 9, plan.runs(s))
        assert np.array_equal(shard, initial_rows(9, plan.rows_of(s), 4, np.float32))


DIM = 8


@st.composite
def sliced_plans(draw):
    """Tables placed whole, dealt by rows, or split into 2, 4 or 8 column slices (on any shards)."""
    n_shards = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 30), min_size=1, max_size=6))
    placements = []
    for _ in sizes:
        kind = draw(st.sampled_from(["whole", "rows", "columns"]))
        if kind == "whole":
            placements.append(draw(st.integers(0, n_shards - 1)))
        elif kind == "rows":
            placements.append(draw(st.permutations(range(n_shards)))[:draw(st.integers(1, n_shards))])
        else:
            parts = draw(st.sampled_from([2, 4, 8]))
            placements.append(Columns(tuple(draw(st.lists(st.integers(0, n_shards - 1), min_size=parts,
                                                          max_size=parts)))))
    offsets = [0, *np.cumsum(sizes).tolist()]
    return ShardPlan.from_tables(offsets, placements, n_shards, "drawn", dim=DIM), offsets, placements


@settings(max_examples=200, deadline=None)
@given(sliced_plans())
def test_every_row_and_column_has_one_place_and_shards_hold_their_pieces_values(case):
    plan, offsets, placements = case
    rows = np.arange(plan.n_rows)
    position, shard, local, col_lo, width = plan.pieces(rows, DIM)
    cells = [(p, c) for p, lo, w in zip(position.tolist(), col_lo.tolist(), width.tolist()) for c in range(lo, lo + w)]
    assert sorted(cells) == [(r, c) for r in range(plan.n_rows) for c in range(DIM)]  # every value once
    shards = [np.full((plan.sizes[s], DIM), np.nan, np.float32) for s in range(plan.n_shards)]
    for s in range(plan.n_shards):
        fill_initial_runs(shards[s], 9, plan.runs(s))
        assert not np.isnan(shards[s]).any() or plan.columns  # whole rows: the shard is dense
    rebuilt = np.full((plan.n_rows, DIM), np.nan, np.float32)  # read every row back through its pieces
    for p, s, at, lo, w in zip(position, shard, local, col_lo, width):
        rebuilt[p, lo:lo + w] = shards[s].reshape(-1, w)[at]
    assert np.array_equal(rebuilt, initial_rows(9, rows, DIM, np.float32))
    used = [{(int(s), v) for s, at, w in zip(shard, local, width) for v in range(at * w, (at + 1) * w)
             if s == k} for k in range(plan.n_shards)]
    assert sum(map(len, used)) == plan.n_rows * DIM  # no value of a shard holds two pieces
    for t, where in enumerate(placements):  # a table's values are on the shards it was placed on
        mine = (position >= offsets[t]) & (position < offsets[t + 1])
        allowed = set(where.shards) if isinstance(where, Columns) else (
            {where} if np.isscalar(where) else set(where))
        assert set(shard[mine].tolist()) <= allowed
    again = ShardPlan(plan.n_rows, plan.n_shards, plan.to_dict()["segments"], dim=plan.dim)
    assert again.fingerprint == plan.fingerprint


def test_a_plan_without_column_slices_keeps_its_file_and_fingerprint():
    plan = ShardPlan.from_tables([0, 10, 30], [0, [1, 0]], 2, "rows", dim=DIM)
    assert "dim" not in plan.to_dict() and all("width" not in s for s in plan.to_dict()["segments"])
    assert plan.fingerprint == ShardPlan.from_tables([0, 10, 30], [0, [1, 0]], 2, "rows").fingerprint
    sliced = ShardPlan.from_tables([0, 10, 30], [Columns((0, 1)), [1, 0]], 2, "sliced", dim=DIM)
    with pytest.raises(ShardPlanError, match="column"):
        sliced.locate(np.arange(3))


@pytest.mark.parametrize("segments, message", [
    ([Segment(0, 0, 10, col_lo=0, width=4)], "do not cover"),
    ([Segment(0, 0, 10, col_lo=0, width=4), Segment(1, 0, 10, col_lo=2, width=4)], "aligned"),
    ([Segment(0, 0, 10, col_lo=0, width=3), Segment(1, 0, 10, col_lo=3, width=5)], "divide"),
    ([Segment(0, 0, 10, col_lo=0, width=4), Segment(0, 0, 10, col_lo=4, width=4)], "held twice"),
])
def test_column_slices_that_do_not_cover_each_value_once_are_refused(segments, message):
    with pytest.raises(ShardPlanError, match=message):
        ShardPlan(10, 2, segments, dim=DIM)


@pytest.mark.parametrize("segments, message", [
    ([Segment(0, 0, 5), Segment(1, 4, 10)], "twice"),
    ([Segment(0, 0, 5), Segment(1, 6, 10)], "nowhere"),
    ([Segment(0, 0, 10, 2, 0), Segment(1, 0, 10, 2, 0, 0)], "phases"),
    ([Segment(0, 0, 5), Segment(0, 5, 10, base=6)], "not dense"),
    ([Segment(0, 0, 8)], "the tables have 10"),
    ([Segment(3, 0, 10)], "shard < 2"),
])
def test_a_plan_that_does_not_place_each_row_once_is_refused(segments, message):
    with pytest.raises(ShardPlanError, match=message):
        ShardPlan(10, 2, segments)


def test_the_default_plan_is_the_stores_old_row_ranges():
    plan = ShardPlan.contiguous(103, 4)
    rows = np.arange(103)
    shard, local = plan.locate(rows)
    assert np.array_equal(shard, rows // 26) and np.array_equal(local, rows % 26)
    assert plan.sizes.tolist() == [26, 26, 26, 25] and plan.shard_rows == 26
    uneven = ShardPlan.from_tables([0, 10, 30], [0, 1], 2, "uneven")  # contiguous, but not equal ranges
    assert [a.tolist() for a in uneven.locate(np.array([9, 10, 25]))] == [[0, 1, 1], [9, 0, 15]]
    general = ShardPlan(103, 4, plan.segments)
    general._per = 0  # the segment lookup, not the division shortcut
    assert all(np.array_equal(a, b) for a, b in zip(general.locate(rows), (shard, local)))


@pytest.mark.parametrize("name", PLANNERS)
def test_every_baseline_places_every_row_and_respects_the_memory_cap(name):
    sizes = [500, 30, 1000, 7, 800, 64, 3, 250]
    cap = 1100
    plan = make_plan(name, sizes, 3, dim=16, cap_rows=cap)
    assert plan.n_rows == sum(sizes) and plan.shard_rows <= cap
    if name in ("size", "dim", "lookup", "size-lookup", "random"):  # table-wise: a table on one rank
        offsets = np.cumsum([0, *sizes])
        for t in range(len(sizes)):
            assert len(set(plan.shard_of(np.arange(offsets[t], offsets[t + 1])).tolist())) == 1
    with pytest.raises(ShardPlanError, match="cap"):
        make_plan(name, sizes, 3, dim=16, cap_rows=800)  # under the 885 rows a third of them needs


def test_round_robin_spreads_each_tables_hottest_rows_over_every_rank():
    sizes = [1000, 1000]
    batches = [np.arange(0, 40), np.concatenate([np.arange(0, 20), 1000 + np.arange(0, 20)])]  # low ids: hot
    ranges = shard_load(make_plan("row-ranges", sizes, 4, dim=8), batches)
    dealt = shard_load(make_plan("round-robin", sizes, 4, dim=8), batches)
    assert ranges.max() / ranges.mean() > 2 and dealt.max() / dealt.mean() == 1.0


def test_plan_shards_writes_a_plan_that_fits_the_workload(tmp_path, criteo_like, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan-shards", "configs/w1-smoke.yaml", f"data.path={criteo_like}", "cluster.ps=2",
                 "--planner", "size", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    plan = ShardPlan.load(out, n_rows=sum(result["rows_per_rank"]), n_shards=2)
    assert plan.fingerprint == result["fingerprint"] and len(result["rows_served_per_batch"]) == 2
    with pytest.raises(ShardPlanError, match="3 PS ranks"):
        ShardPlan.load(out, n_rows=plan.n_rows, n_shards=3)


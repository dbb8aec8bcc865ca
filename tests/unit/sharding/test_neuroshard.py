"""The cost-model planner end to end: search results become plans the store serves, and the CLI makes them."""
import json

import numpy as np
import pytest
import torch

from hybrid.cli import main
from hybrid.runtime.shard_plan import Columns, ShardPlan
from hybrid.sharding import cost_data, neuroshard
from hybrid.sharding.cost_models import CostModels, fit_comm, fit_serving, table_slice


class AnalyticModels:
    """Cost models with a known answer: a rank's cost is its slices' distinct values, plus a little per slice."""

    def serving_ms_many(self, sets):
        return np.array([sum(0.01 + 1e-4 * s.distinct * s.width for s in group) for group in sets])

    def comm_ms(self, bytes_per_rank):
        return 1e-7 * float(np.max(bytes_per_rank))


def _task(rng, cardinalities, hot: int, iterations: int = 3, batch: int = 512):
    """Per table, ids of each iteration: table ``hot`` draws from all its rows, the others from a few."""
    return [[rng.integers(0, c if t == hot else max(1, c // 50), size=batch) for _ in range(iterations)]
            for t, c in enumerate(cardinalities)]


@pytest.mark.parametrize("n_shards", [2, 4])
def test_the_plan_places_every_value_once_within_the_cap_and_spreads_a_hot_table(n_shards):
    rng = np.random.default_rng(1)
    cardinalities = [4000, 300, 500, 800, 200, 600]
    ids = _task(rng, cardinalities, hot=0)
    dim = 16
    cap = int(1.5 * sum(cardinalities) / n_shards)
    plan, result = neuroshard.plan(cardinalities, ids, n_shards, dim, AnalyticModels(), cap_rows=cap)
    assert plan.shard_rows <= cap and plan.n_rows == sum(cardinalities)
    rows = np.arange(plan.n_rows)
    position, shard, local, col_lo, width = plan.pieces(rows, dim)
    covered = np.zeros((plan.n_rows, dim), dtype=np.int64)
    for p, lo, w in zip(position, col_lo, width):
        covered[p, lo:lo + w] += 1
    assert (covered == 1).all()  # every row and column of every table exactly once
    offsets = np.cumsum([0, *cardinalities])
    hot_shards = set(shard[(position >= offsets[0]) & (position < offsets[1])].tolist())
    assert result.splits[0][0] != "whole" and len(hot_shards) > 1  # the hot table is split over ranks
    again = ShardPlan(plan.n_rows, plan.n_shards, plan.to_dict()["segments"], dim=plan.dim)
    assert again.fingerprint == plan.fingerprint


def test_search_placements_become_the_plans_segments():
    placements = neuroshard.placements_of(type("R", (), {"placements": [1, {"columns": [0, 1]}, {"rows": [1, 0]}]}))
    assert placements == [1, Columns((0, 1)), [1, 0]]


def test_slices_of_a_split_are_measured_once_and_add_up_to_the_table():
    rng = np.random.default_rng(2)
    ids = [[rng.integers(0, 100, size=64) for _ in range(3)]]
    slices = neuroshard.slice_maker([100], ids, 16)
    whole = table_slice(ids[0], 100, table=0, width=16)
    halves, parts = slices(0, ("columns", 2)), slices(0, ("rows", 4))
    assert slices(0, ("columns", 2)) is halves and [s.width for s in halves] == [8, 8]
    assert sum(s.rows for s in parts) == 100 and sum(s.distinct for s in parts) == pytest.approx(whole.distinct)


def _tiny_models(tmp_path):
    """Cost models fitted in a blink on made-up samples: enough to drive the CLI."""
    rng = np.random.default_rng(3)
    sets, costs = [], []
    for _ in range(40):
        group = tuple(table_slice([rng.integers(0, 50, size=32)], 50, table=t, width=8)
                      for t in range(int(rng.integers(1, 4))))
        sets.append(group)
        costs.append(0.1 + 0.01 * sum(s.distinct for s in group))
    bytes_lists = [rng.integers(1, 10**6, size=2).tolist() for _ in range(40)]
    comm = [0.1 + 1e-6 * max(b) for b in bytes_lists]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny fits: threads only add overhead
    try:
        models = CostModels.from_fits(fit_serving(sets, costs, epochs=5), fit_comm(bytes_lists, comm, epochs=5))
    finally:
        torch.set_num_threads(threads)
    path = tmp_path / "models.pt"
    models.save(path)
    return path


def test_plan_shards_neuroshard_writes_a_plan_training_loads(tmp_path, criteo_like, capsys):
    out = tmp_path / "plan.json"
    models = _tiny_models(tmp_path)
    assert main(["plan-shards", "configs/w1-smoke.yaml", f"data.path={criteo_like}", "cluster.ps=2", "--batches", "4",
                 "--planner", "neuroshard", "--cost-model", str(models), "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    plan = ShardPlan.load(out, n_rows=result["n_rows"], n_shards=2, dim=16)
    assert plan.fingerprint == result["fingerprint"] and result["evaluations"] > 0
    with pytest.raises(SystemExit, match="--cost-model"):
        main(["plan-shards", "configs/w1-smoke.yaml", f"data.path={criteo_like}", "--planner", "neuroshard"])


def test_cost_data_round_trips_and_a_foreign_file_is_refused(tmp_path):
    piece = table_slice([np.array([1, 1, 2])], 10, table=0, width=8)
    data = {"serving_sets": [(piece,)], "serving_ms": [0.5], "comm_bytes": [[8, 0]], "comm_ms": [0.1],
            "batch": 3, "scale": 1.0, "ps_ranks": 2, "seconds": 0.0}
    cost_data.save(data, tmp_path / "d.json")
    assert cost_data.load(tmp_path / "d.json")["serving_sets"] == [(piece,)]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not sharding cost data"):
        cost_data.load(tmp_path / "bad.json")


def test_the_collectors_variants_place_their_measured_slice_alone_on_the_first_shard():
    variant = cost_data.Variant(base=0, width=8, deal=2)
    segments = cost_data.variant_segments(0, 10, variant, measured=0, rest=1)
    plan = ShardPlan.packed(10, 2, segments, name="v", dim=cost_data.DIM)
    position, shard, _, col_lo, width = plan.pieces(np.arange(10), cost_data.DIM)
    on_first = shard == 0
    assert sorted(position[on_first].tolist()) == [0, 2, 4, 6, 8]  # phase 0 of rows dealt over 2
    assert set(col_lo[on_first].tolist()) == {0} and set(width[on_first].tolist()) == {8}
    rng = np.random.default_rng(0)
    for _ in range(20):
        picks = cost_data.draw_set(rng, 26, 12)
        assert 1 <= len(picks) <= 12 and len(set(picks)) == len(picks)

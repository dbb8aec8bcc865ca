"""A checkpoint's PS rows read under another shard plan (hybrid.runtime.reshard)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid.runtime import checkpoint as ckpt
from hybrid.runtime.reshard import ShardFiles, checkpoint_plan, cold_start, files_to_verify, same_layout
from hybrid.runtime.shard_plan import Columns, ShardPlan, ShardPlanError
from hybrid.sharding.planners import make_plan

TABLES, DIM = [37, 5, 120, 18], 4


def _plans():
    """Plans of every kind the planners make: row ranges, whole tables, rows dealt, column slices."""
    n_rows = sum(TABLES)
    return {"ranges-1": ShardPlan.contiguous(n_rows, 1), "ranges-3": ShardPlan.contiguous(n_rows, 3),
            "round-robin-2": make_plan("round-robin", TABLES, 2, dim=DIM),
            "size-3": make_plan("size", TABLES, 3, dim=DIM), "dim-2": make_plan("dim", TABLES, 2, dim=DIM),
            "sliced-3": ShardPlan.from_tables(np.cumsum([0, *TABLES]), [Columns((0, 2)), 1, [2, 0],
                                                                        Columns((1, 0, 2, 1))], 3, "sliced", dim=DIM)}


def _write_checkpoint(tmp_path, plan: ShardPlan, table: np.ndarray) -> list:
    """Each shard of ``plan`` filled from ``table`` (as a PS holds it) and written as a checkpoint's file."""
    files = []
    for shard in range(plan.n_shards):
        memory = np.zeros((int(plan.sizes[shard]), DIM), table.dtype)
        for start, first, count, stride, col_lo, width in plan.runs(shard):
            rows = first + stride * np.arange(count)
            target = memory.reshape(-1, width) if width else memory
            target[start:start + count] = table[rows, col_lo:col_lo + width] if width else table[rows]
        files.append(tmp_path / ckpt.shard_name(shard))
        ckpt.write_rows(files[-1], memory)
    return files


@settings(max_examples=20, deadline=None)
@given(old=st.sampled_from(sorted(_plans())), new=st.sampled_from(sorted(_plans())),
       chunk=st.sampled_from([1, 7, 1 << 22]))
def test_every_new_shard_holds_exactly_its_rows_whatever_the_two_plans(tmp_path_factory, old, new, chunk):
    tmp_path = tmp_path_factory.mktemp("reshard")
    plans = _plans()
    table = np.random.default_rng(3).normal(size=(sum(TABLES), DIM))
    files = ShardFiles(_write_checkpoint(tmp_path, plans[old], table), plans[old], DIM, np.float64)
    target = plans[new]
    for shard in range(target.n_shards):
        memory = np.full((int(target.sizes[shard]), DIM), np.nan)
        files.fill(memory, target.runs(shard), chunk_values=chunk * DIM)
        expected = np.zeros_like(memory)
        for start, first, count, stride, col_lo, width in target.runs(shard):
            rows = first + stride * np.arange(count)
            view = expected.reshape(-1, width) if width else expected
            view[start:start + count] = table[rows, col_lo:col_lo + width] if width else table[rows]
        used = ~np.isnan(memory)  # alignment padding between column slices stays untouched
        np.testing.assert_array_equal(memory[used], expected[used])
        assert used.sum() == sum(c * (w or DIM) for _, _, c, _, _, w in target.runs(shard))
    np.testing.assert_array_equal(files.read(np.arange(sum(TABLES))[::-1]), table[::-1])


def test_the_checkpoints_plan_is_its_stored_layout_or_the_default_ranges_of_its_ps_ranks():
    dealt = make_plan("round-robin", TABLES, 2, dim=DIM)
    assert checkpoint_plan({"shard_layout": dealt.to_dict()}, sum(TABLES)).fingerprint == dealt.fingerprint
    default = ShardPlan.contiguous(sum(TABLES), 3)
    assert checkpoint_plan({"config": {"cluster": {"ps": 3}}}, sum(TABLES)).fingerprint == default.fingerprint
    with pytest.raises(ShardPlanError, match="does not record its shard plan"):
        checkpoint_plan({"config": {"cluster": {"ps": 2}}, "shard_plan": dealt.fingerprint}, sum(TABLES))


def test_the_schedule_continues_only_on_the_cluster_that_wrote_it():
    plan = ShardPlan.contiguous(sum(TABLES), 2)
    cache = {"ratio": 0.1, "policy": "lru"}
    meta = {"config": {"cluster": {"workers": 4, "ps": 2}, "cache": cache}, "shard_plan": plan.fingerprint}
    assert same_layout(meta, plan) and cold_start(meta, 4, plan, cache) is None
    assert "written by 4 workers + 2 PS; on 2 + 2" in cold_start(meta, 2, plan, cache)
    assert "cache settings differ" in cold_start(meta, 4, plan, {"ratio": 0.2, "policy": "lru"})
    assert "ended its run" in cold_start({**meta, "ends_run": True}, 4, plan, cache)
    other = ShardPlan.contiguous(sum(TABLES), 3)
    assert not same_layout(meta, other) and "re-sharded" in cold_start(meta, 4, other, cache)
    assert files_to_verify(meta, plan, 1) == ["ps-1.npy"]
    meta5 = {"config": {"cluster": {"workers": 4, "ps": 5}}, "shard_plan": "x"}
    assert [files_to_verify(meta5, plan, i) for i in (0, 1)] == [["ps-0.npy", "ps-2.npy", "ps-4.npy"],
                                                                 ["ps-1.npy", "ps-3.npy"]]

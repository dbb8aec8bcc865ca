"""The scheduler: identical plans from independent instances; simulator counts."""
import json

import numpy as np
import pytest

from hybrid import modes
from hybrid.cli import main
from hybrid.config import Mode, load_config
from hybrid.data.store import BatchStore
from hybrid.scheduling import scheduler as scheduler_module
from hybrid.scheduling.plan_producer import PlanProducer
from hybrid.scheduling.policy import SchedulerError
from hybrid.training.simulator import simulate


def _config(store_path, *overrides):
    return load_config(None, [f"data.path={store_path}", "cluster.workers=4", "train.batch_per_worker=16",
                              "cache.ratio=0.2", "seed=3", *overrides])


def _digests(config, store, iterations, worker=0):
    scheduler = modes.scheduler_for(config, cardinalities=store.cardinalities, worker=worker)
    batches = (b.sparse for b in store.batches(config.global_batch))
    return [plan.digest for plan, _ in zip(scheduler.plans(batches), range(iterations))]


@pytest.mark.parametrize("settings", [
    ["scheduler.mode=vanilla"],
    ["scheduler.mode=herald", "scheduler.laia=chunked"],
    ["scheduler.mode=herald", "scheduler.laia=adaptive", "scheduler.score_tables=6", "scheduler.sync=p2p"],
    ["scheduler.mode=herald", "scheduler.scoring=cost", "scheduler.order=confident", "scheduler.swap_rounds=2",
     "scheduler.lookahead=true"],
], ids=["vanilla", "herald-chunked", "herald-adaptive-p2p", "herald-cost-swap-lookahead"])
def test_independent_schedulers_agree_for_1000_iterations(criteo_like, settings):
    store = BatchStore(criteo_like)
    one = _config(criteo_like, *settings, "scheduler.threads=1")
    two = _config(criteo_like, *settings, "scheduler.threads=2")
    first, second = _digests(one, store, 1000), _digests(two, store, 1000, worker=3)
    assert len(first) == 937  # 60000 samples / 64 per batch
    assert first == second  # whatever the thread count, and whichever worker the scheduler serves
    other_seed = _digests(_config(criteo_like, *settings, "seed=4"), store, 20)
    assert other_seed != first[:20]


@pytest.mark.parametrize("mode", list(modes.MODES))
def test_each_workers_transmissions_add_up_to_the_iterations(criteo_like, mode):
    """``per_worker`` splits a plan's pulls, pushes and P2P rows by the worker that makes them, in every mode."""
    from hybrid.scheduling.event_kinds import PEER_KINDS, PULL_KINDS, PUSH_KINDS

    store = BatchStore(criteo_like)
    config = _config(criteo_like, f"scheduler.mode={mode}")
    scheduler = modes.scheduler_for(config, cardinalities=store.cardinalities)
    spread = 0
    for plan, _ in zip(scheduler.plans(b.sparse for b in store.batches(config.global_batch)), range(40)):
        moved = sum(plan.counts[k] for k in PULL_KINDS + PUSH_KINDS + PEER_KINDS)
        assert len(plan.per_worker) == 4 and plan.per_worker.sum() == moved
        spread += plan.per_worker.max() > plan.per_worker.min()
    assert spread > 0


def test_a_scheduler_that_looks_ahead_resumes_to_the_uninterrupted_plans(criteo_like):
    store = BatchStore(criteo_like)
    config = _config(criteo_like, "scheduler.mode=herald", "scheduler.scoring=cost", "scheduler.lookahead=true")
    batches = [b.sparse for _, b in zip(range(40), store.batches(config.global_batch))]
    whole = [plan.digest for plan in modes.scheduler_for(config, cardinalities=store.cardinalities).plans(batches)]
    first = modes.scheduler_for(config, cardinalities=store.cardinalities)
    for plan in first.plans(batches):
        if plan.step == 19:
            saved = first.save_arrays()
            break
    resumed = modes.scheduler_for(config, cardinalities=store.cardinalities)
    assert [plan.digest for plan in resumed.plans(batches[20:], resume=saved)] == whole[20:]
    assert len(whole) == 40


def test_plans_carry_each_workers_executable_share(criteo_like):
    """The four workers' shares partition the global batch and its counts."""
    store = BatchStore(criteo_like)
    config = _config(criteo_like, "scheduler.mode=herald")
    schedulers = [modes.scheduler_for(config, cardinalities=store.cardinalities, worker=w) for w in range(4)]
    streams = [s.plans(b.sparse for b in store.batches(config.global_batch)) for s in schedulers]
    capacity = schedulers[0].state.capacity
    for step, plans in zip(range(30), zip(*streams)):
        batch_rows = store.sparse()[step * 64:(step + 1) * 64].astype(np.int64) + store.table_offsets
        assert len({plan.digest for plan in plans}) == 1
        samples = np.concatenate([plan.work.samples for plan in plans])
        assert sorted(samples.tolist()) == list(range(64))
        counts = plans[0].counts
        for plan in plans:
            work = plan.work
            assert np.array_equal(work.rows[work.index], batch_rows[work.samples])
            assert (work.slots >= 0).all() and (work.slots < capacity).all()
            assert len(work.local) + len(work.accumulate) + len(work.full_set) == len(work.rows)
        assert sum(len(p.work.pull) + len(p.work.prefetch) for p in plans) == counts["pull"]
        assert sum(len(p.work.writeback) for p in plans) == counts["writeback"]
        assert sum(len(p.work.plan_push) for p in plans) == counts["plan_push"]
        assert sum(len(p.work.accumulate) for p in plans) == counts["accumulate"]
        if step == 0:
            assert sum(len(p.work.pull) for p in plans) == 0, "nothing was written before the first iteration"


def test_p2p_trades_push_and_pull_pairs_for_single_sends(criteo_like):
    store = BatchStore(criteo_like)
    ps = simulate(_config(criteo_like), [Mode.herald], iterations=150)[Mode.herald]
    p2p = simulate(_config(criteo_like, "scheduler.sync=p2p"), [Mode.herald], iterations=150)[Mode.herald]
    assert p2p.p2p > 0
    assert p2p.transmissions < ps.transmissions
    with pytest.raises(SchedulerError, match="p2p needs an on-demand mode"):
        modes.scheduler_for(_config(criteo_like, "scheduler.sync=p2p", "scheduler.mode=vanilla"),
                            cardinalities=store.cardinalities)


def test_cache_smaller_than_a_working_set_is_refused(criteo_like):
    store = BatchStore(criteo_like)
    with pytest.raises(SchedulerError, match=r"cache.ratio=0.001 gives \d+ slots .* use cache.ratio >= 0.0"):
        modes.scheduler_for(_config(criteo_like, "cache.ratio=0.001"), cardinalities=store.cardinalities)


def test_unsupported_settings_say_so(criteo_like):
    store = BatchStore(criteo_like)
    with pytest.raises(SchedulerError, match="use data.validation_fraction > 0 or data.test_fraction > 0"):
        modes.scheduler_for(_config(criteo_like, "scheduler.mode=fae", "data.test_fraction=0"),
                            cardinalities=store.cardinalities)
    with pytest.raises(SchedulerError, match="staleness=2 applies to mode het"):
        modes.scheduler_for(_config(criteo_like, "scheduler.staleness=2"), cardinalities=store.cardinalities)
    for setting in ("train.checkpoint_every=10", "train.eval_every=10", "train.deterministic=true"):
        with pytest.raises(SchedulerError, match=f"{setting.split('=')[0]}=.* not supported with scheduler.mode=het"):
            modes.scheduler_for(_config(criteo_like, "scheduler.mode=het", setting),
                                cardinalities=store.cardinalities)


def test_every_registered_mode_is_one_policy_and_schedules(criteo_like):
    """Each mode's scheduler keeps the cluster state its policy names (docs/modes.md's table); one loop runs them."""
    from hybrid.scheduling.policy import Sync

    store = BatchStore(criteo_like)
    for mode, chosen in modes.MODES.items():
        assert chosen.name is mode and modes.get(mode.value) is chosen
        policy = chosen.schedule
        scheduler = modes.scheduler_for(_config(criteo_like), cardinalities=store.cardinalities, mode=mode)
        assert scheduler.state.full_set == (policy.sync in (Sync.full_set, Sync.fae_replicas))
        assert (scheduler.state.staleness >= 0) == (policy.sync is Sync.het_clocks)


def test_herald_cuts_transmissions_on_data_with_locality(criteo_like):
    results = simulate(_config(criteo_like), [Mode.vanilla, Mode.laia, Mode.plan, Mode.herald], iterations=200)
    vanilla, laia, plan, herald = (results[m] for m in (Mode.vanilla, Mode.laia, Mode.plan, Mode.herald))
    assert vanilla.iterations == 190  # 10 warm-up iterations excluded
    assert laia.pulls < vanilla.pulls and herald.pulls == laia.pulls  # same allocation, same pulls
    assert plan.pushes < vanilla.pushes and plan.pulls == vanilla.pulls
    assert herald.transmissions < laia.transmissions < vanilla.transmissions
    assert herald.hit_rate > vanilla.hit_rate


@pytest.mark.parametrize("mode", [Mode.herald, Mode.fae])
def test_simulate_counts_the_runs_epochs_and_any_length_past_one_pass(criteo_like, mode):
    config = _config(criteo_like, "train.epochs=2", "fae.heldout_samples=64")
    store = BatchStore.of(config.data, "train")
    per_epoch = store.num_batches(config.global_batch)
    warmup = config.scheduler.warmup_iterations
    assert simulate(config, [mode])[mode].iterations == 2 * per_epoch - warmup  # the run's length by default
    longer = _config(criteo_like, f"train.iterations={2 * per_epoch + 7}")
    assert simulate(longer, [mode], iterations=3 * per_epoch + 5)[mode].iterations == 3 * per_epoch + 5 - warmup


def test_simulate_json_counts_each_case_and_the_table_goes_to_stderr(criteo_like, capsys):
    assert main(["simulate", "--config", "configs/w1-smoke.yaml", f"data.path={criteo_like}",
                 "--workers", "4", "--iterations", "30", "--modes", "vanilla,herald,herald+scheduler.sync=p2p",
                 "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    table = captured.err.strip().splitlines()
    assert list(result) == ["vanilla", "herald", "herald+scheduler.sync=p2p"]
    for counts in result.values():
        assert counts["transmissions"] == counts["pulls"] + counts["pushes"] + counts["p2p"]
        assert {"pulls", "pushes", "p2p", "transmissions", "hit_rate", "sched_ms"} <= set(counts)
    assert result["herald"]["p2p"] == 0 < result["herald+scheduler.sync=p2p"]["p2p"]
    assert table[-1].startswith("herald+scheduler.sync=p2p") and table[-2].startswith("herald ")


def test_simulate_rejects_unknown_modes(criteo_like, capsys):
    assert main(["simulate", "--config", "configs/w1-smoke.yaml", f"data.path={criteo_like}",
                 "--modes", "vanilla,turbo"]) == 1
    assert "--modes" in capsys.readouterr().err


@pytest.mark.parametrize("settings", [
    ["scheduler.mode=vanilla"],
    ["scheduler.mode=herald", "cache.policy=lfu"],
    ["scheduler.mode=herald", "scheduler.laia=adaptive", "scheduler.score_tables=6"],
], ids=["vanilla", "herald-lfu", "herald-adaptive"])
def test_a_scheduler_resumed_from_saved_arrays_makes_the_same_plans(criteo_like, settings, tmp_path):
    """Saved at plan 40 (through an .npz file), a fresh scheduler of another worker continues identically."""
    store = BatchStore(criteo_like)
    config = _config(criteo_like, *settings)
    full = _digests(config, store, 120)
    scheduler = modes.scheduler_for(config, cardinalities=store.cardinalities, worker=0)
    for plan in scheduler.plans(b.sparse for b in store.batches(config.global_batch)):
        if plan.step == 40:
            np.savez(tmp_path / "scheduler.npz", **scheduler.save_arrays())
            break
    with np.load(tmp_path / "scheduler.npz", allow_pickle=False) as saved:
        arrays = dict(saved)
    assert int(arrays["next_step"]) == 41
    resumed = modes.scheduler_for(config, cardinalities=store.cardinalities, worker=2)
    batches = (b.sparse for b in store.batches(config.global_batch, start_batch=41))
    plans = [(plan.step, plan.digest) for plan, _ in zip(resumed.plans(batches, resume=arrays), range(79))]
    assert plans == list(enumerate(full))[41:]


def test_a_saved_state_of_another_shape_is_refused(criteo_like):
    store = BatchStore(criteo_like)
    scheduler = modes.scheduler_for(_config(criteo_like), cardinalities=store.cardinalities, worker=0)
    next(scheduler.plans(b.sparse for b in store.batches(64)))
    arrays = scheduler.save_arrays()
    other = modes.scheduler_for(_config(criteo_like, "cache.ratio=0.3"), cardinalities=store.cardinalities)
    with pytest.raises(ValueError, match="saved cluster state has"):
        next(other.plans((b.sparse for b in store.batches(64, start_batch=1)), resume=arrays))
    damaged = dict(arrays, **{"state.lru_next": np.full_like(arrays["state.lru_next"], 10**6)})
    fresh = modes.scheduler_for(_config(criteo_like), cardinalities=store.cardinalities)
    with pytest.raises(ValueError, match="lru_next links outside the cache"):
        next(fresh.plans((b.sparse for b in store.batches(64, start_batch=1)), resume=damaged))


def _written_tables(rows, iteration: int, size: int, stale) -> np.ndarray:
    """A state's written rows as states saved before the bitmaps kept them: two linear-probing tables of
    ``size`` entries ``stamp << 32 | row``, iteration t's in table t & 1 with stamp t + 2, and ``stale``
    rows of iteration t - 2 left in the same table (they count as free)."""
    tables = np.zeros(2 * size, dtype=np.int64)
    base = (iteration & 1) * size
    for stamp, entries in ((iteration + 2, rows), (iteration, stale)):
        for row in entries:
            j = int(((int(row) * 0x9E3779B97F4A7C15) % 2**64) >> (64 - int(np.log2(size))))
            while tables[base + j]:
                j = (j + 1) % size
            tables[base + j] = (stamp << 32) | int(row)
    return tables


def test_written_rows_are_saved_and_states_saved_with_the_older_tables_still_load(criteo_like):
    """The rows the last iteration wrote decide which pulls of the next are prefetchable, so a resumed
    run must have them: saved as rows, or (states saved before) as hash tables of any power-of-two size."""
    store = BatchStore(criteo_like)
    config = _config(criteo_like)
    full = _digests(config, store, 12)
    scheduler = modes.scheduler_for(config, cardinalities=store.cardinalities, worker=0)
    for plan in scheduler.plans(b.sparse for b in store.batches(config.global_batch)):
        if plan.step == 5:
            arrays = scheduler.save_arrays()
            break
    rows, iteration = arrays.pop("state.written_rows"), int(arrays["state.scalars"][0])
    assert len(rows) and np.array_equal(rows, np.unique(rows))
    unwritten = np.setdiff1d(np.arange(rows.max() + 1), rows)[:50]
    size = 1 << int(np.ceil(np.log2(2 * len(rows) + 2 * len(unwritten))))
    batches = lambda: (b.sparse for b in store.batches(config.global_batch, start_batch=6))
    saved = [{"state.written_rows": rows},
             {"state.written": _written_tables(rows, iteration, size, unwritten)},
             {"state.written": _written_tables(rows, iteration, 8 * size, [])}]
    for written in saved:
        resumed = modes.scheduler_for(config, cardinalities=store.cardinalities, worker=0)
        plans = [p.digest for p, _ in zip(resumed.plans(batches(), resume=dict(arrays, **written)), range(6))]
        assert plans == full[6:]
    forgotten = modes.scheduler_for(config, cardinalities=store.cardinalities, worker=0)
    resume = dict(arrays, **{"state.written_rows": rows[:0]})  # the test sees the rows: without them plans differ
    assert next(forgotten.plans(batches(), resume=resume)).digest != full[6]
    fresh = modes.scheduler_for(config, cardinalities=store.cardinalities)
    with pytest.raises(ValueError, match="written-row tables"):
        next(fresh.plans(batches(), resume=dict(arrays, **{"state.written": saved[1]["state.written"][:-1]})))
    with pytest.raises(ValueError, match="written rows"):
        next(fresh.plans(batches(), resume=dict(arrays, **{"state.written_rows": rows + fresh.state.n_rows})))


def test_the_scheduler_releases_the_lock_between_steps_only_beside_a_training_loop(criteo_like, monkeypatch):
    """Each release sleeps (about 74 us on the 2-core machine): the simulator, alone, must not pay for them."""
    sleeps = []
    monkeypatch.setattr(scheduler_module.time, "sleep", sleeps.append)
    store = BatchStore(criteo_like)
    config = _config(criteo_like, "scheduler.mode=herald")
    alone = modes.scheduler_for(config, cardinalities=store.cardinalities, worker=0)
    for _ in zip(alone.plans(b.sparse for b in store.batches(config.global_batch)), range(3)):
        pass
    assert sleeps == []
    beside = modes.scheduler_for(config, cardinalities=store.cardinalities, worker=0)
    PlanProducer(beside, iter([])).close()
    assert beside.beside_a_loop
    for _ in zip(beside.plans(b.sparse for b in store.batches(config.global_batch)), range(3)):
        pass
    assert len(sleeps) >= 3 * 6 and set(sleeps) == {0}

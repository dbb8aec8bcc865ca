"""The time model's loads against the simulator's counts of the same run: every row is in one stage."""
import pytest

from hybrid.config import Mode, load_config
from hybrid.data.synthetic import synthesize
from hybrid.data.store import BatchStore
from hybrid.projection.loads import loads, row_bytes
from hybrid.training.simulator import simulate_mode

ITERATIONS = 120


def _config(store_path, *overrides):
    return load_config(None, [f"data.path={store_path}", "train.batch_per_worker=16", "cache.ratio=0.2", "seed=3",
                              "scheduler.warmup_iterations=10", *overrides])


def _figures(config, store, mode):
    counted = simulate_mode(config, store, mode, ITERATIONS)
    run = loads(config, store, mode, iterations=ITERATIONS)
    assert run.schedule_ms > 0
    return counted, (run.load, run.iterations)


@pytest.mark.parametrize("mode", [Mode.vanilla, Mode.herald, Mode.het])
def test_one_worker_and_one_ps_move_every_row_the_simulator_counts(criteo_like, mode):
    config = _config(criteo_like, "cluster.workers=1", "cluster.ps=1", f"scheduler.mode={mode.value}")
    store = BatchStore(criteo_like)
    counted, (load, iterations) = _figures(config, store, mode)
    assert iterations == counted.iterations == ITERATIONS - 10
    by_kind = {k: v / iterations for k, v in counted.by_kind.items()}
    assert load.pull_rows + load.prefetch_rows == pytest.approx(by_kind["pull"])
    assert load.writeback_rows == pytest.approx(by_kind["writeback"])
    assert load.check_rows == pytest.approx(by_kind["version_check"])
    pushed = sum(by_kind[k] for k in ("accumulate", "full_set_push", "plan_push", "delta_push", "delta_writeback"))
    assert load.push_rows == pytest.approx(pushed)
    assert load.samples == 16
    # one worker, one PS rank: the PS's rows are the worker's
    assert (load.ps_pull_rows, load.ps_prefetch_rows, load.ps_push_rows) == pytest.approx(
        (load.pull_rows, load.prefetch_rows, load.push_rows))
    assert load.prefetch_rows > 0  # overlap is on: rows the last iteration did not write are read ahead


def test_without_overlap_nothing_is_read_ahead(criteo_like):
    config = _config(criteo_like, "cluster.workers=1", "cluster.ps=1", "scheduler.mode=herald", "train.overlap=false")
    counted, (load, iterations) = _figures(config, BatchStore(criteo_like), Mode.herald)
    assert load.prefetch_rows == 0 and load.ps_prefetch_rows == 0
    assert load.pull_rows == pytest.approx(counted.by_kind["pull"] / iterations)


def test_the_busiest_worker_and_ps_rank_bound_the_sums_over_all(criteo_like):
    config = _config(criteo_like, "cluster.workers=4", "cluster.ps=2", "scheduler.mode=herald")
    counted, (load, iterations) = _figures(config, BatchStore(criteo_like), Mode.herald)
    pulls = counted.by_kind["pull"] / iterations
    # the busiest of 4 workers moves at least a quarter, the busiest of 2 PS ranks at least half
    assert pulls / 4 <= load.pull_rows + load.prefetch_rows + 1e-9
    assert pulls / 2 <= load.ps_pull_rows + load.ps_prefetch_rows + 1e-9 <= pulls + 1e-9
    assert 2 <= load.pull_ops <= 2 * 2 * 2  # a pull and a prefetch (and write-backs) to each of 2 PS ranks
    assert load.samples >= 16


def test_a_row_on_the_wire_is_the_stored_row_and_its_id(criteo_like):
    assert row_bytes(_config(criteo_like, "model.embedding_dim=16")) == 16 * 4 + 8
    assert row_bytes(_config(criteo_like, "model.embedding_dim=16", "train.embedding_optimizer=rowwise_adagrad")) \
        == 17 * 4 + 8


def test_fae_s_switches_and_hot_sums_are_the_rows_the_simulator_counts(tmp_path):
    synthesize(tmp_path / "store", like="criteo-kaggle", rows=1000, scale=0.001, seed=4)  # most rows hot
    config = _config(tmp_path / "store", "cluster.workers=1", "cluster.ps=1", "scheduler.mode=fae",
                     "train.batch_per_worker=8", "cache.ratio=0.05", "scheduler.warmup_iterations=0",
                     "data.test_fraction=0.1", "fae.budget_mb=0.03", "fae.small_table_kb=0",
                     "fae.sample_fraction=0.5", "fae.heldout_samples=64")
    store = BatchStore(tmp_path / "store")
    counted, (load, iterations) = _figures(config, store, Mode.fae)
    by_kind = {k: v / iterations for k, v in counted.by_kind.items()}
    assert by_kind["hot_allreduce"] > 0 and by_kind["hot_pull"] > 0 and by_kind["hot_push"] > 0
    # the replica read into the worker is pulled in the pull stage, worker 0's write of it written back there
    assert load.pull_rows + load.prefetch_rows == pytest.approx(by_kind["pull"] + by_kind["hot_pull"])
    assert load.writeback_rows == pytest.approx(by_kind["writeback"] + by_kind["hot_push"])
    # a hot iteration sums the gradients of its rows' union: float32 rows of the model's dim
    assert load.hot_allreduce_bytes == pytest.approx(by_kind["hot_allreduce"] * config.model.embedding_dim * 4)
    assert 0 < load.hot_allreduces < 1
    # each new pair of strips (after the first) first measures the held-out loss on 64 samples
    pairs = load.eval_samples * iterations / 64
    assert pairs >= 1 and pairs == pytest.approx(round(pairs))

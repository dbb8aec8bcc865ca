"""The time model's loads against the simulator's counts of the same run: every row is in one stage."""
import pytest

from hybrid.config import Mode, load_config
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


def test_fae_is_refused_until_the_model_covers_it(criteo_like):
    config = _config(criteo_like, "scheduler.mode=fae")
    with pytest.raises(ValueError, match="FAE"):
        loads(config, BatchStore(criteo_like), Mode.fae, iterations=20)

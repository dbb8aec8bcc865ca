"""FAE across ranks: exact on its own order of batches, and measured rows equal the simulation.

FAE changes the order of training (hot and cold strips), so it cannot equal
BSP over the store's order; over the order it trained, replayed from the
held-out losses it measured, it must equal the single-process reference
(docs/design.md section 9). The store is small enough that 70 iterations run
a whole pass: cold, hot, cold, hot strips and the next pass's first cold one.
"""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from hybrid.config import Mode, load_config
from hybrid.data.store import BatchStore
from hybrid.runtime.comm import split_roles
from hybrid.scheduling.fae_order import replayed_batches
from hybrid.training.loop import HybridTrainer
from hybrid.training.reference import train_reference
from hybrid.training.simulator import simulate_mode
from shared_store import shared_store

ITERATIONS = 70


@pytest.fixture(scope="module")
def store_path():
    with shared_store(like="criteo-kaggle", rows=1000, scale=0.001, seed=4) as path:
        yield path


def _config(store_path, *overrides):
    world = MPI.COMM_WORLD
    return load_config(None, [f"data.path={store_path}", f"cluster.workers={world.size - 1}", "cluster.ps=1",
                              "train.batch_per_worker=8", "cache.ratio=0.05", "scheduler.mode=fae",
                              "model.precision=float64", "model.embedding_dim=4", "model.bottom_mlp=[8]",
                              "model.top_mlp=[8]", "train.embedding_lr=0.1", "train.dense_lr=0.05", "seed=5",
                              "fae.budget_mb=0.03", "fae.small_table_kb=0", "fae.sample_fraction=0.5",
                              "fae.heldout_samples=64", "scheduler.warmup_iterations=0", *overrides])


def _train(config, store):
    """Train on every rank; worker 0's log, held-out losses, final table and MLP (others: None)."""
    roles = split_roles(config.cluster.workers, config.cluster.ps)
    trainer = HybridTrainer(config, roles, store)
    log = trainer.train(ITERATIONS)
    trainer.flush()
    lead = roles.worker == 0
    result = (log, trainer.mode.replicas.losses, trainer.table.read_all(),
              [p.detach().cpu().numpy().copy() for p in trainer.model.parameters()],
              trainer.run.counted.summary(timings=False)) if lead else None
    moved = {k: sum(r["moved"][k] for r in log) for k in ("pull", "put", "accumulate")} if log else {}
    trainer.close()
    roles.free()
    return result, MPI.COMM_WORLD.allreduce(moved.get("pull", 0)), \
        MPI.COMM_WORLD.allreduce(moved.get("put", 0) + moved.get("accumulate", 0))


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("device,allreduce", [
    ("cpu", "auto"), ("cpu", "mpi"),
    pytest.param("cuda", "auto", marks=[pytest.mark.cuda, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="GPU workers need a CUDA device (none here)")])])
def test_fae_equals_the_reference_on_its_own_order_and_the_simulation_counts_it(store_path, device, allreduce):
    """With train.allreduce=mpi the hot rows' gradients are summed without Horovod (comm.MpiCollectives)."""
    config = _config(store_path, f"train.device={device}", f"train.allreduce={allreduce}")
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    result, pulls, pushes = _train(config, store)
    if MPI.COMM_WORLD.rank != 0:
        return
    log, losses, table, params, figures = result
    kinds = [r["counts"]["hot_allreduce"] > 0 for r in log]
    assert 0 < sum(kinds) < len(kinds), "the run must train hot and cold strips"
    assert sum(r["counts"]["hot_push"] > 0 for r in log) >= 2 and len(losses) >= 2, "strips must switch"
    assert all(r["moved"]["allreduced"] == r["counts"]["hot_allreduce"] for r in log)

    from hybrid.scheduling.fae_plans import calibration_for
    calibration = calibration_for(config, store, say=lambda *_: None)
    batches = replayed_batches(store, calibration.hot_inputs, config.global_batch, shuffle=config.data.shuffle,
                               seed=config.data.shuffle_seed, losses=losses)
    expected_table, expected_model = train_reference(config, store, ITERATIONS, batches=batches)
    assert np.abs(table - expected_table).max() < 1e-9
    for got, want in zip(params, expected_model.parameters()):
        assert np.abs(got - want.detach().numpy()).max() < 1e-9

    simulated = simulate_mode(config, store, Mode.fae, iterations=ITERATIONS, fae_losses=losses)
    assert (pulls, pushes) == (simulated.pulls, simulated.pushes)
    assert simulated.allreduced == sum(r["counts"]["hot_allreduce"] for r in log) > 0
    assert simulated.by_kind["hot_pull"] > 0 and simulated.by_kind["hot_push"] > 0
    assert figures == simulated.summary(timings=False)  # what the training summary reports


@pytest.mark.shape
@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
def test_every_worker_lays_out_the_same_strips_and_plans(store_path):
    config = _config(store_path, "cluster.transport=packed")
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    roles = split_roles(config.cluster.workers, config.cluster.ps)
    trainer = HybridTrainer(config, roles, store)
    log = trainer.train(ITERATIONS)
    losses = trainer.mode.replicas.losses if trainer.mode is not None else None
    trainer.close()
    everyone = MPI.COMM_WORLD.allgather(None if roles.is_ps else ([r["digest"] for r in log], losses))
    roles.free()
    workers = [x for x in everyone if x is not None]
    assert len(workers) == config.cluster.workers and all(x == workers[0] for x in workers)

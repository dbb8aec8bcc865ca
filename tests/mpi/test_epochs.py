"""Several epochs across ranks (docs/training.md, "Epochs"): exact, resumable, counted as simulated.

A 3-epoch float64 run with ``data.shuffle`` (a fresh permutation each
epoch) and a cosine learning-rate schedule after a warm-up equals the
single-process reference over the same 3 epochs within 1e-9, in every BSP
mode and in FAE (on the order it trained); its rows moved equal what
``hybrid simulate`` counts over the run; stopped in the middle of epoch 2
and resumed, it ends with the uninterrupted model, bit for bit.
"""
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from hybrid.config import Mode, load_config
from hybrid.data.store import BatchStore
from hybrid.exported import evaluate, load
from hybrid.runtime import checkpoint as ckpt
from hybrid.runtime.comm import split_roles
from hybrid.scheduling.fae_order import replayed_batches
from hybrid.training import job as train_job
from hybrid.training.export import export_checkpoint
from hybrid.training.loop import HybridTrainer
from hybrid.training.reference import train_reference
from hybrid.training.simulator import simulate_mode
from shared_store import shared_store

EPOCHS = 3
FAE = ("scheduler.mode=fae", "fae.budget_mb=0.03", "fae.small_table_kb=0", "fae.sample_fraction=0.5",
       "fae.heldout_samples=64")


@pytest.fixture(scope="module")
def store_path():
    with shared_store(like="criteo-kaggle", rows=700, scale=0.001, seed=6) as path:
        yield path


def _config(store_path, *overrides):
    world = MPI.COMM_WORLD
    return load_config(None, [f"data.path={store_path}", f"cluster.workers={world.size - 1}", "cluster.ps=1",
                              "train.batch_per_worker=8", "cache.ratio=0.02", "model.precision=float64",
                              "model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
                              "train.embedding_lr=0.1", "train.dense_lr=0.05", "seed=7", "data.shuffle=true",
                              f"train.epochs={EPOCHS}", "train.lr_schedule=cosine", "train.lr_warmup=5",
                              "train.lr_min_ratio=0.1", "scheduler.warmup_iterations=0", *overrides])


def _train(config, store, resume=None):
    """Train the whole run on every rank (from ``resume``); worker 0: (log, table, MLP, FAE's losses); the rows
    all workers moved by kind."""
    roles = split_roles(config.cluster.workers, config.cluster.ps)
    trainer = HybridTrainer(config, roles, store, resume=resume)
    iterations = config.run_length(store.num_batches(config.global_batch))
    log = trainer.train(iterations)
    trainer.flush()
    result = None
    if roles.worker == 0:
        losses = trainer.mode.replicas.losses if config.scheduler.mode is Mode.fae else None
        result = (log, trainer.table.read_all(), [p.detach().numpy().copy() for p in trainer.model.parameters()],
                  losses)
    moved = {k: sum(r["moved"].get(k, 0) for r in log) for k in ("pull", "put", "accumulate", "p2p", "version_read")}
    trainer.close()
    roles.free()
    return result, {k: MPI.COMM_WORLD.allreduce(moved[k]) for k in moved}


@pytest.mark.shape
@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("overrides", [
    ("scheduler.mode=vanilla",), ("scheduler.mode=herald",), ("scheduler.mode=herald", "scheduler.sync=p2p"),
    ("scheduler.mode=het", "scheduler.staleness=0"), FAE], ids=["vanilla", "herald-ps", "herald-p2p", "het-s0", "fae"])
def test_three_shuffled_epochs_with_a_schedule_equal_the_reference_and_the_simulation(store_path, overrides):
    config = _config(store_path, *overrides)
    store = BatchStore.of(config.data, "train")
    per_epoch = store.num_batches(config.global_batch)
    result, moved = _train(config, store)
    if MPI.COMM_WORLD.rank != 0:
        return
    log, table, params, losses = result
    assert [r["step"] for r in log] == list(range(EPOCHS * per_epoch))
    samples = [np.sort(b.sample_ids) for b in store.batches(config.global_batch, shuffle=True, seed=0,
                                                            stop_batch=EPOCHS * per_epoch)]
    assert not np.array_equal(samples[0], samples[per_epoch]), "each epoch must draw its own order"
    mode = config.scheduler.mode
    batches = None
    if mode is Mode.fae:
        from hybrid.scheduling.fae_plans import calibration_for
        assert sum(r["counts"]["hot_allreduce"] > 0 for r in log) > 0, "FAE must train hot strips"
        hot = calibration_for(config, store, say=lambda *_: None).hot_inputs
        batches = replayed_batches(store, hot, config.global_batch, shuffle=True, seed=0, losses=losses)
    expected_table, expected_model = train_reference(config, store, len(log), batches=batches)
    assert np.abs(table - expected_table).max() < 1e-9
    for got, want in zip(params, expected_model.parameters()):
        assert np.abs(got - want.detach().numpy()).max() < 1e-9

    simulated = simulate_mode(config, store, mode, fae_losses=losses)  # the run's length by default
    assert simulated.iterations == len(log)
    assert (moved["pull"], moved["put"] + moved["accumulate"], moved["p2p"], moved["version_read"]) == \
        (simulated.pulls, simulated.pushes, simulated.p2p, simulated.version_checks)


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", ["ps", "p2p"])
def test_stopped_in_the_middle_of_epoch_two_and_resumed_it_ends_with_the_uninterrupted_model(
        store_path, tmp_path_factory, sync):
    world = MPI.COMM_WORLD
    root = Path(world.bcast(str(tmp_path_factory.mktemp("epochs")) if world.rank == 0 else None))
    probe = _config(store_path)
    per_epoch = BatchStore.of(probe.data, "train").num_batches(probe.global_batch)
    every = per_epoch + per_epoch // 2  # the first checkpoint falls in the middle of epoch 2
    config = _config(store_path, "scheduler.mode=herald", f"scheduler.sync={sync}", f"train.checkpoint_every={every}",
                     "train.checkpoint_keep=5", f"train.checkpoint_dir={root}", "train.deterministic=true")
    store = BatchStore.of(config.data, "train")
    whole, _ = _train(config, store)
    middle = [c for c in ckpt.CheckpointDir(root).complete() if c.step == every - 1]
    assert len(middle) == 1 and per_epoch <= middle[0].step < 2 * per_epoch - 1
    resumed, _ = _train(config, store, resume=middle[0])
    if world.rank == 0:
        (log, table, params, _), (resumed_log, resumed_table, resumed_params, _) = whole, resumed
        assert resumed_log[0]["step"] == every and resumed_log[-1]["step"] == log[-1]["step"]
        assert [r["digest"] for r in resumed_log] == [r["digest"] for r in log[every:]]
        np.testing.assert_array_equal(resumed_table, table)
        for got, want in zip(resumed_params, params):
            np.testing.assert_array_equal(got, want)


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
def test_the_run_tests_the_model_of_its_best_validation_auc_as_its_checkpoint_scores(store_path, tmp_path_factory):
    """Validation after every epoch; the test split on the best of them, which is put back in place of the last
    model: its test AUC is the one the checkpoint written at that epoch scores on its own."""
    world = MPI.COMM_WORLD
    out = Path(world.bcast(str(tmp_path_factory.mktemp("best")) if world.rank == 0 else None))
    fractions = ("data.validation_fraction=0.2", "data.test_fraction=0.2")
    probe = _config(store_path, *fractions)
    per_epoch = BatchStore.of(probe.data, "train").num_batches(probe.global_batch)
    # rates at which this store's validation AUC peaks in epoch 2 or 3 and then falls, on 2-4 workers
    config = _config(store_path, *fractions, "scheduler.mode=herald", "train.epochs=10", "train.lr_schedule=constant",
                     "train.lr_warmup=0", "train.embedding_lr=2", "train.dense_lr=0.5",
                     f"train.checkpoint_every={per_epoch}", "train.checkpoint_keep=10",
                     f"train.checkpoint_dir={out / 'checkpoints'}")
    summary = train_job.run(config, progress=False)
    if world.rank != 0:
        return
    last = 10 * per_epoch - 1
    validations = [e for e in summary["curves"]["evaluations"] if e["split"] == "validation"]
    assert [(e["step"], e["epoch"]) for e in validations] == [((k + 1) * per_epoch - 1, k + 1) for k in range(10)]
    best = max(validations, key=lambda e: e["auc"])
    assert summary["best"] == {"step": best["step"], "epoch": best["epoch"], "auc": best["auc"]}
    assert best["step"] != last, "the best model must be an earlier one for this test to mean anything"
    test = BatchStore.of(config.data, "test")
    for step, reported in ((best["step"], summary["evaluation"]), (last, summary["evaluation_last"])):
        model = out / f"model-{step}.pt"
        export_checkpoint(out / "checkpoints" / f"step-{step:09d}", model, progress=False, say=lambda _: None)
        scored = evaluate(load(model), test)
        assert abs(scored["auc"] - reported["auc"]) < 1e-6 and scored["samples"] == reported["samples"]
    assert [e["split"] for e in summary["curves"]["evaluations"]][-1] == "test"
    assert summary["curves"]["train_loss"][-1]["step"] == last and summary["epochs"] == 10

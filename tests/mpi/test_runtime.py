"""The training runtime across ranks: identical plans, counts equal to the simulator, start-up checks."""
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hybrid import modes
from hybrid._ext import mpi_yield
from hybrid.bench import case_overrides
from hybrid.config import Mode, load_config
from hybrid.data.store import BatchStore, StoreError, _fingerprint
from hybrid.runtime.comm import AgreementError, split_roles
from hybrid.scheduling.policy import Sync
from hybrid.training import job as train_job
from hybrid.training.loop import HybridTrainer
from hybrid.training.simulator import simulate_mode
from hybrid.training.summary_text import format_breakdown, format_summary
from mode_cases import mode_cases
from shared_store import shared_store

pytestmark = pytest.mark.family  # MPI semantics themselves: launch/test.sh runs these under MPICH too


@pytest.fixture(scope="module")
def store_path():
    with shared_store(like="criteo-kaggle", rows=6000, scale=0.001, seed=2) as path:
        yield path


def _config(store_path, *overrides):
    world = MPI.COMM_WORLD
    return load_config(None, [f"data.path={store_path}", f"cluster.workers={world.size - 1}", "cluster.ps=1",
                              "train.batch_per_worker=16", "cache.ratio=0.05", "model.embedding_dim=4",
                              "model.top_mlp=[8]", "scheduler.warmup_iterations=0", *overrides])


def _train_and_total(config, store, kinds: tuple, iterations: int = 40):
    """Train on every rank; (the per-iteration digests of every worker, the rows of ``kinds`` all workers moved)."""
    world = MPI.COMM_WORLD
    roles = split_roles(config.cluster.workers, config.cluster.ps)
    trainer = HybridTrainer(config, roles, store)
    log = trainer.train(iterations)
    moved = np.array([sum(r["moved"][k] for r in log) for k in kinds])
    trainer.close()
    everyone = world.allgather(None if roles.is_ps else [r["digest"] for r in log])
    totals = world.allreduce(np.zeros(len(kinds), np.int64) if roles.is_ps else moved)
    roles.free()
    return [d for d in everyone if d is not None], totals


@pytest.mark.shape
@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", mode_cases() + ["het+scheduler.staleness=3+cache.ratio=0.015"])
@pytest.mark.parametrize("transport,device", [
    ("rma", "cpu"), ("packed", "cpu"),
    pytest.param("rma", "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="GPU workers need a CUDA device (none here)")])])
def test_plans_agree_and_measured_rows_equal_the_simulation(store_path, case, transport, device):
    """Every registered mode the simulator repeats and its variants (tests/mpi/mode_cases.py), and HET keeping
    updates in its caches (staleness 3)."""
    config = _config(store_path, *case_overrides(case), f"cluster.transport={transport}", f"train.device={device}")
    mode, sync, staleness = config.scheduler.mode, config.scheduler.sync.value, config.scheduler.staleness
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    workers, totals = _train_and_total(config, store, ("pull", "put", "accumulate", "p2p", "version_read"))
    assert len(workers) == config.cluster.workers and all(d == workers[0] for d in workers)
    simulated = simulate_mode(config, store, Mode(mode), iterations=40)
    assert simulated.iterations == 40
    assert totals[0] == simulated.pulls
    assert totals[1] + totals[2] == simulated.pushes
    assert totals[3] == simulated.p2p
    assert totals[4] == simulated.version_checks
    if sync == "p2p" and config.cluster.workers > 1:
        assert simulated.p2p > 0, "no row went worker to worker: the test would mean nothing"
    if modes.get(mode).schedule.sync is Sync.het_clocks:
        assert simulated.version_checks > 0
        if staleness:
            assert simulated.by_kind["delta_writeback"] > 0 and simulated.by_kind["local"] > 0, \
                "no update was kept in a cache: the staleness would mean nothing"


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["vanilla", "herald"])
def test_rowwise_adagrad_moves_sgds_rows_and_allreduces_the_shared_rows_the_simulation_counts(store_path, mode):
    config = _config(store_path, f"scheduler.mode={mode}", "train.embedding_optimizer=rowwise_adagrad")
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    _, totals = _train_and_total(config, store, ("pull", "put", "accumulate", "allreduced"))
    simulated = simulate_mode(config, store, Mode(mode), iterations=40)
    sgd = simulate_mode(_config(store_path, f"scheduler.mode={mode}"), store, Mode(mode), iterations=40)
    assert (totals[0], totals[1] + totals[2]) == (simulated.pulls, simulated.pushes) == (sgd.pulls, sgd.pushes)
    # every worker takes part in the same allreduce of the iteration's shared rows
    assert totals[3] == config.cluster.workers * simulated.allreduced
    if config.cluster.workers > 1:
        assert simulated.by_kind["shared_allreduce"] == simulated.allreduced > 0
    assert config.row_bytes == 5 * 4, "each row carries its accumulator: dim 4 + 1 values of float32"


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(120)
def test_a_config_mismatch_stops_every_rank_with_one_message(store_path):
    world = MPI.COMM_WORLD
    config = _config(store_path, f"seed={1 if world.rank == 0 else 2}")
    with pytest.raises(AgreementError, match="ranks disagree on config") as info:
        train_job.run(config, progress=False)
    assert ", differing in seed (1 vs 2);" in str(info.value)  # which key, not only two digests
    assert len(set(world.allgather(str(info.value)))) == 1


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", mode_cases() + ["het+scheduler.staleness=100+cache.ratio=0.015"])
def test_the_training_summary_reports_the_simulators_figures(store_path, case):
    """One definition per figure (hybrid/training/figures.py): hit rate, transmissions by kind, the busiest
    worker's rows, version checks, after the warm-up as simulate counts them, for every registered mode the
    simulator repeats (FAE: tests/mpi/test_fae.py)."""
    overrides = case_overrides(case)
    config = _config(store_path, *overrides, "scheduler.warmup_iterations=5", "train.iterations=30")
    mode = config.scheduler.mode
    summary = train_job.run(config, progress=False)
    if MPI.COMM_WORLD.rank != 0:
        return
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    simulated = simulate_mode(config, store, Mode(mode), iterations=30)
    assert summary["counted"] == {"after_warmup": 5, **simulated.summary(timings=False)}
    assert summary["hit_rate"] == round(simulated.hit_rate, 6) and summary["counted"]["iterations"] == 25
    assert summary["all_iterations"]["iterations"] == 30
    measured = summary["transmissions"]  # over all 30 iterations, at the RMA store
    assert (measured["pull_rows"], measured["push_rows"], measured["p2p_rows"]) == tuple(
        summary["all_iterations"][k] for k in ("pulls", "pushes", "p2p"))
    if "scheduler.sync=p2p" in overrides:
        assert simulated.p2p > 0 and simulated.hit_rate < 1 - simulated.pulls / simulated.needed, \
            "a row from a peer is a miss"
    assert (f"over all 30 iterations; after the 5 warm-up iterations, as hybrid simulate counts: "
            f"{simulated.transmissions} rows, hit rate {simulated.hit_rate:.1%}") in format_summary(summary)


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
def test_the_clock_starts_when_every_worker_is_ready(store_path, tmp_path_factory, monkeypatch):
    """Ranks finish starting at different times (srun starts them apart, imports contend for cores); that
    skew is not training. The last worker starts 1.5 s late: worker 0 waits for it before its clock starts
    (``start_wait_s``), not inside its first allreduce, where it would lower the throughput."""
    world = MPI.COMM_WORLD
    out = Path(world.bcast(str(tmp_path_factory.mktemp("late")) if world.rank == 0 else None))
    delay, late_worker = 1.5, world.size - 2  # the last rank is the PS
    if world.rank == late_worker:
        starts = HybridTrainer.__init__

        def late_start(self, *args, **kwargs):
            starts(self, *args, **kwargs)
            time.sleep(delay)
        monkeypatch.setattr(HybridTrainer, "__init__", late_start)
    summary = train_job.run(_config(store_path, "train.iterations=10"), progress=False,
                            log_path=str(out / "log.jsonl"))
    if world.rank == 0:
        first = json.loads((out / "log.jsonl").read_text().splitlines()[0])
        assert first["timing"]["allreduce"] < delay / 2
        waits = {r["rank"]: r["start_wait_s"] for r in summary["ranks"]}
        assert waits[0] >= delay * 0.9 and waits[late_worker] < delay / 2 and waits[world.size - 1] == 0.0


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
def test_training_reports_throughput_transmissions_and_auc(store_path, tmp_path_factory):
    world = MPI.COMM_WORLD
    out = Path(world.bcast(str(tmp_path_factory.mktemp("summary")) if world.rank == 0 else None))
    summary = train_job.run(_config(store_path, "train.iterations=30"), progress=False,
                            log_path=str(out / "log.jsonl"), summary_path=str(out / "summary.json"))
    yielding = all(world.allgather(mpi_yield.active()))  # MPICH's waits yield (tests/conftest.py prepared them)
    roles = split_roles(world.size - 1, 1)
    shared = all(world.allgather(roles.oversubscribed))  # as the run's own roles counted this host
    roles.free()
    if world.rank == 0:
        assert summary["iterations"] == 30 and summary["throughput"] > 0
        assert summary["transmissions"]["rows"] == summary["transmissions"]["pull_rows"] + \
            summary["transmissions"]["push_rows"] > 0
        assert 0.0 <= summary["evaluation"]["auc"] <= 1.0 and summary["evaluation"]["samples"] == 600
        assert 0.0 < summary["train_loss"] < 2.0
        assert len((out / "log.jsonl").read_text().splitlines()) == 30
        assert (out / "summary.json").is_file()
        stages = summary["iteration_ms"]
        assert set(stages) >= {"schedule_wait", "pull", "compute", "allreduce", "push", "barrier", "other"}
        # the stages and "other" add up to worker 0's iteration (seconds are rounded to the millisecond)
        per_iteration = 1000 * (summary["seconds"] - summary["paused_seconds"]) / summary["iterations"]
        assert sum(stages.values()) == pytest.approx(per_iteration, abs=0.1)
        if torch.cuda.is_available():  # launch/rank_env.sh: one GPU per worker where there are enough
            assert summary["compute"]["device"].startswith("cuda:")
        else:
            allreduce = "Horovod mpi: CPU workers"
            if shared:  # hybrid.runtime.comm.worker_collectives: Horovod's cycle is not worth its cost there
                allreduce = ("MPI reduce-scatter and allgather of one host buffer on the workers' communicator: "
                             "CPU workers whose ranks share cores (Horovod's coordination cycle would take a core's "
                             "share from training)")
            elif yielding:
                allreduce = ("MPI reduce-scatter and allgather of one host buffer on the workers' communicator: "
                             "MPICH ranks share cores (Horovod's cycle would pace every iteration)")
            assert summary["compute"] == {"device": "cpu", "allreduce": allreduce}
        assert "workers on " in format_breakdown(summary)
        # MPI started with pytest, before hybrid train could decide: the summary says so, and counts the host
        launch = summary["launch"]
        assert launch["decided_by"].startswith("nobody: MPI had started before hybrid train could decide")
        assert launch["measured"]["ranks_on_host"] == world.size and launch["mpi"]
        assert "MPI had started before" in format_breakdown(summary)
    else:
        assert summary is None


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
def test_periodic_evaluation_is_logged_with_its_iteration_and_changes_nothing(store_path, tmp_path_factory):
    """eval_every=10 over 30 iterations: evaluations after 9 and 19, and the same schedule and loss as without."""
    world = MPI.COMM_WORLD
    out = Path(world.bcast(str(tmp_path_factory.mktemp("eval")) if world.rank == 0 else None))
    runs = {}
    for every in (0, 10):
        summary = train_job.run(_config(store_path, "train.iterations=30", f"train.eval_every={every}",
                                        "model.precision=float64"),
                                progress=False, log_path=str(out / f"log-{every}.jsonl"))
        runs[every] = summary
    if world.rank != 0:
        return
    logs = {every: [json.loads(line) for line in (out / f"log-{every}.jsonl").read_text().splitlines()]
            for every in runs}
    assert [r["digest"] for r in logs[10]] == [r["digest"] for r in logs[0]]
    assert [r["step"] for r in logs[10] if "evaluation" in r] == [9, 19]
    assert [e["step"] for e in runs[10]["evaluations"]] == [9, 19]
    assert all(0.0 <= e["auc"] <= 1.0 and e["samples"] == 600 for e in runs[10]["evaluations"])
    assert runs[10]["evaluations"][0]["auc"] != runs[10]["evaluation"]["auc"]  # an earlier model
    assert runs[10]["train_loss"] == pytest.approx(runs[0]["train_loss"], abs=1e-12)
    assert runs[10]["evaluation"]["auc"] == pytest.approx(runs[0]["evaluation"]["auc"], abs=1e-9)
    assert runs[10]["checkpoint_rows"]["flushed"] > 0 and runs[0]["checkpoint_rows"]["flushed"] == 0


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["vanilla", "herald"])
def test_the_cache_verification_passes_and_catches_a_corrupted_row(store_path, mode):
    world = MPI.COMM_WORLD
    config = _config(store_path, f"scheduler.mode={mode}", "train.verify_cache=true")
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    roles = split_roles(config.cluster.workers, config.cluster.ps)
    trainer = HybridTrainer(config, roles, store)
    trainer.train(15)  # verifies after every iteration
    trainer.flush()  # now the PS holds every row worker 0 holds fresh: all checkable
    error = None
    if roles.worker == 0:
        holders = trainer.scheduler.state.holder_sets()
        cached = trainer.scheduler.state.cache_rows(0)
        slots = [s for s, r in enumerate(cached) if r >= 0 and holders[r, 1] and holders[r, 0]]
        if slots:  # (asserted below, after the collective close, so a failure cannot hang the others)
            trainer.cache[slots[0]] += 1.0
            try:
                trainer.verify_cache({"cache_rows": cached, "fresh": holders[:, 1], "at_ps": holders[:, 0]})
            except RuntimeError as err:
                error = str(err)
    trainer.close()
    roles.free()
    if world.rank == 0:
        assert error is not None and "differ from the PS" in error


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["ids", "meta", "truncated"])
def test_a_damaged_store_is_refused_at_load_on_every_rank_naming_the_file(store_path, tmp_path_factory, damage):
    """Ids past their table (meta.json rewritten consistently), an edited meta.json, a truncated array."""
    world = MPI.COMM_WORLD
    copy = Path(world.bcast(str(tmp_path_factory.mktemp("damaged")) if world.rank == 0 else None)) / "store"
    if world.rank == 0:
        shutil.copytree(store_path, copy)
        meta = json.loads((copy / "meta.json").read_text())
        if damage == "truncated":
            sparse = copy / "sparse.npy"
            sparse.write_bytes(sparse.read_bytes()[:-100])
        else:
            meta["cardinalities"][-1] = 1  # the last table's ids are larger
            if damage == "ids":
                meta["fingerprint"] = _fingerprint(meta)
            (copy / "meta.json").write_text(json.dumps(meta))
    world.Barrier()
    expected = {"ids": "sparse.npy: sample", "meta": "meta.json was changed", "truncated": "sparse.npy: cannot be read"}
    with pytest.raises(StoreError) as info:
        train_job.run(_config(copy, "train.iterations=5"), progress=False)
    assert expected[damage] in str(info.value)
    assert len(set(world.allgather(str(info.value)))) == 1  # every rank refused it, the same way


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(120)
def test_a_train_split_smaller_than_one_global_batch_is_an_error(store_path):
    world = MPI.COMM_WORLD
    with pytest.raises(ValueError, match="fewer than one global batch") as info:
        train_job.run(_config(store_path, "train.batch_per_worker=100000"), progress=False)
    assert len(set(world.allgather(str(info.value)))) == 1


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
def test_adaptive_laia_under_a_budget_scores_the_tables_every_worker_agreed_on(store_path, monkeypatch):
    """Each rank measures another cost of scoring; the slowest decides, so the plans stay equal."""
    from hybrid.scheduling.allocation import AdaptiveLaiaAllocation

    world = MPI.COMM_WORLD
    monkeypatch.setattr(AdaptiveLaiaAllocation, "measure_cost_ms", lambda self, rows, repeats=5: 0.1 * (world.rank + 1))
    config = _config(store_path, "scheduler.mode=herald", "scheduler.laia=adaptive", "scheduler.budget_ms=0.55")
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    roles = split_roles(config.cluster.workers, config.cluster.ps)
    trainer = HybridTrainer(config, roles, store)
    scored = trainer.scored_tables
    log = trainer.train(30)
    trainer.close()
    everyone = world.allgather(None if roles.is_ps else (scored, [r["digest"] for r in log]))
    roles.free()
    workers = [x for x in everyone if x is not None]
    slowest = 0.1 * config.cluster.workers  # workers are the first ranks
    assert all(x == workers[0] for x in workers)
    assert workers[0][0] == int(0.55 // slowest) < 26


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["rma", "packed"])
def test_het_copies_that_have_seen_every_update_equal_the_ps(store_path, transport):
    """With staleness, a refetched row keeps its own unpushed updates: after the final push, every cached copy
    whose clock has seen all of the PS's updates must hold the PS's value (to float64 rounding: the cache adds
    the updates one by one, the PS their sum)."""
    config = _config(store_path, "scheduler.mode=het", "scheduler.staleness=3", "cache.ratio=0.015",
                     "model.precision=float64", f"cluster.transport={transport}")
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    roles = split_roles(config.cluster.workers, config.cluster.ps)
    trainer = HybridTrainer(config, roles, store)
    log = trainer.train(40)
    trainer.flush()
    checked, differing, version_checks = 0, 0, 0
    if not roles.is_ps:
        rows, slots = trainer.scheduler.state.seen_everything(roles.worker)
        at_ps = np.empty((len(rows), config.model.embedding_dim))
        trainer.table.pull(rows, at_ps).wait()
        checked = len(rows)
        differing = int((np.abs(at_ps - trainer.cache[slots]) > 1e-9).any(axis=1).sum())
        version_checks = sum(r["counts"]["version_check"] for r in log)
    trainer.close()
    totals = MPI.COMM_WORLD.allreduce(np.array([checked, differing, version_checks]))
    roles.free()
    assert totals[0] > 100 and totals[2] > 0, totals
    assert totals[1] == 0, f"{totals[1]} of {totals[0]} cached copies differ from the PS"

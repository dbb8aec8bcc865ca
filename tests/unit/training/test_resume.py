"""Checkpoints and resume through real ``hybrid train`` jobs (docs/design.md section 9).

A run killed (kill -9 of a worker or of the PS rank) or stopped by a signal,
then resumed from its newest checkpoint, ends with the model of the run that
was never interrupted, and its scheduler makes the same allocations and
events from the step it resumed at. The float64 tables and MLP are compared
bit for bit: the runs set ``train.deterministic``, which adds each shared
row's gradients in worker order and allreduces the MLP gradients as one
group (without it, two uninterrupted runs already differ by about 1e-16).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import mpi_jobs

pytestmark = pytest.mark.job  # real mpirun jobs: launch/test.sh --quick leaves them out

ITERATIONS = 200
# 2 workers + 1 PS: a worker, another worker and the PS are what a signal or a kill can reach; a fourth
# rank would add seconds of start-up to each of the 14 jobs here
RANKS, WORKERS = 3, 2
PS_RANK = WORKERS
MPIRUN = mpi_jobs.launcher(RANKS)


def _train_args(store: Path, checkpoints: Path, log: Path, *extra: str) -> list:
    return [sys.executable, "-m", "hybrid", "train", "configs/w1-smoke.yaml", f"data.path={store}",
            f"cluster.workers={WORKERS}", "cluster.ps=1", "train.batch_per_worker=16", f"train.iterations={ITERATIONS}",
            "model.precision=float64",
            "train.checkpoint_every=40", "train.checkpoint_keep=3", f"train.checkpoint_dir={checkpoints}",
            "train.deterministic=true", "--no-progress", "--log-jsonl", str(log), *extra]


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(MPIRUN + list(args), cwd=mpi_jobs.ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))


def _iterations_logged(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.is_file() else 0


def _digests(log: Path) -> dict:
    return {r["step"]: r["digest"] for r in map(json.loads, log.read_text().splitlines())}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: its store, checkpoints (steps 119, 159, 199) and per-step digests."""
    from hybrid.data.synthetic import synthesize

    root = tmp_path_factory.mktemp("resume")
    synthesize(root / "store", like="criteo-kaggle", rows=20000, scale=0.001, seed=1)
    result = _run(*_train_args(root / "store", root / "checkpoints", root / "log.jsonl"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == \
        ["step-000000119", "step-000000159", "step-000000199"]
    return root


def _assert_same_model(final: Path, reference: Path) -> None:
    """Final tables and MLP of two runs, bit for bit."""
    np.testing.assert_array_equal(np.load(final / "ps-0.npy"), np.load(reference / "ps-0.npy"))
    mine = torch.load(final / "dense.pt", weights_only=True)
    theirs = torch.load(reference / "dense.pt", weights_only=True)
    for name, tensor in theirs["model"].items():
        np.testing.assert_array_equal(mine["model"][name].numpy(), tensor.numpy(), err_msg=name)


def _resume_and_compare(reference: Path, checkpoints: Path, tmp_path: Path, *extra: str) -> str:
    log = tmp_path / "resumed.jsonl"
    result = _run(*_train_args(reference / "store", checkpoints, log, "--resume", *extra))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    _assert_same_model(checkpoints / "step-000000199", reference / "checkpoints" / "step-000000199")
    resumed, uninterrupted = _digests(log), _digests(reference / "log.jsonl")
    assert resumed and max(resumed) == ITERATIONS - 1
    assert resumed == {step: uninterrupted[step] for step in resumed}, "the resumed schedule differs"
    return output


# Also the end of the killed job (within 30 s, the rank named by the MPI's launcher), which
# test_mpi_failfast.py checks under MPICH: this test runs under Open MPI only (any_mpi_family)
@pytest.mark.any_mpi_family
@pytest.mark.parametrize("victim", [1, PS_RANK], ids=["worker", "ps"])
def test_a_run_killed_mid_run_resumes_to_the_uninterrupted_model(reference, tmp_path, victim):
    checkpoints = tmp_path / "checkpoints"
    mpi_jobs.kill_rank_mid_run(
        MPIRUN + _train_args(reference / "store", checkpoints, tmp_path / "killed.jsonl"),
        lambda: (checkpoints / "step-000000039" / "meta.json").is_file(), "the first checkpoint", victim)
    assert not (checkpoints / "step-000000199").exists(), "the run finished before the kill"
    holder = json.loads((checkpoints / "owner.json").read_text())  # the killed run never released the directory
    if victim == 1:  # a new run would replace the killed run's checkpoints: refused (hybrid.runtime.run_lease)
        result = _run(*_train_args(reference / "store", checkpoints, tmp_path / "new.jsonl"))
        assert result.returncode != 0 and f"holds the checkpoints of run {holder['run']} (w1-smoke" in result.stderr \
            and "--resume continues that run" in result.stderr, result.stdout + result.stderr
    output = _resume_and_compare(reference, checkpoints, tmp_path)
    assert f"took over {checkpoints} from run {holder['run']} (w1-smoke" in output, output
    # the resumed run is the killed one: its checkpoints keep that run's id
    assert json.loads((checkpoints / "step-000000199" / "meta.json").read_text())["run"] == holder["run"]
    assert "resuming from" in output and "step-000000199" not in output.split("resuming from")[1].split("\n")[0]


def test_sigterm_to_the_launcher_checkpoints_exits_0_and_the_run_resumes(reference, tmp_path):
    """SLURM's SIGTERM before a time limit: every rank saves and leaves with 0; --resume finishes the run."""
    checkpoints, log = tmp_path / "checkpoints", tmp_path / "stopped.jsonl"
    launcher = ["bash", str(mpi_jobs.ROOT / "launch" / "mpirun.sh"), "-n", str(RANKS)]
    status, output = mpi_jobs.act_mid_run(
        launcher + _train_args(reference / "store", checkpoints, log, "train.checkpoint_every=0"),
        lambda: _iterations_logged(log) >= 50, "50 iterations", lambda process: process.send_signal(signal.SIGTERM))
    assert status == 0, output
    stopped = max(_digests(log))
    assert stopped < ITERATIONS - 1
    # mpirun forwards the signal to every rank; the summary names one that had handled it when the workers agreed
    stop_line = rf"stopped by SIGUSR1 on rank [0-{PS_RANK}] after iteration {stopped}; continue with --resume"
    assert re.search(stop_line, output), output
    assert [p.name for p in checkpoints.iterdir()] == [f"step-{stopped:09d}"]  # and no owner.json: released
    # the resumed run may change what does not alter the result: here, only a final checkpoint
    _resume_and_compare(reference, checkpoints, tmp_path, f"train.checkpoint_every={ITERATIONS}")


@pytest.mark.any_mpi_family
def test_a_second_run_given_the_directory_in_use_is_refused_and_the_first_one_is_left_whole(reference, tmp_path):
    """Another seed, the same train.checkpoint_dir: refused at start-up naming the holder; the first ends as alone."""
    checkpoints, log = tmp_path / "checkpoints", tmp_path / "first.jsonl"
    first = mpi_jobs.start(MPIRUN + _train_args(reference / "store", checkpoints, log))
    try:
        mpi_jobs.wait_for(first, lambda: _iterations_logged(log) >= 1, "the first run's first iteration")
        holder = json.loads((checkpoints / "owner.json").read_text())
        # held still while the second starts: the first would otherwise finish its 200 iterations first
        ranks = mpi_jobs.rank_pids(first.pid).values()
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        try:
            second = _run(*_train_args(reference / "store", checkpoints, tmp_path / "second.jsonl", "seed=7"))
        finally:
            for pid in ranks:
                os.kill(pid, signal.SIGCONT)
        assert second.returncode != 0 and time.monotonic() - start < 30, second.stdout + second.stderr
        assert f"train.checkpoint_dir={checkpoints} is in use by run {holder['run']} (w1-smoke, started " \
               f"{holder['started']}) on host {holder['host']}, process {holder['pid']}; wait for it to end, or " \
               f"choose another train.checkpoint_dir" in second.stderr, second.stderr
        assert not (tmp_path / "second.jsonl").exists()  # not one iteration
        output, _ = first.communicate(timeout=120)
    finally:
        mpi_jobs.kill(first)
    assert first.returncode == 0, output
    _assert_same_model(checkpoints / "step-000000199", reference / "checkpoints" / "step-000000199")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-000000119", "step-000000159", "step-000000199"]
    result = _run(*_train_args(reference / "store", checkpoints, log, "--resume"))
    assert result.returncode == 0 and "is the end of this run (iteration 199); nothing to resume" in result.stderr
    # a new run there would replace the finished run's checkpoints step by step: refused
    result = _run(*_train_args(reference / "store", checkpoints, tmp_path / "third.jsonl", "seed=7"))
    run = json.loads((checkpoints / "step-000000199" / "meta.json").read_text())["run"]
    assert run == holder["run"]  # the lease and the checkpoints name the run alike
    assert result.returncode != 0 and f"train.checkpoint_dir={checkpoints} holds the checkpoints of another run " \
        f"(step-000000199 the newest, run {run}); --resume continues it" in result.stderr, result.stderr


@pytest.mark.any_mpi_family
def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous_one(reference, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(reference / "checkpoints", checkpoints)
    shutil.rmtree(checkpoints / "step-000000199")  # as if killed before the end
    shard = checkpoints / "step-000000159" / "ps-0.npy"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(data)
    output = _resume_and_compare(reference, checkpoints, tmp_path)
    assert "skipped damaged checkpoint(s): step-000000159: ps-0.npy does not match its SHA-256 (corrupted)" \
        in output, output
    assert "resuming from" in output and "step-000000119 (after iteration 119)" in output, output


@pytest.mark.any_mpi_family
def test_a_checkpoint_of_another_config_is_refused_and_a_finished_run_is_left_alone(reference, tmp_path):
    args = _train_args(reference / "store", reference / "checkpoints", tmp_path / "log.jsonl", "--resume")
    result = _run(*args, "train.embedding_lr=0.2")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "belongs to another run: it was written by another config: train.embedding_lr (checkpoint 0.1, " \
           "now 0.2)" in output, output
    result = _run(*args)
    assert result.returncode == 0 and "is the end of this run (iteration 199); nothing to resume" in result.stderr


@pytest.mark.parametrize("receiver", [1, PS_RANK], ids=["one-worker", "ps-only"])
def test_a_signal_to_one_rank_stops_every_rank_with_a_checkpoint_naming_it(reference, tmp_path, receiver,
                                                                           monkeypatch):
    """Workers agree on a stop at the end of an iteration; a PS rank forwards its signal to worker 0.

    The PS never sleeps in its barrier here (as under MPICH with a core per
    rank): its handler must still run between its tests of the barrier.
    """
    monkeypatch.setenv("HYBRID_PS_POLL_US", "0")
    checkpoints, log = tmp_path / "checkpoints", tmp_path / "log.jsonl"
    status, output = mpi_jobs.act_mid_run(
        MPIRUN + _train_args(reference / "store", checkpoints, log, "train.checkpoint_every=0"),
        lambda: _iterations_logged(log) >= 30, "30 iterations", mpi_jobs.signal_rank(receiver, signal.SIGUSR1))
    assert status == 0, output
    last = max(_digests(log))
    assert last < ITERATIONS - 1, output
    assert f"stopped by SIGUSR1 on rank {receiver} after iteration {last}" in output, output
    assert [p.name for p in checkpoints.iterdir()] == [f"step-{last:09d}"]


@pytest.mark.any_mpi_family  # the signal's way to the ranks under each family: the tests above
@pytest.mark.parametrize("mode", ["het", "fae"])
def test_a_signal_stops_het_and_fae_runs_at_one_iteration_without_a_checkpoint(reference, tmp_path, mode):
    """Modes whose workers hold updates the PS lacks are not checkpointed: every worker ends, exit 0, said so."""
    checkpoints, log = tmp_path / "checkpoints", tmp_path / "log.jsonl"
    status, output = mpi_jobs.act_mid_run(
        MPIRUN + _train_args(reference / "store", checkpoints, log, "train.checkpoint_every=0",
                             "train.deterministic=false", f"scheduler.mode={mode}"),
        lambda: _iterations_logged(log) >= 30, "30 iterations", mpi_jobs.signal_rank(1, signal.SIGUSR1))
    assert status == 0, output
    last = max(_digests(log))
    assert last < ITERATIONS - 1, output
    assert (f"stopped by SIGUSR1 on rank 1 after iteration {last}, without a checkpoint "
            f"(mode {mode} is not checkpointed)") in output, output
    assert not checkpoints.exists()

"""Signals and faults during ``hybrid train``, across roles and stages (docs/design.md section 13).

Each case ends the whole job within seconds, either with a message naming
the rank and the cause and a non-zero exit, or with a checkpoint, exit 0
and the resume hint; a ``--resume`` afterwards then ends with the model of
the run that was never interrupted, bit for bit (float64,
``train.deterministic=true``). Kills of a worker or the PS mid-run, a
SIGTERM to the launcher, and a hung worker are in tests/unit/training.
"""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import mpi_jobs
from hybrid.runtime import checkpoint as ckpt

ITERATIONS = 40
MPIRUN = mpi_jobs.launcher(3)  # 2 workers + 1 PS
pytestmark = pytest.mark.job  # real mpirun jobs: not run beside other tests (launch/test.sh)


def _args(store: Path, checkpoints: Path, log: Path, *extra: str) -> list:
    return [sys.executable, "-m", "hybrid", "train", "configs/w1-smoke.yaml", f"data.path={store}",
            "cluster.workers=2", "cluster.ps=1", "train.batch_per_worker=16", f"train.iterations={ITERATIONS}",
            "model.precision=float64", "train.checkpoint_every=10", f"train.checkpoint_dir={checkpoints}",
            "train.deterministic=true", "--no-progress", "--log-jsonl", str(log), *extra]


def _logged(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.is_file() else 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The store and the checkpoints of the uninterrupted run."""
    from hybrid.data.synthetic import synthesize

    root = tmp_path_factory.mktemp("signals")
    synthesize(root / "store", like="criteo-kaggle", rows=8000, scale=0.001, seed=3)
    result = subprocess.run(MPIRUN + _args(root / "store", root / "checkpoints", root / "log.jsonl"),
                            cwd=mpi_jobs.ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr
    return root


def _signalled(reference: Path, tmp_path: Path, ready, act, *extra: str) -> tuple[int, float, str, Path]:
    """Start a run, ``act(process)`` once ``ready(process, log)``: (exit status, seconds after the act, output,
    checkpoint directory)."""
    checkpoints, log = tmp_path / "checkpoints", tmp_path / "log.jsonl"
    acted = []

    def timed(process):
        act(process)
        acted.append(time.monotonic())

    process = mpi_jobs.start(MPIRUN + _args(reference / "store", checkpoints, log, *extra))
    try:
        mpi_jobs.wait_for(process, lambda: ready(process, log), "the moment to signal")
        timed(process)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            mpi_jobs.kill(process)
    return process.returncode, time.monotonic() - acted[0], output, checkpoints


def _resumes_to_the_uninterrupted_model(reference: Path, checkpoints: Path, tmp_path: Path) -> None:
    result = subprocess.run(MPIRUN + _args(reference / "store", checkpoints, tmp_path / "resumed.jsonl", "--resume"),
                            cwd=mpi_jobs.ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert result.returncode == 0 and "resuming from" in result.stderr, result.stdout + result.stderr
    last = f"step-{ITERATIONS - 1:09d}"
    final, expected = checkpoints / last, reference / "checkpoints" / last
    np.testing.assert_array_equal(np.load(final / "ps-0.npy"), np.load(expected / "ps-0.npy"))
    mine = torch.load(final / "dense.pt", weights_only=True)["model"]
    for name, tensor in torch.load(expected / "dense.pt", weights_only=True)["model"].items():
        np.testing.assert_array_equal(mine[name].numpy(), tensor.numpy(), err_msg=name)


def _stopped_with_a_checkpoint(status: int, seconds: float, output: str, checkpoints: Path, cause: str) -> None:
    assert status == 0 and seconds < 10, f"exit {status} after {seconds:.1f} s:\n{output}"
    found = re.search(rf"stopped by {cause} after iteration (\d+); continue with --resume \(from (\S+)\)", output)
    assert found, output
    assert Path(found.group(2)) == checkpoints / f"step-{int(found.group(1)):09d}" and int(found.group(1)) < \
        ITERATIONS - 1, output
    assert "Traceback" not in output, output


def test_sigterm_to_the_ps_stops_every_rank_with_a_checkpoint_and_the_run_resumes(reference, tmp_path):
    """A PS rank takes no part in the workers' barrier: it forwards the signal to worker 0."""
    status, seconds, output, checkpoints = _signalled(
        reference, tmp_path, lambda process, log: _logged(log) >= 12, mpi_jobs.signal_rank(2, signal.SIGTERM))
    _stopped_with_a_checkpoint(status, seconds, output, checkpoints, "SIGTERM on rank 2")
    _resumes_to_the_uninterrupted_model(reference, checkpoints, tmp_path)


def test_sigint_to_a_worker_while_it_starts_up_stops_with_a_checkpoint_and_the_run_resumes(reference, tmp_path):
    """From the moment its stop handler is in place (before torch and Horovod load), not before the first
    iteration: the signal waits for the workers' first barrier."""
    def starting(process, log):
        pid = mpi_jobs.rank_pids(process.pid).get(1)
        return pid is not None and mpi_jobs.catches(pid, signal.SIGUSR1) and _logged(log) == 0

    status, seconds, output, checkpoints = _signalled(reference, tmp_path, starting,
                                                      mpi_jobs.signal_rank(1, signal.SIGINT))
    assert seconds < 30, output  # includes the rest of the start-up
    _stopped_with_a_checkpoint(status, 0, output, checkpoints, "SIGINT on rank 1")
    _resumes_to_the_uninterrupted_model(reference, checkpoints, tmp_path)


def test_a_second_signal_interrupts_at_once_naming_the_rank(reference, tmp_path):
    def twice(process):
        victim = mpi_jobs.rank_pids(process.pid)[1]
        os.kill(victim, signal.SIGTERM)
        # soon: a fast machine ends the run's last iterations and its checkpoint within 50 ms of the first
        # signal, and a second signal after the rank's run ended has nothing to interrupt
        time.sleep(0.005)
        os.kill(victim, signal.SIGINT)

    status, seconds, output, checkpoints = _signalled(reference, tmp_path, lambda process, log: _logged(log) >= 12,
                                                      twice)
    assert status != 0 and seconds < 10, f"exit {status} after {seconds:.1f} s:\n{output}"
    # both pending at once, Python handles the lower signal number first: either order is a second signal
    assert re.search(r"hybrid train: interrupted on rank 1 of 3 \(.+\) by (SIGINT after SIGTERM|SIGTERM after SIGINT); "
                     r"ending every rank", output), output
    assert "Traceback" not in output, output


def test_a_stalled_ps_rank_is_reported_by_the_watchdog_and_the_job_ends(reference, tmp_path):
    """SIGSTOP: the PS neither answers nor dies (a frozen host); the workers' watchdog ends the job."""
    stalled = []

    def freeze(process):
        stalled.append(mpi_jobs.rank_pids(process.pid)[2])
        os.kill(stalled[0], signal.SIGSTOP)

    try:
        status, seconds, output, checkpoints = _signalled(
            reference, tmp_path, lambda process, log: _logged(log) >= 12, freeze, "train.watchdog_seconds=4")
    finally:
        with contextlib.suppress(ProcessLookupError, IndexError):
            os.kill(stalled[0], signal.SIGKILL)
    assert status != 0 and seconds < 4 + 10, f"exit {status} after {seconds:.1f} s:\n{output}"
    assert re.search(r"hybrid train: rank [01] of 3 \(.+\): no iteration finished for \d+ s "
                     r"\(train.watchdog_seconds=4\) while in stage \w+ of iteration \d+", output), output
    for checkpoint in ckpt.CheckpointDir(checkpoints).complete():  # only whole ones are taken
        assert ckpt.verify(checkpoint, sorted(checkpoint.meta["files"])) is None

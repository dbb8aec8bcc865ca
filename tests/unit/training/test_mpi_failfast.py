"""A failing MPI test ends its run at once with the failure printed (tests/conftest.py)."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mpi_jobs

pytestmark = pytest.mark.job  # real mpirun jobs: launch/test.sh --quick leaves them out

ROOT = Path(__file__).resolve().parents[3]


def test_a_failure_on_one_rank_ends_the_mpi_run_within_30_seconds():
    command = ["bash", str(ROOT / "launch" / "mpirun.sh"), "-n", "3", sys.executable, "-m", "pytest", "-q",
               "-p", "no:cacheprovider", "--with-mpi", str(ROOT / "tests" / "failfast" / "deliberate_failure.py")]
    start = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HYBRID_MPI_TIMEOUT": "100"})
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert elapsed < 30, f"the run took {elapsed:.0f} s to end:\n{output}"
    assert "rank 1 of 3: FAILED" in output and "deliberate failure on rank 1" in output, output


def _train_with_a_failing_worker(store: Path, when: str, *overrides: str) -> tuple[str, float, int]:
    """A 3-rank ``hybrid train`` (2 workers + 1 PS) on a tiny new store in which worker 1 fails as ``when`` says.

    Returns the output, the time the job ended and its exit status.
    """
    from hybrid.data.synthetic import synthesize

    synthesize(store, like="criteo-kaggle", rows=4000, scale=0.001, seed=1)
    command = ["bash", str(ROOT / "launch" / "mpirun.sh"), "-n", "3", sys.executable,
               str(ROOT / "tests" / "failfast" / "worker_fails.py"), when, "train", "configs/w1-smoke.yaml",
               f"data.path={store}", "cluster.workers=2", "cluster.ps=1", "train.batch_per_worker=16",
               "train.iterations=40", *overrides, "--no-progress"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=200,
                            env={**os.environ, "HYBRID_MPI_TIMEOUT": "180"})
    return result.stdout + result.stderr, time.time(), result.returncode


@pytest.mark.parametrize("when", ["startup", "mid-run"])
def test_an_error_on_one_worker_ends_the_whole_training_job_within_10_seconds(tmp_path, when):
    """`hybrid train` prints the error naming the rank, then aborts every rank: nobody waits in a collective."""
    output, ended, status = _train_with_a_failing_worker(tmp_path / "store", when)
    assert status != 0, output
    assert "error on rank 1 of 3" in output and "deliberate failure on worker 1" in output, output
    raised = float(re.search(r"at t=([0-9.]+)", output).group(1))
    assert ended - raised < 10, f"the job ended {ended - raised:.1f} s after the error:\n{output}"


def test_a_hung_worker_is_reported_by_the_watchdog_and_the_job_ends(tmp_path):
    """Worker 1 sleeps at iteration 5 while the others wait in the allreduce: stage and stacks, then the end."""
    output, ended, status = _train_with_a_failing_worker(tmp_path / "store", "hang", "train.watchdog_seconds=4")
    assert status != 0, output
    assert "no iteration finished for" in output and "a collective is stuck" in output, output
    assert re.search(r"in stage \w+ of iteration 5", output) and "Thread 0x" in output, output  # stage, stacks
    hung = float(re.search(r"worker 1 hangs at t=([0-9.]+)", output).group(1))
    assert ended - hung < 4 + 10, f"the job ended {ended - hung:.1f} s after the hang:\n{output}"


# Under Open MPI the kill -9 tests of test_resume.py make these assertions (and resume the run after
# them): run here under MPICH only, where those do not run (they are marked any_mpi_family).
@pytest.mark.skipif(mpi_jobs.FAMILY.name == "openmpi", reason="under Open MPI, test_resume.py::"
                    "test_a_run_killed_mid_run_resumes_to_the_uninterrupted_model makes these assertions")
@pytest.mark.parametrize("victim", [1, 2], ids=["worker", "ps"])
def test_a_rank_killed_mid_run_ends_the_job_within_30_seconds_naming_it(tmp_path, victim):
    """kill -9 of a worker or of the PS rank while training: a non-zero exit, the rank named, no hang."""
    from hybrid.data.synthetic import synthesize

    synthesize(tmp_path / "store", like="criteo-kaggle", rows=40000, scale=0.001, seed=1)
    log = tmp_path / "log.jsonl"
    # the MPI's launcher itself, not launch/mpirun.sh: the job ends with the MPI's own verdict
    command = mpi_jobs.launcher(3) + [
        sys.executable, "-m", "hybrid", "train", "configs/w1-smoke.yaml", f"data.path={tmp_path / 'store'}",
        "cluster.workers=2", "cluster.ps=1", "train.batch_per_worker=16", "--no-progress", "--log-jsonl", str(log)]
    mpi_jobs.kill_rank_mid_run(command, lambda: log.is_file() and len(log.read_text().splitlines()) >= 5,
                               "training under way", victim)

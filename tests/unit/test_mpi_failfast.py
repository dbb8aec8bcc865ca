"""A failing MPI test ends its run at once with the failure printed (tests/conftest.py)."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize("when", ["startup", "mid-run"])
def test_an_error_on_one_worker_ends_the_whole_training_job_within_10_seconds(tmp_path, when):
    """`hybrid train` prints the error naming the rank, then aborts every rank: nobody waits in a collective."""
    import re

    from hybrid.data.synthetic import synthesize

    synthesize(tmp_path / "store", like="criteo-kaggle", rows=4000, scale=0.001, seed=1)
    command = ["bash", str(ROOT / "launch" / "mpirun.sh"), "-n", "4", sys.executable,
               str(ROOT / "tests" / "failfast" / "worker_fails.py"), when, "train", "configs/w1-smoke.yaml",
               f"data.path={tmp_path / 'store'}", "train.batch_per_worker=16", "train.iterations=40",
               "--no-progress"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=200,
                            env={**os.environ, "HYBRID_MPI_TIMEOUT": "180"})
    ended = time.time()
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "error on rank 1 of 4" in output and "deliberate failure on worker 1" in output, output
    raised = float(re.search(r"at t=([0-9.]+)", output).group(1))
    assert ended - raised < 10, f"the job ended {ended - raised:.1f} s after the error:\n{output}"

"""A failing MPI test ends its run at once with the failure printed (tests/conftest.py)."""
import os
import subprocess
import sys
import time
from pathlib import Path

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

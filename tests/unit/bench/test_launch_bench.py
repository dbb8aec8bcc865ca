"""``hybrid bench launch``: one training through each launch path, and what each path's ranks decided."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mpi_jobs
from hybrid.bench import launch_bench

pytestmark = pytest.mark.job  # real mpirun jobs: launch/test.sh --quick leaves them out

ROOT = Path(__file__).resolve().parents[3]


def test_paths_are_chosen_by_name_and_an_unknown_one_is_refused():
    paths, skipped = launch_bench.available(lambda line: None, ["train.sh", "mpirun -H localhost:N"])
    assert [p.name for p in paths] == ["train.sh", "mpirun -H localhost:N"] and skipped == {}
    with pytest.raises(ValueError, match="unknown launch path.*srun.*choose from"):
        launch_bench.available(lambda line: None, ["srun"])


def test_the_table_names_each_paths_decision_and_its_share_of_the_fastest():
    launch = {"yields": True, "decided_by": "hybrid: 4 ranks x 2 threads > 2 cores"}
    result = {"config": "c.yaml", "overrides": ["scheduler.mode=herald"], "ranks": 4, "repeats": 3,
              "skipped": {"hetjob.sbatch": "example partitions"},
              "paths": [{"path": "train.sh", "samples_per_s": 60000.0, "of_fastest": 1.0, "allreduce_ms": 3.0,
                         "barrier_ms": 1.0, "start_skew_s": 0.31, "launch": launch},
                        {"path": "train.sh --horovodrun", "samples_per_s": 57000.0, "of_fastest": 0.95,
                         "allreduce_ms": 3.5, "barrier_ms": 1.1, "start_skew_s": 0.05,
                         "launch": {**launch, "yields": False}}]}
    table = launch_bench.format_table(result)
    assert "train.sh --horovodrun        57000    0.95      3.50     1.10   0.05" in table
    assert "yield (hybrid: 4 ranks x 2 threads > 2 cores)" in table and "spin (" in table
    assert "not run: hetjob.sbatch: example partitions" in table


def test_horovodrun_and_a_plain_mpirun_that_sees_no_oversubscription_yield_here(tmp_path):
    """The paths whose ranks spun before (docs/cluster.md#how-ranks-wait): they now decide to yield, and say so in the summary."""
    cores = len(os.sched_getaffinity(0))
    store = tmp_path / "store"
    subprocess.run([sys.executable, "-m", "hybrid", "synth", "--like", "criteo-kaggle", "--rows", "3000",
                    "--scale", "0.001", "--seed", "1", "--out", str(store)], check=True, capture_output=True)
    result = subprocess.run(
        [sys.executable, "-m", "hybrid", "bench", "launch", "configs/w1-smoke.yaml", f"data.path={store}",
         # as many compute threads per rank as cores: 3 ranks never fit, on any machine (here: the 2 cores' default)
         "cluster.workers=2", "train.batch_per_worker=16", "train.iterations=20", f"train.threads={max(1, cores)}",
         "--repeats", "1", "--json",
         "--paths", "train.sh --horovodrun,mpirun -H localhost:N"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout.strip().splitlines()[-1])
    launched = {r["path"]: r["launch"] for r in document["paths"]}
    mpich = mpi_jobs.FAMILY.name == "mpich"
    assert launched["train.sh --horovodrun"]["launcher"] == "horovodrun"
    assert launched["mpirun -H localhost:N"]["launcher"] == ("mpiexec (MPICH)" if mpich else "mpirun")
    decided = f"hybrid: 3 ranks x {cores + 1} threads > {cores} cores"
    if mpich:  # MPICH yields only if its waits came through the rank's own module
        decided += "; MPICH's waits yield through hybrid._ext.mpi_yield"
    for launch in launched.values():
        assert launch["ranks_on_host"] == 3 and launch["measured"]["ranks_on_host"] == 3
        assert launch["yields"] and launch["decided_by"] == decided
    assert "launch path" in result.stderr  # the table
    assert all(r["start_skew_s"] >= 0 for r in document["paths"])

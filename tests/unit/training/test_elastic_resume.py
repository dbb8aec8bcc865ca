"""Elastic resume through real ``hybrid train`` jobs: another cluster shape, and more iterations.

A float64 run of 2 workers + 2 PS ranks checkpoints after iteration 9 and
ends; ``--resume`` continues it for 20 iterations on 1 worker + 1 PS (fewer
of both), on 3 + 1 (more workers, fewer PS), on 1 + 3 (more PS), and on its
own shape, each mode at least once with its tables re-sharded. Each ends with the embedding tables and MLP of
the uninterrupted single-process reference (BSP sums every global batch
whichever workers train it), read from the final checkpoint under the
shard plan that wrote it.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import mpi_jobs
from hybrid.config import load_config
from hybrid.data.store import BatchStore
from hybrid.runtime import checkpoint as ckpt
from hybrid.runtime.reshard import ShardFiles, checkpoint_plan
from hybrid.training.reference import train_reference

pytestmark = pytest.mark.job  # real mpirun jobs: launch/test.sh --quick leaves them out

FIRST, TOTAL, GLOBAL_BATCH = 10, 20, 48
FIRST_SHAPE = (2, 2)  # workers, PS
MODEL = ["model.precision=float64", "model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
         "train.checkpoint_every=10"]


def _shape(workers: int, ps: int) -> list:
    return [f"cluster.workers={workers}", f"cluster.ps={ps}", f"train.batch_per_worker={GLOBAL_BATCH // workers}"]


CASES = {"vanilla": ["scheduler.mode=vanilla"], "herald": ["scheduler.mode=herald"],
         "herald-rowwise-adagrad": ["scheduler.mode=herald", "train.embedding_optimizer=rowwise_adagrad"]}


def _hybrid_train(store: Path, checkpoints: Path, workers: int, ps: int, iterations: int, case: str, *extra):
    """``hybrid train`` of ``CASES[case]`` on ``workers + ps`` ranks; its completed process."""
    command = mpi_jobs.launcher(workers + ps) + [
        sys.executable, "-m", "hybrid", "train", "configs/w1-smoke.yaml", f"data.path={store}",
        *CASES[case], f"train.iterations={iterations}", f"train.checkpoint_dir={checkpoints}",
        *MODEL, *_shape(workers, ps), "--no-progress", *extra]
    return subprocess.run(command, cwd=mpi_jobs.ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))


def _final_model(checkpoint: Path):
    """(every stored row, optimizer state included, and the MLP state) of a checkpoint, its PS files read
    under its own plan."""
    meta = json.loads((checkpoint / ckpt.META).read_text())
    plan = checkpoint_plan(meta, meta["rows"])
    files = ShardFiles([checkpoint / ckpt.shard_name(i) for i in range(plan.n_shards)], plan, meta["dim"],
                       np.float64)
    return files.read(np.arange(plan.n_rows)), torch.load(checkpoint / "dense.pt", weights_only=True)["model"]


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory):
    """``first_runs(case)``: a store and a 2 + 2 run of FIRST iterations of the case that checkpointed its end
    (made once per case)."""
    from hybrid.data.synthetic import synthesize

    made = {}

    def first_run(case: str) -> tuple[Path, str]:
        if case not in made:
            root = tmp_path_factory.mktemp(f"elastic-{case}")
            synthesize(root / "store", like="criteo-kaggle", rows=4000, scale=0.001, seed=6)
            result = _hybrid_train(root / "store", root / "checkpoints", *FIRST_SHAPE, FIRST, case)
            assert result.returncode == 0, result.stdout + result.stderr
            assert [p.name for p in (root / "checkpoints").iterdir()] == [f"step-{FIRST - 1:09d}"]
            made[case] = root, case
        return made[case]

    return first_run


# Each way the shape can change once, each mode re-sharded at least once, row-wise Adagrad's state
# re-sharded to more PS ranks. Re-sharding does not depend on the mode, and the scheduler starts cold
# in every mode, so the full product of modes and shapes (7 jobs of up to 6 ranks, about 4 minutes
# here) checked nothing more.
@pytest.mark.parametrize("case,workers,ps", [
    ("vanilla", 1, 1), ("herald", 3, 1), ("vanilla", 1, 3), ("herald", 2, 2), ("herald-rowwise-adagrad", 1, 3)],
    ids=lambda v: str(v))
def test_a_run_resumed_on_another_shape_for_more_iterations_equals_the_uninterrupted_reference(
        first_runs, tmp_path, case, workers, ps):
    root, mode = first_runs(case)
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(root / "checkpoints", checkpoints)
    result = _hybrid_train(root / "store", checkpoints, workers, ps, TOTAL, mode, "--resume")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"resuming from {checkpoints}/step-{FIRST - 1:09d} (after iteration {FIRST - 1})" in output
    resharded = "the PS rows are re-sharded and the scheduler starts cold" in output
    assert resharded == ((workers, ps) != FIRST_SHAPE), output
    assert resharded or "it ended its run: the scheduler starts cold from its tables" in output
    assert f"{TOTAL - FIRST} iterations" in output, output

    config = load_config("configs/w1-smoke.yaml", [f"data.path={root / 'store'}", *CASES[mode], *MODEL,
                                                   *_shape(workers, ps)])
    store = BatchStore(root / "store", split="train", test_fraction=config.data.test_fraction)
    expected_table, expected_model = train_reference(config, store, TOTAL)
    table, dense = _final_model(checkpoints / f"step-{TOTAL - 1:09d}")
    assert np.abs(table - expected_table).max() < 1e-9
    for name, want in expected_model.state_dict().items():
        assert np.abs(dense[name].numpy() - want.numpy()).max() < 1e-9, name


def test_a_resume_that_changes_the_global_batch_says_which_batch_per_worker_keeps_it(first_runs, tmp_path):
    root, mode = first_runs("vanilla")
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(root / "checkpoints", checkpoints)
    result = _hybrid_train(root / "store", checkpoints, 3, 1, TOTAL, mode, "--resume", "train.batch_per_worker=8")
    assert result.returncode != 0
    assert "its global batch is 48 samples (2 workers x 24), this run's 24: train.batch_per_worker=16 keeps it " \
           "on 3 workers" in result.stdout + result.stderr

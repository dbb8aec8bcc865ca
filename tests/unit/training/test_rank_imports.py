"""What each role of a real ``hybrid train`` job loads: PS ranks never torch, workers never torch._dynamo.

Each costs every rank of every job seconds of CPU before its first iteration
(torch about 3 s and 250 MB on a PS rank, torch._dynamo 2.8 s on a worker,
measured here), and neither is used there (hybrid/training/loop.py, hybrid/models.py).
"""
import json
import os
import subprocess
import sys

import pytest

import mpi_jobs

pytestmark = pytest.mark.job  # a real mpirun job: launch/test.sh --quick leaves it out

# hybrid's own entry point; at exit each rank writes which of these modules it had loaded to DIR/RANK.json
REPORTING = """
import atexit, json, os, runpy, sys
path = os.path.join(sys.argv[2], os.environ[sys.argv[1]] + ".json")
atexit.register(lambda: open(path, "w").write(
    json.dumps({m: m in sys.modules for m in ("torch", "torch._dynamo", "horovod.torch")})))
sys.argv = ["hybrid", *sys.argv[3:]]
runpy.run_module("hybrid", run_name="__main__")
"""


def test_ps_ranks_never_load_torch_and_workers_never_load_torch_dynamo(tmp_path):
    from hybrid.data.synthetic import synthesize

    synthesize(tmp_path / "store", like="criteo-kaggle", rows=2000, scale=0.001, seed=1)
    command = mpi_jobs.launcher(3) + [
        sys.executable, "-c", REPORTING, mpi_jobs.FAMILY.rank_variable, str(tmp_path), "train", "configs/w1-smoke.yaml",
        f"data.path={tmp_path / 'store'}", "cluster.workers=2", "cluster.ps=1", "train.iterations=5",
        "train.checkpoint_every=5", f"train.checkpoint_dir={tmp_path / 'checkpoints'}",
        # Horovod asked for: auto does not load it for CPU workers that share cores (hybrid.runtime.comm), and
        # its torch module is what must not bring dynamo in
        "train.allreduce=horovod", "--no-progress"]
    result = subprocess.run(command, cwd=mpi_jobs.ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr
    loaded = {int(p.stem): json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(loaded) == [0, 1, 2], result.stdout + result.stderr
    for worker in (0, 1):  # the workers trained, checkpointed and evaluated
        assert loaded[worker]["torch"] and loaded[worker]["horovod.torch"] and not loaded[worker]["torch._dynamo"]
    assert not loaded[2]["torch"], "the PS rank (rank 2, last) loaded torch"

"""``hybrid export`` then ``hybrid evaluate``: the model taken out of the cluster scores as the run reported.

Each model trains on every rank with 2 PS ranks under a shard plan that
deals rows round-robin (so the export must gather rows from both files),
checkpoints its end, and worker 0 exports it and evaluates the file on the
test split with no MPI involved: the same test AUC and log loss as the
run's summary (to 1e-6).
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mpi4py import MPI

from hybrid.config import load_config
from hybrid.data.store import BatchStore
from hybrid.exported import evaluate, load
from hybrid.runtime.checkpoint import CheckpointError
from hybrid.sharding.planners import make_plan
from hybrid.training import job as train_job
from hybrid.training.export import export_checkpoint
from shared_store import shared_store


@pytest.fixture(scope="module")
def store_path():
    with shared_store(like="criteo-kaggle", rows=3000, scale=0.001, seed=9) as path:
        yield path


# Loads each exported file it is sent and prints the MPI and Horovod modules it has loaded so far.
_PROBE = """\
import sys, torch
from hybrid.exported import load
for line in sys.stdin:
    assert isinstance(load(line.strip()), torch.nn.Module)
    print(sorted(m for m in sys.modules if m.split('.')[0] in ('mpi4py', 'horovod')), flush=True)
"""


@pytest.fixture(scope="module")
def fresh_process():
    """Worker 0's Python process without MPI or Horovod that loads the exported files, one after another.

    One process for the five models, not one each: its start (torch's import, 3 s of CPU here) is what a
    probe costs, and every other rank waits it out. None on the other ranks.
    """
    if MPI.COMM_WORLD.rank != 0:
        yield None
        return
    with tempfile.TemporaryFile("w+") as errors:  # a file, not a pipe: warnings can never fill it and block
        process = subprocess.Popen([sys.executable, "-c", _PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=errors, text=True)
        process.errors = errors
        yield process
        process.kill()
        process.wait()


def _loaded_alone(process: subprocess.Popen, path: Path) -> str:
    """What the fresh process says after loading ``path``: the MPI and Horovod modules it has (or why it ended)."""
    try:
        process.stdin.write(f"{path}\n")
        process.stdin.flush()
        answer = process.stdout.readline().strip()
    except BrokenPipeError:
        answer = ""
    if not answer:
        process.kill()
        process.wait()
        process.errors.seek(0)
        return f"the process ended: {process.errors.read()}"
    return answer


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", ["dlrm", "wide_deep", "deepfm", "dcn", "ncf"])
def test_an_exported_model_evaluates_to_the_runs_reported_test_auc(store_path, tmp_path_factory, fresh_process,
                                                                 model):
    world = MPI.COMM_WORLD
    out = Path(world.bcast(str(tmp_path_factory.mktemp("export")) if world.rank == 0 else None))
    store = BatchStore(store_path)
    if world.rank == 0:
        make_plan("round-robin", list(store.cardinalities), 2, dim=8).save(out / "plan.json")
    world.Barrier()
    config = load_config(None, [f"data.path={store_path}", f"cluster.workers={world.size - 2}", "cluster.ps=2",
                                f"cluster.shard_plan={out / 'plan.json'}", f"model.name={model}",
                                "model.embedding_dim=8", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
                                "train.batch_per_worker=32", "train.iterations=20", "train.checkpoint_every=20",
                                f"train.checkpoint_dir={out / 'checkpoints'}", "data.test_fraction=0.2"])
    summary = train_job.run(config, progress=False)
    if world.rank != 0:
        return
    written = export_checkpoint(out / "checkpoints", out / "model.pt", progress=False, say=lambda _: None)
    assert written["step"] == 19 and written["rows"] == int(store.cardinalities.sum())
    result = evaluate(load(out / "model.pt"), BatchStore(store_path, split="test", test_fraction=0.2))
    reported = summary["evaluation"]
    assert result["samples"] == reported["samples"] == 600
    assert abs(result["auc"] - reported["auc"]) < 1e-6 and abs(result["logloss"] - reported["logloss"]) < 1e-6

    # the file alone, in a process that never loaded MPI or Horovod: loading it loads neither
    assert _loaded_alone(fresh_process, out / "model.pt") == "[]"

    damaged = out / "checkpoints" / "step-000000019" / "ps-1.npy"
    data = damaged.read_bytes()
    damaged.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(CheckpointError, match="ps-1.npy does not match its SHA-256"):
        export_checkpoint(out / "checkpoints", out / "again.pt", progress=False, say=lambda _: None)
    assert not (out / "again.pt").exists()

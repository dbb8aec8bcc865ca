"""Checkpoints on a disk that is read-only, too small or fills up mid-run, and a ``dense.pt`` that would run
code: each run ends in seconds with one message, and no checkpoint a later ``--resume`` would take is left
half-written, nor is the previous good one lost.

The disks are real: a tmpfs of a given size, or a read-only bind mount, made in a private mount namespace
(``unshare -m``) that ends with the job, so nothing stays mounted if a test fails.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mpi_jobs
from hybrid.data.synthetic import synthesize
from hybrid.runtime import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = mpi_jobs.launcher(2)
pytestmark = pytest.mark.job  # real mpirun jobs: not run beside other tests (launch/test.sh)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults") / "store"
    synthesize(path, like="criteo-kaggle", rows=1000, scale=0.0005, seed=1)  # checkpoints of about 1 MB
    return path


@pytest.fixture(scope="module")
def mounts(tmp_path_factory):
    """Skip where this user may not make a private mount namespace (not root, or a restricted container)."""
    probe = tmp_path_factory.mktemp("probe")
    result = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {probe}"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"no private mounts here: {result.stderr.strip()}")


def _train(store: Path, checkpoints: Path, *extra: str, mount: str = "", after: str = "") -> tuple[int, float, str]:
    """``hybrid train`` on 1 worker + 1 PS; with ``mount`` (shell), in a private mount namespace, and ``after``
    (shell) there once the job ended (the namespace and its tmpfs end with it)."""
    command = MPIRUN + [sys.executable, "-m", "hybrid", "train", "configs/w1-smoke.yaml", "cluster.workers=1",
                        "cluster.ps=1", "model.embedding_dim=4", "train.batch_per_worker=16", "cache.ratio=0.5",
                        "train.iterations=20", f"data.path={store}", f"train.checkpoint_dir={checkpoints}",
                        "--no-progress", *extra]
    if mount:
        command = ["unshare", "-m", "sh", "-c", f'{mount} || exit 97; "$@"; status=$?; {after or ":"}; exit $status',
                   "sh", *command]
    start = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    return result.returncode, time.monotonic() - start, result.stdout + result.stderr


def test_a_disk_that_fills_up_mid_run_ends_the_job_and_keeps_the_last_good_checkpoint(store, mounts, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    # about 1 MB per checkpoint: the first fits, the second does not (the first is kept until it is written)
    status, seconds, output = _train(store, checkpoints, "train.checkpoint_every=5", "train.checkpoint_keep=1",
                                     mount=f"mount -t tmpfs -o size=1500k tmpfs {checkpoints}",
                                     after=f'ls -a {checkpoints}; {sys.executable} -c "{_CHECK}" {checkpoints}')
    assert status != 0 and seconds < 60, output[-3000:]
    assert "No space left on device; the previous checkpoints are intact" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "step-000000004" in output.splitlines() and "step-000000009" not in output.splitlines(), output[-3000:]
    assert "complete: [4] verified: None" in output, output[-3000:]  # the last good one, whole


_CHECK = ("import sys; from hybrid.runtime import checkpoint as c; d = c.CheckpointDir(sys.argv[1]).complete(); "
          "print('complete:', [x.step for x in d], 'verified:', c.verify(d[0], sorted(d[0].meta['files'])))")


def test_a_read_only_checkpoint_directory_is_refused_at_start_up(store, mounts, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    status, seconds, output = _train(store, checkpoints / "run", "train.checkpoint_every=5",
                                     mount=f"mount --bind {checkpoints} {checkpoints} && "
                                           f"mount -o remount,bind,ro {checkpoints}")
    assert status != 0 and seconds < 60, output[-3000:]
    assert f"train.checkpoint_dir={checkpoints / 'run'}: {checkpoints} is not writable; choose a writable " \
           f"directory" in output, output[-3000:]
    assert "Traceback" not in output and "iteration" not in output, output[-3000:]


def test_a_disk_without_room_for_one_checkpoint_is_refused_at_start_up(store, mounts, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    status, seconds, output = _train(store, checkpoints, "train.checkpoint_every=5",
                                     mount=f"mount -t tmpfs -o size=64k tmpfs {checkpoints}")
    assert status != 0 and seconds < 60, output[-3000:]
    assert f"{checkpoints} has 0.1 MB free, and a checkpoint takes at least 0.3 MB" in output, output[-3000:]


class _RunsCode:
    """Unpickling this touches a file: what torch.load(weights_only=False) would do with it."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_dense_pt_that_would_run_code_is_refused_and_runs_nothing(store, tmp_path):
    """Even with its checksum forged to match, resume and export refuse it without unpickling it."""
    import torch

    checkpoints = tmp_path / "checkpoints"
    status, _, output = _train(store, checkpoints, "train.checkpoint_every=10")
    assert status == 0, output[-3000:]
    newest = ckpt.CheckpointDir(checkpoints).complete()[0]
    marker = tmp_path / "code-ran"
    torch.save({"model": _RunsCode(str(marker))}, newest.file("dense.pt"))
    meta = newest.meta
    data = newest.file("dense.pt").read_bytes()
    meta["files"]["dense.pt"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (newest.path / ckpt.META).write_text(json.dumps(meta))
    shutil.rmtree(checkpoints / "step-000000009")  # no earlier checkpoint to fall back on

    status, seconds, output = _train(store, checkpoints, "train.checkpoint_every=10", "train.iterations=30",
                                     "--resume")
    assert status != 0 and seconds < 60, output[-3000:]
    assert "dense.pt is not a checkpoint's MLP file (torch.load: UnpicklingError); move" in output, output[-3000:]
    assert "weights_only" not in output and "Traceback" not in output, output[-3000:]
    result = subprocess.run([sys.executable, "-m", "hybrid", "export", str(newest.path), "--out",
                             str(tmp_path / "m.pt")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "is not a checkpoint's MLP file" in result.stderr, result.stderr
    assert not marker.exists() and not (tmp_path / "m.pt").exists()


def test_a_run_whose_directory_another_run_took_over_writes_no_more_checkpoints(store, tmp_path):
    """As after a suspended job's heartbeat stopped and a run elsewhere took its directory (run_lease)."""
    import mpi_jobs

    checkpoints = tmp_path / "checkpoints"
    command = MPIRUN + [sys.executable, "-m", "hybrid", "train", "configs/w1-smoke.yaml", "cluster.workers=1",
                        "cluster.ps=1", "model.embedding_dim=4", "train.batch_per_worker=16", "train.iterations=2000",
                        f"data.path={store}", f"train.checkpoint_dir={checkpoints}", "train.checkpoint_every=500",
                        "--no-progress"]
    taker = {"run": "0123456789ab", "config": "w1-smoke", "host": "node-17", "pid": 77, "started": "then"}
    status, output = mpi_jobs.act_mid_run(
        command, lambda: (checkpoints / "step-000000499" / "meta.json").is_file(), "the first checkpoint",
        lambda _: (checkpoints / "owner.json").write_text(json.dumps(taker)), timeout=60)
    assert status != 0, output[-3000:]  # not the whole run: it ends at its next checkpoint, step 999
    assert f"train.checkpoint_dir={checkpoints} was taken over by run 0123456789ab (w1-smoke, started then) on " \
           f"host node-17, process 77 while this run gave no heartbeat" in output, output[-3000:]
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("step-")) == ["step-000000499"]
    assert json.loads((checkpoints / "owner.json").read_text()) == taker  # the taker's lease left as it was

"""``hybrid.runtime.run_lease``: one run at a time holds a checkpoint directory; a dead holder is found out.

The holders here are this process (alive), a process that has ended (dead,
on this host) and leases written as if from another host, whose heartbeat
is fresh or 60 s old.
"""
import json
import os
import subprocess
import sys
import time

import pytest

from hybrid.runtime import run_lease
from hybrid.runtime.run_lease import LEASE, LeaseError, acquire, this_holder


def _acquire(root, *, resume=False, checkpoints=False, notes=None):
    return acquire(root, this_holder("w1-smoke"), resume=resume, has_checkpoints=lambda: checkpoints,
                   say=(notes.append if notes is not None else lambda _: None))


def _dead_holder() -> dict:
    """A lease of this host whose process has ended."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = this_holder("w1-smoke")
    holder.update(pid=int(child.stdout), run="deadbeef0000")
    return holder


def _write(root, holder: dict, age: float = 0.0) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / LEASE).write_text(json.dumps(holder))
    if age:
        then = time.time() - age
        os.utime(root / LEASE, (then, then))


def test_a_run_takes_the_directory_and_gives_it_back(tmp_path):
    lease = _acquire(tmp_path / "ck")
    written = json.loads((tmp_path / "ck" / LEASE).read_text())
    assert written["pid"] == os.getpid() and written["config"] == "w1-smoke" and written["host"]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [LEASE]  # nothing else left behind
    lease.release()
    assert not (tmp_path / "ck" / LEASE).exists()


@pytest.mark.parametrize("resume", [False, True])
def test_a_second_run_is_refused_naming_the_live_holder(tmp_path, resume):
    first = _acquire(tmp_path)
    with pytest.raises(LeaseError) as refused:
        _acquire(tmp_path, resume=resume, checkpoints=True)
    holder = first.holder
    assert f"train.checkpoint_dir={tmp_path} is in use by run {holder['run']} (w1-smoke, started " \
           f"{holder['started']}) on host {holder['host']}, process {os.getpid()}; wait for it to end" \
           in str(refused.value)
    first.release()
    _acquire(tmp_path).release()  # free again


def test_a_dead_holder_is_taken_over_by_resume_and_by_a_new_run_only_without_its_checkpoints(tmp_path):
    _write(tmp_path, _dead_holder())
    with pytest.raises(LeaseError, match="holds the checkpoints of run deadbeef0000 .* ended without releasing it "
                                         r"\(killed, or its node lost\); --resume continues that run"):
        _acquire(tmp_path, checkpoints=True)
    notes = []
    lease = _acquire(tmp_path, resume=True, checkpoints=True, notes=notes)
    assert json.loads((tmp_path / LEASE).read_text())["pid"] == os.getpid()
    assert len(notes) == 1 and notes[0].startswith(f"took over {tmp_path} from run deadbeef0000 (w1-smoke")
    lease.release()
    _write(tmp_path, _dead_holder())
    _acquire(tmp_path, checkpoints=False).release()  # nothing of the dead run to lose
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_another_hosts_holder_is_judged_by_its_heartbeat(tmp_path):
    elsewhere = dict(this_holder("w1-smoke"), host="node-17", pid=1, run="0123456789ab")
    _write(tmp_path, elsewhere)
    with pytest.raises(LeaseError, match="is in use by run 0123456789ab .* on host node-17, process 1"):
        _acquire(tmp_path, resume=True)
    _write(tmp_path, elsewhere, age=run_lease.STALE_SECONDS + 30)
    notes = []
    _acquire(tmp_path, resume=True, notes=notes).release()
    assert "from run 0123456789ab" in notes[0] and "on host node-17" in notes[0]


def test_a_damaged_lease_is_taken_over(tmp_path):
    (tmp_path / LEASE).write_text('{"run": "abc", "ho')
    notes = []
    _acquire(tmp_path, resume=True, notes=notes).release()
    assert notes == [f"took over {tmp_path} from a damaged owner.json, which ended without releasing it"]


def test_a_requeued_slurm_job_waits_for_its_previous_run_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    previous = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    holder = dict(this_holder("w1-smoke"), pid=previous.pid, run="feedfacecafe")
    holder["pid_start"] = run_lease._process_start(previous.pid)
    _write(tmp_path, holder)
    notes, start = [], time.monotonic()
    lease = _acquire(tmp_path, resume=True, checkpoints=True, notes=notes)
    previous.wait()
    assert 0.5 < time.monotonic() - start < 30
    assert notes[0].startswith("waiting up to 60 s for the previous run of Slurm job 4242 (run feedfacecafe")
    assert notes[1].startswith(f"took over {tmp_path} from run feedfacecafe")
    lease.release()
    monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job: refused at once
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        _write(tmp_path, dict(holder, pid=other.pid, pid_start=run_lease._process_start(other.pid)))
        start = time.monotonic()
        with pytest.raises(LeaseError, match="is in use by run feedfacecafe"):
            _acquire(tmp_path, resume=True)
        assert time.monotonic() - start < 5
    finally:
        other.kill()


def test_the_heartbeat_keeps_the_lease_fresh_and_release_leaves_anothers_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lease, "HEARTBEAT_SECONDS", 0.05)
    lease = _acquire(tmp_path)
    then = time.time() - 100
    os.utime(tmp_path / LEASE, (then, then))
    time.sleep(0.3)
    assert time.time() - (tmp_path / LEASE).stat().st_mtime < 5
    (tmp_path / LEASE).write_text(json.dumps(dict(lease.holder, run="someoneelse0")))  # taken over meanwhile
    lease.release()
    assert json.loads((tmp_path / LEASE).read_text())["run"] == "someoneelse0"


def test_a_run_whose_directory_was_taken_over_finds_out_and_never_touches_the_takers_lease(tmp_path, monkeypatch):
    """A suspended job's heartbeat stopped, another run took the directory: checked before each checkpoint."""
    monkeypatch.setattr(run_lease, "HEARTBEAT_SECONDS", 0.05)
    lease = _acquire(tmp_path)
    lease.check()  # still this run's
    taker = dict(this_holder("w1-smoke"), host="node-17", pid=77, run="0123456789ab")
    _write(tmp_path, taker, age=100)
    time.sleep(0.3)  # heartbeats that would have touched it
    assert time.time() - (tmp_path / LEASE).stat().st_mtime > 90
    with pytest.raises(LeaseError, match=f"train.checkpoint_dir={tmp_path} was taken over by run 0123456789ab .* "
                                         "on host node-17, process 77 while this run gave no heartbeat"):
        lease.check()
    lease.release()
    assert json.loads((tmp_path / LEASE).read_text())["run"] == "0123456789ab"

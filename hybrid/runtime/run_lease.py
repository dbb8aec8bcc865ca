"""Which run holds a checkpoint directory: one at a time (docs/training.md, "One run per checkpoint directory").

Two runs given the same ``train.checkpoint_dir`` wrote checkpoints of the
same names, and each one's retention deleted the other's. Now a run that
writes checkpoints first takes the directory: it creates ``owner.json``
there with ``os.link`` of a file it wrote, which succeeds for one creator
only on a local filesystem, NFS and Lustre alike (``flock`` promises
nothing on the last two). It touches the file every
:data:`HEARTBEAT_SECONDS` while it runs and removes it when it ends,
stopped by a signal included.

A second run that finds the file asks whether its holder still runs. On
the holder's own host (and boot): whether its process, by PID and start
time, is alive. From another host: whether the heartbeat is younger than
:data:`STALE_SECONDS`, both times read from the filesystem's own clock (the
holder's touch, and a file this run just wrote there), so no two hosts'
clocks are compared. A live holder is refused, named. A dead one (kill -9,
a lost node) is taken over by ``--resume``, saying so; a new run takes it
over too where the dead run left no complete checkpoint, and is refused
where it did (its checkpoints would be replaced). A requeued Slurm job
(the same ``SLURM_JOB_ID``) whose previous run is still being killed waits
up to :data:`REQUEUE_WAIT_SECONDS` for it.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

LEASE = "owner.json"
HEARTBEAT_SECONDS = 5.0
STALE_SECONDS = 30.0  # six heartbeats missed: the holder on another host is gone
REQUEUE_WAIT_SECONDS = 60.0


class LeaseError(ValueError):
    """The directory is held by a run that still runs, or cannot be taken (said in one line)."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> Optional[int]:
    """The start time of process ``pid`` in clock ticks since boot (None: no such process, or one that
    has ended and waits to be reaped), which tells a PID reused by another process from the one that
    wrote a lease."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # from field 3 on: the name before ")" may hold spaces
    return None if fields[0] in ("Z", "X") else int(fields[19])


def new_run_id() -> str:
    """The id of a run that starts from iteration 0; its checkpoints and its lease carry it."""
    return uuid.uuid4().hex[:12]


def this_holder(config_name: str, run: Optional[str] = None) -> dict:
    """What a lease says of this process: its run id (``run``, or a new one), config, host, process, start."""
    pid = os.getpid()
    return {"run": run or new_run_id(), "config": config_name, "host": socket.gethostname(), "pid": pid,
            "pid_start": _process_start(pid), "boot": _boot_id(),
            "started": datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds"),
            "slurm_job": os.environ.get("SLURM_JOB_ID")}


def describe(holder: dict) -> str:
    """'run 3f2a9c1b7d0e (w1-smoke, started 2026-11-28T22:30:00+00:00) on host vm, process 4242'."""
    return (f"run {holder.get('run', '?')} ({holder.get('config', '?')}, started {holder.get('started', '?')}) "
            f"on host {holder.get('host', '?')}, process {holder.get('pid', '?')}")


def _alive(holder: dict, lease_mtime: float, now: float) -> bool:
    """Whether the run that wrote ``holder`` still runs; ``now`` is the filesystem's clock."""
    if holder.get("host") == socket.gethostname() and holder.get("boot") == _boot_id():
        start = _process_start(int(holder.get("pid", -1)))
        return start is not None and start == holder.get("pid_start")
    return now - lease_mtime < STALE_SECONDS


class Lease:
    """This run's hold on a checkpoint directory: kept fresh by a thread, released at the end."""

    def __init__(self, path: Path, holder: dict):
        self.path, self.holder = path, holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="checkpoint-dir-lease", daemon=True)
        self._thread.start()

    def _mine(self) -> bool:
        return _read(self.path) == self.holder

    def _beat(self) -> None:
        """Touch the lease while it is this run's; never another run's that took it over."""
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if not self._mine():
                return
            try:
                os.utime(self.path)
            except OSError:
                return

    def check(self) -> None:
        """Raise :class:`LeaseError` if the directory is no longer this run's: another run took it over
        after this one gave no heartbeat for :data:`STALE_SECONDS` (a suspended job, a frozen node).
        Worker 0 asks before each checkpoint, so that two runs never write into one directory."""
        found = _read(self.path)
        if found != self.holder:
            taker = describe(found) if found else "nobody (its owner.json is gone or damaged)"
            raise LeaseError(f"train.checkpoint_dir={self.path.parent} was taken over by {taker} while this run "
                             f"gave no heartbeat; this run writes no more checkpoints there")

    def release(self) -> None:
        """Stop the heartbeat and remove the lease, if it is still this run's."""
        self._stop.set()
        self._thread.join()
        if self._mine():
            self.path.unlink(missing_ok=True)


def _read(path: Path) -> Optional[dict]:
    """The holder a lease names; None if there is none; {} if it is damaged."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def acquire(root: Path, holder: dict, *, resume: bool, has_checkpoints: Callable[[], bool],
            say: Callable[[str], None] = lambda _: None) -> Lease:
    """Take ``root`` for the run ``holder`` describes, or raise :class:`LeaseError` naming who holds it.

    ``has_checkpoints()``: whether ``root`` holds a complete checkpoint (a
    new run does not take over a dead run's). ``say``: notes of what was
    found (a dead holder taken over, a requeued job's previous run waited for).
    """
    root.mkdir(parents=True, exist_ok=True)
    path = root / LEASE
    mine = root / f".{LEASE}.{holder['host']}.{holder['pid']}"
    deadline = time.monotonic() + REQUEUE_WAIT_SECONDS
    waited, taken = False, None
    try:
        while True:
            mine.write_text(json.dumps(holder))
            try:
                os.link(mine, path)
            except FileExistsError:
                pass
            else:
                if taken is not None:
                    say(f"took over {root} from {describe(taken) if taken else 'a damaged owner.json'}, which "
                        f"ended without releasing it")
                return Lease(path, holder)
            found = _read(path)
            try:
                lease_stat = path.stat()
            except FileNotFoundError:
                continue  # released as we looked: try again
            if found is None:
                continue
            if found and _alive(found, lease_stat.st_mtime, mine.stat().st_mtime):  # {}: damaged, by hand
                same_job = resume and holder["slurm_job"] and found.get("slurm_job") == holder["slurm_job"]
                if same_job and time.monotonic() < deadline:
                    if not waited:
                        say(f"waiting up to {REQUEUE_WAIT_SECONDS:.0f} s for the previous run of Slurm job "
                            f"{holder['slurm_job']} ({describe(found)}) to end")
                        waited = True
                    time.sleep(0.5)
                    continue
                raise LeaseError(f"train.checkpoint_dir={root} is in use by {describe(found)}; wait for it to end, "
                                 f"or choose another train.checkpoint_dir")
            if not resume and has_checkpoints():
                raise LeaseError(f"train.checkpoint_dir={root} holds the checkpoints of {describe(found)}, which "
                                 f"ended without releasing it (killed, or its node lost); --resume continues that "
                                 f"run, or choose another train.checkpoint_dir")
            _take_over(path, lease_stat.st_ino)
            taken = found
    finally:
        mine.unlink(missing_ok=True)


def _take_over(path: Path, inode: int) -> None:
    """Move a dead run's lease aside (one taker can), so that the next ``os.link`` creates this run's."""
    aside = path.with_name(f".{LEASE}.dead.{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another run moved it first: the link decides between us
    if aside.stat().st_ino != inode:  # a live run's lease replaced the dead one as we looked: put it back
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
    aside.unlink(missing_ok=True)

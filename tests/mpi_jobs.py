"""Helpers for tests that start their own MPI jobs and act on single ranks, under the venv's MPI family."""
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from hybrid.runtime.mpi_family import of_venv

ROOT = Path(__file__).resolve().parents[1]
FAMILY = of_venv()


def launcher(ranks: int) -> list:
    """The venv's MPI launcher for ``ranks`` ranks on this host (as root, any core count, unbound)."""
    return FAMILY.launcher(ranks)


def rank_pids(parent: int) -> dict:
    """World rank -> pid of the MPI processes below ``parent`` (a launcher) on this host.

    Open MPI's mpirun forks the ranks itself; MPICH's mpiexec starts them
    under a proxy. A rank is the first process on its branch that carries
    the family's rank variable (what a rank starts inherits it).
    """
    pids, branches = {}, [parent]
    key = FAMILY.rank_variable.encode() + b"="
    while branches:
        pid = branches.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            try:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = next((item[len(key):] for item in environ if item.startswith(key)), None)
            if rank is None:
                branches.append(child)
            else:
                pids[int(rank)] = child
    return pids


def start(command: list) -> subprocess.Popen:
    """Start ``command`` in the repository, output merged, in a session of its own (see :func:`kill`).

    ``env``: Python's copy of the environment, without what an MPI singleton
    of this test process (another test) set at C level.
    """
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ), start_new_session=True)


def kill(process: subprocess.Popen) -> None:
    """SIGKILL to every process of the job's session: killing the launcher alone left its ranks running,
    orphaned (Open MPI puts each rank in a process group of its own, so not a process group either)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[3]) == process.pid:  # field 6: the session id
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
    process.wait()


def wait_for(process: subprocess.Popen, ready, what: str, timeout: float = 120) -> None:
    """Poll ``ready()`` until true; kill the job and fail with its output if it ends or time runs out first."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            kill(process)
            raise AssertionError(f"{what} did not happen:\n{process.communicate()[0]}")
        time.sleep(0.02)


def act_mid_run(command: list, ready, what: str, act, timeout: float = 120) -> tuple[int, str]:
    """Start ``command``; once ``ready()``, call ``act(process)``; then its exit status and output.

    The job is killed if anything fails on the way, so no ranks are left behind.
    """
    process = start(command)
    try:
        wait_for(process, ready, what)
        act(process)
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            kill(process)
    return process.returncode, output


def kill_rank_mid_run(command: list, ready, what: str, rank: int) -> str:
    """kill -9 of one world rank once ``ready()``: the job must end non-zero within 30 s, the MPI's
    launcher naming what died; the job's output.

    Open MPI names the rank, its PID and the signal; Hydra (MPICH) names the
    PID and node of the first rank it saw end badly: the victim, or one it took down.
    """
    killed, pids = [], {}

    def kill(process):
        pids.update(rank_pids(process.pid))
        os.kill(pids[rank], signal.SIGKILL)
        killed.append(time.monotonic())

    status, output = act_mid_run(command, ready, what, kill, timeout=60)
    assert time.monotonic() - killed[0] < 30, output
    assert status != 0, output
    if FAMILY.name == "openmpi":
        assert f"process rank {rank} with PID" in output and "signal 9" in output, output  # and the node
    else:
        # a rank talking to the victim can abort first (UCX: process_vm_readv of a dead pid), and Hydra then
        # names that rank, exit code 6, instead of the victim
        named = re.search(r"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\s*=\s*PID (\d+)", output)
        assert named and int(named.group(1)) in pids.values(), output
        assert int(named.group(1)) != pids[rank] or "Killed (signal 9)" in output, output
    return output


def signal_rank(rank: int, signum: int):
    """An ``act`` for :func:`act_mid_run`: send ``signum`` to one world rank of an mpirun job."""
    return lambda process: os.kill(rank_pids(process.pid)[rank], signum)


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt`` in /proc): e.g. ``hybrid train``'s stop."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (signum - 1) & 1)

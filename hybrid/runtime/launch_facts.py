"""How a rank was launched, and how it must wait: the one place that decides (docs/cluster.md).

A rank that waits in MPI busy-polls by default: it keeps a core spinning
until its message arrives. That is fastest when every thread on the host has
a core of its own and ruinous when they do not: four ranks on two cores, each
with Horovod's background thread, took the CPU from one another and trained
6x slower under horovodrun and Slurm than under ``launch/mpirun.sh``, where
OpenMPI happened to see the oversubscription and yield.

Before MPI starts, every rank counts what runs on its host: the ranks the
launcher put there (each launcher says so in its own environment variable),
and per rank its compute threads plus one thread that waits in MPI
(Horovod's background thread on a worker, the serving loop on a PS rank),
against the cores it may run on. When they do not fit it makes OpenMPI yield
while idle (``OMPI_MCA_mpi_yield_when_idle=1``); a user's own setting of
that parameter (environment, ``mpirun --mca``, an MCA parameter file) wins.
MPICH has no such setting: there the rank loads ``hybrid._ext.mpi_yield``,
whose UCX progress yields, and Horovod's thread coordinates every
``HOROVOD_CYCLE_TIME`` = 10 ms instead of 1 (where unset).
The same count gives each rank's compute threads (``train.threads`` wins)
and, after MPI starts, how the runtime's own waits poll
(:class:`hybrid.runtime.comm.Roles`, :func:`idle_poll_seconds`).

The Horovod settings this runtime cannot run (Gloo) are refused here too,
before Horovod loads (:func:`check_horovod_settings`).

Nothing here imports MPI: :func:`prepare` must run before ``mpi4py.MPI``.
"""
from __future__ import annotations

import ctypes
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, MutableMapping, Optional

from hybrid.runtime.mpi_family import of_venv

YIELD_VARIABLE = "OMPI_MCA_mpi_yield_when_idle"
# Horovod's background thread meets the other workers' in an MPI collective every cycle; under MPICH,
# where waiting is polling, a cycle of 10 ms instead of 1 trained herald on MovieLens-100k (3 workers
# + 1 PS on 2 cores) at 9.0k and 9.8k samples/s against 6.1k and 5.7k, alternated (docs/cluster.md).
MPICH_CYCLE_MS = "10"
POLL_VARIABLE = "HYBRID_PS_POLL_US"  # microseconds a waiting PS rank sleeps between calls into MPI
WAITING_THREADS = 1  # per rank, a thread that waits in MPI: Horovod's background thread, a PS rank's loop
# OpenMPI reads MCA parameters from these files too (the user's first); Debian's system file
MCA_FILES = (Path.home() / ".openmpi" / "mca-params.conf", Path("/etc/openmpi/openmpi-mca-params.conf"))


@dataclass(frozen=True)
class HostShare:
    """``ranks`` ranks sharing ``cores`` cores; ``user_threads``: train.threads (0: the default compute threads)."""

    ranks: int
    cores: int
    user_threads: int = 0

    @property
    def compute_threads(self) -> int:
        """``train.threads``, else the cores per rank less one for the thread that waits in MPI (at least 1)."""
        if self.user_threads:
            return self.user_threads
        per_rank = self.cores // max(1, self.ranks)
        return per_rank - WAITING_THREADS if per_rank > WAITING_THREADS else 1

    @property
    def threads_per_rank(self) -> int:
        return self.compute_threads + WAITING_THREADS

    @property
    def fits(self) -> bool:
        """Every thread of every rank on the host has a core: a rank may spin while it waits."""
        return self.ranks * self.threads_per_rank <= self.cores

    def describe(self) -> str:
        return (f"{self.ranks} ranks x {self.threads_per_rank} threads "
                f"{'<=' if self.fits else '>'} {self.cores} cores")


def host_shares(hosts: list) -> list[tuple[int, int]]:
    """Per rank, (ranks, cores) of its machine, from every rank's ``(machine id, cores it may run on)``."""
    counts: dict = {}
    for machine, cores in hosts:
        ranks, union = counts.get(machine, (0, set()))
        counts[machine] = (ranks + 1, union | set(cores))
    return [(counts[machine][0], len(counts[machine][1])) for machine, _ in hosts]


def workers_share_cores(hosts: list, n_workers: int, user_threads: int = 0) -> bool:
    """Whether any worker (ranks ``0 .. n_workers - 1`` of ``hosts``, as :func:`host_shares` takes them) is on
    a machine whose ranks and threads outnumber its cores: one answer for every rank, so that all workers
    wait in one collective alike (``hybrid.runtime.comm.Roles.patient_workers``)."""
    return any(not HostShare(ranks, cores, user_threads).fits for ranks, cores in host_shares(hosts)[:n_workers])


@dataclass(frozen=True)
class LaunchFacts:
    """What the summary reports about the launch (``summary["launch"]``)."""

    launcher: str  # horovodrun, mpirun, srun, mpiexec (MPICH) or none (one process)
    via: Optional[str]  # the sbatch template that ran the launcher, if any
    ranks_on_host: int
    ranks_on_host_from: str  # the variable that said so
    cores: int
    compute_threads: int
    threads_per_rank: int
    fits: bool  # every thread on the host has a core (HostShare.fits), whatever the user's MPI setting says
    yields: bool
    decided_by: str

    def to_dict(self) -> dict:
        return asdict(self)


def launcher(environ: Mapping[str, str]) -> str:
    """Which launcher started this process: the project's scripts say so, else the launcher's own variables."""
    if environ.get("HYBRID_LAUNCHER"):
        return environ["HYBRID_LAUNCHER"]
    if "OMPI_COMM_WORLD_SIZE" in environ:
        return "mpirun"
    if "SLURM_STEP_ID" in environ and ("PMIX_RANK" in environ or "PMI_RANK" in environ):
        return "srun"
    if "PMI_RANK" in environ:
        return "mpiexec (MPICH)"
    return "none"


def ranks_on_host(environ: Mapping[str, str]) -> tuple[int, str]:
    """The ranks the launcher put on this host, and the variable that said so (1 and 'none' alone).

    Ranks of one machine in separate network namespaces look like separate
    hosts here; :class:`hybrid.runtime.comm.Roles` counts them exactly once
    MPI has started, and the summary reports both.
    """
    # HYBRID_RANKS_PER_HOST: a launcher that knows better (hybrid bench e2e: namespaces of one machine)
    for name in ("HYBRID_RANKS_PER_HOST", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if environ.get(name, "").isdigit():
            return int(environ[name]), name
    per_node = _slurm_tasks_here(environ.get("SLURM_STEP_TASKS_PER_NODE", ""), environ.get("SLURM_NODEID", "0"))
    if per_node:
        return per_node, "SLURM_STEP_TASKS_PER_NODE"
    return 1, "none"


def _slurm_tasks_here(spec: str, node_id: str) -> int:
    """Tasks on node ``node_id`` from Slurm's compressed per-node list, e.g. ``'5(x2),4'`` (0: unknown)."""
    counts = []
    for part in filter(None, spec.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            return 0
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    index = int(node_id) if node_id.isdigit() else 0
    return counts[index] if index < len(counts) else 0


def user_yield_setting(environ: Mapping[str, str], files=MCA_FILES) -> Optional[tuple[bool, str]]:
    """Whether the user asked OpenMPI to yield, and where, or None: theirs wins over this module's."""
    if YIELD_VARIABLE in environ:
        return _is_true(environ[YIELD_VARIABLE]), f"{YIELD_VARIABLE}={environ[YIELD_VARIABLE]}"
    for path in files:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            match = re.fullmatch(r"\s*mpi_yield_when_idle\s*=\s*(\S+)\s*", line.split("#", 1)[0])
            if match:
                return _is_true(match.group(1)), f"mpi_yield_when_idle={match.group(1)} in {path}"
    return None


def _is_true(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on", "t", "y")


def decide(environ: Mapping[str, str], cores: int, user_threads: int = 0, files=MCA_FILES) -> LaunchFacts:
    """The decision for a rank with this environment and ``cores`` usable cores (pure: changes nothing)."""
    ranks, source = ranks_on_host(environ)
    share = HostShare(ranks, cores, user_threads)
    user = user_yield_setting(environ, files)
    if user is not None:
        yields, why = user[0], f"user: {user[1]}"
    else:
        yields, why = not share.fits, f"hybrid: {share.describe()}"
    return LaunchFacts(launcher=launcher(environ), via=environ.get("HYBRID_LAUNCH_VIA") or None,
                       ranks_on_host=ranks, ranks_on_host_from=source, cores=cores,
                       compute_threads=share.compute_threads, threads_per_rank=share.threads_per_rank,
                       fits=share.fits, yields=yields, decided_by=why)


def scheduler_threads(configured: int, user_threads: int = 0,
                      environ: Optional[Mapping[str, str]] = None) -> int:
    """``scheduler.threads``, else the rank's compute threads (the cores its share of the host gives).

    The scheduler runs ahead of training in its own thread; its OpenMP
    threads exist only while one of its stages runs, on the cores the rank's
    compute threads use (docs/cluster.md, "How ranks wait").
    """
    if configured:
        return configured
    return decide(os.environ if environ is None else environ, usable_cores(), user_threads).compute_threads


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a cgroup's or a binding's limit included)."""
    return len(os.sched_getaffinity(0))


def prepare(user_threads: int = 0, environ: Optional[MutableMapping[str, str]] = None) -> LaunchFacts:
    """Decide, then set what MPI and OpenMP read when they start; call before ``mpi4py.MPI`` and torch load.

    Sets ``OMPI_MCA_mpi_yield_when_idle=1`` where the ranks do not fit (never
    over a user's setting) and ``OMP_NUM_THREADS`` to the compute threads
    where unset. Where the ranks do not fit, OpenMP's idle threads sleep too
    (``OMP_WAIT_POLICY=PASSIVE``, where unset): spinning between the
    scheduler's parallel regions, they took the cores the other ranks
    train on (docs/cluster.md, "How ranks wait").
    """
    environ = os.environ if environ is None else environ
    facts = decide(environ, usable_cores(), user_threads)
    if facts.yields and facts.decided_by.startswith("hybrid"):
        environ[YIELD_VARIABLE] = "1"
        if of_venv().name == "mpich":
            yield_under_mpich(environ)
    if not facts.fits:
        environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    environ.setdefault("OMP_NUM_THREADS", str(facts.compute_threads))
    return facts


def yield_under_mpich(environ: MutableMapping[str, str]) -> None:
    """Make this process's MPICH yield while it waits: load ``hybrid._ext.mpi_yield`` with ``RTLD_GLOBAL``
    before ``mpi4py.MPI`` loads MPICH, so that MPICH's calls to UCX's progress bind to its yielding one;
    and slow Horovod's coordination cycle (``HOROVOD_CYCLE_TIME``, where unset)."""
    from hybrid._ext import mpi_yield

    ctypes.CDLL(mpi_yield.__file__, mode=os.RTLD_GLOBAL)
    environ.setdefault("HOROVOD_CYCLE_TIME", MPICH_CYCLE_MS)


def check_horovod_settings(environ) -> None:
    """Refuse Horovod's Gloo settings before ``hvd.init``, which would crash or miscount on them.

    The workers' Horovod runs on their MPI communicator, without the PS
    ranks. Horovod 0.28.1's Gloo operations (``HOROVOD_CPU_OPERATIONS=gloo``)
    end it with a segmentation fault there, and its Gloo controller
    (``HOROVOD_CONTROLLER=gloo``) ignores the communicator
    (docs/cluster.md, "launch/mpirun.sh and TCP").
    """
    for name in ("HOROVOD_CPU_OPERATIONS", "HOROVOD_CONTROLLER"):
        if environ.get(name, "").strip().lower() == "gloo":
            raise ValueError(f"{name}=gloo cannot run here: Horovod runs on the workers' MPI communicator, where "
                             f"Horovod 0.28.1's Gloo {'operations crash' if 'CPU' in name else 'controller ignores it'}"
                             f"; unset {name} (CPU workers allreduce with MPI, GPU workers with NCCL)")


def idle_poll_seconds(library: str, environ=os.environ, core_each: bool = False) -> float:
    """How long a rank waiting in ``comm.idle_barrier`` sleeps between calls into MPI (docs/cluster.md).

    Open MPI completes one-sided operations at the origin (shared memory,
    RDMA), so a PS rank need not call into MPI while it waits: 1 ms. (Not
    entirely: with 1 worker + 1 PS on 2 cores a PS that never slept made the
    pulls faster, 0.34-0.40 ms per iteration against 0.64-0.82 at 50-1000 us
    polls, but the pushes slower, 1.09-1.61 ms against 0.35-0.72: 1 ms stays.) MPICH
    without asynchronous progress completes them only when the PS calls
    into MPI, so each pull waits for the PS's next poll: 100 us (measured
    with 1 worker + 1 PS: a pull of 512 rows took 1.25 ms at 1 ms polls and
    0.26 ms at 100 us, for 14% of a core instead of 3%). Where every rank
    on the host has a core of its own (``core_each``), 0: the PS tests its
    barrier without sleeping, at full speed on its own core (1 worker + 1
    PS on 2 cores pulled in 0.25-0.26 ms per iteration, against 0.37-0.39
    at 20 us polls, whose sleeps the kernel's timer slack stretches). With
    more ranks than cores the PS's polls take the workers' cores: there a
    PS waiting inside MPI trained 3 workers + 1 PS slower.
    ``HYBRID_PS_POLL_US`` overrides all (0: never sleep).
    """
    if environ.get(POLL_VARIABLE):
        try:
            poll = float(environ[POLL_VARIABLE])
        except ValueError:
            poll = -1.0
        if not 0 <= poll <= 1e6:
            raise ValueError(f"{POLL_VARIABLE}={environ[POLL_VARIABLE]!r}: give microseconds between 0 and 1e6 "
                             f"(a waiting PS rank sleeps that long between calls into MPI; 0: it never sleeps)")
        return poll * 1e-6
    if "MPICH" not in library:
        return 1e-3
    return 0.0 if core_each else 1e-4

"""Process roles and the collectives the runtime needs (docs/design.md section 2).

``COMM_WORLD`` is split into workers (ranks ``0 .. n-1``: worker ``w`` is
world rank ``w``) and PS ranks (the last ``n_ps`` ranks). Horovod is
initialized on the workers' communicator only, so PS ranks never join an
allreduce. Before anything else, every rank checks that all ranks resolved
the same config and read the same data: a mismatch would deadlock or
silently diverge, so it stops every rank with one message instead.

This module and ``rma_store`` (the windows) are the only ones that touch
MPI; Horovod is imported here, lazily, so data tools run without it, and
training runs without it too: :class:`MpiCollectives` does what the
runtime asks of Horovod with MPI (``train.allreduce=mpi``, or ``auto``
where Horovod is not installed or not worth its cost: see
:func:`worker_collectives`; docs/training.md, "GPU").
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from hybrid.runtime.launch_facts import (HostShare, check_horovod_settings, host_shares, idle_poll_seconds,
                                         workers_share_cores)


# a worker waiting in a collective while ranks share cores sleeps this long between tests of it
PATIENT_POLL_SECONDS = 0.0002


class RoleError(ValueError):
    """The job was launched with a rank count that cannot fit the config."""


class AgreementError(RuntimeError):
    """Ranks disagree on something that must be identical everywhere."""


@dataclass(frozen=True)
class Roles:
    world: MPI.Comm
    n_workers: int
    n_ps: int
    workers: MPI.Comm  # MPI.COMM_NULL on PS ranks
    node_ranks: int = 1  # ranks on this rank's machine (network namespaces of one machine included)
    node_cores: int = 1  # cores those ranks may run on, together
    stops: MPI.Comm = field(default_factory=lambda: MPI.COMM_NULL)  # world's duplicate: PS stop requests to worker 0
    user_threads: int = 0  # train.threads (0: the default)
    # some worker's host has more ranks and threads than cores: every worker then waits in its collectives
    # by sleeping between tests of a non-blocking one (all alike: a blocking and a non-blocking call of one
    # collective never match)
    patient_workers: bool = False

    @property
    def share(self) -> HostShare:
        """This machine's ranks and cores, counted exactly (the launch decision had only the launcher's word)."""
        return HostShare(self.node_ranks, self.node_cores, self.user_threads)

    @property
    def oversubscribed(self) -> bool:
        """The host's ranks and their threads outnumber its cores: a rank that spins while waiting takes another's core."""
        return not self.share.fits

    @property
    def threads(self) -> int:
        """Compute threads per rank (hybrid.runtime.launch_facts.HostShare)."""
        return self.share.compute_threads

    @property
    def poll_seconds(self) -> float:
        """A waiting PS rank's sleep between calls into MPI: for this MPI, and whether each rank of this
        machine has a core of its own (:func:`hybrid.runtime.launch_facts.idle_poll_seconds`)."""
        return idle_poll_seconds(MPI.Get_library_version(), core_each=self.node_ranks <= self.node_cores)

    def worker_barrier(self) -> None:
        """The workers' barrier (see :meth:`worker_barrier_max`)."""
        self.worker_barrier_max(0)

    def worker_barrier_max(self, value: int) -> int:
        """A workers' barrier that also returns the largest ``value`` passed (e.g. a stop request's code).

        One tiny allreduce costs what a barrier costs, so every iteration can
        end with it. It is MPI's (spinning) when each rank has a core, and
        sleeps between tests when some worker's ranks share cores
        (``patient_workers``, alike on every worker). One worker has nobody to wait for.
        """
        if self.n_workers == 1:
            return value
        mine = np.array([value], dtype=np.int32)
        largest = np.zeros(1, dtype=np.int32)
        if self.patient_workers:
            request = self.workers.Iallreduce(mine, largest, op=MPI.MAX)
            while not request.Test():
                time.sleep(PATIENT_POLL_SECONDS)
        else:
            self.workers.Allreduce(mine, largest, op=MPI.MAX)
        return int(largest[0])

    def tell_worker_0(self, code: int) -> tuple[MPI.Request, np.ndarray]:
        """A PS rank's stop request to worker 0; keep the buffer until the request completes."""
        message = np.array([code], dtype=np.int32)
        return self.stops.Isend(message, dest=0), message

    def stop_requests(self) -> int:
        """Worker 0: the largest stop code PS ranks sent since the last call (0: none). A local probe."""
        largest, message = 0, np.zeros(1, dtype=np.int32)
        status = MPI.Status()
        while self.stops.Iprobe(source=MPI.ANY_SOURCE, status=status):
            self.stops.Recv(message, source=status.Get_source())
            largest = max(largest, int(message[0]))
        return largest

    def worker_max(self, value: int) -> int:
        """The largest ``value`` over the workers (collective over the workers)."""
        return self.workers.allreduce(value, op=MPI.MAX)

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def is_ps(self) -> bool:
        return self.world.rank >= self.n_workers

    @property
    def worker(self) -> int | None:
        """This rank's worker index, or None on a PS rank."""
        return None if self.is_ps else self.world.rank

    @property
    def ps_ranks(self) -> list[int]:
        return list(range(self.n_workers, self.n_workers + self.n_ps))

    def free(self) -> None:
        for comm in (self.workers, self.stops):
            if comm != MPI.COMM_NULL:
                comm.Free()


def split_roles(n_workers: int, n_ps: int, world: MPI.Comm = MPI.COMM_WORLD, user_threads: int = 0) -> Roles:
    """Split ``world`` into ``n_workers`` workers and ``n_ps`` PS ranks (collective); ``user_threads``: train.threads."""
    if n_workers < 1 or n_ps < 1:
        raise RoleError(f"need at least one worker and one PS rank, got {n_workers} and {n_ps}")
    if world.size != n_workers + n_ps:
        raise RoleError(f"the config asks for cluster.workers={n_workers} + cluster.ps={n_ps} = "
                        f"{n_workers + n_ps} ranks, but {world.size} were started; launch with "
                        f"-n {n_workers + n_ps} or change cluster.workers")
    is_worker = world.rank < n_workers
    workers = world.Split(0 if is_worker else MPI.UNDEFINED, world.rank)
    machine = _machine_id()
    everyone = world.allgather((machine, os.sched_getaffinity(0)))
    ranks, cores = host_shares(everyone)[world.rank]
    return Roles(world=world, n_workers=n_workers, n_ps=n_ps, workers=workers, node_ranks=ranks, node_cores=cores,
                 stops=world.Dup(), user_threads=user_threads,
                 patient_workers=workers_share_cores(everyone, n_workers, user_threads))


def _machine_id() -> str:
    """What identifies the machine whose cores this rank shares: the kernel's boot id.

    Not MPI's shared-memory node: ranks in separate network namespaces (or
    containers) of one machine are separate MPI nodes but share its cores.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return MPI.Get_processor_name()


def check_agreement(world: MPI.Comm, explain: dict | None = None, **values: str) -> None:
    """Raise :class:`AgreementError` on every rank unless all ranks passed equal values (collective).

    ``explain`` maps a key to this rank's flat ``{name: value}`` dict behind
    it (e.g. the config's keys behind its digest): a disagreement then also
    names the entries that differ, not only two digests.
    """
    everyone = world.allgather((values, explain or {}))
    for key in values:
        seen = [v.get(key) for v, _ in everyone]
        if len(set(seen)) > 1:
            groups: dict = {}
            for rank, value in enumerate(seen):
                groups.setdefault(value, []).append(rank)
            detail = "; ".join(f"ranks {ranks}: {value}" for value, ranks in groups.items())
            differing = _differing([everyone[ranks[0]][1].get(key, {}) for ranks in groups.values()])
            raise AgreementError(f"ranks disagree on {key} ({detail}){differing}; every rank must use the "
                                 f"same config file, overrides and data store")


def _differing(versions: list[dict]) -> str:
    """'': nothing to compare; else ', differing in a (1 vs 2), b (...)' over the first five entries."""
    names = sorted({name for version in versions for name in version
                    if len({repr(v.get(name)) for v in versions}) > 1})
    if not names:
        return ""
    shown = ", ".join(f"{name} ({' vs '.join(repr(v.get(name)) for v in versions)})" for name in names[:5])
    return f", differing in {shown}"


def idle_barrier(comm: MPI.Comm, poll_seconds: float | None = None) -> None:
    """A barrier that sleeps instead of spinning (collective).

    PS ranks wait out a whole training run in a barrier. MPI's blocking
    barrier polls at full speed and, with more ranks than cores, takes CPU
    from the workers; this one tests a non-blocking barrier every
    ``poll_seconds`` (None: :func:`idle_poll_seconds` for this MPI). Each
    test also drives MPI progress for passive-target operations on the MPIs
    that need it. ``poll_seconds=0`` tests without sleeping: progress at
    full speed, for a rank with a core of its own. Never a blocking
    ``Wait``: a PS forwards a signal from its Python handler, which runs
    only between calls into MPI (docs/design.md, section 13).
    """
    if poll_seconds is None:
        poll_seconds = idle_poll_seconds(MPI.Get_library_version())
    request = comm.Ibarrier()
    while not request.Test():
        if poll_seconds:
            time.sleep(poll_seconds)


# MPICH's Hydra drops what its proxies have not yet forwarded when a rank aborts: the error that
# ended a job was missing from its output in one CI run under MPICH (tests/unit/training/test_resume.py).
ABORT_GRACE_SECONDS = 1.0


def abort_job(code: int) -> None:
    """End every rank after this rank's output has left: flush, give the launcher time to forward it, abort."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_SECONDS)
    MPI.COMM_WORLD.Abort(code)


def worker_collectives(roles: Roles, allreduce: str, gpu: bool = False):
    """The workers' collectives (allreduce, broadcast, local rank): Horovod's, or :class:`MpiCollectives`.

    ``train.allreduce=mpi`` never loads Horovod, nor does ``auto`` where
    Horovod would cost more than it gives: a run of one worker (nothing to
    sum), and CPU workers (``gpu`` False on every worker) whose ranks share
    their host's cores, where Horovod's background thread, coordinating every
    cycle, took 15-17% of a core per worker of 3 workers + 1 PS on 2 cores
    and MPI's sum, waiting without spinning, trains faster (docs/cluster.md,
    "MPI families"). Otherwise the workers load it where every one of them
    has it installed; where one has not, ``auto`` gives every worker MPI's
    collectives and ``horovod``/``host`` are refused, naming the workers. The
    workers decide together: a sum that some run through Horovod and others
    through MPI would never complete. None on PS ranks, which never join a
    workers' collective.
    """
    if roles.is_ps:
        return None
    if allreduce == "mpi":
        return MpiCollectives(roles.workers, "asked for (train.allreduce=mpi)", patient=roles.patient_workers)
    facts = roles.workers.allgather((importlib.util.find_spec("horovod") is not None, gpu, roles.oversubscribed))
    installed, gpus, shared = (list(column) for column in zip(*facts))
    missing = ", ".join(str(w) for w, found in enumerate(installed) if not found)
    if missing and allreduce != "auto":
        raise RoleError(f"train.allreduce={allreduce} needs Horovod, which worker(s) {missing} cannot import "
                        f"(launch/setup.sh builds it); train.allreduce=auto or mpi sums with MPI instead")
    if allreduce == "auto" and roles.n_workers == 1:
        return MpiCollectives(roles.workers, "one worker", patient=roles.patient_workers)
    if missing:
        return MpiCollectives(roles.workers, f"Horovod is not installed (worker(s) {missing})",
                              patient=roles.patient_workers)
    if allreduce == "auto" and not any(gpus) and all(shared):
        return MpiCollectives(roles.workers, "CPU workers whose ranks share cores (Horovod's coordination cycle "
                                             "would take a core's share from training)", patient=True)
    return init_horovod(roles)


def init_horovod(roles: Roles):
    """``hvd.init`` on the workers' communicator; returns the module (None on PS ranks)."""
    if roles.is_ps:
        return None
    check_horovod_settings(os.environ)  # before Horovod loads: its Gloo settings crash it
    import horovod.torch as hvd

    hvd.init(comm=roles.workers)
    if hvd.size() != roles.n_workers:
        raise RoleError(f"Horovod sees {hvd.size()} workers, expected {roles.n_workers}")
    return hvd


class MpiCollectives:
    """What the runtime asks of ``horovod.torch``, done by MPI on the workers' communicator.

    Each sum starts when the last worker calls it, in the calling thread (no
    coordination cycle to wait for), over host memory: GPU tensors are
    staged by the caller (hybrid.runtime.accelerator.HostStagedOptimizer).
    A sum is a reduce-scatter and an allgather (:meth:`_sum_in_chunks`):
    every worker gets the same sum, added in worker order, so replicas that
    apply it (FAE's hot rows, the MLP) stay equal. ``reason`` says why the
    run uses it; the training summary prints it. ``patient``: the ranks share
    cores, so a worker waiting for the others' sum sleeps between tests of a
    non-blocking one instead of spinning on a core they need (as
    :meth:`Roles.worker_barrier_max`); it must be alike on every worker
    (``Roles.patient_workers``).
    """

    Sum = "sum"

    def __init__(self, workers: MPI.Comm, reason: str, patient: bool = False):
        self.comm, self.reason, self.patient = workers, reason, patient
        machines = workers.allgather(_machine_id())
        self._local_rank = machines[:workers.rank].count(machines[workers.rank])

    def size(self) -> int:
        return self.comm.size

    def rank(self) -> int:
        return self.comm.rank

    def local_rank(self) -> int:
        """This worker's index among the workers of its machine (which GPU it takes)."""
        return self._local_rank

    def nccl_built(self) -> bool:
        return False

    def gloo_enabled(self) -> bool:
        return False

    def allreduce_(self, tensor, op: str = Sum, name: str = "") -> object:
        """Sum a contiguous host ``tensor`` over the workers, in place."""
        self._check(tensor, op)
        if self.comm.size > 1:
            self._sum_in_chunks(tensor.numpy().reshape(-1))
        return tensor

    def allreduce_rounded_(self, tensor, wire) -> object:
        """Sum a contiguous host ``tensor`` over the workers in place, every value on the wire in ``wire``'s 16 bits.

        Worker ``c`` adds everyone's rounded chunk ``c`` in the tensor's
        precision and rounds the sum (docs/design.md section 14): half the
        bytes of the fp32 sum, and a sum defined to the bit, which a
        reference can repeat (Horovod's ``Compression.fp16`` adds in 16 bits
        in the ring's order).
        """
        self._check(tensor, self.Sum)
        if self.comm.size > 1:
            self._sum_in_chunks(tensor.numpy().reshape(-1), wire)
        return tensor

    def _sum_in_chunks(self, values: np.ndarray, wire=None) -> None:
        """``values`` = their sum over the workers: a reduce-scatter, then an allgather.

        ``Alltoall`` gives worker ``c`` chunk ``c`` of every worker's values;
        it adds them in worker order and ``Allgather`` gives every worker
        every chunk's sum. Each worker sends ``(n - 1) / n`` of the values
        twice, as a ring allreduce does. It replaced ``MPI_Allreduce``, whose
        non-blocking form under Open MPI (libnbc) takes a binomial tree for an
        in-place sum over fewer than 4 ranks: the root of 3 CPU workers sent
        7.9 MB per W1 iteration, the others 4.3 (``hybrid bench e2e``,
        docs/benchmarks.md). With ``wire`` (16 bits) the values travel as its
        bits and the sum is rounded before the allgather.
        """
        n = self.comm.size
        chunk = -(-len(values) // n)
        mine = np.zeros(n * chunk, dtype=np.uint16 if wire is not None else values.dtype)
        mine[:len(values)] = values if wire is None else wire.encode(values)
        theirs = np.empty_like(mine)
        self._collective("Alltoall", mine, theirs)
        parts = theirs if wire is None else wire.decode(theirs, np.empty(n * chunk, dtype=values.dtype))
        parts = parts.reshape(n, chunk)
        total = parts[0].copy()
        for part in parts[1:]:  # worker order
            total += part
        summed = np.empty_like(mine)
        self._collective("Allgather", total if wire is None else wire.encode(total), summed)
        if wire is None:
            values[:] = summed[:len(values)]
        else:
            wire.decode(summed[:len(values)], values)

    def _collective(self, name: str, send: np.ndarray, receive: np.ndarray) -> None:
        """``Alltoall`` or ``Allgather``: blocking, or when ``patient`` its non-blocking form, tested between sleeps."""
        if not self.patient:
            getattr(self.comm, name)(send, receive)
            return
        request = getattr(self.comm, "I" + name.lower())(send, receive)
        while not request.Test():
            time.sleep(PATIENT_POLL_SECONDS)

    def allreduce(self, tensor, op: str = Sum, name: str = "") -> object:
        """The sum of a host ``tensor`` over the workers, as a new tensor."""
        return self.allreduce_(tensor.detach().clone().contiguous(), op, name)

    def broadcast_parameters(self, state: dict, root_rank: int) -> None:
        """Every tensor of ``state`` from worker ``root_rank`` (through host memory for GPU tensors)."""
        import torch  # workers only

        for tensor in state.values():
            host = tensor.detach().cpu().contiguous()
            self.comm.Bcast(host.numpy(), root=root_rank)
            if self.comm.rank != root_rank:
                with torch.no_grad():
                    tensor.copy_(host)

    def shutdown(self) -> None:
        """Nothing to stop: the communicator belongs to :class:`Roles`."""

    def _check(self, tensor, op: str) -> None:
        if op != self.Sum or tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"MpiCollectives sums contiguous host tensors only (op {op!r}, {tensor.device})")


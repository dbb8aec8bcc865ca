"""A time model of one BSP iteration: the runtime's stages, from counts, a cluster and calibrated costs.

The loop's stages (docs/design.md section 11) and what each one waits for:

- ``data``: the next batch's inputs, per sample.
- ``pull``: the write-backs and the pulls of this iteration, one operation
  per PS rank each, completed together: each operation's own cost, each
  row's, and the bytes over the links (below). At its end the pulls of
  the next iteration (prefetch) leave the PS; they travel while this one
  computes.
- ``compute``: forward, backward and the optimizer step, per sample, on
  the worker's device.
- ``allreduce``: the MLP's gradients summed over the workers (inside a
  host through memory; between hosts Horovod's ring, or where the workers
  sum patiently the runtime's MPI sum: an ``Alltoall`` then an
  ``Allgather``), and the calls around it (with one worker, only those).
- ``push``: each worker updates its rows, then writes them to the PS; the
  writes overlap the next batch's ``data``, and the stage ends when they
  and the prefetch have arrived (the loop's flush).
- ``barrier`` and ``other``: a fixed cost per iteration (the barrier's
  latency terms grow with the ranks' log).
- ``schedule``: CPU workers make each plan on their own cores (the
  scheduler thread shares the interpreter with the loop, docs/benchmarks.md
  issue 54), so its time per global batch is CPU work of the iteration,
  but for what it hides: the loop gives the thread its turn while it waits
  in the allreduce, and while the sum's bytes are on the links every
  rank waits and the cores are free.
  GPU workers make it while the device computes: it shows only as
  ``schedule_wait``, where it takes longer than the iteration.

CPU workers whose ranks share cores do all their CPU work (every stage but
the bytes on the links) slower by the share measured on the machine
(``Profile.shares``: the floor in several processes side by side), or by
``busy ranks / cores`` where it was not measured (in ``compute`` only the
workers count, ``Cluster.computing_ranks``); and they wait in their
two collectives patiently, each step of a collective lasting about one of
the sleeps between tests (``Profile.collectives``, measured).

Bytes over the links: every worker of a host moves its rows through that
host's NIC, and every PS host's NIC carries what all workers move from and
to it. Each NIC direction carries its transfers one after another, a
transfer lasting as long as its slower end; an emulated NIC passes its
first bytes after a pause at once (its token bucket). The iteration is
therefore played on the NICs for a few iterations before the one reported
(:func:`stage_ms`). With every rank on one host there is no link: the
operations' own costs, calibrated on that host, are the whole cost.

BSP: an iteration lasts as long as its busiest worker, so ``Load`` holds
the busiest worker's rows and the busiest PS rank's. The model and its
inputs are described in docs/projection.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import partial
from typing import Optional

STAGES = ("data", "pull", "compute", "allreduce", "push", "barrier", "other", "schedule")


@dataclass(frozen=True)
class Cluster:
    """Where the ranks run and what connects them.

    ``gbps``: each host's NIC, per direction; ``None``: no link to price
    (every rank on one host; with ``one_machine``, unshaped emulated links,
    whose cost is in the operations calibrated across them).
    ``cores_per_host``: CPU workers only (``None`` for GPU workers, whose
    compute does not share the host's cores). ``one_machine``: the hosts
    are emulated on one machine (``hybrid bench e2e``), whose
    ``cores_per_host`` cores every rank shares. ``burst_bytes``: what a
    NIC passes at once before its rate applies, after a pause long enough
    to refill it: an emulated link's token bucket (``LinkShape.burst_bytes``,
    256 KiB up to 1 Gbit/s); 0 for a real NIC.
    """

    workers: int
    ps: int
    workers_per_host: int = 1
    gbps: Optional[float] = None
    latency_ms: float = 0.0
    cores_per_host: Optional[int] = None
    one_machine: bool = False
    burst_bytes: float = 0.0

    def __post_init__(self):
        if self.workers < 1 or self.ps < 1 or self.workers_per_host < 1:
            raise ValueError(f"a cluster needs at least one worker, one PS and one worker per host; got "
                             f"workers={self.workers}, ps={self.ps}, workers_per_host={self.workers_per_host}")
        if self.gbps is not None and self.gbps <= 0:
            raise ValueError(f"gbps must be positive (or None for one host), got {self.gbps}")
        if self.latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")
        if self.cores_per_host is not None and self.cores_per_host < 1:
            raise ValueError(f"cores_per_host must be >= 1, got {self.cores_per_host}")
        if self.burst_bytes < 0:
            raise ValueError(f"burst_bytes must be >= 0, got {self.burst_bytes}")

    @property
    def worker_hosts(self) -> int:
        return -(-self.workers // self.workers_per_host)

    @property
    def patient(self) -> bool:
        """Whether the workers wait patiently in their collectives (``hybrid.runtime.comm``): some worker's
        host has more ranks than cores (on one host, or hosts emulated on one machine, every rank counts)."""
        if self.cores_per_host is None:
            return False
        on_host = self.workers + self.ps if self.gbps is None or self.one_machine else self.workers_per_host
        return on_host > self.cores_per_host

    @property
    def computing_ranks(self) -> int:
        """Ranks sharing a worker's cores while it computes: its host's busy workers only, which compute in step.
        A PS rank on an emulated host serves messages in the pull and push stages and sleeps between them
        (``hybrid.runtime.packed_transport``): over a whole MovieLens-100k run, vanilla, 3 workers + 1 PS on 2
        cores, it used 0.64 s of CPU in 4.6 s, each worker 2.5-2.6 (docs/projection.md, "Sixth run")."""
        return min(self.busy_ranks, self.workers)

    @property
    def busy_ranks(self) -> int:
        """Ranks computing on the cores a worker shares: the workers of its host (of all hosts on one
        machine), and on one machine the PS ranks when they serve messages (across links); one-sided
        operations leave the PS rank idle."""
        if self.one_machine:
            return self.workers + self.ps
        if self.gbps is None:
            return self.workers
        return min(self.workers, self.workers_per_host)


@dataclass(frozen=True)
class Profile:
    """Costs calibrated on a machine (``hybrid project --calibrate``), in milliseconds.

    ``op_ms`` and ``row_ms``: one store operation to one PS rank, and each
    of its rows, on the worker's side (issue, routing, staging, completion);
    ``update_row_ms``: each trained row's update in the worker's cache;
    ``sample_ms``: compute per sample on one core or device, ``compute_ms``
    per iteration besides; ``data_sample_ms``: staging the inputs per
    sample; ``allreduce_ms``: the allreduce stage's own calls, besides its
    bytes; ``barrier_ms`` and ``other_ms``: per iteration;
    ``schedule_ms``: the scheduler's time per global batch by worker count
    (interpolated in between, linearly beyond the largest); ``shares``: how
    much slower CPU work runs with that many busy processes on the
    machine's cores, ``((processes, factor), ...)``; ``collectives``: what
    the workers' sum of the MLP and their barrier take when they wait
    patiently (their ranks share cores) among that many workers, measured
    alone (``collective_probe``), ``((workers, allreduce ms, barrier ms), ...)``.
    """

    op_ms: float
    row_ms: float
    sample_ms: float
    update_row_ms: float = 0.0
    compute_ms: float = 0.0
    data_sample_ms: float = 0.0
    allreduce_ms: float = 0.0
    barrier_ms: float = 0.0
    other_ms: float = 0.0
    schedule_ms: tuple = ()  # ((workers, ms per global batch), ...)
    shares: tuple = ()  # ((busy processes, slowdown), ...)
    collectives: tuple = ()  # ((workers, allreduce ms, barrier ms), ...)

    def _costs(self) -> dict:
        """The costs in milliseconds (all but the tables of the scheduler's time, shares and collectives)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("schedule_ms", "shares", "collectives")}

    def __post_init__(self):
        negative = [name for name, value in self._costs().items() if value < 0]
        if negative:
            raise ValueError(f"profile costs must be >= 0: {', '.join(negative)}")

    def slower(self, factor: float) -> "Profile":
        """This profile on a machine ``factor`` times slower (every CPU cost; the shares are ratios already)."""
        costs = {name: value * factor for name, value in self._costs().items()}
        return Profile(**costs, schedule_ms=tuple((w, ms * factor) for w, ms in self.schedule_ms), shares=self.shares,
                       collectives=self.collectives)

    def floor_ms(self, samples: float) -> float:
        """The floor's ms per iteration at ``samples`` per iteration, as calibrated."""
        return self.compute_ms + samples * self.sample_ms

    def schedule_at(self, workers: int) -> float:
        """The scheduler's ms per global batch at ``workers`` (0 when not calibrated)."""
        return _interpolate(self.schedule_ms, workers) if self.schedule_ms else 0.0

    def share_at(self, processes: int, cores: int) -> float:
        """How much slower CPU work runs with ``processes`` busy on ``cores`` (at least 1)."""
        if processes <= 1:
            return 1.0
        if not self.shares:
            return max(1.0, processes / cores)
        return max(1.0, _interpolate(((1, 1.0), *self.shares), processes))


    def patient_collectives(self, workers: int) -> tuple:
        """(allreduce ms, barrier ms) of ``workers`` waiting patiently, as measured (0 when not measured)."""
        if workers <= 1 or not self.collectives:
            return 0.0, 0.0
        return tuple(_interpolate([(w, point[k]) for w, *point in self.collectives], workers) for k in (0, 1))


def _interpolate(points, x: float) -> float:
    """Piecewise linear through ``points`` ((x, y), ...); through the origin below the first, along the last
    segment beyond the last (proportionally when there is one point)."""
    points = sorted(points)
    if x <= points[0][0]:
        return points[0][1] * x / points[0][0]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if len(points) == 1:
        return points[0][1] * x / points[0][0]
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


@dataclass(frozen=True)
class Load:
    """One iteration's work (a mean over a run's iterations), from the simulator's events (``loads``).

    Per stage the busiest worker's rows (each stage's maximum over the
    workers, which may be different workers): read in ``pull``
    (``pull_rows``), written back there (``writeback_rows``), version
    checks there (``check_rows``, HET; ``CHECK_BYTES`` each), received
    from peers (``p2p_rows``), read ahead for the next iteration
    (``prefetch_rows``), written in ``push`` (``push_rows``), updated in
    its cache in ``push`` (``update_rows``: every row it trained); the
    operations those take, one per PS rank each reaches (``pull_ops``,
    ``push_ops``). Per PS rank the busiest one's rows of each kind, summed
    over the workers (``ps_*``). ``row_bytes``: a row on the wire (its id
    included); ``mlp_bytes``: the MLP's gradients allreduced.

    FAE (means over its hot and cold iterations): ``hot_allreduces``, the
    share of iterations that sum the hot rows' gradients in a second
    allreduce of ``hot_allreduce_bytes`` (its mean per iteration); its
    switches are rows like any other (the replica read into every worker
    in ``pull_rows``, worker 0's write of it in ``writeback_rows``, both
    in the pull stage, where the runtime does them); ``eval_samples``: the
    held-out samples whose loss it measures between pairs of strips, a
    forward pass each, also in the pull stage.
    """

    samples: float
    row_bytes: float
    pull_rows: float = 0.0
    writeback_rows: float = 0.0
    check_rows: float = 0.0
    p2p_rows: float = 0.0
    prefetch_rows: float = 0.0
    push_rows: float = 0.0
    update_rows: float = 0.0
    pull_ops: float = 0.0
    push_ops: float = 0.0
    ps_pull_rows: float = 0.0
    ps_writeback_rows: float = 0.0
    ps_check_rows: float = 0.0
    ps_prefetch_rows: float = 0.0
    ps_push_rows: float = 0.0
    mlp_bytes: float = 0.0
    hot_allreduces: float = 0.0
    hot_allreduce_bytes: float = 0.0
    eval_samples: float = 0.0


CHECK_BYTES = 16  # a version check: the row's id out, its version back
# a forward pass's share of a sample's forward, backward and step: the backward pass does twice the forward's
# arithmetic (a gradient for both operands of every product), the step is small beside them
FORWARD_SHARE = 1 / 3


def host_bytes(worker_bytes: float, cluster: Cluster) -> float:
    """What a worker host's NIC carries when each of its workers moves ``worker_bytes``."""
    return worker_bytes * min(cluster.workers, cluster.workers_per_host)


def cpu_share(cluster: Cluster, profile: Profile, ranks: Optional[int] = None) -> float:
    """How much slower a worker's CPU work runs because busy ranks (``ranks``, default ``Cluster.busy_ranks``)
    share its cores (1 for GPU workers)."""
    if cluster.cores_per_host is None:
        return 1.0
    return profile.share_at(cluster.busy_ranks if ranks is None else ranks, cluster.cores_per_host)


def ring_bytes(load: Load, cluster: Cluster) -> float:
    """What each worker host's NIC carries, each way, in ring allreduces between hosts (inside a host memory
    moves them: the calls' cost covers it): ``2 (h - 1) / h`` of the MLP's bytes every iteration, and of
    FAE's hot rows in its share of iterations."""
    hosts = cluster.worker_hosts
    return 2 * (hosts - 1) / hosts * (load.mlp_bytes + load.hot_allreduce_bytes) if hosts > 1 else 0.0


def exchange_bytes(load: Load, cluster: Cluster) -> float:
    """What each worker host's NIC carries, each way, in each of the two exchanges of the runtime's MPI sum (a
    reduce-scatter by ``Alltoall``, then an ``Allgather``; ``hybrid.runtime.comm.MpiCollectives``): every worker
    sends a ``1 / n`` chunk of the bytes to each of the ``n`` workers, those on its own host through memory."""
    n, local = cluster.workers, min(cluster.workers, cluster.workers_per_host)
    return local * (n - local) / n * (load.mlp_bytes + load.hot_allreduce_bytes)


def barrier_rounds_ms(cluster: Cluster) -> float:
    """The workers' barrier between hosts: a round trip per doubling of the workers."""
    rounds = math.ceil(math.log2(cluster.workers)) if cluster.workers > 1 else 0
    return 2 * rounds * cluster.latency_ms if cluster.gbps is not None and cluster.worker_hosts > 1 else 0.0


class _Nic:
    """One direction of one NIC: its transfers one after another at the link's rate, the first bytes after a
    pause at once, as far as its token bucket (``Cluster.burst_bytes``) has refilled since it last carried
    bytes (at the link's rate: 256 KiB in 2 ms at 1 Gbit/s, in 21 ms at 100 Mbit/s)."""

    def __init__(self, cluster: Cluster):
        self.per_ms = cluster.gbps * 1e9 / 8 / 1e3
        self.size = self.tokens = cluster.burst_bytes
        self.free_at = -math.inf  # idle for ever before the first iteration: every bucket full

    def bucket_at(self, at: float) -> float:
        return min(self.size, self.tokens + self.per_ms * max(0.0, at - self.free_at))

    def ms(self, nbytes: float, at: float, burst_cap: float) -> float:
        return max(0.0, nbytes - min(burst_cap, self.bucket_at(at))) / self.per_ms

    def take(self, nbytes: float, begin: float, end: float) -> None:
        self.tokens, self.free_at = max(0.0, self.bucket_at(begin) - nbytes), end


class _Links:
    """The busiest worker host's NIC and the busiest PS host's NIC, each way, through a run of iterations."""

    def __init__(self, cluster: Cluster):
        self.on = cluster.gbps is not None
        self.worker_out, self.worker_in, self.ps_out, self.ps_in = (_Nic(cluster) if self.on else None
                                                                    for _ in range(4))
        self.latency_ms = cluster.latency_ms

    def move(self, at: float, *ends, round_trips: float = 1.0, burst_cap: float = math.inf) -> float:
        """When bytes started at ``at`` arrive: ``ends`` are (NIC, bytes) pairs the bytes cross, the transfer
        starting when every one of them is free and lasting as long as its slowest end, each NIC busy for its
        own part only (the PS host's NIC carries every worker's rows, a worker host's one share of them, at
        the same pace); ``burst_cap``: at most that much rides a bucket (a ring's first chunk)."""
        ends = [(nic, nbytes) for nic, nbytes in ends if nbytes > 0]
        if not self.on or not ends:
            return at
        begin = max(at, *(nic.free_at for nic, _ in ends))
        own = [(nic, nbytes, nic.ms(nbytes, begin, burst_cap)) for nic, nbytes in ends]
        for nic, nbytes, ms in own:  # a NIC that carries its part sooner is free for other bytes meanwhile
            nic.take(nbytes, begin, begin + ms)
        return begin + max(ms for *_, ms in own) + round_trips * 2 * self.latency_ms


SETTLING_ITERATIONS = 4  # iterations run before the one reported: the NICs' buckets settle within 2-3


def stage_ms(load: Load, cluster: Cluster, profile: Profile) -> dict:
    """Milliseconds per stage of one iteration (``STAGES``), and ``schedule_wait``.

    The iteration runs as the loop does (docs/design.md section 11), the
    bytes of each stage over the NICs they cross (:class:`_Links`: full
    duplex, one transfer after another per direction, an emulated NIC's
    bucket refilled while it idles), after ``SETTLING_ITERATIONS``
    iterations that leave the NICs as a long run does:

    - ``pull``: its operations' own costs, then the reads and the
      write-backs, each way at once; at its end the next iteration's
      prefetch leaves the PS and travels while the worker computes.
    - ``allreduce``: its calls, and the MLP's bytes between hosts: a ring's
      (each NIC both ways, only its first chunk at once), or where the
      ranks share cores the runtime's MPI sum, two exchanges each sent at
      once (:func:`exchange_bytes`), and the patient wait as measured alone
      between hosts over unshaped links (the probe's sleeps, its bytes at
      memory speed), which the link's bytes replace where they take longer.
    - ``push``: its operations and the rows' updates, then the writes,
      which travel during the next batch's ``data`` (they show only by what
      they take longer) and wait for the worker host's NIC to finish the
      allreduce's bytes. The busiest worker's bytes leave after its CPU
      work at the cores' share; the PS host's NIC, which takes every
      worker's, starts with the first worker done (its work alone). The
      stage ends when the prefetch has arrived too (the loop's flush).
    - ``schedule``: what of the scheduler's CPU work the sum's bytes on the
      links do not hide.
    """
    links, iteration, clock = _Links(cluster), {}, 0.0
    for _ in range(SETTLING_ITERATIONS + 1):
        iteration, clock = _iteration(load, cluster, profile, links, clock)
    return iteration


def _iteration(load: Load, cluster: Cluster, profile: Profile, links: _Links, clock: float) -> tuple[dict, float]:
    """One iteration from ``clock`` on ``links``: its stages, and the clock at its end."""
    row, share = load.row_bytes, cpu_share(cluster, profile)
    hosted = partial(host_bytes, cluster=cluster)
    data = load.samples * profile.data_sample_ms * share
    compute = (profile.compute_ms + load.samples * profile.sample_ms) * cpu_share(cluster, profile, cluster.computing_ranks)
    evaluation = load.eval_samples * profile.sample_ms * FORWARD_SHARE
    rows_pulled = load.pull_rows + load.writeback_rows + load.check_rows + load.p2p_rows + load.prefetch_rows
    pull_cpu = (load.pull_ops * profile.op_ms + rows_pulled * profile.row_ms + evaluation) * share
    reads = links.move(clock, (links.worker_in, hosted((load.pull_rows + load.p2p_rows) * row
                                                        + load.check_rows * CHECK_BYTES)),
                       (links.ps_out, load.ps_pull_rows * row + load.ps_check_rows * CHECK_BYTES))
    written_back = links.move(clock, (links.worker_out, hosted(load.writeback_rows * row)),
                              (links.ps_in, load.ps_writeback_rows * row))
    pull = max(reads, written_back) + pull_cpu - clock
    clock += pull
    ahead = links.move(clock, (links.worker_in, hosted(load.prefetch_rows * row)),
                       (links.ps_out, load.ps_prefetch_rows * row))
    clock += compute
    waits = profile.patient_collectives(cluster.workers) if cluster.patient else (0.0, 0.0)
    calls = 1 + load.hot_allreduces  # FAE's hot rows: a second sum, its calls and patient wait as the MLP's
    if cluster.patient:  # the runtime's MPI sum: two exchanges, each all at once (an emulated bucket takes it)
        phase = exchange_bytes(load, cluster)
        summed = clock
        for _ in range(2):
            summed = links.move(summed, (links.worker_out, phase), (links.worker_in, phase), round_trips=calls)
    else:  # Horovod's ring: only its first chunk rides a bucket, the rest follows chunk by chunk
        hosts, ring = cluster.worker_hosts, ring_bytes(load, cluster)
        summed = links.move(clock, (links.worker_out, ring), (links.worker_in, ring),
                            round_trips=calls * (hosts - 1), burst_cap=load.mlp_bytes / hosts)
    on_links = max(0.0, summed - clock)  # every rank waits for the bytes: the scheduler thread's turn
    allreduce = calls * profile.allreduce_ms * share + max(calls * waits[0], on_links)
    clock += allreduce
    alone = load.push_ops * profile.op_ms + load.push_rows * profile.row_ms + load.update_rows * profile.update_row_ms
    # each worker updates its rows, then sends them: the busiest one's bytes leave after its CPU work at the cores'
    # share, the PS host's NIC takes every worker's from the first one done on (its work alone)
    writes = max(links.move(clock + alone * share, (links.worker_out, hosted(load.push_rows * row))),
                 links.move(clock + alone, (links.ps_in, load.ps_push_rows * row)))
    push = max(alone * share, writes - clock - data, ahead - clock - data)
    on_cpu = cluster.cores_per_host is not None
    schedule = profile.schedule_at(cluster.workers)
    stages = {"data": data, "pull": pull, "compute": compute, "allreduce": allreduce, "push": push,
              "barrier": profile.barrier_ms * share + waits[1] + barrier_rounds_ms(cluster),
              "other": profile.other_ms * share,
              "schedule": max(0.0, schedule * share - on_links) if on_cpu else 0.0}
    stages["schedule_wait"] = 0.0 if on_cpu else max(0.0, schedule - sum(stages.values()))
    return stages, clock + sum(stages[s] for s in ("push", "data", "barrier", "other", "schedule", "schedule_wait"))


def iteration_ms(load: Load, cluster: Cluster, profile: Profile) -> float:
    """One iteration: its stages, or the scheduler's time per global batch where that is longer."""
    return sum(stage_ms(load, cluster, profile).values())


def bounding_stage(stages: dict) -> str:
    """The stage that takes longest (``schedule``: a GPU worker's scheduler cannot keep ahead)."""
    return "schedule" if stages.get("schedule_wait", 0.0) > 0 else max(STAGES, key=lambda s: stages[s])

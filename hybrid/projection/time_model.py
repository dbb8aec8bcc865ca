"""A time model of one BSP iteration: the runtime's stages, from counts, a cluster and calibrated costs.

The loop's stages (docs/design.md section 11) and what each one waits for:

- ``data``: the next batch's inputs, per sample.
- ``pull``: the write-backs and the pulls of this iteration, one operation
  per PS rank each, completed together: each operation's own cost, each
  row's, and the bytes over the links (below); the pulls issued ahead for
  the next iteration (prefetch) travel while this one computes and count
  only where they take longer than compute and the allreduce.
- ``compute``: forward, backward and the optimizer step, per sample, on
  the worker's device; CPU workers that share a host's cores take longer in
  proportion (``ranks_per_host / cores_per_host`` when over 1).
- ``allreduce``: the MLP's gradients summed over the workers (ring, inside
  a host through memory, between hosts over the links); nothing with one worker.
- ``push``: the updates written to the PS, overlapping the next batch's
  ``data``; the bytes as for pulls.
- ``barrier`` and ``other``: a fixed cost per iteration (the barrier's
  latency terms grow with the ranks' log).

Bytes over the links: every worker of a host moves its rows through that
host's NIC, and every PS host's NIC carries what all workers move from and
to it, so a stage takes the longer of the two; the link's one-way latency is
paid twice per round trip. With every rank on one host there is no link:
the operations' own costs, calibrated on that host, are the whole cost.

BSP: an iteration lasts as long as its busiest worker, so ``Load`` holds
the busiest worker's rows and the busiest PS rank's; the scheduler runs
ahead of training and sets the pace only when a global batch takes it longer
than the iteration. The model and its inputs are described in
docs/projection.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Optional

STAGES = ("data", "pull", "compute", "allreduce", "push", "barrier", "other")


@dataclass(frozen=True)
class Cluster:
    """Where the ranks run and what connects them.

    ``gbps``: each host's NIC, per direction; ``None``: every rank on one
    host (no link). ``cores_per_host``: CPU workers only (``None`` for GPU
    workers, whose compute does not share the host's cores).
    """

    workers: int
    ps: int
    workers_per_host: int = 1
    gbps: Optional[float] = None
    latency_ms: float = 0.0
    cores_per_host: Optional[int] = None

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

    @property
    def worker_hosts(self) -> int:
        return -(-self.workers // self.workers_per_host)

    @property
    def ranks_per_host(self) -> int:
        """Ranks sharing a host's cores: its workers, and the PS ranks too when there is no link."""
        return self.workers + self.ps if self.gbps is None else min(self.workers, self.workers_per_host)


@dataclass(frozen=True)
class Profile:
    """Costs calibrated on a machine (``hybrid project --calibrate``), in milliseconds.

    ``op_ms`` and ``row_ms``: one store operation to one PS rank, and each
    of its rows, on the worker's side (issue, routing, staging, completion);
    ``sample_ms``: compute per sample on one core or device, ``compute_ms``
    per iteration besides; ``data_sample_ms``: staging the inputs per
    sample; ``allreduce_ms``: one allreduce call of the MLP gradients
    besides its bytes; ``barrier_ms`` and ``other_ms``: per iteration;
    ``schedule_ms``: the scheduler's time per global batch by worker count
    (interpolated in between, linearly beyond the largest).
    """

    op_ms: float
    row_ms: float
    sample_ms: float
    compute_ms: float = 0.0
    data_sample_ms: float = 0.0
    allreduce_ms: float = 0.0
    barrier_ms: float = 0.0
    other_ms: float = 0.0
    schedule_ms: tuple = ()  # ((workers, ms per global batch), ...), sorted by workers

    def __post_init__(self):
        negative = [f.name for f in fields(self) if f.name != "schedule_ms" and getattr(self, f.name) < 0]
        if negative:
            raise ValueError(f"profile costs must be >= 0: {', '.join(negative)}")

    def schedule_at(self, workers: int) -> float:
        """The scheduler's ms per global batch at ``workers`` (0 when not calibrated)."""
        points = sorted(self.schedule_ms)
        if not points:
            return 0.0
        if workers <= points[0][0]:
            return points[0][1] * workers / points[0][0]
        for (w0, t0), (w1, t1) in zip(points, points[1:]):
            if workers <= w1:
                return t0 + (t1 - t0) * (workers - w0) / (w1 - w0)
        if len(points) == 1:
            return points[0][1] * workers / points[0][0]
        (w0, t0), (w1, t1) = points[-2], points[-1]
        return t1 + (t1 - t0) * (workers - w1) / (w1 - w0)


@dataclass(frozen=True)
class Load:
    """One iteration's work (a mean over a run's iterations), from the simulator's events (``loads``).

    Per stage the busiest worker's rows (each stage's maximum over the
    workers, which may be different workers): read in ``pull``
    (``pull_rows``), written back there (``writeback_rows``), version
    checks there (``check_rows``, HET; ``CHECK_BYTES`` each), received
    from peers (``p2p_rows``), read ahead for the next iteration
    (``prefetch_rows``), written in ``push`` (``push_rows``); the
    operations those take, one per PS rank each reaches (``pull_ops``,
    ``push_ops``). Per PS rank the busiest one's rows of each kind, summed
    over the workers (``ps_*``). ``row_bytes``: a row on the wire (its id
    included); ``mlp_bytes``: the gradients allreduced (FAE's hot rows too).
    """

    samples: float
    row_bytes: float
    pull_rows: float = 0.0
    writeback_rows: float = 0.0
    check_rows: float = 0.0
    p2p_rows: float = 0.0
    prefetch_rows: float = 0.0
    push_rows: float = 0.0
    pull_ops: float = 0.0
    push_ops: float = 0.0
    ps_pull_rows: float = 0.0
    ps_writeback_rows: float = 0.0
    ps_check_rows: float = 0.0
    ps_prefetch_rows: float = 0.0
    ps_push_rows: float = 0.0
    mlp_bytes: float = 0.0


CHECK_BYTES = 16  # a version check: the row's id out, its version back


def transfer_ms(nbytes: float, gbps: Optional[float]) -> float:
    """Milliseconds to move ``nbytes`` over a ``gbps`` link (0 without a link)."""
    return 0.0 if gbps is None else nbytes * 8 / (gbps * 1e9) * 1e3


def link_ms(worker_bytes: float, ps_bytes: float, cluster: Cluster) -> float:
    """Bytes of one direction of one stage over the links: the busier of a worker host's NIC and the busiest
    PS host's NIC, and a round trip.

    ``worker_bytes``: what the busiest worker moves (a host carries that
    for each of its workers); ``ps_bytes``: what all workers move from or
    to the busiest PS rank. Nothing moves: no round trip either.
    """
    if cluster.gbps is None or not (worker_bytes or ps_bytes):
        return 0.0
    per_host = worker_bytes * min(cluster.workers, cluster.workers_per_host)
    return max(transfer_ms(per_host, cluster.gbps), transfer_ms(ps_bytes, cluster.gbps)) + 2 * cluster.latency_ms


def compute_share(cluster: Cluster) -> float:
    """How much longer compute takes because the host's ranks share its cores (1 for GPU workers)."""
    if cluster.cores_per_host is None:
        return 1.0
    return max(1.0, cluster.ranks_per_host / cluster.cores_per_host)


def allreduce_ms(load: Load, cluster: Cluster, profile: Profile) -> float:
    """A ring allreduce of ``mlp_bytes``: through memory inside a host, over the links between hosts.

    Between ``h`` hosts a ring moves ``2 (h - 1) / h`` of the bytes through
    each NIC in ``2 (h - 1)`` steps, each paying the link's latency.
    """
    if cluster.workers == 1:
        return 0.0
    hosts = cluster.worker_hosts
    if cluster.gbps is None or hosts == 1:
        return profile.allreduce_ms
    return profile.allreduce_ms + transfer_ms(2 * (hosts - 1) / hosts * load.mlp_bytes, cluster.gbps) \
        + 2 * (hosts - 1) * cluster.latency_ms


def barrier_ms(cluster: Cluster, profile: Profile) -> float:
    """The workers' barrier: its fixed cost and a round trip per doubling of the workers."""
    rounds = math.ceil(math.log2(cluster.workers)) if cluster.workers > 1 else 0
    hosts_apart = cluster.gbps is not None and cluster.worker_hosts > 1
    return profile.barrier_ms + (2 * rounds * cluster.latency_ms if hosts_apart else 0.0)


def stage_ms(load: Load, cluster: Cluster, profile: Profile) -> dict:
    """Milliseconds per stage of one iteration (``STAGES``), and ``schedule_wait``.

    Links are full duplex: a stage takes its slower direction. The
    prefetch of the next iteration travels during compute and the
    allreduce and shows in ``pull`` only by what it takes longer; the
    writes travel during the next batch's ``data`` and show in ``push`` by
    what they take longer than that. ``schedule_wait`` is what the
    scheduler takes beyond the iteration when it cannot keep ahead.
    """
    row = load.row_bytes
    data = load.samples * profile.data_sample_ms
    compute = (profile.compute_ms + load.samples * profile.sample_ms) * compute_share(cluster)
    allreduce = allreduce_ms(load, cluster, profile)
    reads = link_ms((load.pull_rows + load.p2p_rows) * row + load.check_rows * CHECK_BYTES,
                    load.ps_pull_rows * row + load.ps_check_rows * CHECK_BYTES, cluster)
    writes_back = link_ms(load.writeback_rows * row, load.ps_writeback_rows * row, cluster)
    ahead = link_ms(load.prefetch_rows * row, load.ps_prefetch_rows * row, cluster)
    rows_pulled = load.pull_rows + load.writeback_rows + load.check_rows + load.p2p_rows + load.prefetch_rows
    pull = load.pull_ops * profile.op_ms + rows_pulled * profile.row_ms + max(reads, writes_back) \
        + max(0.0, ahead - compute - allreduce)
    writes = link_ms(load.push_rows * row, load.ps_push_rows * row, cluster)
    push = load.push_ops * profile.op_ms + load.push_rows * profile.row_ms + max(0.0, writes - data)
    stages = {"data": data, "pull": pull, "compute": compute, "allreduce": allreduce, "push": push,
              "barrier": barrier_ms(cluster, profile), "other": profile.other_ms}
    iteration = sum(stages.values())
    stages["schedule_wait"] = max(0.0, profile.schedule_at(cluster.workers) - iteration)
    return stages


def iteration_ms(load: Load, cluster: Cluster, profile: Profile) -> float:
    """One iteration: its stages, or the scheduler's time per global batch where that is longer."""
    return sum(stage_ms(load, cluster, profile).values())


def bounding_stage(stages: dict) -> str:
    """The stage that takes longest (``schedule_wait``: the scheduler cannot keep ahead)."""
    return "schedule" if stages.get("schedule_wait", 0.0) > 0 else max(STAGES, key=lambda s: stages[s])

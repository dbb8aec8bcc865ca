"""``hybrid simulate``: count embedding transmissions per mode, without MPI.

Runs the same scheduler and cluster state the training runtime uses over the
store's global batches and counts what docs/design.md section 6 defines: pulls
(rows read from the PS), pushes (rows written to the PS: Accumulate, Put of
plan pushes and full-set pushes, eviction write-backs), p2p rows, and the
fresh hit rate; HET's version checks (8-byte reads, not rows) and FAE's allreduced rows apart; and
``busiest``, the transmissions of each iteration's busiest worker, summed (the slowest worker sets the
pace). The first ``warmup`` iterations are excluded, as in the paper.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional

from hybrid import modes
from hybrid.config import Config, Mode
from hybrid.data.store import BatchStore
from hybrid.scheduling.event_kinds import ALLREDUCE_KINDS, CHECK_KINDS, PEER_KINDS, PULL_KINDS, PUSH_KINDS


@dataclass
class ModeCounts:
    """Totals over the counted iterations of one mode."""

    iterations: int = 0
    pulls: int = 0
    pushes: int = 0
    p2p: int = 0
    version_checks: int = 0
    allreduced: int = 0
    needed: int = 0
    fetched: int = 0  # needed rows that were not fresh in the cache (pulled or sent peer to peer)
    busiest: int = 0  # per iteration, the transmissions of the worker with the most, summed
    by_kind: dict = field(default_factory=dict)
    sched_seconds: dict = field(default_factory=dict)

    @property
    def transmissions(self) -> int:
        return self.pulls + self.pushes + self.p2p

    @property
    def hit_rate(self) -> float:
        """Fresh hits / needed rows (FAE: of its cold iterations; the replicas' refills are not misses)."""
        return 1.0 - self.fetched / self.needed if self.needed else 0.0

    @property
    def sched_ms(self) -> float:
        """Scheduling time per batch (scoring + allocation + state update + plan)."""
        return 1000 * sum(self.sched_seconds.values()) / max(1, self.iterations)

    def add(self, plan) -> None:
        self.iterations += 1
        self.pulls += sum(plan.counts[k] for k in PULL_KINDS)
        self.p2p += sum(plan.counts[k] for k in PEER_KINDS)
        self.pushes += sum(plan.counts[k] for k in PUSH_KINDS)
        self.version_checks += sum(plan.counts[k] for k in CHECK_KINDS)
        self.allreduced += sum(plan.counts[k] for k in ALLREDUCE_KINDS)
        self.needed += plan.needed
        self.fetched += plan.counts["pull"] + plan.counts["p2p"]
        self.busiest += int(plan.per_worker.max()) if plan.per_worker is not None and len(plan.per_worker) else 0
        for kind, n in plan.counts.items():
            self.by_kind[kind] = self.by_kind.get(kind, 0) + n
        for stage, seconds in plan.timing.items():
            self.sched_seconds[stage] = self.sched_seconds.get(stage, 0.0) + seconds

    def summary(self) -> dict:
        return {"pulls": self.pulls, "pushes": self.pushes, "p2p": self.p2p,
                "transmissions": self.transmissions, "version_checks": self.version_checks,
                "allreduced": self.allreduced, "busiest": self.busiest, "hit_rate": round(self.hit_rate, 6),
                "sched_ms": round(self.sched_ms, 4), "iterations": self.iterations,
                "by_kind": self.by_kind,
                "sched_ms_by_stage": {k: round(1000 * v / max(1, self.iterations), 4)
                                      for k, v in self.sched_seconds.items()}}


def simulate_mode(config: Config, store: BatchStore, mode: Mode, iterations: int = 0,
                  progress=None, fae_losses: Optional[list] = None) -> ModeCounts:
    """Counts of one mode over ``iterations`` global batches (0 = the whole split, one pass for FAE).

    FAE's strip lengths follow the held-out loss, which only training
    measures: ``fae_losses`` (per pair, as a run logged them) lays out the
    run's strips; without them the rate stays at its start.
    """
    scheduler, batches, pass_length = modes.get(mode).simulation(config, store, fae_losses)
    iterations = iterations or pass_length
    if iterations:
        batches = itertools.islice(batches, iterations)
    counts, seen = ModeCounts(), 0
    for plan in scheduler.plans(batches):
        seen += 1
        if plan.step >= config.scheduler.warmup_iterations:
            counts.add(plan)
        if progress is not None:
            progress(1)
    if not counts.iterations:
        raise ValueError(f"nothing to count for mode {mode.value}: {seen} global batches of {config.global_batch} "
                         f"samples, all within scheduler.warmup_iterations={config.scheduler.warmup_iterations}; "
                         f"lower the warm-up or use more data (or fewer workers)")
    return counts


def simulate(config: Config, modes, iterations: int = 0, progress=None) -> dict[Mode, ModeCounts]:
    """Counts per mode on the training split of ``config.data.path``."""
    store = BatchStore(config.data.path, split="train", test_fraction=config.data.test_fraction)
    return {mode: simulate_mode(config, store, mode, iterations, progress) for mode in modes}


def reduction(mode: ModeCounts, baseline: ModeCounts) -> dict:
    """Relative reduction of pulls, pushes and transmissions versus ``baseline``."""
    def cut(a, b):
        return 1.0 - a / b if b else 0.0
    return {"pulls": cut(mode.pulls, baseline.pulls), "pushes": cut(mode.pushes, baseline.pushes),
            "transmissions": cut(mode.transmissions, baseline.transmissions)}

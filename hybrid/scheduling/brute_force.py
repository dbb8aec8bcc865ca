"""Exhaustive allocation for tiny cases: how far LAIA is from the best choice.

The Herald paper's Appendix C measures scheduling quality as brute-force
transmissions over LAIA transmissions with one sample per worker. From the
same cluster state, every balanced allocation of batch ``t`` is tried; its
cost is what it causes: the plan pushes of ``t - 1`` that batch ``t`` needs
plus the pulls and pushes of training ``t``. The cheapest is optimal for that
iteration, so LAIA can only tie or lose against it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from hybrid._ext.cluster_state import ClusterState
from hybrid.scheduling.allocation import capacities
from hybrid.scheduling.event_kinds import TRANSMISSION_KINDS


def iteration_cost(state: ClusterState, rows: np.ndarray, alloc: np.ndarray) -> int:
    """Transmissions caused by allocating ``rows`` as ``alloc`` (state is not modified)."""
    trial = state.copy()
    planned = trial.plan(rows, alloc)
    trained = trial.train()
    return sum(planned.get(k, 0) + trained.get(k, 0) for k in TRANSMISSION_KINDS)  # FAE's kinds: not the state's


def balanced_allocations(n_samples: int, n_workers: int):
    """Every distinct assignment of samples to workers with balanced capacities."""
    slots = np.repeat(np.arange(n_workers, dtype=np.int32), capacities(n_samples, n_workers))
    seen = set()
    for order in itertools.permutations(slots):
        if order not in seen:
            seen.add(order)
            yield np.array(order, dtype=np.int32)


def best_allocation(state: ClusterState, rows: np.ndarray) -> tuple[np.ndarray, int]:
    """The cheapest balanced allocation of ``rows`` from ``state`` and its cost."""
    best, best_cost = None, None
    for alloc in balanced_allocations(len(rows), state.n_workers):
        cost = iteration_cost(state, rows, alloc)
        if best_cost is None or cost < best_cost:
            best, best_cost = alloc, cost
    return best, best_cost


@dataclass
class Quality:
    brute_force: int  # summed optimal transmissions
    heuristic: int  # summed transmissions of the evaluated policy

    @property
    def ratio(self) -> float:
        """Brute-force over heuristic transmissions (1.0 = optimal)."""
        return self.brute_force / self.heuristic if self.heuristic else 1.0


def scheduling_quality(state: ClusterState, policy, batches) -> Quality:
    """Follow ``policy`` over ``batches`` (global row ids), comparing each step with brute force.

    ``state`` must be the one ``policy`` reads (LAIA scores from it).
    """
    total_best = total_policy = 0
    for t, rows in enumerate(batches):
        alloc = policy.allocate(rows, t)
        total_policy += iteration_cost(state, rows, alloc)
        total_best += best_allocation(state, rows)[1]
        state.plan(rows, alloc)
        state.train()
    return Quality(total_best, total_policy)

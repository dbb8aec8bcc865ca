"""Modes: vanilla, herald (with its halves laia and plan), het and fae, each one module, plugged into one loop.

A mode (``base.TrainingMode``) is its scheduling choices, the settings it
refuses, and what it does at the training loop's fixed points. The loop
(``hybrid.training.loop``) and the simulator take a mode from :func:`get`
and have no branch of their own per mode. docs/modes.md ("How to add a
mode") walks through one mode's module.

May import: ``hybrid.scheduling``, ``hybrid.runtime`` (inside worker-side
methods only where it starts MPI), ``hybrid.config``, ``hybrid.data``.
"""
from __future__ import annotations

from typing import Optional


from hybrid.config import Config, LaiaOrder, LaiaScoring, LaiaVariant, Mode, SyncMode
from hybrid.modes.base import TrainingMode, WorkerContext, run_length
from hybrid.modes.fae import Fae
from hybrid.modes.herald import Herald, Laia, Plan
from hybrid.modes.het import Het
from hybrid.modes.vanilla import Vanilla
from hybrid.scheduling.policy import Allocation
from hybrid.scheduling.scheduler import Scheduler

MODES: dict[Mode, type[TrainingMode]] = {mode.name: mode for mode in (Vanilla, Laia, Plan, Herald, Het, Fae)}

__all__ = ["MODES", "TrainingMode", "WorkerContext", "check", "get", "run_label", "run_length", "scheduler_for"]


def get(mode: Mode) -> type[TrainingMode]:
    """The mode class of a ``scheduler.mode`` value."""
    return MODES[Mode(mode)]


def check(config: Config, cardinalities, mode: Optional[Mode] = None) -> int:
    """Raise ``SchedulerError`` if ``config`` cannot run (its mode, or ``mode``); else the cache slots per worker.

    Cheap (nothing is allocated), so training runs it on every rank before
    any collective: such an error then stops every rank alike.
    """
    chosen = get(config.scheduler.mode if mode is None else mode)
    chosen.check(config)
    return Scheduler.capacity(config, cardinalities, chosen.schedule)


def scheduler_for(config: Config, *, cardinalities, mode: Optional[Mode] = None,
                  worker: Optional[int] = None) -> Scheduler:
    """The scheduler of ``config``'s mode (or ``mode``) over the cluster state (``worker``: the runtime's own)."""
    return get(config.scheduler.mode if mode is None else mode).scheduler_for(
        config, cardinalities=cardinalities, worker=worker)


def run_label(config: Config) -> str:
    """The mode and, for LAIA modes, the allocation settings that differ from the paper's: ``herald+cost+confident``.

    Runs of one mode with different allocations are told apart by it in
    summaries and ``hybrid compare``.
    """
    sched = config.scheduler
    parts = [sched.mode.value]
    if get(sched.mode).schedule.allocation is Allocation.laia:
        parts += [name for name, used in (
            (sched.laia.value, sched.laia is not LaiaVariant.exact), ("cost", sched.scoring is LaiaScoring.cost),
            ("confident", sched.order is LaiaOrder.confident), (f"swap{sched.swap_rounds}", sched.swap_rounds > 0),
            ("lookahead", sched.lookahead)) if used]
    if sched.sync is SyncMode.p2p:
        parts.append("p2p")
    return "+".join(parts)

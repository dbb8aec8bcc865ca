"""Modes, each one module, plugged into one loop: the registry :data:`MODES` (docs/modes.md has its table).

A mode (``base.TrainingMode``) is its scheduling choices, the settings it
refuses, and what it does at the training loop's fixed points. The loop
(``hybrid.training.loop``) and the simulator take a mode from :func:`get`
and have no branch of their own per mode; every list of modes (the CLI's,
the docs' table, the tests' parameters) is read from :data:`MODES`.
docs/modes.md ("How to add a mode") walks through adding one.

May import: ``hybrid.scheduling``, ``hybrid.runtime`` (inside worker-side
methods only where it starts MPI), ``hybrid.config``, ``hybrid.data``.
"""
from __future__ import annotations

from typing import Optional


from hybrid.config import Config, Mode, SyncMode
from hybrid.modes.base import TrainingMode, WorkerContext, run_length
from hybrid.modes.fae import Fae
from hybrid.modes.herald import Herald, Laia, Plan
from hybrid.modes.het import Het
from hybrid.modes.vanilla import Vanilla
from hybrid.scheduling.policy import SchedulerError
from hybrid.scheduling.scheduler import Scheduler

MODES: dict[Mode, type[TrainingMode]] = {}

__all__ = ["MODES", "TrainingMode", "WorkerContext", "check", "get", "register", "run_label", "run_length",
           "scheduler_for"]


def register(mode: type[TrainingMode]) -> type[TrainingMode]:
    """Add ``mode`` to :data:`MODES` under its ``name`` (a class decorator too); a name is taken once."""
    name = Mode(mode.name)
    if MODES.get(name, mode) is not mode:
        raise ValueError(f"mode {name!r} is registered already ({MODES[name].__module__}.{MODES[name].__name__})")
    mode.name = name
    MODES[name] = mode
    return mode


for _mode in (Vanilla, Laia, Plan, Herald, Het, Fae):
    register(_mode)


def get(mode: str) -> type[TrainingMode]:
    """The mode class of a ``scheduler.mode`` value; a name no module registered is refused, naming those that are."""
    found = MODES.get(mode)
    if found is None:
        raise SchedulerError(f"scheduler.mode={mode} is not a mode; the modes are {', '.join(MODES)} "
                             f"(docs/modes.md)")
    return found


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
    """The mode and its allocation's settings that differ from the paper's (``SchedulePolicy.label_settings``):
    ``herald+cost+confident``.

    Runs of one mode with different allocations are told apart by it in
    summaries and ``hybrid compare``.
    """
    sched = config.scheduler
    parts = [sched.mode.value, *get(sched.mode).schedule.label_settings(config)]
    if sched.sync is SyncMode.p2p:
        parts.append("p2p")
    return "+".join(parts)


TABLE_BEGIN, TABLE_END = "<!-- modes:begin -->", "<!-- modes:end -->"


def table() -> str:
    """The registered modes as docs/modes.md's table (Markdown): what every list of modes in the docs points to."""
    lines = ["| mode (`scheduler.mode`) | allocation | synchronization | what it is | also tested with | "
             "checkpoints | `wire_precision=bf16` |", "|---|---|---|---|---|---|---|"]
    for name, mode in MODES.items():
        summary = (mode.__doc__ or "").strip().splitlines()[0] if mode.__doc__ else ""
        variants = ", ".join(f"`{v}`" for v in mode.variants) or "-"
        lines.append(f"| `{name}` | {mode.schedule.allocation.value} | {mode.schedule.sync.value} | {summary} | "
                     f"{variants} | {'yes' if mode.checkpoints else 'refused'} | "
                     f"{'yes' if mode.sixteen_bit_wire else 'refused'} |")
    return "\n".join(lines)


def write_table(path) -> bool:
    """Rewrite the table between ``TABLE_BEGIN`` and ``TABLE_END`` in the page at ``path``; whether it changed."""
    from pathlib import Path

    text = Path(path).read_text()
    start, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"{path} has no '{TABLE_BEGIN}' ... '{TABLE_END}' marker lines")
    new = text[:start + len(TABLE_BEGIN)] + "\n" + table() + "\n" + text[end:]
    Path(path).write_text(new)
    return new != text

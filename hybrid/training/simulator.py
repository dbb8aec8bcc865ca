"""``hybrid simulate``: count embedding transmissions per mode, without MPI.

Runs the same scheduler and cluster state the training runtime uses over the
store's global batches and reports the figures ``hybrid.training.figures``
defines (transmissions by kind, hit rate, the busiest worker's rows, HET's
version checks, allreduced rows), as ``hybrid train`` does. The first
``scheduler.warmup_iterations`` are left out, as in the paper.
"""
from __future__ import annotations

import itertools
from typing import Optional

from hybrid import modes
from hybrid.config import Config, Mode
from hybrid.data.store import BatchStore
from hybrid.training.figures import Figures


def simulate_mode(config: Config, store: BatchStore, mode: Mode, iterations: int = 0,
                  progress=None, fae_losses: Optional[list] = None) -> Figures:
    """Counts of one mode over ``iterations`` global batches (0 = the run's: ``train.iterations``, or
    ``train.epochs`` passes over the split, as ``hybrid train`` trains).

    FAE's strip lengths follow the held-out loss, which only training
    measures: ``fae_losses`` (per pair, as a run logged them) lays out the
    run's strips; without them the rate stays at its start.
    """
    length = iterations or modes.run_length(config, store)  # past one pass: epoch after epoch, as in training
    scheduler, batches = modes.get(mode).simulation(config, store, length, fae_losses)
    counts, seen = Figures(), 0
    for plan in scheduler.plans(itertools.islice(batches, length)):
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


def simulate(config: Config, modes, iterations: int = 0, progress=None) -> dict[Mode, Figures]:
    """Counts per mode on the training split of ``config.data.path``."""
    store = BatchStore.of(config.data, "train")
    return {mode: simulate_mode(config, store, mode, iterations, progress) for mode in modes}


def reduction(mode: Figures, baseline: Figures) -> dict:
    """Relative reduction of pulls, pushes and transmissions versus ``baseline``."""
    def cut(a, b):
        return 1.0 - a / b if b else 0.0
    return {"pulls": cut(mode.pulls, baseline.pulls), "pushes": cut(mode.pushes, baseline.pushes),
            "transmissions": cut(mode.transmissions, baseline.transmissions)}

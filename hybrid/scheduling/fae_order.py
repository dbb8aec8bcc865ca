"""FAE's order of training: hot and cold mini-batches, in strips (docs/design.md section 7).

The calibrator (``hybrid.scheduling.fae_calibration``) classifies every training input
hot (all its rows are hot) or cold. The inputs of each kind, in the store's
order (with ``data.shuffle``, pass ``p`` in the permutation of epoch ``p``),
are cut into global batches: FAE's hot and cold mini-batches. A pass runs
them in strips, cold first, strip lengths from the shuffle schedule
(``hybrid.scheduling.shuffle_schedule``, whose rate carries over from pass
to pass); passes follow one another for as many iterations as the run trains.

The schedule's rate follows the held-out loss measured after each (cold,
hot) pair of strips. The plan stream runs up to three batches ahead of
training (docs/design.md section 11), so a pair's strips are laid out with
the losses of the pairs that ended at least :data:`LAG_BATCHES` batches
before it starts; the paper's rule applies one or two pairs later than it
would in a loop without look-ahead. The layout depends only on the losses,
which every worker receives alike, so every rank lays out the same order.
"""
from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import numpy as np

from hybrid.data.store import BatchStore, GlobalBatch
from hybrid.scheduling.shuffle_schedule import ShuffleSchedule

LAG_BATCHES = 4


@dataclass(frozen=True)
class Strip:
    """Where a batch sits in FAE's order."""

    kind: str  # "hot" or "cold"
    pair: int  # index of its (cold, hot) pair of strips, counted over passes
    last: bool  # the last batch of its strip


@dataclass(frozen=True)
class MiniBatches:
    """FAE's mini-batches: store positions of each hot and each cold global batch."""

    hot: list
    cold: list

    @staticmethod
    def of(store: BatchStore, hot_inputs: np.ndarray, batch_size: int, *, shuffle: bool = False,
           seed: int = 0, epoch: int = 0) -> "MiniBatches":
        """Cut the split's hot and cold inputs (``hot_inputs``: bool per input of the split) into batches,
        in ``epoch``'s order."""
        if len(hot_inputs) != store.n_samples:
            raise ValueError(f"hot_inputs classifies {len(hot_inputs)} inputs, the split has {store.n_samples}")
        order = store.order(shuffle, seed, epoch)
        is_hot = np.asarray(hot_inputs, dtype=bool)[order - store.start]
        cut = lambda positions: [positions[i:i + batch_size]  # noqa: E731
                                 for i in range(0, len(positions) - batch_size + 1, batch_size)]
        batches = MiniBatches(hot=cut(order[is_hot]), cold=cut(order[~is_hot]))
        if not batches.hot and not batches.cold:
            raise ValueError(f"the split's {store.n_samples} inputs make no global batch of {batch_size}")
        return batches


def strip_order(passes: Callable[[int], MiniBatches], schedule: ShuffleSchedule,
                loss: Callable[[int], Optional[float]]) -> Iterator[tuple[np.ndarray, Strip]]:
    """(positions, strip) of every batch, pass after pass, without end; ``passes(p)``: pass ``p``'s mini-batches.

    ``loss(pair)`` returns the held-out loss after that pair (blocking until
    it is known), or None when it is not measured (the simulator); the
    schedule observes each in pair order.
    """
    pair, step, observed = 0, 0, 0
    ends: list[int] = []  # step of each pair's last batch
    for number in itertools.count():
        batches = passes(number)
        left = {"cold": list(range(len(batches.cold))), "hot": list(range(len(batches.hot)))}
        totals = {kind: len(indices) for kind, indices in left.items()}
        while left["cold"] or left["hot"]:
            while observed < pair and ends[observed] <= step - LAG_BATCHES:
                value = loss(observed)
                if value is not None:
                    schedule.observe(value)
                observed += 1
            for kind in ("cold", "hot"):
                count = schedule.strip(totals[kind], len(left[kind]))
                chosen, left[kind] = left[kind][:count], left[kind][count:]
                for i, index in enumerate(chosen):
                    yield getattr(batches, kind)[index], Strip(kind, pair, i == count - 1)
                step += count
            ends.append(step - 1)
            pair += 1


def fae_batches(store: BatchStore, order: Iterator[tuple[np.ndarray, Strip]]) -> Iterator[GlobalBatch]:
    """The global batches of ``order``, each tagged with its strip."""
    for index, (positions, strip) in enumerate(order):
        yield dataclasses.replace(store.gather(index, positions), strip=strip)


def replayed_batches(store: BatchStore, hot_inputs: np.ndarray, batch_size: int, *, shuffle: bool, seed: int,
                     losses: Optional[list] = None) -> Iterator[GlobalBatch]:
    """FAE's batches as a run that measured ``losses`` (per pair) trained them.

    Without losses (the simulator, before any training) the rate stays at its start.
    """
    def passes(epoch: int) -> MiniBatches:
        return MiniBatches.of(store, hot_inputs, batch_size, shuffle=shuffle, seed=seed, epoch=epoch)

    known = list(losses or [])
    return fae_batches(store, strip_order(passes, ShuffleSchedule(),
                                          lambda pair: known[pair] if pair < len(known) else None))


class LossFeed:
    """Held-out losses handed from the training loop to the thread laying out the strips.

    :meth:`get` waits for the next loss in pair order and gives up with
    :class:`FeedClosed` once :meth:`close` is called (the run ended first).
    """

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._next = 0

    def put(self, loss: float) -> None:
        self._queue.put(loss)

    def get(self, pair: int) -> float:
        if pair != self._next:
            raise ValueError(f"losses are read in pair order: expected pair {self._next}, got {pair}")
        while True:
            try:
                value = self._queue.get(timeout=0.1)
                self._next += 1
                return value
            except queue.Empty:
                if self._closed.is_set():
                    raise FeedClosed(f"the run ended before the loss of pair {pair}") from None

    def close(self) -> None:
        self._closed.set()


class FeedClosed(RuntimeError):
    """The training loop ended while the strips waited for a loss."""

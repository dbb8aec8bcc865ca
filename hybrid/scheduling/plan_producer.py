"""The scheduler thread of a worker: plans made ahead of training, and where it saves its state.

Each worker runs its scheduler one or more batches ahead of its training loop
(docs/design.md section 11), so by the time iteration ``t`` ends, its cluster
state has moved past ``t``. What a checkpoint or a mid-run evaluation needs
from the scheduler is therefore taken here, when plan ``t`` is made, and
travels with it: the scheduler's arrays (``BatchPlan.saved``) and this
worker's dirty rows (``BatchPlan.dirty``).

The thread makes a plan when the training loop gives it a turn
(:meth:`PlanProducer.turn`), which the loop does where it waits outside the
interpreter (the workers' allreduce, waiting for the others; with one
worker, the backward pass), and whenever the loop finds no plan ready.
Both threads share one interpreter lock: a scheduler free to run whenever
its queue had room made its next plan during the loop's own Python (the
pulls, the forward), and each handover of the lock cost the loop its wait.
With 1 worker + 1 PS on W1 smoke (2 cores), iterations 1,000-1,400 of an
epoch took 8.54 and 8.59 ms of wall time for 7.20 and 7.19 ms of the loop's
CPU while the scheduler ran beside them, and 6.36 and 6.91 ms for 6.36 and
6.89 once every plan was made (docs/benchmarks.md, issue 54).

Steps known in advance (every ``checkpoint_every``, every ``eval_every``, the
last) are marked as the plans are made. A stop on a signal (section 13) picks
its step at run time: :meth:`PlanProducer.hold` parks the thread at its
newest plan and says which; the workers take the largest such step over all
of them, which no worker's scheduler has passed yet, and
:meth:`PlanProducer.release` lets each thread run to it, mark it and end.
"""
from __future__ import annotations

import collections
import queue
import threading
from typing import Callable, Iterable, Iterator, Optional

from hybrid.data.store import GlobalBatch
from hybrid.scheduling.plans import BatchPlan
from hybrid.scheduling.scheduler import Scheduler


class _End:
    """Typed end marker of the plan queue."""


class PlanProducer:
    """Runs the scheduler ahead of training in a thread, handing (plan, batch) pairs over a bounded queue.

    The thread is the only reader of ``batches``: each plan travels with the
    global batch it was made from. ``marks(step)`` says whether plan ``step``
    carries the saved state and/or the dirty rows (``(save, dirty)``), e.g.
    for the checkpoint at the end of the run; the plan a stop was agreed on
    carries both. Only the worker that writes the scheduler's state
    (``keeps_state``) copies it; on the others ``saved`` is an empty dict,
    which still marks the plan a checkpoint follows.
    """

    def __init__(self, scheduler: Scheduler, batches: Iterable[GlobalBatch], *,
                 marks: Callable[[int], tuple[bool, bool]] = lambda step: (False, False),
                 resume: Optional[dict] = None, start_step: int = 0, keeps_state: bool = True, depth: int = 2):
        self.scheduler, self.marks, self.keeps_state = scheduler, marks, keeps_state
        scheduler.beside_a_loop = True  # its thread shares the interpreter lock with the training loop
        self._start_step = start_step  # the first plan's step without ``resume`` (a cold-started resumed run)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._turn = threading.Event()  # the thread may make its next plan (one turn is kept if it is busy)
        self._stop = threading.Event()
        self._hold, self._held, self._released = threading.Event(), threading.Event(), threading.Event()
        self._stop_after: Optional[int] = None
        self._newest = -1  # step of the newest plan made (the scheduler's state is the one after it)
        self._resume = resume  # handed to the thread, which lets it go once loaded
        self._thread = threading.Thread(target=self._run, args=(batches,), daemon=True, name="scheduler")
        self._thread.start()

    def _run(self, batches: Iterable[GlobalBatch]) -> None:
        pending: collections.deque = collections.deque()

        whole = getattr(self.scheduler, "takes_batches", False)  # FAE's scheduler reads each batch's strip

        def feed():
            for batch in batches:
                pending.append(batch)
                yield batch if whole else batch.sparse

        try:  # any error, the scheduler's call included, reaches the consumer
            plans = self.scheduler.plans(feed(), self._resume, start_step=self._start_step)
            self._resume = None  # the generator drops it once loaded
            for plan in self._paced(plans):
                self._newest = plan.step
                save, dirty = self.marks(plan.step)
                stop = plan.step == self._stop_after
                self._mark(plan, save or stop, dirty or stop)
                if not self._put((plan, pending.popleft())):
                    return
                if self._stop_after is not None and plan.step >= self._stop_after:
                    break
            self._put(_End())
        except BaseException as err:  # handed to the consumer, which re-raises it
            self._put(err)

    def _paced(self, plans: Iterator[BatchPlan]) -> Iterator[BatchPlan]:
        """``plans``, each made only once the loop gave a turn; ends when closed."""
        while self._await_turn():
            plan = next(plans, None)
            if plan is None:
                return
            yield plan

    def _await_turn(self) -> bool:
        """Wait for a turn; False once closed. A hold is one: the thread makes its next plan and parks with it
        in hand (:meth:`_put`), where the agreed stop can still mark it."""
        while not self._stop.is_set():
            if self._turn.wait(0.1) or self._hold.is_set():
                self._turn.clear()
                return True
        return False

    def turn(self) -> None:
        """Let the thread make its next plan now: the loop is about to wait outside the interpreter."""
        self._turn.set()

    def _mark(self, plan: BatchPlan, save: bool, dirty: bool) -> None:
        """Attach what the end of ``plan``'s iteration needs; the scheduler is still right after ``plan``."""
        if save and plan.saved is None:
            plan.saved = self.scheduler.save_arrays() if self.keeps_state else {}
        if dirty and plan.dirty is None:
            plan.dirty = self.scheduler.state.dirty_slots(self.scheduler.state.focus)

    def _put(self, item) -> bool:
        """Queue ``item`` unless closed meanwhile (parking when held); returns whether it was queued."""
        while not self._stop.is_set():
            if self._hold.is_set():
                self._park()
                if isinstance(item, tuple) and item[0].step == self._stop_after:
                    self._mark(item[0], True, True)
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _park(self) -> None:
        self._held.set()
        self._released.wait()

    def hold(self) -> int:
        """Park the thread at its newest plan; returns that plan's step (the last one if it has ended).

        A thread that has ended cannot save its state any more: stopping at
        its last plan is the end of the run, which needs no checkpoint.
        """
        self._hold.set()
        self._turn.set()  # a thread waiting for its turn goes on to its next plan and parks with it
        while not self._held.wait(0.01):
            if not self._thread.is_alive():
                break
        return self._newest

    def release(self, stop_after: int) -> None:
        """Let a held thread go on to plan ``stop_after`` (>= the step :meth:`hold` returned), mark it and end."""
        self._stop_after = stop_after
        self._hold.clear()
        self._released.set()

    def __iter__(self) -> Iterator[tuple[BatchPlan, GlobalBatch]]:
        while True:
            if self._queue.empty():  # the loop would wait for the plan: the thread may make it now
                self._turn.set()
            item = self._queue.get()
            if isinstance(item, _End):
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._released.set()
        self._thread.join(timeout=5)

"""The scheduler's thread (hybrid.scheduling.plan_producer): its errors reach the training loop, it makes plans
when the loop gives it turns, and a stop agreed meanwhile still marks the plan it stops after."""
import time
from types import SimpleNamespace

import pytest

from hybrid.scheduling.plan_producer import PlanProducer


class _RefusingScheduler:
    """A scheduler whose ``plans`` fails when called, before any plan exists (a bad argument, say)."""

    def plans(self, batches, resume=None, start_step=0):
        raise TypeError(f"refused at step {start_step}")


def test_an_error_of_the_scheduler_call_itself_is_raised_in_the_consumer_not_lost_in_its_thread():
    producer = PlanProducer(_RefusingScheduler(), iter([]), start_step=7)
    try:
        with pytest.raises(TypeError, match="refused at step 7"):
            next(iter(producer))
    finally:
        producer.close()


class _CountingScheduler:
    """A scheduler of numbered plans that records how many it has made; a checkpoint saves its count."""

    def __init__(self):
        self.made = 0
        self.state = SimpleNamespace(focus=0, dirty_slots=lambda focus: ("dirty", self.made))

    def plans(self, batches, resume=None, start_step=0):
        for step, _ in enumerate(batches, start_step):
            self.made += 1
            yield SimpleNamespace(step=step, saved=None, dirty=None)

    def save_arrays(self):
        return {"made": self.made}


def _batches(n):
    return iter([SimpleNamespace(sparse=i) for i in range(n)])


def _eventually(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_the_thread_makes_a_plan_only_when_given_a_turn_or_when_the_loop_would_wait():
    scheduler = _CountingScheduler()
    producer = PlanProducer(scheduler, _batches(10))
    try:
        time.sleep(0.3)
        assert scheduler.made == 0  # no turn yet: the loop's own Python runs alone
        plans = iter(producer)
        first, _ = next(plans)  # nothing queued: taking a plan is a turn
        assert first.step == 0
        time.sleep(0.3)
        assert scheduler.made == 1
        producer.turn()  # the loop enters its backward pass
        assert _eventually(lambda: scheduler.made == 2)
        time.sleep(0.3)
        assert scheduler.made == 2  # one turn, one plan
        assert next(plans)[0].step == 1
        assert [plan.step for plan, _ in plans] == list(range(2, 10))  # a loop that only takes plans gets them all
    finally:
        producer.close()


def test_a_stop_agreed_while_the_thread_waits_for_its_turn_marks_the_plan_it_stops_after():
    scheduler = _CountingScheduler()
    producer = PlanProducer(scheduler, _batches(10))
    try:
        plans = iter(producer)
        assert next(plans)[0].step == 0
        newest = producer.hold()  # the thread makes its next plan and parks with it in hand
        assert newest == 1
        producer.release(stop_after=newest)
        plan, _ = next(plans)
        assert (plan.step, plan.saved, plan.dirty) == (1, {"made": 2}, ("dirty", 2))
        assert next(plans, None) is None
    finally:
        producer.close()

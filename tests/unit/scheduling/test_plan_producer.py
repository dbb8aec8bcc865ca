"""The scheduler's thread (hybrid.scheduling.plan_producer): its errors reach the training loop."""
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

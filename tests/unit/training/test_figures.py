"""A run's figures kept as warm-up and counted parts: merged, they are the figures of every plan."""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hybrid.scheduling.event_kinds import KINDS
from hybrid.scheduling.plans import BatchPlan
from hybrid.training.figures import Figures

counts = st.fixed_dictionaries({kind: st.integers(0, 1000) for kind in KINDS})


def _plan(step: int, events: dict, per_worker: list) -> BatchPlan:
    return BatchPlan(step=step, allocation=np.zeros(4, np.int32), counts=events,
                     timing={"allocation": 0.001 * step, "plan": 0.002}, digest="",
                     per_worker=np.array(per_worker, np.int64))


@given(st.lists(st.tuples(counts, st.lists(st.integers(0, 500), min_size=1, max_size=4)), min_size=1, max_size=12),
       st.integers(0, 12))
def test_warm_up_and_counted_figures_merge_into_those_of_every_plan(plans, warmup):
    plans = [_plan(step, events, per_worker) for step, (events, per_worker) in enumerate(plans)]
    whole, before, after = Figures(), Figures(), Figures()
    for plan in plans:
        whole.add(plan)
        (after if plan.step >= warmup else before).add(plan)
    merged = before.merged(after)
    assert merged.summary(timings=False) == whole.summary(timings=False)
    assert merged.sched_seconds.keys() == whole.sched_seconds.keys()
    assert all(abs(merged.sched_seconds[k] - whole.sched_seconds[k]) < 1e-12 for k in whole.sched_seconds)

"""An allocation states the most samples it gives one worker, start-up sizes the caches for it, and every
batch is held to it (docs/modes.md, "How to add a mode")."""
import dataclasses

import numpy as np
import pytest

from hybrid.config import load_config
from hybrid.scheduling.allocation import RandomAllocation
from hybrid.scheduling.policy import Allocation, SchedulePolicy, SchedulerError, Sync
from hybrid.scheduling.scheduler import Scheduler

CARDINALITIES = np.full(4, 100)  # 4 tables of 100 rows


class Lopsided(RandomAllocation):
    """Worker 0 trains its own samples and worker 1's: twice a balanced share. States the balanced one."""

    def allocate(self, rows, iteration, upcoming=None):
        alloc = np.arange(len(rows), dtype=np.int32) % self.n_workers
        alloc[alloc == 1] = 0
        return alloc


class StatedLopsided(Lopsided):
    """The same allocation, its largest share stated."""

    @classmethod
    def largest_share(cls, n_samples, n_workers):
        return 2 * -(-n_samples // n_workers)


@dataclasses.dataclass(frozen=True)
class PolicyOf(SchedulePolicy):
    """vanilla's synchronization with a throwaway allocation class."""

    cls: type = RandomAllocation

    def allocation_class(self, config):
        return self.cls

    def allocation_policy(self, config, state, cardinalities):
        return self.cls(config.cluster.workers, config.seed)


def _scheduler(cls, cache_ratio):
    # 4 workers x 8 samples: a balanced working set is 8 x 4 tables = 32 rows, 8% of the 400
    config = load_config(None, ["cluster.workers=4", "train.batch_per_worker=8", f"cache.ratio={cache_ratio}",
                                "scheduler.mode=vanilla", "scheduler.threads=1"])
    return Scheduler.from_config(config, cardinalities=CARDINALITIES,
                                 policy=PolicyOf(Allocation.balanced, Sync.full_set, cls))


def _batches(count):
    rng = np.random.default_rng(0)
    return (rng.integers(0, 100, size=(32, 4)) for _ in range(count))


def test_a_stated_unbalanced_allocation_is_refused_at_start_up_when_the_caches_cannot_hold_its_share():
    with pytest.raises(SchedulerError, match=r"^cache.ratio=0.08 gives 32 slots per worker, but one iteration may "
                                             r"need up to 64 rows \(16 samples on one worker x 4 tables\); use "
                                             r"cache.ratio >= 0.1600$"):
        _scheduler(StatedLopsided, 0.08)
    # sized for its share, it trains: worker 0 holds 64 rows each iteration
    plans = list(_scheduler(StatedLopsided, 0.16).plans(_batches(5)))
    assert [np.bincount(p.allocation, minlength=4).tolist() for p in plans] == [[16, 0, 8, 8]] * 5


def test_an_allocation_giving_more_than_it_states_is_refused_at_its_first_batch():
    scheduler = _scheduler(Lopsided, 0.08)  # states the balanced 8 samples: start-up sizes for those
    with pytest.raises(SchedulerError, match=r"^Lopsided gave worker 0 16 of 32 samples, more than the 8 its "
                                             r"largest_share states \(the caches are sized for that\)$"):
        next(iter(scheduler.plans(_batches(5))))


def test_every_mode_balances():
    """The modes' allocations give each worker the batch per worker, rounded up (what start-up assumes)."""
    for n_samples, n_workers, share in ((32, 4, 8), (33, 4, 9), (3, 4, 1)):
        assert RandomAllocation.largest_share(n_samples, n_workers) == share
    config = load_config(None, ["cluster.workers=4", "train.batch_per_worker=8"])
    from hybrid.modes import MODES
    assert {name: mode.schedule.largest_share(config) for name, mode in MODES.items()} == dict.fromkeys(MODES, 8)

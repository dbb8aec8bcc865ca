"""The scheduler's threads change its speed, never its schedule (docs/design.md section 3, "Threads").

Every stage runs across ``scheduler.threads`` threads: the needs, each
worker's pulls, the updates, the plan and the allocations. Whatever the
count, every plan (allocation, counts, each worker's transmissions, the
focus worker's share, the digest of all events) and the cluster state after
it must be those of one thread.
"""
import numpy as np
import pytest

from hybrid import modes
from hybrid.config import load_config
from hybrid.data.store import BatchStore
from hybrid.runtime import launch_facts

SETTINGS = {
    "vanilla": ["scheduler.mode=vanilla"],
    "laia": ["scheduler.mode=laia"],
    "plan": ["scheduler.mode=plan"],
    "herald-ps": ["scheduler.mode=herald"],
    "herald-p2p": ["scheduler.mode=herald", "scheduler.sync=p2p"],
    "herald-chunked": ["scheduler.mode=herald", "scheduler.laia=chunked"],
    "herald-cost": ["scheduler.mode=herald", "scheduler.scoring=cost", "scheduler.order=confident"],
    "herald-cost-blocks": ["scheduler.mode=herald", "scheduler.scoring=cost", "scheduler.order=confident",
                           "scheduler.blocks=4", "scheduler.block_size=5"],
    "herald-cost-swap": ["scheduler.mode=herald", "scheduler.scoring=cost", "scheduler.swap_rounds=2",
                         "scheduler.lookahead=true"],
    "het-0": ["scheduler.mode=het", "scheduler.staleness=0"],
    "het-100": ["scheduler.mode=het", "scheduler.staleness=100"],
    "fae": ["scheduler.mode=fae"],
    "herald-lfu": ["scheduler.mode=herald", "cache.policy=lfu"],
}


def _share(work) -> list:
    """The focus worker's plan as arrays, to compare whole."""
    if work is None:
        return []
    transfers = [work.writeback, work.pull, work.prefetch, work.plan_push]
    arrays = [work.samples, work.index, work.rows, work.slots, work.local, work.accumulate, work.full_set,
              work.accumulate_turns, np.array([work.accumulate_rounds]), work.p2p_in.peers, work.p2p_in.rows,
              work.p2p_out.peers, work.p2p_out.rows]
    return arrays + [a for t in transfers for a in (t.rows, t.slots)]


def _run(store, settings, threads, *, workers, batch, iterations=25, focus=1):
    config = load_config(None, [f"data.path={store.path}", f"cluster.workers={workers}",
                                f"train.batch_per_worker={batch}", "cache.ratio=0.2", "seed=5",
                                f"scheduler.threads={threads}", *settings])
    scheduler = modes.scheduler_for(config, cardinalities=store.cardinalities, worker=focus)
    assert scheduler.state.threads == threads
    batches = (b.sparse for b in store.batches(config.global_batch))
    plans = []
    for plan, _ in zip(scheduler.plans(batches), range(iterations)):
        plans.append((plan.digest, plan.allocation.copy(), plan.counts, plan.per_worker.copy(), _share(plan.work)))
    return plans, scheduler.state.digest(), scheduler.state.holder_sets()


def _assert_same(one, other):
    (plans, digest, holders), (plans_n, digest_n, holders_n) = one, other
    assert len(plans) == len(plans_n)
    for step, (a, b) in enumerate(zip(plans, plans_n)):
        assert a[0] == b[0], f"digest of plan {step}"
        assert np.array_equal(a[1], b[1]) and a[2] == b[2] and np.array_equal(a[3], b[3]), f"plan {step}"
        assert len(a[4]) == len(b[4]) and all(np.array_equal(x, y) for x, y in zip(a[4], b[4])), f"share {step}"
    assert digest == digest_n and np.array_equal(holders, holders_n)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_mode_schedules_alike_at_1_2_4_and_16_threads(criteo_like, name):
    store = BatchStore(criteo_like)
    one = _run(store, SETTINGS[name], 1, workers=6, batch=16)
    for threads in (2, 4, 16):  # 16: more threads than workers, and than this machine's cores
        _assert_same(one, _run(store, SETTINGS[name], threads, workers=6, batch=16))


@pytest.mark.parametrize("name", ["herald-ps", "herald-p2p", "herald-cost", "herald-cost-blocks", "het-0"])
def test_holder_sets_of_two_words_schedule_alike_at_1_and_3_threads(criteo_like, name):
    """70 workers: holder bits of one row span two words, and threads set bits of the same words."""
    store = BatchStore(criteo_like)
    one = _run(store, SETTINGS[name], 1, workers=70, batch=4, iterations=12, focus=66)
    _assert_same(one, _run(store, SETTINGS[name], 3, workers=70, batch=4, iterations=12, focus=66))


def test_the_default_thread_count_is_the_ranks_compute_threads():
    assert launch_facts.scheduler_threads(3) == 3  # a setting wins
    # 2 ranks on the host share its cores, one thread each waits in MPI
    environ = {"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    cores = launch_facts.usable_cores()
    assert launch_facts.scheduler_threads(0, environ=environ) == max(1, cores // 2 - 1)
    assert launch_facts.scheduler_threads(0, user_threads=5, environ=environ) == 5  # train.threads

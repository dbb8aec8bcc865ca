"""FAE's order of training and its plans (hybrid/scheduling/fae_order.py, hybrid/scheduling/fae_plans.py), without MPI."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hybrid import modes
from hybrid.config import Mode, load_config
from hybrid.data.store import BatchStore
from hybrid.data.synthetic import synthesize
from hybrid.scheduling.fae_order import LAG_BATCHES, LossFeed, FeedClosed, MiniBatches, fae_batches, strip_order
from hybrid.scheduling.fae_plans import FaeScheduler, calibration_for
from hybrid.scheduling.plan_producer import PlanProducer
from hybrid.scheduling.shuffle_schedule import ShuffleSchedule


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("fae") / "store"
    synthesize(path, like="criteo-kaggle", rows=1500, scale=0.001, seed=4)
    return path


def _config(store_path, *overrides):
    return load_config(None, [f"data.path={store_path}", "cluster.workers=3", "train.batch_per_worker=8",
                              "cache.ratio=0.05", "scheduler.mode=fae", "model.embedding_dim=4",
                              "fae.budget_mb=0.02", "fae.small_table_kb=0", "fae.sample_fraction=0.5", *overrides])


class _Split:
    """Just what MiniBatches.of reads of a store."""

    def __init__(self, n):
        self.n_samples, self.start = n, 10

    def order(self, shuffle, seed, epoch=0):
        positions = np.arange(self.start, self.start + self.n_samples)
        return np.random.default_rng([seed, epoch]).permutation(positions) if shuffle else positions


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), min_size=4, max_size=200), st.integers(1, 9), st.booleans())
def test_mini_batches_are_all_hot_or_all_cold_and_take_each_input_once(hot, size, shuffle):
    split, hot = _Split(len(hot)), np.array(hot)
    if hot.sum() < size and (~hot).sum() < size:
        with pytest.raises(ValueError, match="make no global batch"):
            MiniBatches.of(split, hot, size, shuffle=shuffle, seed=1)
        return
    batches = MiniBatches.of(split, hot, size, shuffle=shuffle, seed=1)
    for kind, flag in (("hot", True), ("cold", False)):
        chosen = getattr(batches, kind)
        assert len(chosen) == int((hot == flag).sum()) // size
        assert all(len(b) == size and (hot[b - split.start] == flag).all() for b in chosen)
    everything = np.concatenate(batches.hot + batches.cold)
    assert len(np.unique(everything)) == len(everything)


def _layout(n_cold, n_hot, losses=None, passes=2):
    """(kind, pair, last, index) of each batch of ``passes`` passes, and when each loss was asked for."""
    batches = MiniBatches(hot=[np.array([i]) for i in range(n_hot)], cold=[np.array([-1 - i]) for i in range(n_cold)])
    asked, produced = [], []

    def loss(pair):
        asked.append((pair, len(produced)))
        return None if losses is None else losses[pair]

    order = strip_order(lambda p: batches, ShuffleSchedule(), loss)
    for positions, strip in itertools.islice(order, passes * (n_cold + n_hot)):
        produced.append((strip.kind, strip.pair, strip.last, int(positions[0])))
    return produced, asked


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 30), st.integers(0, 30))
def test_a_pass_runs_every_mini_batch_once_in_strips_that_start_cold(n_cold, n_hot):
    if n_cold + n_hot == 0:
        return
    produced, _ = _layout(n_cold, n_hot, passes=1)
    assert sorted(i for *_, i in produced) == sorted(list(range(n_hot)) + [-1 - i for i in range(n_cold)])
    strips = [list(group) for _, group in itertools.groupby(produced, key=lambda b: (b[0], b[1]))]
    assert all(s[-1][2] and not any(b[2] for b in s[:-1]) for s in strips), "the last batch of each strip is marked"
    if n_cold and n_hot:
        assert produced[0][0] == "cold"
        assert [len(s) for s in strips[:2]] == [-(-n_cold // 2), -(-n_hot // 2)]  # R(50)


def test_a_loss_is_used_only_once_its_pair_ended_lag_batches_before():
    produced, asked = _layout(12, 12, losses=[1.0] * 100, passes=6)
    ends = {}
    for step, (_, pair, *_) in enumerate(produced):
        ends[pair] = step
    for pair, step in asked:
        assert ends[pair] <= step - LAG_BATCHES
    assert [pair for pair, _ in asked] == list(range(len(asked)))


def test_rising_losses_shorten_the_strips_and_a_replay_lays_out_the_same_order():
    rising = [float(i) for i in range(100)]
    steady, _ = _layout(40, 40, passes=2)
    shorter, _ = _layout(40, 40, losses=rising, passes=2)
    pairs = lambda produced: len({pair for _, pair, *_ in produced})  # noqa: E731
    assert pairs(shorter) > pairs(steady)
    assert _layout(40, 40, losses=rising, passes=2)[0] == shorter


def test_the_loss_feed_hands_losses_in_order_and_gives_up_when_closed():
    feed = LossFeed()
    feed.put(0.5)
    assert feed.get(0) == 0.5
    with pytest.raises(ValueError, match="pair order"):
        feed.get(3)
    feed.close()
    with pytest.raises(FeedClosed):
        feed.get(1)


def _plans(config, store, worker):
    calibration = calibration_for(config, store, say=lambda *_: None)
    scheduler = FaeScheduler(modes.scheduler_for(config, cardinalities=store.cardinalities, mode=Mode.fae,
                                                 worker=worker), calibration.hot_rows)
    mini = MiniBatches.of(store, calibration.hot_inputs, config.global_batch)
    batches = fae_batches(store, strip_order(lambda p: mini, ShuffleSchedule(), lambda pair: None))
    n = len(mini.hot) + len(mini.cold) + 10
    return list(scheduler.plans(itertools.islice(batches, n))), calibration, scheduler


def test_plans_switch_at_strip_ends_and_hot_iterations_touch_only_the_replicas(store_path):
    config = _config(store_path)
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    plans, calibration, scheduler = _plans(config, store, worker=0)
    hot_rows = len(calibration.hot_rows)
    kinds = [p.fae.kind for p in plans]
    assert "hot" in kinds and "cold" in kinds
    assert [p.step for p in plans] == list(range(len(plans)))  # what the rates and the warm-up follow
    for before, plan in zip([None] + plans[:-1], plans):
        switched = before is not None and before.fae.kind != plan.fae.kind
        new_pair = before is not None and before.fae.pair != plan.fae.pair
        assert plan.counts["hot_pull"] == (hot_rows * 3 if plan.fae.kind == "hot" and (before is None or switched)
                                           else 0)
        assert plan.counts["hot_push"] == (hot_rows if new_pair and before.fae.kind == "hot" else 0)
        assert (plan.fae.observe == before.fae.pair) if new_pair else plan.fae.observe is None
        if plan.fae.kind == "hot":
            assert plan.counts["hot_allreduce"] > 0 and plan.counts["pull"] == plan.counts["full_set_push"] == 0
            work = plan.work
            assert np.array_equal(calibration.hot_rows[work.slots], work.rows)
            assert np.array_equal(work.hot.union[work.hot.positions], work.slots)
        else:
            assert plan.counts["hot_allreduce"] == 0 and plan.counts["full_set_push"] > 0


def test_every_worker_gets_its_own_share_of_the_same_plans(store_path):
    config = _config(store_path)
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    shares = [_plans(config, store, worker=w)[0] for w in range(3)]
    for plans in zip(*shares):
        assert len({p.digest for p in plans}) == 1
        samples = np.sort(np.concatenate([p.work.samples for p in plans]))
        assert np.array_equal(samples, np.arange(config.global_batch))


def test_the_replicas_written_to_the_ps_make_cached_copies_stale(store_path):
    config = _config(store_path)
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    _, calibration, scheduler = _plans(config, store, worker=0)
    holders = scheduler.state.holder_sets()
    scheduler.state.reset_to_ps(calibration.hot_rows)
    after = scheduler.state.holder_sets()
    assert after[calibration.hot_rows, 0].all() and not after[calibration.hot_rows, 1:].any()
    cold = np.setdiff1d(np.arange(len(holders)), calibration.hot_rows)
    assert np.array_equal(after[cold], holders[cold])


def test_fae_s_cold_scheduler_releases_the_lock_beside_a_training_loop(store_path):
    """The plan producer marks the scheduler it is given; FAE's wraps the one that makes the cold plans."""
    config = _config(store_path)
    store = BatchStore(store_path, split="train", test_fraction=config.data.test_fraction)
    cold = modes.scheduler_for(config, cardinalities=store.cardinalities, mode=Mode.fae, worker=0)
    scheduler = FaeScheduler(cold, np.zeros(0, dtype=np.int64))
    assert not scheduler.beside_a_loop
    PlanProducer(scheduler, iter([])).close()
    assert cold.beside_a_loop and scheduler.beside_a_loop

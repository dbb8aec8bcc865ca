"""Learning-rate schedules: the factor of each iteration, as docs/training.md defines it."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid.config import ConfigError, load_config
from hybrid.lr_schedule import RateSchedule


def _rates(*overrides, per_epoch=10):
    config = load_config(None, ["train.dense_lr=0.2", "train.embedding_lr=0.1", *overrides])
    return RateSchedule.of(config, per_epoch)


def test_constant_is_the_configured_rates_after_a_linear_warm_up():
    rates = _rates("train.lr_warmup=4")
    assert [rates.factor(t) for t in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert (rates.dense(1), rates.embedding(1)) == (0.2 * 0.5, 0.1 * 0.5)
    assert _rates().factor(0) == 1.0  # no warm-up: the configured rates from the first iteration


def test_step_decays_every_epoch_by_default_and_every_n_iterations_when_set():
    by_epoch = _rates("train.lr_schedule=step", "train.lr_step_gamma=0.5", "train.epochs=3")
    assert [by_epoch.factor(t) for t in (0, 9, 10, 19, 20, 29)] == [1, 1, 0.5, 0.5, 0.25, 0.25]
    every = _rates("train.lr_schedule=step", "train.lr_step_gamma=0.5", "train.lr_step_every=4", "train.lr_warmup=2")
    assert [every.factor(t) for t in (0, 1, 2, 5, 6, 9, 10)] == [0.5, 1, 1, 1, 0.5, 0.5, 0.25]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(1, 50), st.integers(0, 20), st.floats(0, 1))
def test_cosine_falls_from_one_to_the_floor_at_the_last_iteration_never_rising(epochs, per_epoch, warmup, floor):
    rates = _rates("train.lr_schedule=cosine", f"train.epochs={epochs}", f"train.lr_warmup={warmup}",
                   f"train.lr_min_ratio={floor}", per_epoch=per_epoch)
    total = epochs * per_epoch
    after = [rates.factor(t) for t in range(min(warmup, total), total)]
    assert all(a >= b - 1e-15 for a, b in zip(after, after[1:]))
    assert all(floor - 1e-12 <= f <= 1.0 + 1e-12 for f in after)
    if total - 1 > warmup:
        assert after[0] == pytest.approx(1.0) and after[-1] == pytest.approx(floor)
    assert rates.factor(total - 1 + 5) == pytest.approx(floor) or total - 1 <= warmup  # a longer run stays there


def test_the_factor_is_a_function_of_the_iteration_alone():
    a, b = _rates("train.lr_schedule=cosine", "train.epochs=2"), _rates("train.lr_schedule=cosine", "train.epochs=2")
    assert [a.factor(t) for t in range(20)] == [b.factor(t) for t in reversed(range(20))][::-1]
    assert a.factor(7) == 0.5 * (1 + math.cos(math.pi * 7 / 19))


@pytest.mark.parametrize("override,message", [
    ("train.lr_step_gamma=0", "train.lr_step_gamma: must be in"), ("train.lr_min_ratio=2", "train.lr_min_ratio"),
    ("train.lr_warmup=-1", "train.lr_warmup"), ("train.lr_schedule=linear", "train.lr_schedule"),
    ("train.epochs=0", "train.epochs: must be >= 1")])
def test_bad_schedule_settings_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_epochs_and_iterations_are_not_set_together():
    with pytest.raises(ConfigError, match="set train.epochs or train.iterations, not both"):
        load_config(None, ["train.epochs=2", "train.iterations=10"])
    assert load_config(None, ["train.epochs=3"]).run_length(7) == 21
    assert load_config(None, ["train.iterations=10"]).run_length(7) == 10

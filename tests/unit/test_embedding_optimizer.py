"""Row-wise Adagrad for embeddings: the update rule, the rows it must sum first, and where it is refused."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid import modes
from hybrid.config import ConfigError, Mode, load_config
from hybrid.embedding_optimizer import state_columns, updated
from hybrid.scheduling.policy import SchedulerError
from hybrid.scheduling.scheduler import shared_rows

ADAGRAD = ["train.embedding_optimizer=rowwise_adagrad", "model.embedding_dim=4", "train.embedding_lr=0.3",
           "model.precision=float64"]


def test_rowwise_adagrad_is_fbgemms_exact_rowwise_adagrad_and_sgd_is_unchanged():
    config = load_config(None, ADAGRAD)
    assert state_columns(config) == 1 and config.row_width == 5 and config.row_bytes == 40
    rng = np.random.default_rng(4)
    rows, gradients = np.concatenate([rng.normal(size=(6, 4)), rng.uniform(0, 2, (6, 1))], axis=1), rng.normal(size=(6, 4))
    weights, state = torch.tensor(rows[:, :4]), torch.tensor(rows[:, 4])
    g = torch.tensor(gradients)
    state = state + (g * g).mean(dim=1)  # FBGEMM: momentum1 += mean(g^2); w -= lr * g / (sqrt(momentum1) + eps)
    weights = weights - 0.3 * g / (state.sqrt() + 1e-8)[:, None]
    got = updated(rows, gradients, config, config.train.embedding_lr)
    np.testing.assert_allclose(got, np.concatenate([weights.numpy(), state.numpy()[:, None]], axis=1), rtol=1e-15)
    assert not np.shares_memory(got, rows)
    sgd = load_config(None, ["model.embedding_dim=4", "train.embedding_lr=0.3"])
    assert state_columns(sgd) == 0
    np.testing.assert_array_equal(updated(rows[:, :4], gradients, sgd, 0.3), rows[:, :4] - 0.3 * gradients)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_shared_rows_are_those_two_or_more_workers_train(data):
    workers = data.draw(st.integers(1, 5))
    batch, tables = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 3))
    rows = np.array(data.draw(st.lists(st.integers(0, 20), min_size=batch * tables, max_size=batch * tables)),
                    dtype=np.int64).reshape(batch, tables)
    allocation = np.array(data.draw(st.lists(st.integers(0, workers - 1), min_size=batch, max_size=batch)),
                          dtype=np.int32)
    trainers = {}
    for sample in range(batch):
        for row in rows[sample]:
            trainers.setdefault(int(row), set()).add(int(allocation[sample]))
    expected = sorted(row for row, who in trainers.items() if len(who) > 1)
    assert shared_rows(rows, allocation, workers).tolist() == expected


@pytest.mark.parametrize("mode", [Mode.het, Mode.fae])
def test_modes_whose_workers_update_rows_apart_refuse_rowwise_adagrad(mode):
    config = load_config(None, ADAGRAD + [f"scheduler.mode={mode.value}"])
    with pytest.raises(SchedulerError, match="train.embedding_optimizer=rowwise_adagrad is not supported"):
        modes.check(config, np.array([100, 200]))


def test_a_non_positive_epsilon_is_refused():
    with pytest.raises(ConfigError, match="train.embedding_eps"):
        load_config(None, ["train.embedding_eps=0"])

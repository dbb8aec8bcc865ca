"""How a row's summed gradient updates it: SGD, or row-wise Adagrad (docs/training.md, "Embedding optimizers").

Row-wise Adagrad is FBGEMM's ``EXACT_ROWWISE_ADAGRAD``, TorchRec's default:
each row keeps one accumulator ``s`` (stored as the row's last value, so it
lives beside the row on the PS and in the caches and moves with it), and a
row trained with summed gradient ``g`` (over the whole global batch) becomes

    s <- s + mean(g * g)
    w <- w - lr * g / (sqrt(s) + eps)

The update is not linear in ``g``: a row several workers train must be
updated once with the sum of their gradients, never as a sum of
per-worker updates (``hybrid.modes.vanilla`` sums them first). Rows no
sample of the batch uses have ``g = 0`` and are left unchanged.
"""
from __future__ import annotations

import numpy as np

from hybrid.config import Config, EmbeddingOptimizer


def state_columns(config: Config) -> int:
    """Optimizer values stored after each row's embedding: 0 for SGD, 1 for row-wise Adagrad."""
    return config.row_width - config.model.embedding_dim


def updated(rows: np.ndarray, gradients: np.ndarray, config: Config, lr: float) -> np.ndarray:
    """``rows`` (``[n, row_width]``, state included) after their summed ``gradients`` (``[n, dim]``) at rate ``lr``
    (the iteration's, ``hybrid.lr_schedule``).

    The same NumPy operations on every worker and in the reference, so two
    workers holding the same row and gradient compute the same bits.
    """
    dim = config.model.embedding_dim
    out = rows.copy()
    if config.train.embedding_optimizer is EmbeddingOptimizer.sgd:
        out[:, :dim] -= lr * gradients
        return out
    state = rows[:, dim] + (gradients * gradients).mean(axis=1)
    out[:, :dim] -= lr * gradients / (np.sqrt(state) + config.train.embedding_eps)[:, None]
    out[:, dim] = state
    return out

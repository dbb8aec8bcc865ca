"""A trained model taken out of the cluster: one file, loaded on one machine without MPI or Horovod.

``hybrid export CHECKPOINT --out FILE`` (``hybrid.training.export``) writes
the file; this module reads it (docs/export.md)::

    from hybrid.exported import load
    model = load("w1.pt")                 # a torch.nn.Module, in eval mode
    logits = model(dense, sparse)         # dense [B, n_dense] floats, sparse [B, tables] per-table ids
    probabilities = torch.sigmoid(logits)

The file is a ``torch.save`` dict (read with ``weights_only=True``, no
pickled code): ``format``, the ``config`` the run trained with, the MLP's
``state_dict``, every embedding row as one ``[rows, dim]`` tensor,
``table_offsets`` (each table's first global row), ``n_dense`` and the
checkpoint's ``step``. It imports only torch, NumPy, scikit-learn (for
:func:`evaluate`) and this package's model definitions.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import nn

from hybrid import torch_files
from hybrid.config import ModelConfig
from hybrid.data.store import BatchStore
from hybrid.models import build_model

FORMAT = "hybrid-export/1"


class ExportedModel(nn.Module):
    """The dense model behind its embedding tables: ``forward(dense, sparse)`` returns logits.

    ``sparse`` holds each sample's id in each table (the store's ids, as
    ``hybrid preprocess`` made them), not global rows.
    """

    def __init__(self, model: nn.Module, embeddings: torch.Tensor, table_offsets: torch.Tensor,
                 config: dict | None = None):
        super().__init__()
        self.config = config or {}  # the config the run trained with (e.g. its data.test_fraction)
        self.model = model
        self.embeddings = nn.Embedding.from_pretrained(embeddings, freeze=True)
        self.register_buffer("table_offsets", table_offsets.to(torch.int64))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return self.model(dense, self.embeddings(sparse.to(torch.int64) + self.table_offsets))


def save(path: str | Path, *, config: dict, model_state: dict, embeddings: np.ndarray, table_offsets: np.ndarray,
         n_dense: int, step: int) -> None:
    """Write an export to ``path`` atomically (a temporary file renamed): a partial file never has its name.

    ``embeddings`` is written from its own memory, without a copy.
    """
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    torch.save({"format": FORMAT, "config": config, "model": model_state,
                "embeddings": torch.from_numpy(embeddings), "table_offsets": torch.from_numpy(table_offsets),
                "n_dense": int(n_dense), "step": int(step)}, temporary)
    temporary.replace(path)


def load(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = True) -> ExportedModel:
    """The model of an export, in eval mode; with ``mmap`` the tables stay on disk until rows are read."""
    saved = torch_files.load(path, what="a model written by hybrid export", remedy="export one with 'hybrid export'",
                             map_location=map_location, mmap=mmap)
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise ValueError(f"{path}: not a model written by hybrid export (format {FORMAT})")
    settings = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), saved["config"]["model"]))
    model = build_model(settings, n_dense=saved["n_dense"], n_tables=len(saved["table_offsets"]),
                        seed=saved["config"]["seed"])
    model.load_state_dict(saved["model"])
    return ExportedModel(model, saved["embeddings"], saved["table_offsets"], saved["config"]).eval()


def auc_and_logloss(labels: np.ndarray, probabilities: np.ndarray) -> dict:
    """Test AUC and log loss as the training summary reports them (NaN AUC with one class only; both NaN, and
    ``nonfinite`` counted, when some outputs are not finite: a model that diverged).

    Both are computed here with NumPy and equal scikit-learn's ``roc_auc_score`` and ``log_loss``
    (tests/unit/test_exported.py checks that): importing ``sklearn.metrics`` costs about 2 s of CPU, which
    every rank of every run paid at its first evaluation."""
    if len(labels) == 0:
        return {"samples": 0, "auc": float("nan"), "logloss": float("nan")}
    nonfinite = int((~np.isfinite(probabilities)).sum())
    if nonfinite:
        return {"samples": int(len(labels)), "auc": float("nan"), "logloss": float("nan"), "nonfinite": nonfinite}
    labels = np.asarray(labels, dtype=np.float64)
    clipped = np.clip(probabilities, 1e-7, 1 - 1e-7)
    eps = np.finfo(clipped.dtype).eps  # as scikit-learn clips: float32 outputs at 1.2e-7
    clipped = np.clip(clipped, eps, 1 - eps).astype(np.float64)
    logloss = float(-np.mean(labels * np.log(clipped) + (1 - labels) * np.log1p(-clipped)))
    return {"samples": int(len(labels)), "auc": roc_auc(labels, probabilities), "logloss": logloss}


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The area under the ROC curve (NaN with one class only): the Mann-Whitney statistic, tied scores counted
    half, which is the trapezoidal area scikit-learn's ``roc_auc_score`` computes."""
    positive = np.asarray(labels) == 1
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, group, size = np.unique(np.asarray(scores), return_inverse=True, return_counts=True)
    mean_rank = np.cumsum(size) - (size - 1) / 2.0  # ranks from 1; a group of ties shares their mean
    rank_sum = float(mean_rank[group.reshape(-1)][positive].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def evaluate(model: ExportedModel, store: BatchStore, batch_size: int = 4096, limit: int = 0) -> dict:
    """AUC and log loss of ``model`` on the samples of ``store`` (e.g. its test split; the first ``limit``)."""
    rows, tables = model.embeddings.num_embeddings, len(model.table_offsets)
    if store.n_tables != tables or int(store.cardinalities.sum()) != rows:
        raise ValueError(f"{store.path} has {store.n_tables} tables of {int(store.cardinalities.sum())} rows; the "
                         f"model was trained on {tables} tables of {rows} rows")
    dtype = model.embeddings.weight.dtype
    stop = store.stop if not limit else min(store.stop, store.start + limit)
    probabilities, labels = [], []
    with torch.no_grad():
        for begin in range(store.start, stop, batch_size):
            batch = store.gather(0, np.arange(begin, min(stop, begin + batch_size)))
            logits = model(torch.from_numpy(batch.dense).to(dtype), torch.from_numpy(batch.sparse))
            probabilities.append(torch.sigmoid(logits).numpy())
            labels.append(batch.labels)
    return auc_and_logloss(np.concatenate(labels or [np.zeros(0)]), np.concatenate(probabilities or [np.zeros(0)]))

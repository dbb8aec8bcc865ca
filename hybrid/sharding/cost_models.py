"""Neural cost models for sharding embedding tables over PS ranks (NeuroShard, docs/design.md section 8).

A shard plan is only as good as its slowest PS rank, and what a rank costs is
not the sum of simple per-table heuristics: it depends on how many distinct
rows an iteration touches, how skewed the accesses are, the row width and
how the tables share the rank. NeuroShard (MLSys'23) "pre-trains, then
searches": costs of many random table combinations and placements are
measured once through the real store (elsewhere), two small networks learn
them, and the planner's search then asks the networks instead of the
hardware. This module holds the learned half: the per-slice features
(:class:`TableSlice`, :func:`table_slice`, :func:`slice_features`), the
serving cost model (DeepSets over the slices one rank holds: a shared
per-slice MLP, a sum, a head MLP; the paper's Figure 5 after DreamShard), the
communication cost model (an MLP over the bytes each rank moves), their
training (:func:`fit_serving`, :func:`fit_comm`: MSE on the logarithm of the
cost by default, Adam, a seeded held-out split) and :class:`CostModels`, which bundles both with how their data was
collected and saves/loads them as plain tensors (``weights_only`` loading).
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from hybrid import torch_files

N_BINS = 17
"""Access-count histogram bins: [2**k, 2**(k+1)) for k = 0..15, then >= 2**16."""

N_FEATURES = 4 + N_BINS
"""Features per slice (21): log2(1+rows)/32, width/128, pooling, log2(1+distinct)/20, the N_BINS fractions."""

MAX_RANKS = 8
"""Ranks the communication model takes (bytes per rank, zero padded)."""

PART_KINDS = ("whole", "columns", "rows")

_FORMAT = "hybrid.shard_costs/1"


@dataclass(frozen=True)
class TableSlice:
    """What one PS rank holds of one table: the cost models' per-table input."""
    table: int                 # the table's index in its task
    rows: int                  # rows this slice holds (its share of the table's cardinality)
    width: int                 # columns this slice holds (embedding values per row)
    pooling: float             # ids per sample that reach this slice
    distinct: float            # mean distinct rows of the slice one iteration touches
    histogram: tuple           # N_BINS fractions summing to 1 (or all 0 if never touched)
    part: tuple = ("whole", 1, 0)   # ("whole"|"columns"|"rows", parts, index): which part of the table

    def __post_init__(self):
        """Reject malformed slices here: the search caches costs keyed by them, so a bad one would spread."""
        if len(self.histogram) != N_BINS:
            raise ValueError(f"TableSlice: histogram has {len(self.histogram)} bins, expected {N_BINS}")
        _check_part(self.part)


def _check_part(part) -> None:
    """A part is ("whole", 1, 0), ("columns", k, j) or ("rows", k, j) with 0 <= j < k."""
    if not (isinstance(part, tuple) and len(part) == 3 and part[0] in PART_KINDS):
        raise ValueError(f"part must be (kind, parts, index) with kind in {PART_KINDS}, got {part!r}")
    kind, parts, index = part
    if not (int(parts) >= 1 and 0 <= int(index) < int(parts)):
        raise ValueError(f"part {part!r}: need parts >= 1 and 0 <= index < parts")
    if kind == "whole" and (parts, index) != (1, 0):
        raise ValueError(f"part {part!r}: a whole table is ('whole', 1, 0)")


def access_histogram(counts) -> np.ndarray:
    """Fractions of touched rows by access count, in power-of-two bins (float64, N_BINS).

    ``counts`` are one iteration's per-row access counts (touched rows only,
    each >= 1). Bin k < 16 holds counts in [2**k, 2**(k+1)), bin 16 counts
    >= 2**16. How skewed the accesses are decides how much of the work repeats
    on cached rows, which sizes and pooling alone do not show. The bin is read
    from the float exponent (np.frexp), exact at powers of two.
    """
    counts = np.asarray(counts)
    hist = np.zeros(N_BINS)
    if counts.size == 0:
        return hist
    if counts.min() < 1:
        raise ValueError(f"access_histogram: counts must be >= 1 (touched rows only), got min {counts.min()}")
    _, exponent = np.frexp(counts.astype(np.float64))     # count = m * 2**exponent, m in [0.5, 1)
    bins = np.minimum(exponent - 1, N_BINS - 1)           # floor(log2(count)), capped
    hist += np.bincount(bins, minlength=N_BINS)
    return hist / counts.size


def _rows_in_phase(cardinality: int, parts: int, index: int) -> int:
    """How many r in [0, cardinality) have r % parts == index."""
    return max(0, (cardinality - index + parts - 1) // parts)


def table_slice(batches, cardinality: int, *, table: int, width: int, pooling: float = 1.0,
                part: tuple = ("whole", 1, 0)) -> TableSlice:
    """Measure one slice of a table on sample iterations: its rows, pooling, distinct rows and access histogram.

    ``batches`` are the table-local row ids (0..cardinality-1) each iteration
    reads, one per sample lookup (repeats kept). A ("columns", k, j) part holds
    every row at the ``width`` the caller gives. A ("rows", k, j) part holds
    the rows r with r % k == j (rows dealt round-robin over k ranks): only the
    ids in that phase reach it, so its pooling is ``pooling`` times their mean
    fraction (over iterations with any ids; 1/k if none has any), and only
    they count for distinct rows and the histogram. The histogram is averaged
    over the iterations that touch the slice at all (so it sums to 1, or is
    all 0 if none does); ``distinct`` over all iterations. So the k row parts'
    rows, distinct rows and pooling add up to the whole table's.
    """
    part = tuple(part)
    _check_part(part)
    if len(batches) == 0:
        raise ValueError("table_slice: no batches to measure")
    kind, parts, index = part
    fractions, distinct = [], np.zeros(len(batches))
    hist_sum, touched = np.zeros(N_BINS), 0
    for b, ids in enumerate(batches):
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= cardinality):
            raise ValueError(f"table_slice: table {table} batch {b} has ids outside [0, {cardinality})")
        mine = ids[ids % parts == index] if kind == "rows" and parts > 1 else ids
        if ids.size:
            fractions.append(mine.size / ids.size)
        if mine.size:
            _, counts = np.unique(mine, return_counts=True)
            distinct[b] = counts.size
            hist_sum += access_histogram(counts)
            touched += 1
    rows = _rows_in_phase(cardinality, parts, index) if kind == "rows" else int(cardinality)
    histogram = hist_sum / touched if touched else hist_sum
    if fractions:
        share = float(np.mean(fractions))
    else:  # no ids at all: round-robin deals ids evenly in expectation
        share = 1.0 / parts if kind == "rows" else 1.0
    return TableSlice(table=int(table), rows=int(rows), width=int(width),
                      pooling=float(pooling * share), distinct=float(distinct.mean()),
                      histogram=tuple(float(h) for h in histogram), part=part)


def slice_features(slices: Sequence[TableSlice]) -> np.ndarray:
    """Per slice, the model's N_FEATURES (21) inputs, each scaled to O(1): float32 [n, 21].

    Columns: log2(1+rows)/32, width/128, pooling, log2(1+distinct)/20, then
    the N_BINS histogram fractions. Logs because rows and distinct rows span
    orders of magnitude and their costs grow in steps (cache levels), not
    linearly; pooling is already O(1) here (one id per sample per table).
    """
    out = np.zeros((len(slices), N_FEATURES), dtype=np.float32)
    for i, s in enumerate(slices):
        out[i, :4] = (np.log2(1.0 + s.rows) / 32.0, s.width / 128.0, s.pooling, np.log2(1.0 + s.distinct) / 20.0)
        out[i, 4:] = s.histogram
    return out


def serving_inputs(sets: Sequence[Sequence[TableSlice]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sets of slices as one padded batch: features [B, T_max, F] and a bool mask [B, T_max] of real slices.

    Sets differ in size (a rank holds however many slices the plan gives it),
    so they are zero padded to the largest and the mask tells the model which
    rows are slices.
    """
    t_max = max((len(s) for s in sets), default=0)
    x = np.zeros((len(sets), t_max, N_FEATURES), dtype=np.float32)
    mask = np.zeros((len(sets), t_max), dtype=bool)
    for b, slices in enumerate(sets):
        if len(slices):
            x[b, :len(slices)] = slice_features(slices)
            mask[b, :len(slices)] = True
    return torch.from_numpy(x), torch.from_numpy(mask)


def comm_inputs(bytes_per_rank_list) -> torch.Tensor:
    """Bytes each rank moves per iteration, as the comm model's input [B, MAX_RANKS] float32.

    Each entry is log2(1+bytes)/32 (bytes span orders of magnitude), sorted
    descending (which rank is which does not matter, the busiest sets the
    pace) and zero padded to MAX_RANKS.
    """
    out = np.zeros((len(bytes_per_rank_list), MAX_RANKS), dtype=np.float32)
    for b, per_rank in enumerate(bytes_per_rank_list):
        per_rank = np.asarray(per_rank, dtype=np.float64).reshape(-1)
        if per_rank.size > MAX_RANKS:
            raise ValueError(f"comm_inputs: entry {b} has {per_rank.size} ranks; the comm model takes at most "
                             f"MAX_RANKS={MAX_RANKS}")
        if per_rank.size and per_rank.min() < 0:
            raise ValueError(f"comm_inputs: entry {b} has negative bytes")
        out[b, :per_rank.size] = np.sort(np.log2(1.0 + per_rank) / 32.0)[::-1]
    return torch.from_numpy(out)


class ServingCostModel(nn.Module):
    """Milliseconds one PS rank takes to serve the slices it holds: DeepSets (NeuroShard Fig. 5, DreamShard).

    A shared MLP embeds each slice, the embeddings are summed over the set
    (so the prediction does not depend on slice order and takes any number of
    slices), and a head MLP maps the sum to a cost. Predictions are the head's
    output times the buffer ``target_scale`` (set from the training targets),
    so the network works near 1 while callers see milliseconds.
    """

    def __init__(self):
        super().__init__()
        self.per_table = nn.Sequential(nn.Linear(N_FEATURES, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        self.register_buffer("target_scale", torch.ones(()))
        self.register_buffer("log_target", torch.zeros((), dtype=torch.bool))

    def forward_scaled(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Cost in units of ``target_scale`` [B] for padded sets ``x`` [B, T, F] with ``mask`` [B, T]."""
        embedded = self.per_table(x) * mask.to(x.dtype).unsqueeze(-1)
        return self.head(embedded.sum(dim=1)).squeeze(-1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Predicted milliseconds [B]."""
        return _milliseconds(self, self.forward_scaled(x, mask))


class CommCostModel(nn.Module):
    """Milliseconds of an iteration's PS communication, from the bytes each rank moves (see :func:`comm_inputs`).

    An MLP (64-64) over the sorted, scaled bytes per rank; like the serving
    model, predictions are the output times the buffer ``target_scale``.
    """

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(MAX_RANKS, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, 1))
        self.register_buffer("target_scale", torch.ones(()))
        self.register_buffer("log_target", torch.zeros((), dtype=torch.bool))

    def forward_scaled(self, x: torch.Tensor) -> torch.Tensor:
        """Cost in units of ``target_scale`` [B] for inputs ``x`` [B, MAX_RANKS]."""
        return self.mlp(x).squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Predicted milliseconds [B]."""
        return _milliseconds(self, self.forward_scaled(x))


def _milliseconds(model: nn.Module, scaled: torch.Tensor) -> torch.Tensor:
    """A model's output in milliseconds: times ``target_scale``, after ``exp`` if it learned logarithms."""
    return (torch.exp(scaled) if bool(model.log_target) else scaled) * model.target_scale


@dataclass
class FitReport:
    """A trained model and how well it predicts: MSEs in ms**2, errors on the held-out samples.

    The relative error is mean |pred - y| / y over held-out samples with y > 0.
    Held-out figures are NaN when nothing was held out.
    """
    model: nn.Module
    train_mse: float
    held_out_mse: float
    held_out_mean_abs_error_ms: float
    held_out_mean_relative_error: float
    n_train: int
    n_held_out: int
    seconds: float

    def errors(self) -> dict:
        """The figures without the model (for metadata and logs)."""
        return {"train_mse": self.train_mse, "held_out_mse": self.held_out_mse,
                "held_out_mean_abs_error_ms": self.held_out_mean_abs_error_ms,
                "held_out_mean_relative_error": self.held_out_mean_relative_error,
                "n_train": self.n_train, "n_held_out": self.n_held_out, "seconds": self.seconds}


def split_indices(n: int, held_out: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Train and held-out indices: the last ``round(held_out * n)`` of a seeded permutation are held out."""
    if not 0.0 <= held_out < 1.0:
        raise ValueError(f"held_out must be in [0, 1), got {held_out}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_held = round(held_out * n)
    if n - n_held < 1:
        raise ValueError(f"no training samples left: {n} samples, held_out={held_out}")
    return perm[:n - n_held], perm[n - n_held:]


def _fit(model: nn.Module, inputs: tuple, y: torch.Tensor, *, epochs: int, lr: float, batch_size: int,
         seed: int, held_out: float, log_target: bool = False) -> FitReport:
    """Train ``model`` (its ``forward_scaled`` on ``inputs``) on ``y`` ms by MSE with Adam; report its errors.

    Targets are divided by the mean training target (kept in the model's
    ``target_scale``) so the loss is O(1) whatever the units; the reported
    MSEs are back in ms**2. With ``log_target`` the model learns the
    logarithm of that ratio: MSE then weighs every sample's relative error
    alike, which targets spanning decades (communication from a few rows to
    tens of thousands) need. Shuffles come from a generator seeded by ``seed``.
    """
    start = time.perf_counter()
    if epochs < 0 or batch_size < 1:
        raise ValueError(f"need epochs >= 0 and batch_size >= 1, got {epochs} and {batch_size}")
    train, held = split_indices(len(y), held_out, seed)
    scale = float(y[train].abs().mean())
    model.target_scale.fill_(scale if scale > 0 else 1.0)
    model.log_target.fill_(log_target)
    if log_target and float(y[train].min()) <= 0:
        raise ValueError("log_target needs every training cost above 0 ms")
    y_scaled = torch.log(y / model.target_scale) if log_target else y / model.target_scale
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    shuffle = torch.Generator().manual_seed(seed + 1)
    model.train()
    for _ in range(epochs):
        order = train[torch.randperm(len(train), generator=shuffle)]
        for lo in range(0, len(order), batch_size):
            idx = order[lo:lo + batch_size]
            loss = nn.functional.mse_loss(model.forward_scaled(*(t[idx] for t in inputs)), y_scaled[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        pred = model(*inputs)
    err = pred - y
    train_mse = float((err[train] ** 2).mean())
    nan = float("nan")
    if len(held):
        positive = held[y[held] > 0]
        relative = float((err[positive].abs() / y[positive]).mean()) if len(positive) else nan
        held_mse, held_mae = float((err[held] ** 2).mean()), float(err[held].abs().mean())
    else:
        relative = held_mse = held_mae = nan
    return FitReport(model=model, train_mse=train_mse, held_out_mse=held_mse, held_out_mean_abs_error_ms=held_mae,
                     held_out_mean_relative_error=relative, n_train=len(train), n_held_out=len(held),
                     seconds=time.perf_counter() - start)


def _targets(costs_ms, n: int) -> torch.Tensor:
    """Targets as a float32 tensor, one per sample."""
    y = torch.as_tensor(np.asarray(costs_ms, dtype=np.float32).reshape(-1))
    if len(y) != n:
        raise ValueError(f"{n} samples but {len(y)} costs")
    if n == 0:
        raise ValueError("no samples to fit")
    return y


def fit_serving(sets: Sequence[Sequence[TableSlice]], costs_ms, *, epochs: int = 200, lr: float = 1e-3,
                batch_size: int = 64, seed: int = 0, held_out: float = 0.2, log_target: bool = True) -> FitReport:
    """Train a :class:`ServingCostModel` on measured sets of slices and their costs (ms); deterministic per seed.

    By default on logarithms (see :func:`_fit`): sets of one small slice and of twenty large ones differ tenfold."""
    y = _targets(costs_ms, len(sets))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ServingCostModel()
        return _fit(model, serving_inputs(sets), y, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                    held_out=held_out, log_target=log_target)


def fit_comm(bytes_lists, costs_ms, *, epochs: int = 200, lr: float = 1e-3, batch_size: int = 64, seed: int = 0,
             held_out: float = 0.2, log_target: bool = True) -> FitReport:
    """Train a :class:`CommCostModel` on measured bytes per rank and their costs (ms); deterministic per seed.

    By default on logarithms (see :func:`_fit`): the measured costs span decades."""
    y = _targets(costs_ms, len(bytes_lists))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CommCostModel()
        return _fit(model, (comm_inputs(bytes_lists),), y, epochs=epochs, lr=lr, batch_size=batch_size,
                    seed=seed, held_out=held_out, log_target=log_target)


@dataclass
class CostModels:
    """Both cost models and how they came to be: what the planner's search asks instead of the hardware.

    ``metadata`` is plain JSON (how the costs were collected, the embedding
    width, the fits' errors, ...); it is saved with the weights so a plan can
    name the models it was searched with.
    """
    serving: ServingCostModel
    comm: CommCostModel
    metadata: dict = field(default_factory=dict)

    @classmethod
    def from_fits(cls, serving: FitReport, comm: FitReport, **metadata) -> CostModels:
        """Bundle two fits, recording their errors in the metadata next to the caller's entries."""
        metadata = {**metadata, "serving_fit": serving.errors(), "comm_fit": comm.errors()}
        return cls(serving=serving.model, comm=comm.model, metadata=metadata)

    def serving_ms(self, slices: Sequence[TableSlice]) -> float:
        """Predicted ms for one PS rank holding ``slices``."""
        return float(self.serving_ms_many([slices])[0])

    def serving_ms_many(self, sets: Sequence[Sequence[TableSlice]]) -> np.ndarray:
        """Predicted ms for many sets at once (float64 [len(sets)]): one forward pass for a search step."""
        if len(sets) == 0:
            return np.zeros(0)
        self.serving.eval()
        with torch.no_grad():
            return self.serving(*serving_inputs(sets)).double().numpy()

    def comm_ms(self, bytes_per_rank) -> float:
        """Predicted ms of communication when each rank moves ``bytes_per_rank[r]`` bytes."""
        self.comm.eval()
        with torch.no_grad():
            return float(self.comm(comm_inputs([bytes_per_rank]))[0])

    def save(self, path) -> None:
        """Write plain tensors and a JSON string, so :meth:`load` can use ``weights_only`` loading."""
        try:
            metadata = json.dumps(self.metadata, allow_nan=True)
        except TypeError as exc:
            raise ValueError(f"CostModels metadata must be plain JSON: {exc}") from None
        torch.save({"format": _FORMAT, "serving": self.serving.state_dict(), "comm": self.comm.state_dict(),
                    "metadata": metadata}, path)

    @classmethod
    def load(cls, path) -> CostModels:
        """Read a file written by :meth:`save`; ValueError for any other file (FileNotFoundError if none)."""
        saved = torch_files.load(path, what="a cost-model file", remedy="make one with 'hybrid shard-costs train'",
                                 map_location="cpu")
        if not (isinstance(saved, dict) and saved.get("format") == _FORMAT):
            raise ValueError(f"{path} is not a cost-model file (no {_FORMAT!r} format marker)")
        serving, comm = ServingCostModel(), CommCostModel()
        try:
            serving.load_state_dict(saved["serving"])
            comm.load_state_dict(saved["comm"])
            metadata = json.loads(saved["metadata"])
        except (KeyError, RuntimeError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: malformed cost-model file ({type(exc).__name__}: {exc})") from None
        serving.eval()
        comm.eval()
        return cls(serving=serving, comm=comm, metadata=metadata)

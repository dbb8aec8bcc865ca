"""Cost data for NeuroShard's models, measured through the real store (docs/design.md section 8).

Run under MPI with one worker (rank 0) and at least two PS ranks (the last
ranks). Two kinds of samples, as in the paper's pre-training:

- **Serving cost** of a set of table slices placed on one PS rank: the
  worker's time to read one iteration's distinct rows of the set from that
  rank and add their gradients back (``pull`` then ``accumulate``, each
  completed), the median over a few iterations. The pool is the sharding
  tasks' Criteo-like tables, augmented: each table at every width in
  ``WIDTHS`` (a column slice of that width of a 128-wide table), whole or
  with its rows dealt over 2 or 4 ranks (one phase measured). Every variant
  is its own table in one store: its measured slice on the first PS rank,
  everything else of it on the last, so one store serves every sample.
  Sets are drawn as plans make them (:func:`draw_set`).
- **Communication cost** as a function of the bytes each PS rank moves: the
  time of one iteration's reads and gradient additions to every PS rank at
  once, with a random number of rows per rank, imbalanced to a random degree
  (the paper's greedy-with-probability-``p`` placements).

Rank 0 returns the samples; the other ranks return None.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from hybrid.runtime.shard_plan import Segment, ShardPlan
from hybrid.sharding.cost_models import TableSlice, table_slice
from hybrid.sharding.tasks import pool_profile, table_ids

DIM = 128
WIDTHS = (4, 8, 16, 32, 64, 128)
DEALS = (1, 2, 4)
ITEMSIZE = 4


@dataclass(frozen=True)
class Variant:
    """An augmented pool table: base table ``base`` at ``width`` columns, rows dealt over ``deal`` ranks."""
    base: int
    width: int
    deal: int


def variant_segments(lo: int, hi: int, variant: Variant, measured: int, rest: int) -> list[Segment]:
    """The variant's rows ``[lo, hi)``: its first phase's first ``width`` columns on shard ``measured``,
    all its other values on shard ``rest`` (columns in aligned power-of-two slices, as plans require)."""
    pieces = [(0, variant.width)]
    edge = variant.width
    while edge < DIM:  # [w, 2w), [2w, 4w), ...: each slice aligned to its width
        pieces.append((edge, edge))
        edge *= 2
    segments = []
    for phase in range(variant.deal):
        for col_lo, width in pieces:
            shard = measured if phase == 0 and col_lo == 0 else rest
            segments.append(Segment(shard, lo, hi, variant.deal, phase, col_lo=col_lo,
                                    width=0 if width == DIM else width))
    return segments


def draw_set(rng, n_base: int, max_tables: int) -> list[int]:
    """A random set of distinct variants (indices into the pool's variants) like those a plan puts on a rank.

    A task has one embedding width, so a set has one: its tables mostly at
    that width, some as column halves or quarters, some with their rows
    dealt over 2 or 4 ranks (the search's moves); 1 to ``max_tables`` of them.
    """
    width = int(rng.choice(WIDTHS))
    picks = set()
    for _ in range(int(rng.integers(1, max_tables + 1))):
        narrower = [w for w in (width // 2, width // 4) if w >= WIDTHS[0]]
        w = int(rng.choice(narrower)) if narrower and rng.random() < 0.3 else width
        deal = int(rng.choice(DEALS[1:])) if rng.random() < 0.3 else 1
        picks.add(_variant_index(int(rng.integers(n_base)), w, deal))
    return sorted(picks)


def _variant_index(base: int, width: int, deal: int) -> int:
    """The position of ``Variant(base, width, deal)`` in the pool's variant list (base, then width, then deal)."""
    return (base * len(WIDTHS) + WIDTHS.index(width)) * len(DEALS) + DEALS.index(deal)


def _variant_ids(ids: list, variant: Variant) -> list:
    """The variant's measured phase's ids per iteration (rows dealt: those with ``id % deal == 0``)."""
    return [i[i % variant.deal == 0] if variant.deal > 1 else i for i in ids]


def _time(store, rows: np.ndarray, only=None) -> float:
    """Seconds to read ``rows`` and add them back (of shard ``only``, or of every shard), each completed."""
    out = np.zeros((len(rows), store.dim), dtype=store.dtype)
    start = time.perf_counter()
    store.pull(rows, out, only=only).wait()
    store.accumulate(rows, out, only=only).wait()
    return time.perf_counter() - start


def collect(*, serving_samples: int = 800, comm_samples: int = 300, max_tables: int = 60, batch: int = 4096,
            iterations: int = 6, scale: float = 0.001, seed: int = 0, say=lambda line: None) -> dict | None:
    """Measure ``serving_samples`` table sets and ``comm_samples`` placements; the samples on rank 0."""
    from mpi4py import MPI

    from hybrid.runtime.rma_store import EmbeddingStore

    world = MPI.COMM_WORLD
    if world.size < 3:
        raise ValueError("collecting sharding costs needs 1 worker + at least 2 PS ranks (mpirun -n 3 or more)")
    ps_ranks = list(range(1, world.size))
    started = time.perf_counter()
    base_cards, base_ids = table_ids(pool_profile(), scale=scale, batch=batch, iterations=iterations, seed=seed)
    variants = [Variant(b, w, d) for b in range(len(base_cards)) for w in WIDTHS for d in DEALS]
    offsets = np.concatenate([[0], np.cumsum([base_cards[v.base] for v in variants])])
    segments = [s for k, v in enumerate(variants)
                for s in variant_segments(int(offsets[k]), int(offsets[k + 1]), v, 0, len(ps_ranks) - 1)]
    plan = ShardPlan.packed(int(offsets[-1]), len(ps_ranks), segments, name="cost-collector", dim=DIM)
    serving_sets, serving_ms = [], []
    with EmbeddingStore(world, ps_ranks, plan.n_rows, DIM, transport="rma", plan=plan) as store:
        if world.rank == 0:
            rng = np.random.default_rng(seed)
            slices = {}
            for n in range(serving_samples):
                chosen = []
                for k in draw_set(rng, len(base_cards), max_tables):
                    v = variants[k]
                    ids = _variant_ids(base_ids[v.base], v)
                    if k not in slices:
                        part = ("rows", v.deal, 0) if v.deal > 1 else ("whole", 1, 0)
                        slices[k] = table_slice(base_ids[v.base], int(base_cards[v.base]), table=0, width=v.width,
                                                part=part)
                    chosen.append((k, ids))
                times = []
                for it in range(iterations):
                    rows = np.unique(np.concatenate([offsets[k] + ids[it] for k, ids in chosen]))
                    times.append(_time(store, rows, only=0))
                serving_sets.append(tuple(replace(slices[k], table=t) for t, (k, _) in enumerate(chosen)))
                serving_ms.append(1e3 * float(np.median(times[1:])))
                if (n + 1) % 50 == 0:
                    say(f"serving costs: {n + 1}/{serving_samples} sets measured")
        store.barrier()
    comm_bytes, comm_ms = _collect_comm(world, ps_ranks, comm_samples, batch, iterations, seed, say)
    if world.rank != 0:
        return None
    return {"serving_sets": serving_sets, "serving_ms": serving_ms, "comm_bytes": comm_bytes, "comm_ms": comm_ms,
            "batch": batch, "scale": scale, "ps_ranks": len(ps_ranks), "seconds": time.perf_counter() - started}


def _collect_comm(world, ps_ranks: list, samples: int, batch: int, iterations: int, seed: int, say):
    """Per sample, the rows each PS rank serves (imbalanced to a random degree) and the time of them all at once.

    Each sample uses the first 1 to all PS ranks (plans for fewer ranks leave
    the others idle), draws a total of 16 to ``4 * batch`` distinct rows
    per rank used on average (log-uniform) and splits it over them: each rank with probability
    ``p`` (drawn per sample) an even share, else a random one, as the paper's
    placements range from balanced to random.
    """
    from hybrid.runtime.rma_store import EmbeddingStore

    n_ps = len(ps_ranks)
    per_rank = 8 * batch
    plan = ShardPlan.contiguous(per_rank * n_ps, n_ps)
    comm_bytes, comm_ms = [], []
    with EmbeddingStore(world, ps_ranks, plan.n_rows, DIM, transport="rma", plan=plan) as store:
        if world.rank == 0:
            rng = np.random.default_rng(seed + 1)
            for n in range(samples):
                used = int(rng.integers(1, n_ps + 1))  # plans for fewer PS ranks leave the others idle
                total = int(used * np.exp(rng.uniform(np.log(16), np.log(4 * batch))))  # every scale alike
                p = rng.random()
                shares = np.where(rng.random(n_ps) < p, 1.0, rng.random(n_ps) * 2) * (np.arange(n_ps) < used)
                counts = np.minimum(per_rank, np.round(total * shares / shares.sum())).astype(np.int64)
                times = []
                for _ in range(max(2, iterations // 2)):
                    rows = np.concatenate([r * per_rank + rng.choice(per_rank, size=c, replace=False)
                                           for r, c in enumerate(counts)])
                    times.append(_time(store, np.sort(rows)))
                comm_bytes.append((2 * ITEMSIZE * DIM * counts).tolist())
                comm_ms.append(1e3 * float(np.median(times)))
                if (n + 1) % 50 == 0:
                    say(f"communication costs: {n + 1}/{samples} placements measured")
        store.barrier()
    return comm_bytes, comm_ms


def save(data: dict, path) -> None:
    """The samples as JSON (slices as their fields): small, and readable by anyone."""
    import json
    from dataclasses import asdict
    from pathlib import Path

    out = dict(data, serving_sets=[[asdict(s) for s in group] for group in data["serving_sets"]])
    Path(path).write_text(json.dumps(out) + "\n")


def load(path) -> dict:
    """Samples written by :func:`save`."""
    import json
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text())
        data["serving_sets"] = [tuple(TableSlice(**dict(s, histogram=tuple(s["histogram"]), part=tuple(s["part"])))
                                      for s in group) for group in data["serving_sets"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not sharding cost data ({err})") from None
    return data

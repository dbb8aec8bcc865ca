"""Side-by-side check of a synthetic store against the real store it imitates.

Synthetic data are only useful for scheduling results if they reproduce the
statistics that decide them: how far apart a row's accesses are (reuse
distance) and how a global batch's rows recur in the same and the next
batches. ``compare`` measures both on the two stores, table by table (tables
are matched by position), and reports the differences; ``format_table``
prints them. Run it as ``python -m hybrid.data.calibration REAL SYNTHETIC``.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

from hybrid.data.access_stats import batch_recurrence, reuse_quantiles, reuse_within_batches
from hybrid.data.store import BatchStore

@dataclass(frozen=True)
class Row:
    table: str
    statistic: str
    real: float
    synthetic: float

    @property
    def difference(self) -> float:
        return self.synthetic - self.real


def table_statistics(ids: np.ndarray, batch: int) -> dict:
    """The calibrated statistics of one table's id column, by name."""
    ids = np.asarray(ids, dtype=np.int64)
    stats = {"accessed rows": float(np.unique(ids).size)}
    stats.update({f"reuse p{q}": v for q, v in reuse_quantiles(ids).items() if not math.isnan(v)})
    stats.update({f"reuse <= {k} batch": v for k, v in reuse_within_batches(ids, batch).items()})
    recurrence = batch_recurrence(ids, batch)
    stats["in same batch"] = recurrence.pop("same")
    stats.update({f"in next {k} batch": v for k, v in recurrence.items()})
    return stats


def compare(real_store: str, synthetic_store: str, batch: int = 1024) -> list[Row]:
    """Statistics of every table of both stores (all samples, file order), side by side."""
    real, synthetic = BatchStore(real_store, test_fraction=0.0), BatchStore(synthetic_store, test_fraction=0.0)
    if real.n_tables != synthetic.n_tables:
        raise ValueError(f"{real_store} has {real.n_tables} tables, {synthetic_store} {synthetic.n_tables}")
    rows = []
    for t, name in enumerate(real.table_names):
        a = table_statistics(real.sparse()[:, t], batch)
        b = table_statistics(synthetic.sparse()[:, t], batch)
        rows += [Row(name, key, a[key], b.get(key, math.nan)) for key in a]
    return rows


def format_table(rows: list[Row]) -> str:
    """Plain-text table: shares as percentages (difference in points), counts and distances as numbers."""
    lines = [f"{'table':<10}{'statistic':<20}{'real':>10}{'synthetic':>11}{'diff':>9}"]
    for r in rows:
        if r.statistic.startswith(("reuse <=", "in ")):
            values = f"{r.real:>10.1%}{r.synthetic:>11.1%}{100 * r.difference:>+8.1f}p"
        else:
            values = f"{r.real:>10.0f}{r.synthetic:>11.0f}{r.difference:>+9.0f}"
        lines.append(f"{r.table:<10}{r.statistic:<20}{values}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybrid.data.calibration", description=__doc__.splitlines()[0])
    parser.add_argument("real")
    parser.add_argument("synthetic")
    parser.add_argument("--global-batch", type=int, default=1024)
    args = parser.parse_args(argv)
    print(format_table(compare(args.real, args.synthetic, args.global_batch)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``hybrid bench ps``: batched pulls and pushes through the RMA store, against memory bandwidth.

Run under MPI with at least 2 ranks (``launch/mpirun.sh -n 2 python -m hybrid
bench ps``): rank 0 is the worker, the last rank the PS. For each row width
it times batched ``pull`` (Get), ``put`` and ``accumulate`` of random rows,
each completed with a flush, and, in the same process, a NumPy fancy-index
gather and scatter of the same rows from a local array: the memory-bandwidth
ceiling of a copy that needs no communication at all.
"""
from __future__ import annotations

import time

import numpy as np

TABLE_BYTES = 256 << 20


def _rate(seconds: float, rows: int, dim: int) -> dict:
    return {"rows_per_s": rows / seconds, "gb_per_s": rows * dim * 4 / seconds / 1e9}


def run(*, dims=(16, 128, 512), rows_per_op: int = 8192, repeats: int = 20, seed: int = 0) -> list[dict] | None:
    """Results on rank 0 (None elsewhere); collective over COMM_WORLD."""
    from mpi4py import MPI

    from hybrid.rma_store import EmbeddingStore

    world = MPI.COMM_WORLD
    if world.size < 2:
        raise ValueError("hybrid bench ps needs 2 ranks (a worker and a PS): "
                         "launch/mpirun.sh -n 2 python -m hybrid bench ps")
    results = []
    rng = np.random.default_rng(seed)
    for dim in dims:
        n_rows = TABLE_BYTES // (dim * 4)
        store = EmbeddingStore(world, [world.size - 1], n_rows, dim, dtype=np.float32)
        if world.rank == 0:
            batches = [np.sort(rng.choice(n_rows, size=rows_per_op, replace=False)) for _ in range(repeats)]
            values = np.ones((rows_per_op, dim), dtype=np.float32)
            out = np.empty_like(values)
            local = np.zeros((n_rows, dim), dtype=np.float32)
            timings = {}
            for name, op in (("pull", lambda r: store.pull(r, out).wait()),
                             ("put", lambda r: store.put(r, values).wait()),
                             ("accumulate", lambda r: store.accumulate(r, values).wait()),
                             ("numpy_gather", lambda r: np.take(local, r, axis=0, out=out)),
                             ("numpy_scatter", lambda r: local.__setitem__(r, values))):
                op(batches[0])  # warm-up
                start = time.perf_counter()
                for rows in batches:
                    op(rows)
                timings[name] = time.perf_counter() - start
            row = {"dim": dim, "rows_per_op": rows_per_op, "table_rows": n_rows}
            for name, seconds in timings.items():
                row[name] = {k: round(v, 3) for k, v in _rate(seconds, rows_per_op * repeats, dim).items()}
            row["pull_vs_numpy"] = round(timings["numpy_gather"] / timings["pull"], 3)
            row["put_vs_numpy"] = round(timings["numpy_scatter"] / timings["put"], 3)
            results.append(row)
        store.close()
    return results if world.rank == 0 else None


def format_rows(results: list[dict]) -> str:
    lines = [f"{'dim':>5}{'op':>15}{'Mrows/s':>10}{'GB/s':>8}"]
    for row in results:
        for op in ("pull", "put", "accumulate", "numpy_gather", "numpy_scatter"):
            rate = row[op]
            lines.append(f"{row['dim']:>5}{op:>15}{rate['rows_per_s'] / 1e6:>10.2f}{rate['gb_per_s']:>8.2f}")
        lines.append(f"{'':>5}{'pull/numpy':>15}{row['pull_vs_numpy']:>10.3f}   put/numpy {row['put_vs_numpy']:.3f}")
    return "\n".join(lines)

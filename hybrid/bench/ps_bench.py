"""``hybrid bench ps``: scattered-row pulls and pushes through the store, against one contiguous transfer.

Run under MPI with at least 2 ranks (``launch/mpirun.sh -n 2 python -m
hybrid bench ps``, or across emulated hosts with ``hybrid bench e2e --ps``):
rank 0 is the worker, the last rank the PS. For each row width and
transport it times ``pull``, ``put`` and ``accumulate`` of ``rows_per_op``
random rows, each completed before the next starts, and, on the same
window, the same bytes as ONE contiguous ``Get`` / ``Put``: what the
network charges for those bytes. ``*_vs_contiguous`` is the ratio of the
two: 1 means the transport costs per byte, a large ratio that it costs per
row. Times are medians over ``repeats`` operations.
"""
from __future__ import annotations

import time

import numpy as np

TABLE_BYTES = 256 << 20
OPS = ("pull", "put", "accumulate")


def _median_ms(op, batches) -> float:
    op(batches[0])  # warm-up: connection set-up, registration
    seconds = []
    for rows in batches:
        start = time.perf_counter()
        op(rows)
        seconds.append(time.perf_counter() - start)
    return round(float(np.median(seconds)) * 1e3, 3)


def run(*, dims=(16, 128, 512), transports=("rma", "packed"), rows_per_op: int = 8192, repeats: int = 7,
        seed: int = 0) -> list[dict] | None:
    """One result row per (dim, transport) on rank 0 (None elsewhere); collective over COMM_WORLD."""
    from mpi4py import MPI

    from hybrid.runtime.rma_store import EmbeddingStore

    world = MPI.COMM_WORLD
    if world.size < 2:
        raise ValueError("hybrid bench ps needs 2 ranks (a worker and a PS): "
                         "launch/mpirun.sh -n 2 python -m hybrid bench ps")
    results = []
    rng = np.random.default_rng(seed)
    for dim in dims:
        n_rows = max(TABLE_BYTES // (dim * 4), rows_per_op)
        for transport in transports:
            store = EmbeddingStore(world, [world.size - 1], n_rows, dim, dtype=np.float32, transport=transport)
            if world.rank == 0:
                results.append(_time_worker(store, rng, n_rows, dim, transport, rows_per_op, repeats))
            store.barrier()  # the PS serves the worker's packed messages in here
            store.close()
        baseline = _contiguous(world, dim, rows_per_op, repeats)
        if baseline is not None:
            results.append(baseline)
    return _with_ratios(results) if world.rank == 0 else None


def _time_worker(store, rng, n_rows, dim, transport, rows_per_op, repeats) -> dict:
    batches = [np.sort(rng.choice(n_rows, size=rows_per_op, replace=False)) for _ in range(repeats)]
    values = np.ones((rows_per_op, dim), dtype=np.float32)
    out = np.empty_like(values)
    row = {"dim": dim, "transport": store.transport, "rows_per_op": rows_per_op,
           "mb_per_op": round(values.nbytes / 1e6, 3)}
    row["pull_ms"] = _median_ms(lambda r: store.pull(r, out).wait(), batches)
    row["put_ms"] = _median_ms(lambda r: store.put(r, values).wait(), batches)
    row["accumulate_ms"] = _median_ms(lambda r: store.accumulate(r, values).wait(), batches)
    return row


def _contiguous(world, dim: int, rows_per_op: int, repeats: int) -> dict | None:
    """The baseline: the same bytes as one contiguous Get / Put into the PS's window (collective)."""
    from mpi4py import MPI

    from hybrid.runtime.comm import idle_barrier

    target = world.size - 1
    buffer = np.ones(rows_per_op * dim, dtype=np.float32)
    win = MPI.Win.Allocate(buffer.nbytes if world.rank == target else 0, disp_unit=4, comm=world)
    row = None
    if world.rank == 0:
        win.Lock_all()

        def get(_):
            win.Get(buffer, target, target=(0, len(buffer), MPI.FLOAT))
            win.Flush(target)

        def put(_):
            win.Put(buffer, target, target=(0, len(buffer), MPI.FLOAT))
            win.Flush(target)

        row = {"dim": dim, "transport": "contiguous", "rows_per_op": rows_per_op,
               "mb_per_op": round(buffer.nbytes / 1e6, 3), "get_ms": _median_ms(get, [None] * repeats),
               "put_ms": _median_ms(put, [None] * repeats)}
        win.Unlock_all()
    idle_barrier(world)  # the PS drives progress for one-sided transfers while it polls here
    win.Free()
    return row


def _with_ratios(results: list[dict]) -> list[dict]:
    """Each operation's time over the faster contiguous transfer of the same bytes.

    The faster of one Get and one Put is what the link allows: some MPIs
    complete a large one-sided Put well below the link's rate (OpenMPI's osc
    ucx over TCP took 4x longer than the Get at 1 Gbit/s).
    """
    contiguous = {r["dim"]: min(r["get_ms"], r["put_ms"]) for r in results if r["transport"] == "contiguous"}
    for row in results:
        base = contiguous.get(row["dim"])
        if row["transport"] == "contiguous" or base is None:
            continue
        for op in OPS:
            row[f"{op}_vs_contiguous"] = round(row[f"{op}_ms"] / base, 2)
    return results


def format_rows(results: list[dict]) -> str:
    lines = [f"{'dim':>5} {'transport':<11}{'MB/op':>7}{'pull ms':>9}{'put ms':>8}{'acc ms':>8}"
             f"   x contiguous (pull/put/acc)"]
    for row in results:
        if row["transport"] == "contiguous":
            lines.append(f"{row['dim']:>5} {'contiguous':<11}{row['mb_per_op']:>7.2f}{row['get_ms']:>9.2f}"
                         f"{row['put_ms']:>8.2f}{'':>8}   (one Get / one Put)")
            continue
        lines.append(f"{row['dim']:>5} {row['transport']:<11}{row['mb_per_op']:>7.2f}{row['pull_ms']:>9.2f}"
                     f"{row['put_ms']:>8.2f}{row['accumulate_ms']:>8.2f}   "
                     f"{row.get('pull_vs_contiguous', float('nan')):.2f} / {row.get('put_vs_contiguous', float('nan')):.2f}"
                     f" / {row.get('accumulate_vs_contiguous', float('nan')):.2f}")
    return "\n".join(lines)

"""What the workers' two collectives cost where their ranks share cores: a micro-benchmark under MPI.

Workers whose ranks share cores wait in their collectives patiently
(``hybrid.runtime.comm``: a non-blocking call tested between sleeps, so a
waiting rank leaves the core to one that computes). A non-blocking
collective advances only when a rank tests it, so each of its steps lasts
about one sleep: the MLP's sum and the barrier cost a fixed latency per
iteration that no one-worker run shows. This probe measures it with the
runtime's own calls, nothing else running:

    launch/mpirun.sh -n 3 python -m hybrid.projection.collective_probe --bytes 600000

Rank 0 prints one JSON line: the ranks, and the median ms of the sum of
``--bytes`` and of the barrier (docs/projection.md).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

WARMUP = 50


def probe(n_bytes: int, iterations: int) -> dict:
    import torch
    from mpi4py import MPI

    from hybrid.runtime.comm import PATIENT_POLL_SECONDS, MpiCollectives

    comm = MPI.COMM_WORLD
    collectives = MpiCollectives(comm, "probe", patient=True)
    gradients = torch.ones(max(1, n_bytes // 4), dtype=torch.float32)
    mine, largest = np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.int32)
    sums, barriers = [], []
    for step in range(WARMUP + iterations):
        start = time.perf_counter()
        collectives.allreduce_(gradients)
        middle = time.perf_counter()
        request = comm.Iallreduce(mine, largest, op=MPI.MAX)  # as Roles.worker_barrier_max, patiently
        while not request.Test():
            time.sleep(PATIENT_POLL_SECONDS)
        if step >= WARMUP:
            sums.append(middle - start)
            barriers.append(time.perf_counter() - middle)
    return {"ranks": comm.size, "bytes": int(gradients.numel() * 4), "iterations": iterations,
            "allreduce_ms": round(1e3 * statistics.median(sums), 4),
            "barrier_ms": round(1e3 * statistics.median(barriers), 4)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, required=True, help="the gradients summed (the MLP's bytes)")
    parser.add_argument("--iterations", type=int, default=500)
    args = parser.parse_args(argv)
    result = probe(args.bytes, args.iterations)
    from mpi4py import MPI

    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

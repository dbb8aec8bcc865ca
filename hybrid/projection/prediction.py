"""One case's predicted iteration: its loads counted by the simulator, on a cluster, at a profile's costs."""
from __future__ import annotations

from dataclasses import asdict, replace
from typing import Optional

from hybrid.config import Config
from hybrid.data.store import BatchStore
from hybrid.projection.loads import loads
from hybrid.projection.time_model import Cluster, Profile, bounding_stage, stage_ms
from hybrid.wire_format import value_bytes


def mlp_bytes(config: Config, store: BatchStore) -> int:
    """Bytes of the dense model's gradients as the workers' sum sends them each iteration (2 a value with a
    16-bit ``cluster.wire_precision``)."""
    from hybrid.models import build_model

    model = build_model(config.model, n_dense=store.n_dense, n_tables=store.n_tables, seed=config.seed)
    return sum(p.numel() for p in model.parameters()) * value_bytes(config)


def predict(config: Config, store: BatchStore, cluster: Cluster, profile: Profile, *,
            iterations: int = 0, schedule_ms: Optional[float] = None) -> dict:
    """The mode's iteration on ``cluster``: ms per stage, in total, the bounding stage, and the load behind it.

    The scheduler's ms per global batch is the one measured while counting
    the loads (this machine, this many workers) unless ``schedule_ms`` is given.
    """
    if config.cluster.workers != cluster.workers or config.cluster.ps != cluster.ps:
        raise ValueError(f"the config has {config.cluster.workers} workers and {config.cluster.ps} PS ranks, the "
                         f"cluster {cluster.workers} and {cluster.ps}")
    run = loads(config, store, config.scheduler.mode, iterations=iterations, mlp_bytes=mlp_bytes(config, store))
    measured = run.schedule_ms if schedule_ms is None else schedule_ms
    stages = stage_ms(run.load, cluster, replace(profile, schedule_ms=((cluster.workers, measured),)))
    return {"iteration_ms": sum(stages.values()), "stages": stages, "bound": bounding_stage(stages),
            "schedule_ms": measured, "load": asdict(run.load), "iterations": run.iterations}

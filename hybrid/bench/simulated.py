"""Workloads and cases counted by the simulator, shared by the transmission suites.

A workload is a config plus overrides; its store is made when missing
(synthetic ones with :func:`hybrid.data.synthetic.synthesize`, MovieLens-100k
with :func:`hybrid.data.fetch.fetch_movielens_100k`), so a suite runs on a
fresh checkout. A case is ``MODE[+KEY=VALUE...]`` (:func:`hybrid.bench.case_overrides`),
counted with :func:`hybrid.training.simulator.simulate_mode` exactly as ``hybrid simulate`` counts it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hybrid.bench import case_mode
from hybrid.bench.result_files import ROOT
from hybrid.config import Config, load_config
from hybrid.data.store import BatchStore, StoreError
from hybrid.training.simulator import simulate_mode

# the paper's simulation setting (section 6.1): 8 workers, caches of 10% of the rows
PAPER_SETTING = ("cluster.workers=8", "cache.ratio=0.1")


@dataclass(frozen=True)
class Workload:
    name: str
    config: str  # path, relative to the repository or absolute
    overrides: tuple = ()


WORKLOADS = {
    "w1": Workload("w1", "configs/w1-smoke.yaml"),
    "w2": Workload("w2", "configs/w2-smoke.yaml"),
    "w3": Workload("w3", "configs/w3-smoke.yaml"),
    "w4": Workload("w4", "configs/w4-smoke.yaml"),
    "ml100k": Workload("ml100k", "configs/ml100k.yaml"),
    # MovieLens is in time order, which LAIA exploits: the shuffled twin shows how much
    "ml100k-shuffled": Workload("ml100k-shuffled", "configs/ml100k.yaml", ("data.shuffle=true",)),
    # small caches need more rows than the smoke stores hold (a cache must fit one worker's batch):
    # W1 at 0.01 of Criteo's cardinalities (337,865 rows), MovieLens-100k at 16 samples per worker
    "w1-s0.01": Workload("w1-s0.01", "configs/w1-smoke.yaml",
                         ("data.path=data/bench-w1-s0.01-2m", "data.synthetic.rows=2000000",
                          "data.synthetic.scale=0.01")),
    "ml100k-b16": Workload("ml100k-b16", "configs/ml100k.yaml", ("train.batch_per_worker=16",)),
}


def workload(name: str) -> Workload:
    """A named workload, or a config file path (named by its stem) for other data."""
    if name in WORKLOADS:
        return WORKLOADS[name]
    if name.endswith((".yaml", ".yml")):
        return Workload(Path(name).stem, name)
    raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)} or a config .yaml")


def resolve(path: str) -> Path:
    """Config and data paths are relative to the repository, so a suite runs from any directory."""
    return Path(path) if Path(path).is_absolute() else ROOT / path


def workload_config(item: Workload, overrides=()) -> tuple[Path, list[str]]:
    """The config path and the overrides (data path made absolute) of ``item`` under ``overrides``."""
    path = resolve(item.config)
    base = [*item.overrides, *overrides]
    data = resolve(load_config(path, base).data.path)
    return path, [*base, f"data.path={data}"]


def ensure_store(config: Config, say: Callable[[str], None]) -> None:
    """Make ``config``'s store if it is missing: synthesize it, or fetch MovieLens-100k."""
    path = Path(config.data.path)
    if (path / "meta.json").is_file():
        return
    spec = config.data.synthetic
    if spec is not None:
        from hybrid.data.synthetic import synthesize

        say(f"synthesizing {path} ({spec.like}, {spec.rows} rows, scale {spec.scale})")
        synthesize(path, like=spec.like, rows=spec.rows, scale=spec.scale, seed=spec.seed,
                   recurrence=spec.recurrence())
    elif path.name == "ml-100k":
        from hybrid.data.fetch import fetch_movielens_100k

        say(f"fetching MovieLens-100k into {path}")
        fetch_movielens_100k(path)
    else:
        raise StoreError(f"{path}: no store, and the config says neither how to synthesize nor fetch it "
                         f"(make it with 'hybrid preprocess')")


def count_cases(item: Workload, cases, *, overrides=(), iterations: int = 0,
                say: Callable[[str], None] = lambda line: None) -> dict:
    """Counts of each case on ``item``, normalized to the first case (the baseline, vanilla)."""
    path, base = workload_config(item, overrides)
    config = load_config(path, base)
    ensure_store(config, say)
    store = BatchStore.of(config.data, "train")
    counted = {}
    for case in cases:
        mode, extra = case_mode(case)
        counts = simulate_mode(load_config(path, base + extra), store, mode, iterations)
        counted[case] = counts.summary()  # the figures hybrid simulate and hybrid train report
    baseline = counted[cases[0]]
    for counts in counted.values():
        counts["normalized"] = {k: round(counts[k] / baseline[k], 4) if baseline[k] else None
                                for k in ("pulls", "pushes", "transmissions", "busiest")}
    say(f"{item.name}: {len(cases)} cases counted")
    return {"config": str(item.config), "overrides": [o for o in base if not o.startswith("data.path=")],
            "workers": config.cluster.workers, "cache_ratio": config.cache.ratio,
            "batch_per_worker": config.train.batch_per_worker, "cases": counted}

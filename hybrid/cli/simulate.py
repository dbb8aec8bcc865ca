"""``simulate``: embedding transmissions per mode, counted without MPI (``hybrid.training.simulator``)."""
from __future__ import annotations

import json

from hybrid.cli.output import progress_bar, text_out
from hybrid.config import ConfigError, load_config


def cmd_simulate(args) -> int:
    """Every case of ``--modes`` simulated on the same store, then counted against vanilla when it is one of them."""
    from hybrid.data.store import BatchStore
    from hybrid.training.simulator import simulate_mode
    from hybrid.wire_format import row_bytes as wire_row_bytes

    overrides = list(args.overrides)
    if args.workers is not None:
        overrides.append(f"cluster.workers={args.workers}")
    if args.cache_ratio is not None:
        overrides.append(f"cache.ratio={args.cache_ratio}")
    config = load_config(args.config, overrides)
    cases = _cases(args, overrides)
    store = BatchStore.of(config.data, "train")
    store.check_ids()  # the scheduler's kernels trust the ids: one out of its table would read past it
    with progress_bar(unit="batches", desc="simulate") as bar:
        results = {label: simulate_mode(case_config, store, mode, args.iterations, bar.update)
                   for label, (mode, case_config) in cases.items()}
    row_bytes = {label: wire_row_bytes(case_config) for label, (_, case_config) in cases.items()}
    _print_counts(config, results, row_bytes, text_out(args))
    if args.json:
        print(json.dumps({label: {**counts.summary(), "bytes": counts.transmissions * row_bytes[label],
                                  "row_bytes": row_bytes[label]} for label, counts in results.items()}))
    return 0


def _cases(args, overrides: list[str]) -> dict:
    """label -> (mode, the case's config) for each ``MODE[+KEY=VALUE...]`` of ``--modes``."""
    from hybrid import modes
    from hybrid.bench import case_overrides

    cases = {}
    for label in args.modes.split(","):
        try:
            mode_override, *extra = case_overrides(label)
            mode = modes.get(mode_override.split("=", 1)[1]).name
        except ValueError:
            raise ConfigError(f"--modes {args.modes!r}: expected MODE[+KEY=VALUE...], MODE one of "
                              f"{', '.join(modes.MODES)}") from None
        cases[label] = (mode, load_config(args.config, overrides + extra))
    return cases


def _print_counts(config, results: dict, row_bytes: dict, out) -> None:
    """The table of counts, one row a case, with the cut against vanilla when vanilla was simulated, and the
    rows' bytes per counted iteration as they cross hosts (``KB/iter``: 2 bytes a value with a 16-bit wire)."""
    from hybrid.training.simulator import reduction

    baseline = results.get("vanilla")
    print(f"{config.name}: {config.cluster.workers} workers, batch {config.train.batch_per_worker}/worker, "
          f"cache {config.cache.ratio:.0%} of rows, {next(iter(results.values())).iterations} counted iterations "
          f"(after {config.scheduler.warmup_iterations} warm-up)", file=out)
    width = max(9, *(len(label) + 1 for label in results))
    print(f"{'mode':<{width}}{'pulls':>11}{'pushes':>11}{'p2p':>8}{'total':>11}{'-pull':>8}{'-push':>8}{'-total':>8}"
          f"{'hit':>7}{'sched ms':>10}{'checks':>11}{'allreduced':>11}{'busiest':>10}{'KB/iter':>10}", file=out)
    for label, counts in results.items():
        cut = reduction(counts, baseline) if baseline else None
        cuts = "".join(f"{cut[k]:>8.1%}" for k in ("pulls", "pushes", "transmissions")) if cut else " " * 24
        print(f"{label:<{width}}{counts.pulls:>11}{counts.pushes:>11}{counts.p2p:>8}{counts.transmissions:>11}"
              f"{cuts}{counts.hit_rate:>7.1%}{counts.sched_ms:>10.3f}{counts.version_checks:>11}"
              f"{counts.allreduced:>11}{counts.busiest:>10}"
              f"{counts.transmissions * row_bytes[label] / max(1, counts.iterations) / 1024:>10.1f}", file=out)


def register(subparsers) -> None:
    """Add ``simulate``."""
    p = subparsers.add_parser("simulate", help="count embedding transmissions per mode, without MPI")
    p.add_argument("--config", required=True)
    p.add_argument("--modes", default="vanilla,laia,plan,herald",
                   help="comma-separated cases, each MODE[+KEY=VALUE...], e.g. herald+scheduler.sync=p2p "
                        "(default: %(default)s)")
    p.add_argument("--workers", type=int, help="override cluster.workers")
    p.add_argument("--iterations", type=int, default=0, help="global batches to run (0 = the run's: train.iterations, "
                   "or train.epochs passes over the train split)")
    p.add_argument("--cache-ratio", type=float, help="override cache.ratio")
    p.add_argument("--json", action="store_true",
                   help="print only JSON on stdout (one object per mode; the table goes to stderr)")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    p.set_defaults(func=cmd_simulate)

"""Commands about one workload config: ``config`` (what it resolves to) and ``fae`` (FAE's calibration of its store).

The two are listed apart in ``hybrid --help`` (``fae`` after ``shard-costs``),
so each has its own ``register_*`` and ``hybrid.cli.build_parser`` calls them
where they stand.
"""
from __future__ import annotations

import json
import shlex
import sys
import time

import yaml

from hybrid.config import load_config


def cmd_config(args) -> int:
    """The config after defaults and overrides, with its digest; with ``--layout``, what a launcher needs."""
    from hybrid import modes

    config = load_config(args.config, args.overrides)
    modes.get(config.scheduler.mode)  # the registry knows the modes; the config only their spelling
    if args.layout:  # for launch scripts: eval "$(hybrid config CONFIG --layout)"
        print(f"HYBRID_WORKERS={config.cluster.workers} HYBRID_PS={config.cluster.ps} "
              f"HYBRID_RANKS={config.cluster.workers + config.cluster.ps} "
              f"HYBRID_CHECKPOINT_DIR={shlex.quote(str(config.checkpoint_path))}")
        return 0
    print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
    print(f"# digest {config.digest()}")
    return 0


def cmd_fae(args) -> int:
    """FAE's calibration of a workload's store: hot rows and hot inputs, kept beside the data."""
    from hybrid.data.store import BatchStore
    from hybrid.scheduling.fae_plans import calibration_for

    config = load_config(args.config, args.overrides)
    store = BatchStore.of(config.data, "train")
    store.check_ids()  # the calibration indexes its counts by id
    start = time.perf_counter()
    stored = calibration_for(config, store, say=lambda line: print(line, file=sys.stderr))
    s = stored.summary
    if args.json:
        print(json.dumps({**s, "path": str(stored.path), "seconds": round(time.perf_counter() - start, 3)}))
        return 0
    print(f"{config.name}: cutoff {s['cutoff']} sampled accesses ({s['sampled_inputs']} inputs sampled); "
          f"{s['hot_rows']} hot rows, {s['hot_bytes'] / 2**20:.1f} MB (estimated at most "
          f"{s['estimated_bytes'] / 2**20:.1f} MB, budget {s['budget_bytes'] / 2**20:g} MB); "
          f"{s['hot_inputs']} of {s['inputs']} training inputs hot ({s['hot_inputs'] / max(1, s['inputs']):.1%})")
    print(f"  hot rows per table: {s['hot_rows_per_table']}")
    print(f"  kept in {stored.path} ({time.perf_counter() - start:.1f} s)")
    return 0


def register_config(subparsers) -> None:
    """Add ``config``."""
    p = subparsers.add_parser("config", help="print a resolved workload config")
    p.add_argument("config")
    p.add_argument("--layout", action="store_true",
                   help="print HYBRID_WORKERS=.. HYBRID_PS=.. HYBRID_RANKS=.. HYBRID_CHECKPOINT_DIR=.. (for launchers)")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(func=cmd_config)


def register_fae(subparsers) -> None:
    """Add ``fae``."""
    p = subparsers.add_parser("fae", help="FAE's calibration: hot rows within fae.budget_mb, hot and cold inputs")
    p.add_argument("config")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    p.set_defaults(func=cmd_fae)

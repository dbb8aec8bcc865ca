"""``project``: a run's iteration on a cluster, from the time model (``hybrid.projection``, docs/projection.md).

``hybrid project --calibrate CONFIG --profile FILE`` measures this machine's
costs and writes them; ``hybrid project --validate CONFIG --profile FILE``
trains cases the calibration did not see on this host and compares them
with their predictions; ``hybrid project CONFIG --profile FILE --workers N
--ps P ...`` predicts one iteration of the config's mode on the described
cluster, stage by stage.
"""
from __future__ import annotations

import json
from pathlib import Path

from hybrid.cli.output import text_out


def cmd_project(args) -> int:
    if args.calibrate and args.validate:
        raise ValueError("--calibrate writes a profile, --validate reads one: one at a time")
    if args.validate:
        from hybrid.projection.validation import ONE_HOST_CASES, format_table, validate

        result = validate(args.config, args.profile, cases=args.cases.split(",") if args.cases else ONE_HOST_CASES,
                          overrides=args.overrides, iterations=args.iterations or 300, repeats=args.repeats,
                          say=lambda line: print(line, file=text_out(args)))
        print(format_table(result), file=text_out(args))
        if args.json:
            print(json.dumps(result))
        return 0
    if args.calibrate:
        from hybrid.projection.calibration import calibrate

        from hybrid.bench.emulated_hosts import LinkShape

        rate = args.across_hosts
        link = None if rate is None else LinkShape(None if rate == "none" else rate)
        written = calibrate(args.config, args.overrides, iterations=args.iterations or 300, repeats=args.repeats,
                            link=link, say=lambda line: print(line, file=text_out(args)))
        Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
        Path(args.profile).write_text(json.dumps(written, indent=1) + "\n")
        print(f"profile of {written['config']} on this machine written to {args.profile}: "
              + ", ".join(f"{k} {v:.4g}" for k, v in written["profile"].items() if isinstance(v, float)),
              file=text_out(args))
        if args.json:
            print(json.dumps(written))
        return 0
    return _predict(args)


def _predict(args) -> int:
    from hybrid.config import load_config
    from hybrid.data.store import BatchStore
    from hybrid.projection.calibration import read_profile
    from hybrid.projection.prediction import predict
    from hybrid.projection.time_model import STAGES, Cluster

    overrides = list(args.overrides)
    for key, value in (("cluster.workers", args.workers), ("cluster.ps", args.ps)):
        if value is not None:
            overrides.append(f"{key}={value}")
    config = load_config(args.config, overrides)
    cluster = Cluster(workers=config.cluster.workers, ps=config.cluster.ps,
                      workers_per_host=args.workers_per_host or config.cluster.workers, gbps=args.gbps,
                      latency_ms=args.latency_ms, cores_per_host=args.cores_per_host, one_machine=args.one_machine)
    result = predict(config, BatchStore.of(config.data, "train"), cluster, read_profile(args.profile),
                     iterations=args.iterations)
    out = text_out(args)
    link = "one host" if cluster.gbps is None else f"{cluster.gbps:g} Gbit/s, {cluster.latency_ms:g} ms"
    print(f"{config.name} {config.scheduler.mode.value}: {cluster.workers} workers ({cluster.workers_per_host} per "
          f"host) + {cluster.ps} PS, {link}: {result['iteration_ms']:.2f} ms per iteration, bound by "
          f"{result['bound']}", file=out)
    print("  ms/iteration: " + ", ".join(f"{s} {result['stages'][s]:.2f}" for s in (*STAGES, "schedule_wait")),
          file=out)
    if args.json:
        print(json.dumps({"config": config.name, "mode": config.scheduler.mode.value,
                          "cluster": cluster.__dict__, **result}))
    return 0


def register(subparsers) -> None:
    """Add ``project``."""
    p = subparsers.add_parser("project", help="a run's iteration on a cluster, from the calibrated time model")
    p.add_argument("config")
    p.add_argument("--profile", required=True, help="the calibration's file (written with --calibrate, read otherwise)")
    p.add_argument("--calibrate", action="store_true",
                   help="measure this machine's costs for CONFIG's model (runs hybrid bench train and plain)")
    p.add_argument("--across-hosts", metavar="RATE",
                   help="calibration: run the one-worker loops across two emulated hosts joined by a link of RATE "
                        "as tc writes it (1gbit), or none for unshaped (root; default: on this host)")
    p.add_argument("--validate", action="store_true",
                   help="train the cases on this host (hybrid bench train) and compare them with the predictions")
    p.add_argument("--cases", help="validation: comma-separated MODE[+KEY=VALUE...], the first the ratios' "
                   "denominator (default: vanilla, herald and het with 3 workers, herald and het with 2)")
    p.add_argument("--repeats", type=int, default=3,
                   help="calibration and validation: runs per case, alternating (default 3)")
    p.add_argument("--iterations", type=int, default=0,
                   help="global batches counted (0: the run's); calibration: per run (0: 300)")
    p.add_argument("--workers", type=int, help="override cluster.workers")
    p.add_argument("--ps", type=int, help="override cluster.ps (one PS rank per host)")
    p.add_argument("--workers-per-host", type=int, help="workers sharing a host and its NIC (default: all)")
    p.add_argument("--gbps", type=float, help="each host's NIC, Gbit/s per direction (default: one host, no link)")
    p.add_argument("--latency-ms", type=float, default=0.0, help="one-way latency of a link (default 0)")
    p.add_argument("--cores-per-host", type=int,
                   help="CPU workers: the cores a host's ranks share (default: GPU workers, compute off the CPU)")
    p.add_argument("--one-machine", action="store_true",
                   help="the hosts are emulated on one machine whose cores every rank shares (hybrid bench e2e)")
    p.add_argument("--json", action="store_true", help="print only JSON on stdout (the text goes to stderr)")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    p.set_defaults(func=cmd_project)

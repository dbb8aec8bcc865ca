"""``project``: a run's iteration on a cluster, from the time model (``hybrid.projection``, docs/projection.md).

``hybrid project --calibrate CONFIG --profile FILE`` measures this machine's
costs and writes them; ``hybrid project --validate CONFIG --profile FILE``
trains cases the calibration did not see on this host and compares them
with their predictions; ``hybrid project CONFIG --profile FILE --workers N
--ps P ...`` predicts one iteration of the config's mode on the described
cluster, stage by stage; ``hybrid project CONFIG --profile FILE --sweep``
projects every mode to GPU clusters of 8 to 1,024 workers, NIC rates and PS
hosts (a table, JSON and a PNG).
"""
from __future__ import annotations

import json
from pathlib import Path

from hybrid.cli.output import text_out


def cmd_project(args) -> int:
    if sum(map(bool, (args.calibrate, args.validate, args.sweep, args.paper))) > 1:
        raise ValueError("--calibrate, --validate, --sweep and --paper are separate commands: one at a time")
    if args.paper:
        return _paper(args)
    if args.config is None:
        raise ValueError("a config is needed (all forms but --paper)")
    if args.sweep:
        return _sweep(args)
    if args.validate:
        from hybrid.projection.validation import ONE_HOST_CASES, format_table, plot, validate

        e2e = [_workload_profile(item) for item in args.e2e]
        links = [None if rate == "unshaped" else rate for rate in args.links.split(",")]
        cases = [] if args.cases == "none" else args.cases.split(",") if args.cases else ONE_HOST_CASES
        result = validate(args.config, args.profile, cases=cases, overrides=args.overrides,
                          iterations=args.iterations or 300, repeats=args.repeats, e2e=e2e, links=links,
                          e2e_repeats=args.e2e_repeats,
                          say=lambda line: print(line, file=text_out(args)))
        print(format_table(result), file=text_out(args))
        return _written(args, result, text_out(args), plot)
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


def _workload_profile(item: str) -> tuple[str, str]:
    """``--e2e WORKLOAD=PROFILE``: an e2e workload and the profile calibrated for it across hosts."""
    from hybrid.bench.e2e_bench import WORKLOADS

    workload, _, profile = item.partition("=")
    if workload not in WORKLOADS or not profile:
        raise ValueError(f"--e2e {item!r}: expected WORKLOAD=PROFILE with WORKLOAD one of {', '.join(WORKLOADS)}")
    return workload, profile


def _numbers(text: str, kind, option: str) -> tuple:
    """A comma-separated list of numbers (``--workers 8,64``)."""
    try:
        values = tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{option}: expected comma-separated numbers, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise ValueError(f"{option}: every value must be positive, got {text!r}")
    return values


def _one(text, kind, option: str):
    """A single value of an option that takes a list under --sweep."""
    if text is None:
        return None
    values = _numbers(text, kind, option)
    if len(values) > 1:
        raise ValueError(f"{option}: one value without --sweep, got {text!r}")
    return values[0]


def _host_ms(args):
    """A GPU worker's host cost per iteration: --host-profile's fixed compute (None: the profile's own)."""
    from hybrid.projection.calibration import read_profile

    return None if args.host_profile is None else read_profile(args.host_profile).compute_ms


def _sweep(args) -> int:
    from hybrid.projection.calibration import read_profile
    from hybrid.projection.gpu import device
    from hybrid.projection.sweep import Grid, format_table, plot, sweep

    grid = Grid(modes=tuple(args.modes.split(",")), workers=_numbers(args.workers or "8,64,256,1024", int, "--workers"),
                gbps=_numbers(args.gbps or "10,100", float, "--gbps"), ps=_numbers(args.ps or "1,4", int, "--ps"),
                workers_per_host=args.workers_per_host or 8,
                latency_ms=0.01 if args.latency_ms is None else args.latency_ms,
                scheduler_threads=args.scheduler_threads)
    out = text_out(args)
    result = sweep(args.config, read_profile(args.profile), grid, device(args.gpu), overrides=args.overrides,
                   iterations=args.iterations, host_ms=_host_ms(args), say=lambda line: print(line, file=out))
    print(format_table(result), file=out)
    return _written(args, result, out, plot)


def _paper(args) -> int:
    from hybrid.projection import paper
    from hybrid.projection.calibration import read_profile

    out = text_out(args)
    result = paper.testbed(read_profile(args.profile), iterations=args.iterations, overrides=args.overrides,
                           large={"workload": "W1", "ps": (1, 4)}, host_ms=_host_ms(args),
                           say=lambda line: print(line, file=out))
    print(paper.format_table(result), file=out)
    return _written(args, result, out)


def _written(args, result: dict, out, plot=None) -> int:
    """``--out PREFIX``: the result as PREFIX.json (and PREFIX.png with ``plot``); ``--json``: on stdout."""
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
        files = [f"{args.out}.json"]
        if plot is not None:
            plot(result, f"{args.out}.png")
            files.append(f"{args.out}.png")
        print(f"written: {', '.join(files)}", file=out)
    if args.json:
        print(json.dumps(result))
    return 0


def _predict(args) -> int:
    from hybrid.config import load_config
    from hybrid.data.store import BatchStore
    from hybrid.projection.calibration import read_profile
    from hybrid.projection.prediction import predict
    from hybrid.projection.time_model import STAGES, Cluster

    overrides = list(args.overrides)
    for key, value in (("cluster.workers", _one(args.workers, int, "--workers")),
                       ("cluster.ps", _one(args.ps, int, "--ps"))):
        if value is not None:
            overrides.append(f"{key}={value}")
    config = load_config(args.config, overrides)
    cluster = Cluster(workers=config.cluster.workers, ps=config.cluster.ps,
                      workers_per_host=args.workers_per_host or config.cluster.workers,
                      gbps=_one(args.gbps, float, "--gbps"),
                      latency_ms=args.latency_ms or 0.0, cores_per_host=args.cores_per_host,
                      one_machine=args.one_machine)
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
    p.add_argument("config", nargs="?", help="the workload (every form but --paper)")
    p.add_argument("--profile", required=True, help="the calibration's file (written with --calibrate, read otherwise)")
    p.add_argument("--calibrate", action="store_true",
                   help="measure this machine's costs for CONFIG's model (runs hybrid bench train and plain)")
    p.add_argument("--across-hosts", metavar="RATE",
                   help="calibration: run the one-worker loops across two emulated hosts joined by a link of RATE "
                        "as tc writes it (1gbit), or none for unshaped (root; default: on this host)")
    p.add_argument("--validate", action="store_true",
                   help="train the cases on this host (hybrid bench train) and compare them with the predictions")
    p.add_argument("--cases", help="validation on this host: comma-separated MODE[+KEY=VALUE...], the first the "
                   "ratios' denominator (default: vanilla, herald, het and fae with 3 workers; vanilla, herald and het "
                   "with 2; none: no one-host cases)")
    p.add_argument("--e2e", action="append", default=[], metavar="WORKLOAD=PROFILE",
                   help="validation across emulated hosts (root): the hybrid bench e2e workload (movielens-100k, "
                        "w1-scale0.1) and its profile (calibrated with --across-hosts none); repeatable")
    p.add_argument("--e2e-repeats", type=int, help="--e2e: runs per case (default: --repeats)")
    p.add_argument("--links", default="unshaped,1gbit,100mbit",
                   help="--e2e: the links, as tc rates or unshaped (default unshaped,1gbit,100mbit)")
    p.add_argument("--repeats", type=int, default=3,
                   help="calibration and validation: runs per case, alternating (default 3)")
    p.add_argument("--iterations", type=int, default=0,
                   help="global batches counted (0: the run's); calibration: per run (0: 300)")
    p.add_argument("--paper", action="store_true",
                   help="the Herald paper's testbed and large-scale runs (W1-W4 on synthetic data shaped like "
                        "theirs), Herald over HET beside the paper's figures")
    p.add_argument("--sweep", action="store_true",
                   help="every mode (--modes) on GPU workers (--gpu) at each of --workers, --gbps and --ps")
    p.add_argument("--workers", help="override cluster.workers (--sweep: a list, default 8,64,256,1024)")
    p.add_argument("--ps", help="override cluster.ps, one PS rank per host (--sweep: a list, default 1,4)")
    p.add_argument("--workers-per-host", type=int,
                   help="workers sharing a host and its NIC (default: all; --sweep: 8)")
    p.add_argument("--gbps", help="each host's NIC, Gbit/s per direction (default: one host, no link; --sweep: a "
                   "list, default 10,100)")
    p.add_argument("--latency-ms", type=float, default=None,
                   help="one-way latency of a link (default 0; --sweep: 0.01)")
    p.add_argument("--modes", default="vanilla,herald,het",
                   help="--sweep: comma-separated modes, the first the speed-ups' denominator "
                        "(default vanilla,herald,het)")
    p.add_argument("--gpu", default="h200", help="--sweep: the GPU workers' device, its compute stated from its data "
                   "sheet (rtx3090, h100, h200; default h200)")
    p.add_argument("--host-profile", help="--sweep, --paper: a profile whose fixed compute per iteration is a GPU "
                   "worker's host cost (calibrate the same layers at a small embedding dimension; default: "
                   "--profile's)")
    p.add_argument("--scheduler-threads", type=int, default=16,
                   help="--sweep: each rank's scheduler threads on a GPU host (default 16, the Herald paper's pool)")
    p.add_argument("--out", help="--sweep and --validate: write OUT.json and OUT.png; --paper: OUT.json")
    p.add_argument("--cores-per-host", type=int,
                   help="CPU workers: the cores a host's ranks share (default: GPU workers, compute off the CPU)")
    p.add_argument("--one-machine", action="store_true",
                   help="the hosts are emulated on one machine whose cores every rank shares (hybrid bench e2e)")
    p.add_argument("--json", action="store_true", help="print only JSON on stdout (the text goes to stderr)")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    p.set_defaults(func=cmd_project)

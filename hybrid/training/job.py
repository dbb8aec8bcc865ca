"""``hybrid train CONFIG``: one multi-rank training run, from start-up checks to the summary.

Every rank runs this. Ranks first agree on the config digest and the data
fingerprint (a mismatch stops all of them with one message), then train,
flush dirty rows to the PS, evaluate on the held-out split and report on
worker 0: throughput, embedding transmissions measured at the RMA store,
hit rate, AUC/log loss, the iteration time breakdown, and each rank's
start-up time and peak memory. PS ranks wait in the store's barrier (serving
packed transfers) while the workers train.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np
from tqdm import tqdm

from hybrid import modes, wire_format
from hybrid.config import Config, flatten
from hybrid.data.store import BatchStore, StoreError
from hybrid.runtime import checkpoint as ckpt, run_lease
from hybrid.runtime.comm import check_agreement, split_roles
from hybrid._ext import mpi_yield
from hybrid.runtime.launch_facts import YIELD_VARIABLE, LaunchFacts, decide, usable_cores
from hybrid.runtime.link_counters import difference, link_bytes
from hybrid.runtime.preemption import StopRequest
from hybrid.runtime.reshard import checkpoint_plan, cold_start, files_to_verify, same_layout
from hybrid.runtime.shard_plan import ShardPlan, ShardPlanError
from hybrid.training import learning_curves
from hybrid.training.loop import STAGES, HybridTrainer
from hybrid.training.summary_text import other_ms


def _open_stores(config: Config) -> tuple[Optional[dict], str]:
    """The train, validation (None without ``data.validation_fraction``) and test views, and the
    fingerprint (or the reason there is none, to agree on)."""
    try:
        splits = {split: BatchStore.of(config.data, split) for split in ("train", "validation", "test")}
        train = splits["train"]
        train.check_ids()  # every split: the whole sparse.npy
        train.check_values()  # and the whole labels.npy and dense.npy
        if not splits["validation"].n_samples:
            splits["validation"] = None
        return splits, train.fingerprint
    except StoreError as err:
        return None, f"unreadable ({err})"


def run(config: Config, *, log_path: Optional[str] = None, summary_path: Optional[str] = None,
        progress: bool = True, resume: bool = False, stop: Optional[StopRequest] = None,
        launch: Optional[LaunchFacts] = None) -> Optional[dict]:
    """Train as configured; returns the summary on worker 0 and None on other ranks.

    ``resume``: continue from the newest usable checkpoint in
    ``config.checkpoint_path`` (from the start when there is none). ``stop``:
    a signal request that ends the run early with a checkpoint. Errors found
    before training (config or data disagreement, a bad store, a checkpoint
    of another run, a checkpoint directory in use) are raised on every rank
    alike, marked ``at_start_up`` (True). Later ones may be raised on some
    ranks only, with the others left in a collective: the caller must then
    end the job, as ``hybrid train`` does (print, then ``MPI_Abort``).
    ``launch``: what :func:`hybrid.runtime.launch_facts.prepare` decided
    before MPI started (None: MPI had started before anyone decided).
    """
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        start = _start_up(config, world, resume)
    except Exception as err:
        err.at_start_up = True  # hybrid.cli.train: the ranks may agree on it and end without MPI_Abort
        raise
    if start is None:
        return None
    roles, splits, plan, iterations, checkpoint, lease, run_id = start
    try:
        # From here an error may be raised on some ranks only: it propagates without any collective
        # cleanup (which would wait for ranks that never come), and `hybrid train` aborts the job.
        trainer = HybridTrainer(config, roles, splits["train"], resume=checkpoint, stop=stop, plan=plan, lease=lease,
                                run_id=run_id)
        summary = _train(config, trainer, splits, iterations, log_path, progress)
        if summary is not None:
            summary["launch"] = _launch_report(roles, launch)
        trainer.close()
        roles.free()
        if summary is not None and summary_path:
            Path(summary_path).write_text(json.dumps(summary, indent=2) + "\n")
        return summary
    finally:
        if lease is not None:
            lease.release()


def _start_up(config: Config, world, resume: bool) -> Optional[tuple]:
    """Every check before training, alike on every rank (collective): (roles, splits, plan, iterations,
    checkpoint to resume or None, the checkpoint directory's lease or None, the run's id or None); None
    if a resumed run is already at its end."""
    roles = split_roles(config.cluster.workers, config.cluster.ps, world, user_threads=config.train.threads)
    splits, fingerprint = _open_stores(config)
    check_agreement(world, config=config.digest(), data=fingerprint,
                    explain={"config": flatten(config.to_dict())})
    if splits is None:
        raise StoreError(f"{config.data.path}: {fingerprint}; every rank failed to read it")
    train = splits["train"]
    plan, plan_state = _shard_plan(config, int(train.cardinalities.sum()))
    check_agreement(world, shard_plan=plan_state)  # every rank read the same plan, or failed alike
    if plan is None:
        raise ShardPlanError(plan_state)
    if train.num_batches(config.global_batch) == 0:
        raise ValueError(f"{config.data.path}: the train split has {train.n_samples} samples, fewer than one "
                         f"global batch of {config.global_batch} (cluster.workers x train.batch_per_worker); "
                         f"use a larger store or a smaller batch")
    modes.check(config, train.cardinalities)  # before any collective allocation, on every rank alike
    iterations = modes.run_length(config, train)  # past one pass: epoch after epoch
    if config.train.checkpoint_every:
        _check_checkpoint_room(config, roles, plan.n_rows * config.row_bytes)
    lease, run_id = _take_checkpoint_dir(config, roles, resume)
    try:
        checkpoint = _resume_point(config, roles, fingerprint, plan) if resume else None
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    if checkpoint is not None and checkpoint.step + 1 >= iterations:
        _say(roles, f"{checkpoint.path} is the end of this run (iteration {checkpoint.step}); nothing to resume")
        if lease is not None:
            lease.release()
        roles.free()
        return None
    return roles, splits, plan, iterations, checkpoint, lease, run_id


def _shard_plan(config: Config, n_rows: int) -> tuple[Optional[ShardPlan], str]:
    """The run's shard plan and its fingerprint, or (None, why it cannot be used)."""
    if not config.cluster.shard_plan:
        plan = ShardPlan.contiguous(n_rows, config.cluster.ps)
        return plan, plan.fingerprint
    try:
        plan = ShardPlan.load(config.cluster.shard_plan, n_rows=n_rows, n_shards=config.cluster.ps,
                              dim=config.model.embedding_dim)
    except ShardPlanError as err:
        return None, f"cluster.shard_plan: {err}"
    if plan.columns and config.row_width != config.model.embedding_dim:
        return None, (f"cluster.shard_plan: {config.cluster.shard_plan} splits rows into column slices, but "
                      f"train.embedding_optimizer={config.train.embedding_optimizer.value} keeps state beside "
                      f"each whole row; use a plan of whole rows")
    return plan, plan.fingerprint


def _check_checkpoint_room(config: Config, roles, table_bytes: int) -> None:
    """Every rank can write into ``train.checkpoint_dir``, with room for the tables (collective).

    Each rank asks its own view of the directory (PS ranks on other hosts
    write there too); rank 0 also compares the free space with the tables.
    """
    problem = ckpt.room_problem(config.checkpoint_path, table_bytes if roles.rank == 0 else 0)
    problems = sorted({p for p in roles.world.allgather(problem) if p})
    if problems:
        raise ckpt.CheckpointError(f"train.checkpoint_dir={config.checkpoint_path}: {'; '.join(problems)}; "
                                   f"choose a writable directory with room, on a filesystem every rank sees")


def _take_checkpoint_dir(config: Config, roles, resume: bool) -> tuple[Optional[run_lease.Lease], Optional[str]]:
    """Rank 0 takes ``train.checkpoint_dir`` for this run, or every rank raises naming its holder (collective).

    Returns the lease (rank 0; None elsewhere) and the run's id on every
    rank: a resumed run's is that of the checkpoints in the directory (a
    directory holds one run's: a new run is refused where there are any),
    so that the lease and the checkpoints name the run alike.

    Only a run that writes checkpoints takes it: a checkpointed mode, with
    periodic checkpoints, a directory of its own or ``--resume``. Without
    them a run checkpoints only when a signal stops it, into
    ``checkpoints/<config name>``, and side-by-side runs of one config are
    not refused (docs/training.md, "One run per checkpoint directory").
    """
    if not modes.get(config.scheduler.mode).checkpoints or \
            not (resume or config.train.checkpoint_every or config.train.checkpoint_dir):
        return None, None
    lease, run_id, refused = None, None, None
    if roles.rank == 0:
        root = config.checkpoint_path
        existing = ckpt.CheckpointDir(root).complete()
        run_id = (existing[0].meta.get("run") if resume and existing else None) or run_lease.new_run_id()
        try:
            lease = run_lease.acquire(root, run_lease.this_holder(config.name, run_id), resume=resume,
                                      has_checkpoints=lambda: bool(existing), say=lambda message: _say(roles, message))
            if existing and not resume:  # a new run would replace them step by step
                lease.release()
                lease = None
                refused = (f"train.checkpoint_dir={root} holds the checkpoints of another run ({existing[0].path.name} "
                           f"the newest, run {existing[0].meta.get('run', 'of an earlier version')}); --resume "
                           f"continues it, or choose another train.checkpoint_dir")
        except run_lease.LeaseError as err:
            refused = str(err)
        except OSError as err:
            refused = f"train.checkpoint_dir={root}: {err.strerror or err}; choose a writable directory"
    refused, run_id = roles.world.bcast((refused, run_id), root=0)
    if refused:
        raise ckpt.CheckpointError(refused)
    return lease, run_id


def _say(roles, message: str) -> None:
    if roles.rank == 0:
        print(f"hybrid train: {message}", file=sys.stderr, flush=True)


def _resume_point(config: Config, roles, fingerprint: str, plan: ShardPlan) -> Optional[ckpt.Checkpoint]:
    """The newest checkpoint every rank can use, chosen alike on every rank (collective).

    One of another config or data is refused outright; a damaged one
    (a file missing, truncated or changed) is skipped for the previous one.
    Each rank checks only the files it will read: PS ranks their rows (on
    another cluster shape a share of every old PS file), workers the MLP
    and the scheduler's state (only where the schedule continues).
    """
    directory = ckpt.CheckpointDir(config.checkpoint_path)
    candidates = roles.world.bcast(directory.complete() if roles.rank == 0 else None, root=0)
    if not candidates:
        _say(roles, f"no checkpoint in {directory.root}; starting from iteration 0")
        return None
    skipped = []
    for candidate in candidates:
        other = ckpt.mismatch(candidate, config.training_dict(), fingerprint)
        if other:
            raise ckpt.CheckpointError(f"{candidate.path} belongs to another run: {other}; resume with the "
                                       f"config and data that wrote it, or set train.checkpoint_dir elsewhere")
        if not same_layout(candidate.meta, plan):
            try:
                checkpoint_plan(candidate.meta, plan.n_rows)  # its layout is known, or it cannot be re-sharded
            except ShardPlanError as err:
                raise ckpt.CheckpointError(f"{candidate.path}: {err}") from None
        cold = cold_start(candidate.meta, roles.n_workers, plan, config.to_dict()["cache"])
        if roles.is_ps:
            mine = files_to_verify(candidate.meta, plan, roles.ps_ranks.index(roles.rank))
        else:
            mine = ["dense.pt"] + (["scheduler.npz"] if cold is None else [])
        problems = sorted({p for p in roles.world.allgather(ckpt.verify(candidate, mine)) if p})
        if not problems:
            if skipped:
                _say(roles, f"skipped damaged checkpoint(s): {'; '.join(skipped)}")
            _say(roles, f"resuming from {candidate.path} (after iteration {candidate.step})")
            if cold is not None:
                _say(roles, cold)
            return candidate
        skipped.append(f"{candidate.path.name}: {', '.join(problems)}")
    raise ckpt.CheckpointError(f"no usable checkpoint in {directory.root}: {'; '.join(skipped)}")


def _train(config: Config, trainer: HybridTrainer, splits: dict, iterations: int,
           log_path: Optional[str], progress: bool) -> Optional[dict]:
    lead = trainer.roles.worker == 0
    bar = tqdm(total=iterations, initial=trainer.run.start_step, unit="it", desc=f"train {config.scheduler.mode.value}", file=sys.stderr,
               disable=None if (lead and progress) else True)
    if lead and log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "w", buffering=1) if (lead and log_path) else None  # a line per iteration, kept on a kill

    def on_step(record: dict) -> None:
        bar.update(1)
        if log_file is not None:
            log_file.write(json.dumps(record) + "\n")

    if not trainer.roles.is_ps:  # the clock starts once every worker is ready: start-up skew is not training
        arrived = time.perf_counter()
        trainer.roles.worker_barrier()
        trainer.start_wait_seconds = time.perf_counter() - arrived
    try:
        links = link_bytes()
        start = time.perf_counter()
        heldout = splits["validation"] or splits["test"]  # evaluated during the run
        log = trainer.train(iterations, on_step=on_step, heldout=heldout)  # PS ranks: serve until end_service
        seconds = time.perf_counter() - start
        links = difference(link_bytes(), links)
    finally:
        bar.close()
        if log_file is not None:
            log_file.close()
    stopped = trainer.roles.is_ps or trainer.run.stopped_by is not None
    if not stopped:
        trainer.flush()
    final = None if stopped else _final_evaluations(trainer, splits["validation"], splits["test"])
    trainer.end_service()
    ranks = trainer.roles.world.gather({**_rank_report(trainer), "train_link_bytes": links}, root=0)
    return _summarize(config, trainer, log, seconds, final, ranks) if not trainer.roles.is_ps else None


def _final_evaluations(trainer: HybridTrainer, validation: Optional[BatchStore], test: BatchStore) -> dict:
    """The run's end (workers, after the flush): the validation split, then the test split on the last model
    and, with ``train.keep_best``, on the best validation model if an earlier one was better (worker 0's
    results; the other workers' are None)."""
    step = trainer.last_step
    entries = []
    if validation is not None:
        entries.append(trainer.note_evaluation(step, "validation", trainer.evaluate(validation)))
    last = trainer.evaluate(test)
    entries.append(trainer.note_evaluation(step, "test", last))
    kept = trainer.evaluate(test) if trainer.restore_best() else last
    return {"kept": kept, "last": last, "entries": entries}


def _launch_report(roles, launch: Optional[LaunchFacts]) -> dict:
    """How the job was launched and how its ranks wait (docs/cluster.md).

    The decision was made before MPI started, from the launcher's word on
    how many ranks share this host; ``measured`` is the host as the ranks
    counted it once MPI ran (network namespaces of one machine included).
    """
    from mpi4py import MPI

    if launch is None:  # MPI started first (a test harness): report what OpenMPI itself chose
        launch = replace(decide(os.environ, usable_cores(), roles.user_threads),
                         decided_by="nobody: MPI had started before hybrid train could decide")
        if not os.environ.get(YIELD_VARIABLE):
            launch = replace(launch, yields=os.environ.get("OMPI_MCA_mpi_oversubscribe", "0") == "1")
    library = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]  # "Open MPI v4.1.4, package: ..."
    report = {**launch.to_dict(), "mpi": " ".join(library.split(",")[0].split()),
              "measured": {"ranks_on_host": roles.node_ranks, "cores": roles.node_cores,
                           "fits": roles.share.fits}}
    if report["yields"] and "MPICH" in report["mpi"]:  # MPICH yields through the rank's own module, if it loaded
        if mpi_yield.active():
            report["decided_by"] += "; MPICH's waits yield through hybrid._ext.mpi_yield"
        else:
            report["yields"] = False
            report["decided_by"] += "; but MPICH's waits did not come through hybrid._ext.mpi_yield: they spin"
    return report


def _rank_report(trainer: HybridTrainer) -> dict:
    """This rank's start-up time, its wait for the other workers before the clock started, and peak
    resident memory (Linux reports kilobytes)."""
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rank": trainer.roles.rank, "role": "ps" if trainer.roles.is_ps else "worker",
            "startup_s": round(trainer.startup_seconds, 3), "start_wait_s": round(trainer.start_wait_seconds, 3),
            "peak_rss_mb": round(peak_kb / 1024, 1)}


def _summarize(config: Config, trainer: HybridTrainer, log: list[dict], seconds: float,
               final: Optional[dict], ranks: Optional[list]) -> Optional[dict]:
    """Totals over workers (collective over the workers); the summary on worker 0."""
    moved = np.array([sum(r["moved"].get(k, 0) for r in log)
                      for k in ("pull", "put", "accumulate", "p2p", "version_read")], dtype=np.int64)
    total = trainer.roles.workers.allreduce(moved)
    loss_sums = trainer.roles.workers.allreduce(np.array([r["loss_sum"] for r in log], dtype=np.float64))
    loss_sum = float(loss_sums.sum())
    mean_ms = {s: 1000 * sum(r["timing"].get(s, 0.0) for r in log) / max(1, len(log)) for s in STAGES}
    training = seconds - trainer.run.paused_seconds  # throughput leaves out checkpoints and evaluations
    # the rest of an iteration's time (worker 0's): the loop's bookkeeping between iterations (records, counts,
    # checks), and the scheduler's thread holding the interpreter between stages
    mean_ms["other"] = other_ms(training, len(log), mean_ms)
    if trainer.roles.worker != 0:
        return None
    everything, counted = trainer.run.figures, trainer.run.counted
    row_bytes = config.row_bytes
    wire_bytes = trainer.table.wire_row_bytes  # a row as training moved it: 2 bytes a value with a 16-bit wire
    pulls, pushes, p2p = int(total[0]), int(total[1] + total[2]), int(total[3])
    samples = sum(r["samples"] for r in log)
    shard_rows = trainer.table.plan.shard_rows
    return {
        "config": config.name, "mode": config.scheduler.mode.value, "label": modes.run_label(config),
        "workers": config.cluster.workers,
        "ps": config.cluster.ps, "model": config.model.name.value, "iterations": len(log), "samples": samples,
        "seconds": round(seconds, 3), "paused_seconds": round(trainer.run.paused_seconds, 3),
        "throughput": round(samples / training, 1) if training > 0 else 0.0,
        "transmissions": {"pull_rows": pulls, "push_rows": pushes, "p2p_rows": p2p, "rows": pulls + pushes + p2p,
                          "pull_bytes": pulls * wire_bytes, "push_bytes": pushes * wire_bytes,
                          "p2p_bytes": p2p * wire_format.row_bytes(config)},
        "wire_precision": config.cluster.wire_precision.value,
        "version_checks": {"rows": int(total[4]), "bytes": 8 * int(total[4])},  # HET: read, not transmissions
        # FAE's hot rows and row-wise Adagrad's shared rows, summed with Horovod: not transmissions
        "allreduced_rows": everything.allreduced,
        # the figures hybrid simulate reports, by the same definitions (hybrid/training/figures.py): of the
        # iterations after scheduler.warmup_iterations, and of every iteration this run trained
        "hit_rate": round((counted if counted.iterations else everything).hit_rate, 6),
        "counted": {"after_warmup": config.scheduler.warmup_iterations, **counted.summary(timings=False)},
        "all_iterations": everything.summary(timings=False),
        "train_loss": round(loss_sum / samples, 6) if samples else float("nan"),
        "events": everything.by_kind, "iteration_ms": {k: round(v, 3) for k, v in mean_ms.items()},
        "overlap": config.train.overlap, "transport": trainer.table.transport,
        "compute": {"device": trainer.device_name(), "allreduce": trainer.allreduce.describe()},
        "scored_tables": trainer.scored_tables,  # adaptive LAIA under budget_ms: agreed by every worker
        "table_rows": trainer.table.plan.n_rows, "ps_shard_mb": round(shard_rows * row_bytes / 2**20, 1),
        "ranks": ranks,
        "evaluation": final["kept"] if final else None,  # test split, on the model kept (train.keep_best)
        "evaluation_last": final["last"] if final and final["kept"] is not final["last"] else None,
        "best": trainer.run.best, "epochs": trainer.epoch_of(trainer.run.start_step + len(log) - 1),
        "iterations_per_epoch": trainer.per_epoch,
        "curves": {"train_loss": learning_curves.train_loss_points(
                       [r["step"] for r in log], loss_sums, [r["samples"] for r in log],
                       eval_every=config.train.eval_every, per_epoch=trainer.per_epoch),
                   "evaluations": trainer.run.evaluations + [e for e in (final or {}).get("entries", []) if e]},
        "start_step": trainer.run.start_step, "stopped_by": trainer.run.stopped_by,
        "checkpoints": trainer.run.checkpoints, "evaluations": trainer.run.evaluations,
        "checkpoint_rows": {"flushed": trainer.run.flushed_rows, "restored": trainer.run.restored_rows},
    }

"""The hybrid-parallel training loop of one rank (docs/design.md, sections 2, 3 and 11).

Workers train their share of each global batch: the scheduler (every worker
runs its own, identically, in a background thread, making each plan when
this loop gives it a turn: hybrid.scheduling.plan_producer) says which samples are
theirs and which embedding rows move where; this loop executes that worker's
share against the RMA store and its cache, runs forward/backward, allreduces
MLP gradients with Horovod and applies the embedding updates. PS ranks only
host the store. Every array touched per iteration follows the batch: the
worker's distinct rows, its samples, its events; never the cache or a table.

Stages of iteration ``t`` (each a ``torch.profiler.record_function`` range,
and the time breakdown of the summary). The loop knows only these; the
mode (one of ``hybrid.modes.MODES``) is called at fixed points
of them and the loop has no branch per mode:

- ``pull``: ``mode.begin`` (FAE: the replica's synchronization the plan asks
  for; P2P: the rows other workers need from this cache sent, theirs
  received; HET: the version reads of the cached rows needed); write back
  evicted dirty rows and read the rows ``t`` needs that the previous
  iteration wrote (one flush); place those prefetched during ``t - 1``;
  ``mode.after_reads`` (P2P: received rows placed; HET: versions checked);
  start reading ``t + 1``'s prefetchable rows if ``mode.reads_ahead``;
- ``compute``: forward/backward of the worker's samples, their rows from
  ``mode.embeddings`` (the cache, or FAE's replica); after the allreduce, the
  MLP's optimizer step (the model's arithmetic, which a one-process trainer
  does too);
- ``allreduce``: the MLP gradients, summed over the workers (nothing with one
  worker); then ``mode.reduce`` (FAE's hot iterations: the batch's hot-row
  gradients);
- ``push``: ``mode.update`` (local SGD, then Accumulate/Put of shared,
  full-set and plan-pushed rows; HET: its pushes of unpushed updates; FAE's
  hot iterations: SGD on the replica); ``data`` and ``schedule_wait``: the
  next plan and batch arrive while those writes are in flight; then
  complete them (one flush);
- ``barrier``: the workers' barrier that ends ``t``.

Ordering: what makes BSP exact with the overlap (docs/design.md, section 11).
Reads and writes of different rows never conflict; for one row:

1. Every read of iteration ``t`` completes before any Accumulate or Put of
   ``t``: reads are flushed in ``pull`` (prefetched ones at the end of
   ``t - 1``), and those writes start after the allreduce, which no worker
   leaves before every worker has entered it, i.e. finished its reads (one
   worker: its own reads are complete). (The
   write-backs in ``pull`` are of rows nobody reads in ``t``: a dirty row that
   another worker needs in ``t`` was plan-pushed in ``t - 1``, so it is no
   longer dirty when evicted.)
2. Every write of ``t`` completes before ``t``'s barrier; a read of a row that
   ``t`` writes is issued after that barrier (a ``pull`` of ``t + 1``).
3. A read issued before that barrier (a ``prefetch`` of ``t + 1``) is of a
   row no worker writes in ``t`` (the cluster state marks it), so it returns
   the value ``t + 1`` needs; it lands in a buffer, not the cache, because its
   slot may still hold a row that ``t`` trains.
4. Write-backs copy their slots when issued, before ``t``'s rows land there.

PS ranks never load torch (3 s of CPU and 250 MB of memory per rank here):
the workers' code imports it, and what needs it (the model, its optimizer,
device staging, the MLP's checkpoint file), where it runs.
"""
from __future__ import annotations

import copy
import itertools
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from hybrid import modes
from hybrid._ext import mpi_yield
from hybrid.config import Config
from hybrid.data.store import BatchStore, GlobalBatch
from hybrid.lr_schedule import RateSchedule, set_rate
from hybrid.runtime import checkpoint as ckpt
from hybrid.runtime.comm import MpiCollectives, Roles, worker_collectives
from hybrid.runtime.embedding_init import fill_initial_runs
from hybrid.runtime.preemption import StopRequest, describe
from hybrid.runtime.reshard import ShardFiles, checkpoint_plan, cold_start, same_layout
from hybrid.runtime.rma_store import EmbeddingStore, Handle
from hybrid.runtime.run_lease import Lease, new_run_id
from hybrid.runtime.shard_plan import ShardPlan
from hybrid.runtime.watchdog import Watchdog
from hybrid.scheduling.allocation import AdaptiveLaiaAllocation
from hybrid.scheduling.plan_producer import PlanProducer
from hybrid.scheduling.plans import BatchPlan
from hybrid.training.figures import Figures
from hybrid.wire_format import Wire

STAGES = ("data", "schedule_wait", "pull", "compute", "allreduce", "push", "barrier")


class Stages:
    """Seconds per stage of one iteration; each stage is also a ``torch.profiler`` range while a profiler records.

    Entered about ten times per iteration, so it costs what a clock read
    costs: opening a ``record_function`` range is 20-30 us of the
    dispatcher's, and only pays while a profiler records. One stage at a
    time: ``with stages("pull"): ...`` (stages do not nest).
    """

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.current = "starting"  # the stage running now (the watchdog's report)
        self._start = 0.0
        self._range = None
        torch = sys.modules.get("torch")  # not on PS ranks (see the module docstring)
        self._profiling = torch.autograd._profiler_enabled if torch else None

    def __call__(self, name: str) -> "Stages":
        self.current = name
        return self

    def __enter__(self) -> None:
        if self._profiling is not None and self._profiling():
            self._range = sys.modules["torch"].profiler.record_function(self.current)
            self._range.__enter__()
        self._start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.seconds[self.current] = self.seconds.get(self.current, 0.0) + time.perf_counter() - self._start
        if self._range is not None:
            self._range.__exit__(*exc)
            self._range = None


@dataclass
class _Ready:
    """An iteration whose inputs the previous one prepared (and whose prefetchable rows it read)."""

    plan: BatchPlan
    batch: GlobalBatch
    inputs: tuple  # dense, labels, index tensors of this worker's samples
    prefetched: Optional[tuple]  # (handle, values) of plan.work.prefetch, or None when nothing was read ahead


@dataclass
class RunState:
    """What a worker's run did besides training: checkpoints, evaluations, rows moved for them."""

    start_step: int = 0  # first iteration of this run (> 0 when resumed)
    stopped_by: Optional[str] = None  # the signal that ended the run early, if one did
    checkpoints: list = field(default_factory=list)  # {"step", "path", "seconds"} per checkpoint written
    evaluations: list = field(default_factory=list)  # {"step", "epoch", "split", ...evaluation} per evaluation
    best: Optional[dict] = None  # {"step", "epoch", "auc"} of the best validation evaluation (train.keep_best)
    flushed_rows: int = 0  # dirty rows copied to the PS for checkpoints and evaluations (not transmissions)
    restored_rows: int = 0  # cached rows read back from the PS when resuming (not transmissions)
    paused_seconds: float = 0.0  # spent on checkpoints and evaluations between iterations
    # the figures of the iterations this run trained before scheduler.warmup_iterations, and of those after
    # it (as simulate counts): each plan is added once, the loop's own time (docs/benchmarks.md, issue 54)
    warmup: Figures = field(default_factory=Figures)
    counted: Figures = field(default_factory=Figures)

    @property
    def figures(self) -> Figures:
        """The figures of every iteration this run trained."""
        return self.warmup.merged(self.counted)


class HybridTrainer:
    """One rank's part of a training run; construct on every rank (collective).

    ``resume``: a checkpoint chosen by every rank alike (``hybrid.training.job``): PS
    ranks load their rows from it, workers the MLP, its optimizer and the
    scheduler's state. ``stop``: a signal request that ends the run early
    with a checkpoint (docs/design.md section 13). ``lease``: worker 0's hold
    on the checkpoint directory, checked before each checkpoint (None: not held);
    ``run_id``: the run's id its checkpoints carry.
    """

    def __init__(self, config: Config, roles: Roles, store: BatchStore, *,
                 resume: Optional[ckpt.Checkpoint] = None, stop: Optional[StopRequest] = None,
                 plan: Optional[ShardPlan] = None, lease: Optional[Lease] = None, run_id: Optional[str] = None):
        start = time.perf_counter()
        self.config, self.roles, self.data = config, roles, store
        self.stop = stop or StopRequest()
        self.checkpoints = ckpt.CheckpointDir(config.checkpoint_path, config.train.checkpoint_keep)
        self.lease = lease
        # the run's id in its checkpoints (retention removes only its own): ``run_id`` (hybrid.training.job:
        # the lease's), else a resumed checkpoint's, else a new one
        self.run_id = run_id or (resume.meta.get("run") if resume else None) or new_run_id()
        self.run = RunState(start_step=resume.step + 1 if resume else 0)
        self.per_epoch = max(1, store.num_batches(config.global_batch))  # global batches in one pass
        self.rates = RateSchedule.of(config, self.per_epoch)
        self.best_model = None  # workers: the MLP of run.best; PS ranks: their rows of it (train.keep_best)
        self.dtype = np.dtype(config.model.precision.value)
        self.overlap = config.train.overlap
        n_rows = int(store.cardinalities.sum())
        dim = config.model.embedding_dim
        mode = modes.get(config.scheduler.mode)
        if plan is None:
            plan = ShardPlan.load(config.cluster.shard_plan, n_rows=n_rows, n_shards=config.cluster.ps, dim=dim) \
                if config.cluster.shard_plan else ShardPlan.contiguous(n_rows, config.cluster.ps)
        self.table = EmbeddingStore(roles.world, roles.ps_ranks, n_rows, config.row_width, dtype=self.dtype,
                                    init=self._initial_rows(resume, plan), transport=config.cluster.transport.value,
                                    spin_seconds=0.0 if roles.oversubscribed else 0.002,
                                    versions=mode.store_versions, plan=plan, poll_seconds=roles.poll_seconds,
                                    wire=Wire.of(config))
        self.hvd = worker_collectives(roles, config.train.allreduce,  # horovod.torch, or MpiCollectives
                                      gpu=self._computes_on_gpu(config, roles))
        self.last_loss = 0.0
        self.start_wait_seconds = 0.0  # workers: the wait for the others before the clock starts (job._train)
        self._served = False  # the workers have released the PS ranks (end_service)
        self.mode = None  # workers: the mode's worker side (hybrid.modes), called at the loop's fixed points
        self.scored_tables = None  # workers with adaptive LAIA under scheduler.budget_ms: the count agreed on
        if roles.is_ps:
            self.startup_seconds = time.perf_counter() - start
            return
        import torch

        from hybrid import torch_files
        from hybrid.models import build_model
        from hybrid.runtime import accelerator

        self.torch_dtype = getattr(torch, config.model.precision.value)
        self.mode = mode(modes.WorkerContext(config, roles, self.table, store, self.hvd, evaluate=self.evaluate))
        self.scheduler, self.cache = self.mode.scheduler, self.mode.cache  # the cache: rows by slot
        self.scored_tables = self._agree_on_scored_tables()
        if config.train.verify_cache:
            self.scheduler.snapshot_worker = roles.worker
        torch.set_num_threads(roles.threads)  # train.threads, else the host's cores per rank
        self.device = accelerator.pick_device(config.train.device, self.hvd.local_rank())
        self.staging = accelerator.Staging(self.device)
        self.model = build_model(config.model, n_dense=store.n_dense, n_tables=store.n_tables,
                                 seed=config.seed).to(self.device)
        self.hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        identities, mpich_yields = zip(*roles.workers.allgather((accelerator.gpu_identity(self.device),
                                                                 mpi_yield.active())))
        self.allreduce = accelerator.choose_allreduce(
            config.train.allreduce, list(identities), nccl_built=bool(self.hvd.nccl_built()),
            cpu_backend="gloo" if self.hvd.gloo_enabled() else "mpi", mpich_yields=list(mpich_yields),
            without_horovod=self.hvd.reason if isinstance(self.hvd, MpiCollectives) else None,
            sixteen_bit_wire=self.table.wire.sixteen_bit)
        self.optimizer = self._dense_optimizer()
        self.resume_arrays = None
        if resume is not None:
            dense = torch_files.load(resume.file("dense.pt"), what="a checkpoint's MLP file", map_location=self.device,
                                     remedy=f"move {resume.path} away to resume from the previous checkpoint")
            self.model.load_state_dict(dense["model"])
            self.optimizer.load_state_dict(dense["optimizer"])
            if cold_start(resume.meta, roles.n_workers, self.table.plan, config.to_dict()["cache"]) is None:
                self.resume_arrays = ckpt.read_arrays(resume.file("scheduler.npz"))
        self.startup_seconds = time.perf_counter() - start

    @staticmethod
    def _computes_on_gpu(config: Config, roles: Roles) -> bool:
        """Whether this worker will compute on a GPU (asked before Horovod loads; False on PS ranks)."""
        if roles.is_ps:
            return False
        from hybrid.runtime import accelerator

        return accelerator.pick_device(config.train.device, 0).type == "cuda"

    def _agree_on_scored_tables(self) -> Optional[int]:
        """Adaptive LAIA with ``scheduler.budget_ms``: how many tables every worker scores.

        The count follows the measured cost of scoring, which differs between
        ranks; derived on each rank from its own clock, the plans would
        diverge. Every worker times scoring on the first global batch, and the
        slowest rank's cost fixes the count for the run (a resumed run keeps
        the one it saved). None when the count is not measured.
        """
        policy = self.scheduler.policy
        if not isinstance(policy, AdaptiveLaiaAllocation) or policy.score_tables or policy.budget_ms <= 0:
            return None
        first = next(self.data.batches(self.config.global_batch, shuffle=self.config.data.shuffle,
                                       seed=self.config.data.shuffle_seed))
        mine = policy.measure_cost_ms(self.scheduler.global_rows(first.sparse))
        return policy.fix_table_count(max(self.roles.workers.allgather(mine)))

    def _initial_rows(self, resume: Optional[ckpt.Checkpoint], plan: ShardPlan) -> Callable[[np.ndarray, list], None]:
        """How a PS rank fills its shard: the seeded initial rows, its file of the checkpoint, or (the
        checkpoint written by other PS ranks or under another plan) its rows gathered from every file."""
        if resume is None:
            return lambda shard, runs: fill_initial_runs(shard, self.config.seed, runs,
                                                         dim=self.config.model.embedding_dim)
        if same_layout(resume.meta, plan):
            index = self.roles.ps_ranks.index(self.roles.rank) if self.roles.is_ps else 0
            return lambda shard, runs: ckpt.read_rows_into(resume.file(ckpt.shard_name(index)), shard)
        old = checkpoint_plan(resume.meta, plan.n_rows)
        files = ShardFiles([resume.file(ckpt.shard_name(i)) for i in range(old.n_shards)], old,
                           self.config.row_width, self.dtype)
        return lambda shard, runs: files.fill(shard, runs)

    def device_name(self) -> str:
        """This worker's device as the summary names it: cpu, or cuda:N and the GPU's model."""
        if self.device.type != "cuda":
            return "cpu"
        import torch

        return f"{self.device} ({torch.cuda.get_device_name(self.device)})"

    def _dense_optimizer(self):
        """The MLP's optimizer, its step preceded by the sum of the gradients over the workers.

        Horovod fuses whichever gradients are ready in one cycle, and the
        fused size picks MPI's allreduce algorithm, hence the summation
        order: one group makes the fusion fixed. The host-staged sum is one
        buffer anyway (hybrid.runtime.accelerator).
        """
        from hybrid.models import dense_optimizer
        from hybrid.runtime import accelerator

        local = dense_optimizer(self.config, self.model.parameters())
        if not self.allreduce.summed:  # one worker
            return accelerator.DenseOptimizer(local)
        if self.allreduce.by_mpi:
            collectives = self.hvd if isinstance(self.hvd, MpiCollectives) else \
                MpiCollectives(self.roles.workers, self.allreduce.reason, patient=self.roles.patient_workers)
            return accelerator.HostStagedOptimizer(local, collectives, list(self.model.parameters()), self.table.wire)
        if self.allreduce.host_staged:
            return accelerator.HostStagedOptimizer(local, self.hvd, list(self.model.parameters()))
        return accelerator.DenseOptimizer(
            self.hvd.DistributedOptimizer(local, named_parameters=self.model.named_parameters(), op=self.hvd.Sum,
                                          groups=1 if self.config.train.deterministic else None), horovod=True)

    # -------------------------------------------------------------- training
    def train(self, iterations: int, on_step: Optional[Callable[[dict], None]] = None,
              heldout: Optional[BatchStore] = None) -> list[dict]:
        """Run global batches ``start_step .. iterations - 1``; one record per iteration (workers) or [].

        A record holds the plan's event counts (all workers), the rows this
        worker moved through the store during the iteration (``moved``; with
        overlap that includes the next iteration's prefetched rows), how many
        of this iteration's rows were read during the previous one
        (``prefetched``), the plan digest, seconds per stage and this worker's
        summed sample losses, and the evaluation on ``heldout`` (the validation
        split, else the test split) when one ran after it (every
        ``train.eval_every`` iterations and each epoch's end). A worker that finishes no iteration
        for ``train.watchdog_seconds`` prints its stage and stacks and ends
        the job (``hybrid.runtime.watchdog``). PS ranks serve the workers until they
        end the run (:meth:`end_service`), writing their rows at checkpoints.
        """
        if self.roles.is_ps:
            self._serve()
            return []
        first = self.run.start_step
        batches = self.mode.batches(first)
        self.last_step = iterations - 1
        producer = PlanProducer(self.scheduler, itertools.islice(batches, iterations - first), marks=self._marks,
                                resume=self.resume_arrays, start_step=first, keeps_state=self.roles.worker == 0)
        log = []
        self.stages = Stages()
        where = lambda: f"in stage {self.stages.current} of iteration {first + len(log)}"  # noqa: E731
        try:
            with Watchdog(self.config.train.watchdog_seconds, where) as watchdog:
                self._restore_cache()
                self._loop(producer, log, on_step, watchdog, heldout)
        finally:
            self.mode.finish()
            producer.close()
        return log

    def _marks(self, step: int) -> tuple[bool, bool]:
        """(save, dirty rows) for plan ``step``: checkpoints every ``checkpoint_every`` and at the end,
        evaluations every ``eval_every`` and at each epoch's end."""
        every = self.config.train.checkpoint_every
        save = bool(every) and ((step + 1) % every == 0 or step == self.last_step)
        return save, save or self._evaluates_after(step)

    def _evaluates_after(self, step: int) -> bool:
        """Whether a mid-run evaluation follows iteration ``step``: every ``train.eval_every`` iterations and
        at each epoch's end, not after the last one (the run's own evaluation follows it), and only in modes
        whose PS holds every update mid-run (HET's and FAE's workers hold some: ``mode.checkpoints``)."""
        evaluate = self.config.train.eval_every
        due = (bool(evaluate) and (step + 1) % evaluate == 0) or (step + 1) % self.per_epoch == 0
        return due and step != self.last_step and self.mode.checkpoints

    def epoch_of(self, step: int) -> float:
        """Passes over the train split completed after iteration ``step`` (the curves' second axis)."""
        return round((step + 1) / self.per_epoch, 4)

    def _restore_cache(self) -> None:
        """Resuming: read this worker's cached rows back from the PS (checkpointed with every dirty row).

        At full precision whatever the wire: between iterations a cached row
        equals its PS copy bit for bit, rounded or not (docs/design.md section 14).
        """
        if self.resume_arrays is None:
            return
        capacity, me = self.scheduler.state.capacity, self.roles.worker
        rows = self.resume_arrays["state.slot_row"][me * capacity:(me + 1) * capacity].astype(np.int64)
        slots = np.flatnonzero(rows >= 0)
        self.table.pull(rows[slots], self.cache, at=slots, exact=True).wait()
        self.run.restored_rows += len(slots)
        self.resume_arrays = None  # the scheduler holds what it needs

    def _loop(self, producer: PlanProducer, log: list, on_step, watchdog: Watchdog, heldout) -> None:
        """The iterations, each prepared by the one before (see the module docstring)."""
        # the scheduler thread makes its next plan where this loop waits outside the interpreter: in the
        # workers' allreduce (waiting for the others), or with one worker in the backward pass (plan_producer)
        self._scheduler_turn = producer.turn
        plans = iter(producer)
        stages = self.stages = Stages()
        with stages("schedule_wait"):
            first = next(plans, None)
            upcoming = next(plans, None) if first is not None else None
        ready = self._ready(*first, None, stages) if first is not None else None
        stopping = 0  # the agreed stop request's code, once there is one
        while ready is not None:
            before = dict(self.table.rows_moved)
            following, upcoming, stop = self._iteration(ready, upcoming, plans, stages)
            moved = {k: self.table.rows_moved[k] - before[k] for k in before}
            moved.update(ready.plan.work.moved_outside_store())  # rows from peers' caches, rows allreduced
            prefetched = len(ready.plan.work.prefetch) if ready.prefetched is not None else 0
            record = {"step": ready.plan.step, "counts": ready.plan.counts, "moved": moved,
                      "prefetched": prefetched, "digest": ready.plan.digest, "timing": stages.seconds,
                      "samples": len(ready.batch), "loss_sum": self.last_loss}
            paused = time.perf_counter()
            record.update(self._after(ready.plan, following is None, heldout, watchdog))
            self.run.paused_seconds += time.perf_counter() - paused
            log.append(record)
            counted = ready.plan.step >= self.config.scheduler.warmup_iterations
            (self.run.counted if counted else self.run.warmup).add(ready.plan)
            watchdog.beat()
            if on_step is not None:
                on_step(record)
            if stop and following is not None and not self.mode.checkpoints:  # all stop here, no checkpoint
                self.run.stopped_by = describe(stop)
                break
            if stop and not stopping and following is not None:
                stopping = stop
                self._stop_at_agreed_step(producer)
            ready, stages = following, Stages()
            self.stages = stages
        if stopping and log and log[-1]["step"] < self.last_step:  # else the run simply ended
            self.run.stopped_by = describe(stopping)

    def _stop_at_agreed_step(self, producer: PlanProducer) -> None:
        """A worker got a stop signal: every worker ends after the same step and checkpoints it.

        That step is the newest plan any worker's scheduler has made, so none
        has gone past it yet (docs/design.md section 13).
        """
        producer.release(stop_after=self.roles.worker_max(producer.hold()))

    def _after(self, plan: BatchPlan, last: bool, heldout: Optional[BatchStore], watchdog: Watchdog) -> dict:
        """The checkpoint and the evaluation on ``heldout`` that follow iteration ``plan.step``, if due; their
        record fields.

        A plan carries the scheduler's state exactly when a checkpoint follows it.
        """
        fields: dict = {}
        if plan.saved is not None:
            self._flush_copies(plan)
            fields["checkpoint"] = self._checkpoint(plan)
            watchdog.beat()
        if heldout is not None and not last and self._evaluates_after(plan.step):
            if "checkpoint" not in fields:
                self._flush_copies(plan)
            self.roles.worker_barrier()  # every worker's copies are at the PS before anyone reads
            result = self.evaluate(heldout)
            fields["evaluation"] = result
            self.note_evaluation(plan.step, heldout.split, result)
            watchdog.beat()
        return fields

    def note_evaluation(self, step: int, split: str, result: Optional[dict]) -> Optional[dict]:
        """An evaluation after iteration ``step`` (worker 0 has ``result``), as the curves hold it.

        Mid-run ones are kept in ``run.evaluations``. On the validation split
        with ``train.keep_best``, a model whose AUC is the best so far is kept
        (collective over all ranks then; the last iteration's model stays in
        place, so it needs no copy).
        """
        entry = None if result is None else {"step": step, "epoch": self.epoch_of(step), "split": split, **result}
        if entry is not None and step != self.last_step:
            self.run.evaluations.append(entry)
        if split == "validation" and self.config.train.keep_best:
            auc = self.roles.workers.bcast(None if result is None else result["auc"], root=0)
            if self.run.best is None or auc > self.run.best["auc"]:
                self.run.best = {"step": step, "epoch": self.epoch_of(step), "auc": auc}
                if step != self.last_step:
                    self.best_model = copy.deepcopy(self.model.state_dict())
                    self._tell_ps("keep")
        return entry

    def restore_best(self) -> bool:
        """Put the kept best model back in place of the last one (collective over all ranks); whether one was
        kept from an earlier iteration than the last. The run trains no further afterwards: the caches and
        the cluster state still describe the last model."""
        if self.run.best is None or self.run.best["step"] == self.last_step:
            return False
        self.model.load_state_dict(self.best_model)
        self._tell_ps("restore")
        return True

    def _tell_ps(self, op: str) -> None:
        """Have every PS rank keep a copy of its rows (``keep``) or put that copy back (``restore``), once
        every write has reached the PS; every rank leaves when they are done (collective over all ranks)."""
        self.table.barrier()
        self.roles.world.bcast({"op": op}, root=0)
        self.roles.world.Barrier()

    def _flush_copies(self, plan: BatchPlan) -> None:
        """Write copies of this worker's dirty rows to the PS, leaving the schedule as it is.

        Afterwards the PS holds every row's latest value (what a checkpoint
        or an evaluation reads), and the cluster state still says the rows
        are dirty, so the run goes on exactly as without the copies. No read
        of the next iteration can touch them: a dirty row another worker
        needs was plan-pushed, so it is no longer dirty.
        """
        rows, slots = plan.dirty
        self.table.put(rows, self.cache[slots], exact=True).wait()
        self.run.flushed_rows += len(rows)

    def _checkpoint(self, plan: BatchPlan) -> dict:
        """Checkpoint iteration ``plan.step`` (collective over all ranks; after :meth:`_flush_copies`).

        Worker 0 makes the temporary directory and, once every rank's
        writes have reached the PS (the store barrier), tells the PS ranks to
        write their rows; it writes the MLP, the optimizer and the
        scheduler's state, collects every file's checksum and commits.
        """
        start = time.perf_counter()
        lead = self.roles.worker == 0
        if lead and self.lease is not None:
            self.lease.check()  # another run took the directory over: nothing more is written into it
        staging = self.checkpoints.staging(plan.step) if lead else None
        self.table.barrier()
        self.roles.world.bcast({"op": "checkpoint", "step": plan.step}, root=0)
        files = {}
        if lead:
            import torch

            with ckpt.writing(staging / "dense.pt"):
                torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()},
                           staging / "dense.pt")
            files["dense.pt"] = ckpt.file_record(staging / "dense.pt")
            files["scheduler.npz"] = ckpt.write_arrays(staging / "scheduler.npz", plan.saved)
        gathered = self.roles.world.gather(files, root=0)
        entry = {"step": plan.step, "path": None, "seconds": 0.0}
        if lead:
            meta = ckpt.metadata(step=plan.step, training=self.config.training_dict(), fingerprint=self.data.fingerprint,
                                 files={k: v for part in gathered for k, v in part.items()},
                                 extra={"run": self.run_id,
                                        "mode": self.config.scheduler.mode.value, "rows": self.table.plan.n_rows,
                                        "shard_plan": self.table.plan.fingerprint,
                                        "shard_layout": self.table.plan.to_dict(),
                                        # the run's last iteration: its scheduler planned no next batch
                                        "ends_run": plan.step == self.last_step,
                                        # what an export needs to rebuild the model without the store
                                        "cardinalities": self.data.cardinalities.tolist(),
                                        "n_dense": self.data.n_dense,
                                        "dim": self.table.dim, "dtype": self.dtype.name})
            entry["path"] = str(self.checkpoints.commit(staging, meta).path)
        entry["seconds"] = round(time.perf_counter() - start, 3)
        self.run.checkpoints.append(entry)
        return entry

    def _serve(self) -> None:
        """A PS rank's run: serve the workers; at each checkpoint write this rank's rows; until the end.

        A stop signal here goes on to worker 0, which adds it to the workers'
        next barrier: the run then ends as if a worker had been signalled.
        """
        index = self.roles.ps_ranks.index(self.roles.rank)
        told = []
        self.stop.forward(lambda signum: told.append(self.roles.tell_worker_0(self.stop.code(self.roles.rank))))
        while True:
            self.stop.raise_if_interrupted()
            self.table.barrier()
            command = self.roles.world.bcast(None, root=0)
            if command["op"] == "end":
                self.stop.forward(None)
                for request, _ in told:
                    request.Wait()
                self._served = True
                return
            if command["op"] in ("keep", "restore"):  # see _tell_ps
                if command["op"] == "keep":
                    self.best_model = self.table.shard.copy()
                else:
                    self.table.shard[...] = self.best_model
                self.roles.world.Barrier()
                continue
            path = self.checkpoints.staging_path(command["step"]) / ckpt.shard_name(index)
            record = ckpt.write_rows(path, self.table.shard)
            self.roles.world.gather({ckpt.shard_name(index): record}, root=0)

    def end_service(self) -> None:
        """Workers: release the PS ranks from :meth:`_serve` (collective over all ranks, after evaluation)."""
        if self.roles.is_ps or self._served:
            return
        self.table.barrier()
        self.roles.world.bcast({"op": "end"}, root=0)
        self._served = True

    def _ready(self, plan: BatchPlan, batch: GlobalBatch, prefetched, stages: Stages) -> _Ready:
        """The iteration's inputs as tensors: its samples' dense features, labels and row positions."""
        work = plan.work
        with stages("data"):
            dense = self.staging.to_device(batch.dense[work.samples], self.torch_dtype)
            labels = self.staging.to_device(batch.labels[work.samples], self.torch_dtype)
            index = self.staging.to_device(work.index.astype(np.int64))
        return _Ready(plan, batch, (dense, labels, index), prefetched)

    def _iteration(self, ready: _Ready, upcoming, plans, stages: Stages):
        """One iteration (see the module docstring); returns the next iteration, ready, the one after, and
        whether any worker was asked to stop.

        ``upcoming`` is the next (plan, batch): its prefetchable rows are read
        and its inputs prepared during this iteration, and the (plan, batch)
        after it is taken from ``plans`` while this iteration's writes complete.
        """
        import torch

        work, (dense, labels, index) = ready.plan.work, ready.inputs
        with stages("pull"):
            started = self.mode.begin(ready.plan)  # before anything of this iteration lands in the cache
            handles = [self.table.put(work.writeback.rows, self.cache[work.writeback.slots]),
                       self.table.pull(work.pull.rows, self.cache, at=work.pull.slots)]
            if ready.prefetched is None:  # nothing was read ahead (first iteration, or overlap off)
                handles.append(self.table.pull(work.prefetch.rows, self.cache, at=work.prefetch.slots))
            self.table.complete(*handles, *started)
            if ready.prefetched is not None:  # completed by the last iteration's final flush
                self.cache[work.prefetch.slots] = ready.prefetched[1]
            self.mode.after_reads(work)
            ahead = self._prefetch(upcoming[0]) if (upcoming is not None and self.overlap and
                                                    self.mode.reads_ahead(upcoming[0])) else None
        with stages("compute"):
            step = ready.plan.step  # the iteration's learning rates (hybrid.lr_schedule), alike on every worker
            set_rate(self.optimizer, self.rates.dense(step))
            self.mode.embedding_lr = self.rates.embedding(step)
            dim = self.config.model.embedding_dim  # stored rows may carry optimizer state after it
            leaf = self.staging.to_device(self.mode.embeddings(work)[work.slots, :dim]).requires_grad_(True)
            logits = self.model(dense, self._gather(leaf, index))
            # the global batch's mean loss: each worker sums its samples over the global batch size,
            # and the MLP gradients are summed (not averaged) over the workers
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum") \
                / len(ready.batch)
            self.optimizer.zero_grad()
            if self.roles.n_workers == 1:
                self._scheduler_turn()
            loss.backward()
        with stages("allreduce"):
            if self.roles.n_workers > 1:
                self._scheduler_turn()
            self.optimizer.synchronize()  # ordering rule 1: every worker's reads of this iteration are complete
            gradients = self.mode.reduce(work, self.staging.to_host(leaf.grad))
        with stages("compute"):  # the MLP's update: the model's arithmetic, as in a one-process trainer
            self.optimizer.step()
            self.last_loss = float(loss.detach()) * len(ready.batch)
        with stages("push"):
            writes = self.mode.update(work, gradients)
            if not self.overlap:
                self.table.complete(*writes)
        following, after = None, None
        if upcoming is not None:  # while the writes are in flight
            following = self._ready(*upcoming, ahead, stages)
            with stages("schedule_wait"):
                after = next(plans, None)
        with stages("push"):
            self.table.complete(*writes, *([ahead[0]] if ahead else []))  # ordering rule 2
        with stages("barrier"):
            self.stop.raise_if_interrupted()
            mine = self.stop.code(self.roles.rank)
            if self.roles.worker == 0:
                mine = max(mine, self.roles.stop_requests())  # a PS rank's, forwarded (see _serve)
            stop = self.roles.worker_barrier_max(mine)
        if ready.plan.snapshot is not None:
            self.verify_cache(ready.plan.snapshot)
        return following, after, stop

    def _gather(self, leaf, index):
        """The samples' rows [samples, tables, dim] from the iteration's rows ``leaf``, differentiably.

        On a CPU through ``index_select``: its backward is one ``index_add_`` in index order, the same sums
        as ``embedding``'s, whose CPU backward adds row by row (0.4-0.6 ms more for W1 smoke's forward and
        backward alone; within the noise of whole runs here, docs/benchmarks.md). On a GPU ``embedding``, whose backward sorts and does not depend on
        the order of atomic adds.
        """
        import torch

        if leaf.is_cuda:
            return torch.nn.functional.embedding(index, leaf)
        return leaf.index_select(0, index.view(-1)).view(*index.shape, leaf.shape[1])

    def _prefetch(self, upcoming: BatchPlan) -> tuple[Handle, np.ndarray]:
        """Start reading the next iteration's prefetchable rows into a buffer (ordering rule 3)."""
        rows = upcoming.work.prefetch.rows
        values = np.empty((len(rows), self.cache.shape[1]), dtype=self.dtype)
        return self.table.pull(rows, values), values

    def verify_cache(self, snapshot: dict) -> None:
        """Check that every cached row this worker holds fresh, and the PS holds too, equals the PS copy.

        ``snapshot`` is the state at the end of the iteration just run (see
        ``Scheduler.snapshot_worker``: the scheduler thread is already ahead).
        Dirty rows (only this worker has the latest value) cannot be checked
        against the PS. Copies are exact, so any difference is a bug. A debug
        aid: it reads every cached row each iteration.
        """
        me = self.roles.worker
        cached = snapshot["cache_rows"]
        slots = np.flatnonzero(cached >= 0)
        rows = cached[slots].astype(np.int64)
        checkable = snapshot["fresh"][rows] & snapshot["at_ps"][rows]
        rows, slots = rows[checkable], slots[checkable]
        at_ps = np.empty((len(rows), self.cache.shape[1]), dtype=self.dtype)
        self.table.pull(rows, at_ps, exact=True).wait()  # a 16-bit wire too: equal to the bit (design section 14)
        bad = np.flatnonzero((at_ps != self.cache[slots]).any(axis=1))
        if len(bad):
            raise RuntimeError(f"worker {me}: {len(bad)} fresh cached rows differ from the PS, e.g. row "
                               f"{rows[bad[0]]} in slot {slots[bad[0]]}; the cache and the cluster state disagree")

    # ------------------------------------------------------------ inspection
    def flush(self) -> None:
        """Write every update the PS has not seen to it (collective over workers), e.g. before reading the table."""
        if self.roles.is_ps:
            return
        self.mode.flush()
        self.roles.worker_barrier()

    def evaluate(self, test: BatchStore, batch_size: int = 4096, limit: Optional[int] = None) -> Optional[dict]:
        """AUC and log loss on ``test`` after :meth:`flush`; the result on worker 0, None elsewhere.

        Workers split the test samples (the first ``limit`` of them), read
        their rows straight from the PS (the latest model after the flush) and
        gather predictions to worker 0. Its reads are not transmissions of
        training, so they are not counted in ``table.rows_moved``.
        """
        if self.roles.is_ps:
            return None
        import torch

        from hybrid.exported import auc_and_logloss

        me, n = self.roles.worker, self.roles.n_workers
        offsets = self.data.table_offsets
        probabilities, labels = [], []
        counted = dict(self.table.rows_moved)
        stop = test.stop if limit is None else min(test.stop, test.start + limit)
        positions = np.arange(test.start, stop)[me::n]
        with torch.no_grad():
            for begin in range(0, len(positions), batch_size):
                batch = test.gather(0, positions[begin:begin + batch_size])
                rows = batch.sparse.astype(np.int64) + offsets
                unique, inverse = np.unique(rows, return_inverse=True)
                values = np.empty((len(unique), self.config.row_width), dtype=self.dtype)
                self.table.pull(unique, values, exact=True).wait()  # the master rows, whatever the wire
                emb = self.staging.to_device(values[inverse.reshape(rows.shape), :self.config.model.embedding_dim])
                logits = self.model(self.staging.to_device(batch.dense, self.torch_dtype), emb)
                probabilities.append(torch.sigmoid(logits).cpu().numpy())
                labels.append(batch.labels)
        self.table.rows_moved.update(counted)
        gathered = self.roles.workers.gather((np.concatenate(probabilities or [np.zeros(0)]),
                                              np.concatenate(labels or [np.zeros(0)])), root=0)
        if me != 0:
            return None
        return auc_and_logloss(np.concatenate([g[1] for g in gathered]), np.concatenate([g[0] for g in gathered]))

    def close(self) -> None:
        """End the PS ranks' service if the run has not, and free the store (collective over all ranks)."""
        if self.roles.is_ps and not self._served:
            self._serve()
        self.end_service()
        if self.hvd is not None:
            self.hvd.shutdown()
        if not self.roles.is_ps:
            self.mode.close()
        self.table.close()

"""``train`` (multi-rank training, under mpirun), ``compare`` (the summaries of runs side by side) and ``plot``
(their learning curves).

``mpi4py.MPI`` is imported only inside ``train``: a process that imported
it is an MPI singleton, and an mpirun it starts fails at once.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from hybrid.cli.output import EXIT_FAILURE
from hybrid.config import ConfigError, load_config
from hybrid.data.store import StoreError


def cmd_train(args) -> int:
    """This rank's part of the job; on an error anywhere in it, every rank ends."""
    from hybrid.runtime import launch_facts
    from hybrid.runtime.preemption import StopRequest

    # first, so that a signal while torch and Horovod load also ends in a checkpoint and exit 0
    stop = StopRequest().install()  # SIGTERM/SIGINT/SIGUSR1: checkpoint, then exit 0
    try:
        config, refused = load_config(args.config, args.overrides), None
    except ConfigError as err:
        if launch_facts.launcher(os.environ) == "none":
            raise
        config, refused = None, err  # under a launcher: the ranks agree on it below and say it once
    # how ranks wait: MPI and torch read it as they start
    launch = launch_facts.prepare(config.train.threads if config else 0)
    try:
        from hybrid.training import job, summary_text  # MPI starts here: from now on, every rank must end alike
        from mpi4py import MPI

        refusals = MPI.COMM_WORLD.Dup()  # for agreeing on a refusal only: no other collective waits on it
        if refused is not None:
            refused.at_start_up = True
            raise refused
        summary = job.run(config, log_path=args.log_jsonl, summary_path=args.summary_json,
                          progress=not args.no_progress, resume=args.resume, stop=stop, launch=launch)
        refusals.Free()
        stop.raise_if_interrupted()  # a second signal whose interrupt was dropped (e.g. in a finalizer)
    except (Exception, KeyboardInterrupt) as err:
        if getattr(err, "at_start_up", False) and _refused_together(err, refusals):
            return EXIT_FAILURE
        _end_the_job(err)
        raise
    if summary is not None:
        print(summary_text.format_summary(summary), flush=True)
        print(summary_text.format_breakdown(summary), flush=True)
        extra = summary_text.format_checkpoints(summary)
        if extra:
            print(extra, flush=True)
    return 0


# How long ranks refused at start-up wait for the others: they raise at the same collective, so they
# come within moments; one that failed alone (an unexpected error) ends the job after this instead.
AGREE_SECONDS = 5.0


def _refused_together(err: Exception, comm) -> bool:
    """Whether every rank refused the run at start-up; then worker 0 has printed each distinct error once,
    naming its ranks, and every rank may exit 1 (MPI finalized, no ``MPI_Abort`` and its banner; Open
    MPI's ``mpirun`` still notes the non-zero exit, docs/training.md).

    False after :data:`AGREE_SECONDS` without every rank (or on one rank alone, where there is nobody
    to agree with): the caller ends the job as for any error.
    """
    from mpi4py import MPI

    if comm.size == 1:
        return False
    request = comm.Ibarrier()
    deadline = time.monotonic() + AGREE_SECONDS
    while not request.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    errors = comm.gather((f"{type(err).__name__}: {err}", MPI.Get_processor_name()), root=0)
    if comm.rank == 0:
        groups: dict = {}
        for rank, (line, host) in enumerate(errors):
            ranks, hosts = groups.setdefault(line, ([], []))
            ranks.append(rank)
            if host not in hosts:
                hosts.append(host)
        # one write per line, newline included: lines written in two parts ran together with other ranks'
        sys.stderr.write("".join(f"hybrid train: error on {rank_ranges(ranks)} of {comm.size} ({', '.join(hosts)}): "
                                 f"{line}\n" for line, (ranks, hosts) in groups.items()))
        sys.stderr.flush()
    comm.Barrier()  # the message is out before any rank exits
    return True


def rank_ranges(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-3', 'ranks 0, 2-3': sorted ranks as ranges."""
    ranks = sorted(ranks)
    spans, first, last = [], ranks[0], ranks[0]
    for rank in ranks[1:] + [None]:
        if rank is not None and rank == last + 1:
            last = rank
            continue
        spans.append(str(first) if first == last else f"{first}-{last}")
        first = last = rank
    return f"rank {spans[0]}" if len(ranks) == 1 else f"ranks {', '.join(spans)}"


def _end_the_job(err: BaseException) -> None:
    """Print ``err`` naming this rank, then abort every rank (docs/design.md section 2).

    An error raised on some ranks only would leave the others waiting in a
    collective forever, so no collective runs on this path: the message goes
    out first, then ``MPI_Abort`` ends the whole job with a non-zero exit.
    """
    from mpi4py import MPI

    from hybrid.runtime.comm import abort_job

    world = MPI.COMM_WORLD
    if world.size == 1:
        return
    where = f"rank {world.rank} of {world.size} ({MPI.Get_processor_name()})"
    if isinstance(err, KeyboardInterrupt):  # a second stop signal (hybrid.runtime.preemption)
        message = f"hybrid train: interrupted on {where} by {str(err) or 'SIGINT'}"
    else:
        detail = "" if isinstance(err, (ConfigError, StoreError, ValueError, RuntimeError)) else \
            "".join(traceback.format_exception(err))
        message = f"{detail}hybrid train: error on {where}: {type(err).__name__}: {err}"
    sys.stderr.write(f"{message}; ending every rank\n")  # one write: ranks' lines do not run together
    sys.stderr.flush()
    abort_job(EXIT_FAILURE)


def _read_summaries(paths: list[str]) -> list[dict]:
    summaries = []
    for path in paths:
        try:
            summary = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not a training summary ({err})") from None
        if not isinstance(summary, dict) or "transmissions" not in summary:
            raise ValueError(f"{path}: not a training summary (no transmissions); write one with "
                             f"'hybrid train ... --summary-json FILE'")
        summaries.append(summary)
    return summaries


def cmd_compare(args) -> int:
    """Modes side by side from the summaries ``hybrid train --summary-json`` wrote."""
    from hybrid.training.summary_text import compare_summaries

    print(compare_summaries(_read_summaries(args.summaries)))
    return 0


def cmd_plot(args) -> int:
    """Learning curves of the summaries ``hybrid train --summary-json`` wrote, one PNG."""
    from hybrid.training.learning_curves import plot

    summaries = _read_summaries(args.summaries)
    labels = args.labels.split(",") if args.labels else \
        [f"{s['config']} {s.get('label', s['mode'])}" for s in summaries]
    if len(labels) != len(summaries):
        raise ValueError(f"--labels names {len(labels)} runs, {len(summaries)} summaries were given")
    missing = [path for path, s in zip(args.summaries, summaries) if not s.get("curves")]
    if missing:
        raise ValueError(f"{', '.join(missing)}: no learning curves in the summary (written by an older "
                         f"version); train again to plot it")
    print(f"wrote {plot(summaries, labels, Path(args.out))}")
    return 0


def register(subparsers) -> None:
    """Add ``train`` and ``compare``."""
    p = subparsers.add_parser("train", help="multi-rank training (run under mpirun: workers + PS ranks)")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    p.add_argument("--log-jsonl", help="worker 0 writes one JSON record per iteration here")
    p.add_argument("--summary-json", help="worker 0 writes the final summary here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest usable checkpoint in train.checkpoint_dir (start if none)")
    p.set_defaults(func=cmd_train)

    p = subparsers.add_parser("compare", help="modes side by side from 'hybrid train --summary-json' files")
    p.add_argument("summaries", nargs="+", help="summary JSON files; per config, the first is the baseline")
    p.set_defaults(func=cmd_compare)

    p = subparsers.add_parser("plot", help="learning curves (train loss, validation and test AUC) of "
                                           "'hybrid train --summary-json' files, one PNG")
    p.add_argument("summaries", nargs="+", help="summary JSON files, one line each on the figure")
    p.add_argument("--out", default="results/learning_curves.png", help="the PNG to write")
    p.add_argument("--labels", help="comma-separated labels, one per summary (default: config and mode)")
    p.set_defaults(func=cmd_plot)

"""Command line: ``hybrid <command>`` (also ``python -m hybrid``).

One module per command group; each adds its parsers (``register``) and
holds its ``cmd_*`` functions, which take the parsed arguments and return
the exit status:

- ``data``: ``synth``, ``preprocess``, ``fetch``, ``stats`` (make and inspect sample stores).
- ``workload``: ``config`` (what a workload config resolves to), ``fae`` (FAE's calibration of its store).
- ``sharding``: ``plan-shards``, ``shard-costs`` (place tables on PS ranks; NeuroShard's cost models).
- ``simulate``: ``simulate`` (transmissions per mode, without MPI).
- ``bench``: ``bench`` (every benchmark) and the argument types of its options.
- ``train``: ``train`` (under mpirun), ``compare``, ``plot``.
- ``export``: ``export`` (a checkpoint as one file), ``evaluate`` (an exported model on a store).
- ``project``: ``project`` (a run's iteration on a cluster, from the calibrated time model).
- ``output``: what the groups share: progress bars, where text goes, strict JSON, ``EXIT_FAILURE``.

This module builds the parser and runs a command (``main``): it turns the
errors a user can fix into one line and ``EXIT_FAILURE``, and makes SIGTERM
unwind the store writers like Ctrl-C. Heavy imports (torch, mpi4py.MPI,
Horovod) happen inside the commands, so importing ``hybrid.cli`` starts no MPI.

May import every package of hybrid.
"""
from __future__ import annotations

import argparse
import gc
import os
import signal
import sys

from hybrid.cli import bench, data, export, project, sharding, simulate, train, workload
from hybrid.cli.output import EXIT_FAILURE
from hybrid.config import ConfigError
from hybrid.data.formats import FormatError
from hybrid.data.store import StoreError

__all__ = ["EXIT_FAILURE", "build_parser", "main", "process_main"]


def build_parser() -> argparse.ArgumentParser:
    """Every command, in the order ``hybrid --help`` lists them (``fae`` stands after ``shard-costs``)."""
    parser = argparse.ArgumentParser(prog="hybrid", description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    data.register(sub)
    workload.register_config(sub)
    sharding.register(sub)
    workload.register_fae(sub)
    simulate.register(sub)
    bench.register(sub)
    train.register(sub)
    export.register(sub)
    project.register(sub)
    return parser


_STORE_WRITERS = ("synth", "preprocess", "fetch")


_MAIN_PID = os.getpid()


def _interrupt(signum, frame):
    """SIGTERM as KeyboardInterrupt: a store writer cleans up the same way whichever stopped it.

    A process the command forked (``hybrid preprocess``'s workers) inherits
    this handler; it ends at once instead, silently: the command's own
    process stops it and reports.
    """
    if os.getpid() != _MAIN_PID:
        os._exit(128 + signum)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv=None) -> int:
    """Run ``hybrid ARGV``.

    The exit status: 0; ``EXIT_FAILURE`` for an error a user can fix (one
    line, no traceback); 130 for an interrupted command (a store writer leaves no partial store).
    """
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
        left = "; no partial store was left behind" if args.command in _STORE_WRITERS else ""
        if args.command == "preprocess":
            left += " (the parts it finished stay for the next run to take up)"
        print(f"hybrid {args.command}: interrupted ({str(err) or 'Ctrl-C'}){left}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader (e.g. `| head`) went away: not our error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ConfigError, FormatError, StoreError, ValueError, RuntimeError, FileNotFoundError) as err:
        print(f"hybrid {args.command}: error: {err}", file=sys.stderr)
        return EXIT_FAILURE


def process_main() -> int:
    """``main`` as a process's whole life (the ``hybrid`` script, ``python -m hybrid``): run, then get out fast.

    What the command left behind is collected here and every object still
    alive is frozen (``gc.freeze``), so the collections the interpreter runs
    as it exits skip them: those walked every object torch and Horovod made
    as they loaded, 0.3-0.4 s of CPU per process and 0.4 s at the end of a
    3-rank job here (docs/testing.md). The exit is otherwise the usual one
    (atexit, MPI_Finalize, flushed streams). Callers in a process that goes
    on (tests) call ``main``.
    """
    status = main()
    gc.collect()
    gc.freeze()
    return status

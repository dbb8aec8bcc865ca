"""``python -m hybrid``: the same as the ``hybrid`` console script."""
import sys

try:
    from hybrid.cli import process_main
except KeyboardInterrupt:  # Ctrl-C (or a signal to an MPI rank) while the command loads: nothing was done yet
    print("hybrid: interrupted while starting", file=sys.stderr)
    sys.exit(130)

sys.exit(process_main())

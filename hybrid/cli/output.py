"""What the command groups share about output: progress bars, where text goes, strict JSON, the failure status."""
from __future__ import annotations

import math
import sys

from tqdm import tqdm

EXIT_FAILURE = 1


def progress_bar(total=None, unit="rows", desc=None):
    """A tqdm bar on stderr that hides itself when stderr is not a terminal."""
    return tqdm(total=total, unit=unit, unit_scale=True, desc=desc, disable=None, file=sys.stderr)


def text_out(args):
    """Where a command's human-readable lines go: stderr under ``--json``, whose stdout is the JSON alone."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def say(line: str) -> None:
    """A progress line on stderr, flushed at once: long runs (benchmarks, cost collection) show where they are."""
    print(line, file=sys.stderr, flush=True)


def finite(value):
    """NaN/inf become null: strict JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value

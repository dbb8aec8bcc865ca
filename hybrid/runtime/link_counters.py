"""Bytes this host's network interfaces have sent and received, from ``/proc/net/dev``.

A rank reads them around its training loop, so a run reports what crossed
its links while it trained (docs/design.md section 12). Loopback is left
out: on one host ranks talk through shared memory or ``lo``, and those bytes
never reach a wire. In an emulated host (a network namespace) the only other
interface is the rank's own link.
"""
from __future__ import annotations

from pathlib import Path


def link_bytes(path: str = "/proc/net/dev") -> dict:
    """``{"sent": ..., "received": ...}`` summed over every interface but ``lo`` (zeros where unreadable)."""
    sent = received = 0
    try:
        lines = Path(path).read_text().splitlines()[2:]
    except OSError:
        return {"sent": 0, "received": 0}
    for line in lines:
        name, _, fields = line.partition(":")
        if name.strip() == "lo":
            continue
        values = fields.split()
        received += int(values[0])
        sent += int(values[8])
    return {"sent": sent, "received": received}


def difference(after: dict, before: dict) -> dict:
    return {key: after[key] - before[key] for key in after}

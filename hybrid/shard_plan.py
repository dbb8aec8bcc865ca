"""Where every embedding row lives on the PS ranks: a shard plan (docs/design.md section 8).

A plan is a list of segments. A segment puts the global rows ``lo + phase,
lo + phase + stride, ...`` below ``hi`` on PS shard ``shard``, stored from
local row ``base`` on. That expresses every row-wise placement the planners
use: a whole table (one segment over the table, stride 1), row ranges of a
table (several stride-1 segments) and a table's rows dealt round-robin over
``k`` shards (``k`` segments of stride ``k``: with ids in popularity order,
the hottest rows spread over every shard instead of landing on the first).

Segments with the same ``(lo, hi, stride)`` form a group whose phases must
be exactly ``0 .. stride - 1``, the groups must tile ``[0, n_rows)``, and each
shard's segments must tile its local rows ``[0, size)``: then every row has
exactly one place. Mapping rows is a binary search over the groups plus
arithmetic, so it follows the rows asked for, never the table size.

The default plan is contiguous row ranges of the global row space, the
same layout :class:`hybrid.rma_store.EmbeddingStore` always used.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np


class ShardPlanError(ValueError):
    """A plan that does not place every row exactly once, or does not fit its shards."""


@dataclass(frozen=True)
class Segment:
    shard: int
    lo: int
    hi: int
    stride: int = 1
    phase: int = 0
    base: int = 0

    @property
    def count(self) -> int:
        """Rows in the segment."""
        first = self.lo + self.phase
        return max(0, -(-(self.hi - first) // self.stride))


class ShardPlan:
    """Every global row's PS shard and local row, from segments (see the module docstring)."""

    def __init__(self, n_rows: int, n_shards: int, segments, *, name: str = "custom"):
        self.n_rows, self.n_shards, self.name = int(n_rows), int(n_shards), name
        self.segments = sorted((Segment(**s) if isinstance(s, dict) else s for s in segments),
                               key=lambda s: (s.lo, s.hi, s.stride, s.phase))
        self.sizes = np.zeros(self.n_shards, dtype=np.int64)
        self._check()
        groups = sorted({(s.lo, s.hi, s.stride) for s in self.segments})
        self._group_lo = np.array([g[0] for g in groups], dtype=np.int64)
        self._group_stride = np.array([g[2] for g in groups], dtype=np.int64)
        # groups tile the rows, so each starts at its own lo; its segments follow in phase order
        self._group_first = np.searchsorted(np.array([s.lo for s in self.segments], dtype=np.int64), self._group_lo)
        self._unit_strides = bool((self._group_stride == 1).all())
        # equal contiguous ranges (the default): a row's place is one division, as before plans existed
        per = self.segments[0].hi if self.segments else 0
        self._per = per if self._unit_strides and all(
            seg.shard == i and seg.lo == i * per and seg.hi == min(self.n_rows, (i + 1) * per) and seg.base == 0
            for i, seg in enumerate(self.segments)) else 0
        self._shard = np.array([s.shard for s in self.segments], dtype=np.int64)
        self._base = np.array([s.base for s in self.segments], dtype=np.int64)

    # ---------------------------------------------------------- construction
    @classmethod
    def contiguous(cls, n_rows: int, n_shards: int) -> "ShardPlan":
        """Contiguous ranges of the global row space, ``ceil(n_rows / n_shards)`` rows per shard (the default)."""
        per = -(-n_rows // n_shards) if n_rows else 0
        segments = [Segment(s, min(n_rows, s * per), min(n_rows, (s + 1) * per)) for s in range(n_shards)]
        return cls(n_rows, n_shards, [s for s in segments if s.hi > s.lo], name="row-ranges")

    @classmethod
    def from_tables(cls, offsets, placements, n_shards: int, name: str) -> "ShardPlan":
        """A plan from per-table placements: ``placements[t]`` is a shard (the whole table) or a list of
        shards (its rows dealt round-robin over them). ``offsets``: each table's first global row, then the total."""
        offsets = [int(x) for x in offsets]
        fill = [0] * n_shards
        segments = []
        for t, where in enumerate(placements):
            lo, hi = offsets[t], offsets[t + 1]
            shards = [int(where)] if np.isscalar(where) else [int(s) for s in where]
            for phase, shard in enumerate(shards):
                segment = Segment(shard, lo, hi, len(shards), phase, fill[shard])
                fill[shard] += segment.count
                segments.append(segment)
        return cls(offsets[-1], n_shards, segments, name=name)

    def _check(self) -> None:
        """Every row placed once and each shard's local rows dense (raises :class:`ShardPlanError`)."""
        position = 0
        by_group: dict = {}
        for s in self.segments:
            if not (0 <= s.shard < self.n_shards) or s.stride < 1 or not (0 <= s.phase < s.stride) or s.lo >= s.hi:
                raise ShardPlanError(f"segment {asdict(s)}: needs 0 <= shard < {self.n_shards}, stride >= 1, "
                                     f"0 <= phase < stride and lo < hi")
            by_group.setdefault((s.lo, s.hi, s.stride), []).append(s.phase)
        for (lo, hi, stride), phases in sorted(by_group.items()):
            if lo != position:
                raise ShardPlanError(f"rows [{position}, {lo}) are placed {'nowhere' if lo > position else 'twice'}")
            if sorted(phases) != list(range(stride)):
                raise ShardPlanError(f"rows [{lo}, {hi}) in stride {stride}: phases {sorted(phases)}, "
                                     f"expected each of 0 .. {stride - 1} once")
            position = hi
        if position != self.n_rows:
            raise ShardPlanError(f"the plan places rows [0, {position}), the tables have {self.n_rows}")
        for shard in range(self.n_shards):
            mine = sorted((s.base, s.count) for s in self.segments if s.shard == shard)
            end = 0
            for base, count in mine:
                if base != end:
                    raise ShardPlanError(f"shard {shard}: local rows [{end}, {base}) are not dense")
                end += count
            self.sizes[shard] = end

    # ---------------------------------------------------------------- lookup
    def _segments_of(self, rows: np.ndarray):
        """Each row's segment and its step within the segment."""
        group = np.searchsorted(self._group_lo, rows, side="right") - 1
        offset = rows - self._group_lo[group]
        if self._unit_strides:  # whole tables and row ranges: one segment per group
            return group, offset
        stride = self._group_stride[group]
        return self._group_first[group] + offset % stride, offset // stride

    def shard_of(self, rows) -> np.ndarray:
        """PS shard of each global row."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._per:
            return rows // self._per
        return self._shard[self._segments_of(rows)[0]]

    def locate(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """(shard, local row) of each global row."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._per:
            return np.divmod(rows, self._per)
        segment, step = self._segments_of(rows)
        return self._shard[segment], self._base[segment] + step

    def runs(self, shard: int) -> list[tuple[int, int, int, int]]:
        """``(local_start, global_start, count, stride)`` per segment of ``shard``, by local row."""
        return sorted((s.base, s.lo + s.phase, s.count, s.stride) for s in self.segments if s.shard == shard)

    def rows_of(self, shard: int) -> np.ndarray:
        """The global rows of ``shard`` in local order."""
        parts = [start + stride * np.arange(count, dtype=np.int64) for _, start, count, stride in self.runs(shard)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    @property
    def shard_rows(self) -> int:
        """Rows of the largest shard."""
        return int(self.sizes.max()) if self.n_shards else 0

    # ---------------------------------------------------------------- files
    def to_dict(self) -> dict:
        return {"name": self.name, "n_rows": self.n_rows, "n_shards": self.n_shards,
                "segments": [asdict(s) for s in self.segments]}

    @property
    def fingerprint(self) -> str:
        """Hash of the placement (not the name): a checkpoint's shards are in this plan's layout."""
        text = json.dumps({k: v for k, v in self.to_dict().items() if k != "name"}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path, *, n_rows: int, n_shards: int) -> "ShardPlan":
        """Read a plan and check it fits ``n_rows`` rows on ``n_shards`` PS ranks."""
        try:
            values = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ShardPlanError(f"{path}: not a shard plan ({err})") from None
        if values.get("n_rows") != n_rows or values.get("n_shards") != n_shards:
            raise ShardPlanError(f"{path}: plans {values.get('n_rows')} rows on {values.get('n_shards')} PS ranks; "
                                 f"this run has {n_rows} rows on {n_shards} PS ranks (make it again with "
                                 f"hybrid plan-shards)")
        return cls(n_rows, n_shards, values["segments"], name=values.get("name", "custom"))


def layout_mismatch(meta: dict, plan: ShardPlan) -> Optional[str]:
    """Why a checkpoint's PS shard files do not fit ``plan``'s layout, or None.

    Shard files hold each PS rank's rows in its plan's local order, so a
    checkpoint resumes only under the plan that wrote it (older checkpoints,
    without the key, were written under the default row ranges).
    """
    saved = meta.get("shard_plan", ShardPlan.contiguous(plan.n_rows, plan.n_shards).fingerprint)
    if saved == plan.fingerprint:
        return None
    return f"its PS shards are in the layout of shard plan {saved}, this run's plan is {plan.fingerprint}"

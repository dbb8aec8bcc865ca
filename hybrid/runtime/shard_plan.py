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
same layout :class:`hybrid.runtime.rma_store.EmbeddingStore` always used.

Column slices: a segment may hold only the columns ``col_lo ..
col_lo + width`` of its rows (``width`` dividing the embedding width
``dim``; 0 means whole rows). Within a group every phase then carries the
same column split, which must tile ``[0, dim)``: each row is one piece per
slice, and a row read gathers its pieces from their shards. A shard's
memory stays ``[size, dim]``; a segment of unit width ``u`` (``width``, or
``dim`` for whole rows) uses the values ``base * u .. (base + count) * u``
of it, i.e. local rows of the shard viewed as ``[-1, u]``. Segments of one
shard must not overlap; gaps are alignment padding, narrower than the unit.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np

from hybrid._ext.shard_routes import Router


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
    col_lo: int = 0
    width: int = 0  # columns held; 0: whole rows

    @property
    def count(self) -> int:
        """Rows in the segment."""
        first = self.lo + self.phase
        return max(0, -(-(self.hi - first) // self.stride))

    def unit(self, dim: int) -> int:
        """Values per local row of the segment: its width, or ``dim`` for whole rows."""
        return self.width or dim

    def to_dict(self) -> dict:
        """Fields; the column ones only for a slice (row-wise plans keep their files and fingerprints)."""
        values = asdict(self)
        if not self.width:
            del values["col_lo"], values["width"]
        return values


@dataclass(frozen=True)
class Columns:
    """A table placement: the table's columns in ``len(shards)`` equal slices, slice ``j`` on ``shards[j]``."""
    shards: tuple


class ShardPlan:
    """Every global row's PS shard and local row, from segments (see the module docstring)."""

    def __init__(self, n_rows: int, n_shards: int, segments, *, name: str = "custom", dim: int = 0):
        self.n_rows, self.n_shards, self.name, self.dim = int(n_rows), int(n_shards), name, int(dim)
        self.segments = sorted((Segment(**s) if isinstance(s, dict) else s for s in segments),
                               key=lambda s: (s.lo, s.hi, s.stride, s.phase, s.col_lo))
        self.columns = any(s.width for s in self.segments)
        self.sizes = np.zeros(self.n_shards, dtype=np.int64)
        self._check()
        groups = sorted({(s.lo, s.hi, s.stride) for s in self.segments})
        self._group_lo = np.array([g[0] for g in groups], dtype=np.int64)
        self._group_stride = np.array([g[2] for g in groups], dtype=np.int64)
        # groups tile the rows, so each starts at its own lo; its segments follow in (phase, column) order
        self._group_first = np.searchsorted(np.array([s.lo for s in self.segments], dtype=np.int64), self._group_lo)
        ends = np.append(self._group_first[1:], len(self.segments))
        self._group_pieces = (ends - self._group_first) // self._group_stride  # column slices per row
        self._unit_strides = bool((self._group_stride == 1).all()) and not self.columns
        # equal contiguous ranges (the default): a row's place is one division, as before plans existed
        per = self.segments[0].hi if self.segments else 0
        self._per = per if self._unit_strides and all(
            seg.shard == i and seg.lo == i * per and seg.hi == min(self.n_rows, (i + 1) * per) and seg.base == 0
            for i, seg in enumerate(self.segments)) else 0
        self._shard = np.array([s.shard for s in self.segments], dtype=np.int64)
        self._base = np.array([s.base for s in self.segments], dtype=np.int64)
        self._col_lo = np.array([s.col_lo for s in self.segments], dtype=np.int64)
        self._width = np.array([s.unit(self.dim) for s in self.segments], dtype=np.int64)
        # routes() keys pieces by (shard, width) with column slices, by the shard alone for whole rows
        self._route_dim = self.dim if self.columns else 0
        self._router = Router(self._group_lo, self._group_stride, self._group_first, self._group_pieces,
                              self._shard, self._base, self._col_lo,
                              self._width if self.columns else np.zeros(len(self.segments), dtype=np.int64),
                              self.n_shards, self._route_dim, self.n_rows)

    # ---------------------------------------------------------- construction
    @classmethod
    def contiguous(cls, n_rows: int, n_shards: int) -> "ShardPlan":
        """Contiguous ranges of the global row space, ``ceil(n_rows / n_shards)`` rows per shard (the default)."""
        per = -(-n_rows // n_shards) if n_rows else 0
        segments = [Segment(s, min(n_rows, s * per), min(n_rows, (s + 1) * per)) for s in range(n_shards)]
        return cls(n_rows, n_shards, [s for s in segments if s.hi > s.lo], name="row-ranges")

    @classmethod
    def from_tables(cls, offsets, placements, n_shards: int, name: str, *, dim: int = 0) -> "ShardPlan":
        """A plan from per-table placements: ``placements[t]`` is a shard (the whole table), a list of
        shards (its rows dealt round-robin over them) or :class:`Columns` (its columns in equal slices,
        which needs ``dim``). ``offsets``: each table's first global row, then the total."""
        offsets = [int(x) for x in offsets]
        segments = []
        for t, where in enumerate(placements):
            lo, hi = offsets[t], offsets[t + 1]
            if isinstance(where, Columns):
                width = dim // len(where.shards) if dim else 0
                if not width or width * len(where.shards) != dim:
                    raise ShardPlanError(f"table {t}: {len(where.shards)} column slices of a width-{dim} table "
                                         f"are not equal whole columns")
                segments += [Segment(int(shard), lo, hi, col_lo=j * width, width=width if width < dim else 0)
                             for j, shard in enumerate(where.shards)]
                continue
            shards = [int(where)] if np.isscalar(where) else [int(s) for s in where]
            segments += [Segment(shard, lo, hi, len(shards), phase) for phase, shard in enumerate(shards)]
        return cls.packed(offsets[-1], n_shards, segments, name=name, dim=dim)

    @classmethod
    def packed(cls, n_rows: int, n_shards: int, segments, *, name: str, dim: int = 0) -> "ShardPlan":
        """A plan of ``segments`` (their ``base`` ignored) laid out in each shard's memory: whole rows
        first, in the order given (the layout whole-row plans always had), then slices from the widest
        down, each aligned to its width."""
        fill = [0] * n_shards  # values used per shard
        placed = []
        order = sorted(range(len(segments)), key=lambda i: (-segments[i].width if segments[i].width else -np.inf, i))
        for i in order:
            segment = segments[i]
            unit = segment.width or dim or 1
            base = -(-fill[segment.shard] // unit)
            placed.append(replace(segment, base=base))
            fill[segment.shard] = (base + segment.count) * unit
        return cls(n_rows, n_shards, placed, name=name, dim=dim if any(s.width for s in placed) else 0)

    def _check(self) -> None:
        """Every row (and column) placed once, shards without overlaps (raises :class:`ShardPlanError`)."""
        if self.columns and self.dim < 1:
            raise ShardPlanError("a plan with column slices needs the embedding width (dim)")
        position = 0
        by_group: dict = {}
        for s in self.segments:
            if not (0 <= s.shard < self.n_shards) or s.stride < 1 or not (0 <= s.phase < s.stride) or s.lo >= s.hi:
                raise ShardPlanError(f"segment {asdict(s)}: needs 0 <= shard < {self.n_shards}, stride >= 1, "
                                     f"0 <= phase < stride and lo < hi")
            if s.width and (self.dim % s.width or not 0 <= s.col_lo <= self.dim - s.width or s.col_lo % s.width):
                raise ShardPlanError(f"segment {asdict(s)}: a column slice's width must divide the embedding "
                                     f"width {self.dim} and its columns lie inside it, aligned to the width")
            by_group.setdefault((s.lo, s.hi, s.stride), {}).setdefault(s.phase, []).append((s.col_lo, s.width))
        for (lo, hi, stride), phases in sorted(by_group.items()):
            if lo != position:
                raise ShardPlanError(f"rows [{position}, {lo}) are placed {'nowhere' if lo > position else 'twice'}")
            if sorted(phases) != list(range(stride)):
                raise ShardPlanError(f"rows [{lo}, {hi}) in stride {stride}: phases {sorted(phases)}, "
                                     f"expected each of 0 .. {stride - 1} once")
            splits = {tuple(sorted(columns)) for columns in phases.values()}
            split = splits.pop()
            if splits or not self._tiles(split):
                raise ShardPlanError(f"rows [{lo}, {hi}): column slices {sorted(phases.items())} do not cover "
                                     f"columns [0, {self.dim}) once, alike in every phase")
            position = hi
        if position != self.n_rows:
            raise ShardPlanError(f"the plan places rows [0, {position}), the tables have {self.n_rows}")
        unit_rows = max(1, self.dim)
        for shard in range(self.n_shards):
            mine = sorted((s.base * s.unit(unit_rows), (s.base + s.count) * s.unit(unit_rows), s.unit(unit_rows))
                          for s in self.segments if s.shard == shard)
            end = 0
            for begin, stop, unit in mine:
                if begin < end:
                    raise ShardPlanError(f"shard {shard}: local values [{begin}, {end}) are held twice")
                if begin - end >= unit:
                    raise ShardPlanError(f"shard {shard}: local rows [{end // unit}, {begin // unit}) are not dense")
                end = stop
            self.sizes[shard] = -(-end // unit_rows)

    def _tiles(self, split) -> bool:
        """Whether one phase's column pieces cover every column once (a single whole-row piece does)."""
        if split == ((0, 0),):
            return True
        edge = 0
        for col_lo, width in split:
            if not width or col_lo != edge:
                return False
            edge += width
        return edge == self.dim

    # ---------------------------------------------------------------- lookup
    def _segments_of(self, rows: np.ndarray):
        """Each row's segment and its step within the segment (plans without column slices)."""
        group = np.searchsorted(self._group_lo, rows, side="right") - 1
        offset = rows - self._group_lo[group]
        if self._unit_strides:  # whole tables and row ranges: one segment per group
            return group, offset
        stride = self._group_stride[group]
        return self._group_first[group] + offset % stride, offset // stride

    def _whole_rows(self) -> None:
        if self.columns:
            raise ShardPlanError(f"plan {self.name!r} splits tables by columns: a row has one place per "
                                 f"slice (ShardPlan.pieces)")

    def shard_of(self, rows) -> np.ndarray:
        """PS shard of each global row (plans without column slices)."""
        self._whole_rows()
        rows = np.asarray(rows, dtype=np.int64)
        if self._per:
            return rows // self._per
        return self._shard[self._segments_of(rows)[0]]

    def locate(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """(shard, local row) of each global row (plans without column slices)."""
        self._whole_rows()
        rows = np.asarray(rows, dtype=np.int64)
        if self._per:
            return np.divmod(rows, self._per)
        segment, step = self._segments_of(rows)
        return self._shard[segment], self._base[segment] + step

    def pieces(self, rows, dim: int):
        """Every piece of ``rows``: (position in ``rows``, shard, local row in units of the piece's
        width, first column, width). Whole rows are one piece of width ``dim``."""
        rows = np.asarray(rows, dtype=np.int64)
        if not self.columns:
            shard, local = self.locate(rows)
            n = len(rows)
            return np.arange(n), shard, local, np.zeros(n, dtype=np.int64), np.full(n, dim, dtype=np.int64)
        position, local, col_lo, bounds = self.routes(rows)
        keys = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
        return position, keys // (self.dim + 1), local, col_lo, keys % (self.dim + 1)

    def routes(self, rows, only: Optional[int] = None):
        """The pieces of ``rows`` (on shard ``only``, or on every shard) grouped by shard and width:
        ``(position, local, col_lo, bounds)``, the pieces of shard ``s`` and width ``w`` being
        ``bounds[k]:bounds[k + 1]`` with ``k = s * (dim + 1) + w`` (``shard_routes.Router.route``). A plan of whole
        rows has one piece per row and keys ``k = s`` (width 0). Raises for rows outside the plan."""
        try:
            return self._router.route(np.ascontiguousarray(rows, dtype=np.int64), -1 if only is None else only)
        except ValueError as err:
            raise ShardPlanError(str(err)) from None

    def by_shard(self, rows, only: Optional[int] = None) -> list:
        """A plan of whole rows (no column slices): ``[(shard, positions, local rows as a list)]`` per shard
        holding some of ``rows``, positions in row order (``shard_routes.Router.by_shard``). Raises for rows
        outside the plan."""
        try:
            return self._router.by_shard(np.ascontiguousarray(rows, dtype=np.int64), -1 if only is None else only)
        except ValueError as err:
            raise ShardPlanError(str(err)) from None

    def route_key(self, key: int) -> tuple[int, int]:
        """(shard, piece width) of a key of :meth:`routes`; the width is 0 for a plan of whole rows."""
        return divmod(key, self._route_dim + 1)

    def runs(self, shard: int) -> list[tuple[int, int, int, int, int, int]]:
        """``(local_start, global_start, count, stride, col_lo, width)`` per segment of ``shard``, in
        the order of the values they use; ``local_start`` counts rows of the segment's width, 0 is whole rows."""
        unit = max(1, self.dim)
        return [run[1:] for run in sorted((s.base * s.unit(unit), s.base, s.lo + s.phase, s.count, s.stride,
                                           s.col_lo, s.width) for s in self.segments if s.shard == shard)]

    def rows_of(self, shard: int) -> np.ndarray:
        """The global rows of ``shard`` in local order (of each slice, for column slices)."""
        parts = [start + stride * np.arange(count, dtype=np.int64) for _, start, count, stride, _, _ in self.runs(shard)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    @property
    def shard_rows(self) -> int:
        """Rows of the largest shard (in rows of the whole embedding width)."""
        return int(self.sizes.max()) if self.n_shards else 0

    # ---------------------------------------------------------------- files
    def to_dict(self) -> dict:
        values = {"name": self.name, "n_rows": self.n_rows, "n_shards": self.n_shards,
                  "segments": [s.to_dict() for s in self.segments]}
        if self.columns:
            values["dim"] = self.dim
        return values

    @property
    def fingerprint(self) -> str:
        """Hash of the placement (not the name): a checkpoint's shards are in this plan's layout."""
        text = json.dumps({k: v for k, v in self.to_dict().items() if k != "name"}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path, *, n_rows: int, n_shards: int, dim: int = 0) -> "ShardPlan":
        """Read a plan and check it fits ``n_rows`` rows of width ``dim`` on ``n_shards`` PS ranks."""
        try:
            values = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ShardPlanError(f"{path}: not a shard plan ({err})") from None
        if values.get("n_rows") != n_rows or values.get("n_shards") != n_shards:
            raise ShardPlanError(f"{path}: plans {values.get('n_rows')} rows on {values.get('n_shards')} PS ranks; "
                                 f"this run has {n_rows} rows on {n_shards} PS ranks (make it again with "
                                 f"hybrid plan-shards)")
        if dim and values.get("dim", dim) != dim:
            raise ShardPlanError(f"{path}: slices columns of width-{values['dim']} rows; this run's embedding "
                                 f"width is {dim} (make it again with hybrid plan-shards)")
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, values: dict) -> "ShardPlan":
        """The plan :meth:`to_dict` wrote (checked as any plan is)."""
        return cls(values["n_rows"], values["n_shards"], values["segments"], name=values.get("name", "custom"),
                   dim=values.get("dim", 0))

"""NeuroShard's online search for PS-tier sharding plans (Zha et al., MLSys'23, section 3.3).

NeuroShard "pre-trains cost models, then searches": the cost models are
written elsewhere; this module is the search, written against three abstract
callables so that it does not depend on them:

``slices(t, split)``
    table ``t`` cut by ``split`` into its slices: hashable objects with
    ``.rows``, ``.width`` and ``.distinct`` (rows of the slice a global batch
    reads), one per part. ``split`` is ``("whole", 1)``, ``("columns", k)``
    (``k`` slices of ``dim / k`` columns each) or ``("rows", k)`` (the rows
    dealt round-robin over ``k`` ranks; slice ``j`` is phase ``j``).
``serving(sets)``
    the computation cost model, batched: many sets of slices (each a tuple)
    -> the predicted ms a PS rank holding exactly that set spends serving a
    global batch (reading the distinct rows, adding the gradients back).
``comm(bytes_per_rank)``
    the communication cost model: bytes each rank moves per iteration ->
    the predicted ms.

A plan's cost is the slowest rank's serving cost plus the communication
cost, ``max_r serving(set_r) + comm(bytes)``: NeuroShard's simulated
embedding cost (computation plus communication, the max over devices since
the slowest one is the bottleneck). ``comm`` takes the whole per-rank byte
vector and returns one number because communication is a collective: how it
depends on the per-rank bytes (typically through their max) is the model's
business. A slice moves ``2 * distinct * width * itemsize`` bytes per
iteration: its rows are read, then their gradients are sent back.

The search is the paper's two nested loops (Algorithms 1 and 2):

* the outer loop, a beam search over *column plans*: each move doubles one
  table's column slices (1 -> 2 -> 4 ...), or, the paper's future work
  (section 6) and a candidate here, deals its rows over all ranks;
* the inner loop, a greedy grid search: for each of ``grid_m`` caps on the
  device dimension (sum of slice widths on a rank, the paper's proxy for
  communication balance, Observation 3), slices by descending predicted
  cost, each to the rank whose predicted cost *after* taking it is lowest
  (the model sees the whole set, so multi-table non-linearity is captured,
  Observation 2); the best complete assignment under the plan cost wins.

Every serving prediction goes through one life-long cache keyed by the
multiset of slices on a rank, shared by the whole search ("Implementation
with caching": small changes to the column plan or the cap re-ask the same
sets, the paper reports >95% hits). An empty rank costs 0 by definition,
never asked of the model (see ``_ServingCache``).

Batching: the greedy runs are generators that yield the sets they need
costed; the runs for all ``grid_m`` caps of a column plan, and the inner
loops of all column plans of one beam step, advance in lockstep, so one
``serving`` call carries the cache misses of one greedy step of all of them
(a few hundred calls per search instead of one per step per run). The runs
for different caps also share their work while they make the same choices
(they fork when the caps first admit different ranks), so a lookup repeated
only because another cap made the same choice is not made at all: the
reported ``cache_hits`` count real repeats, and the hit rate is lower than
the paper's per-run count would be; ``evaluations`` are the same.

Beyond the paper: column halving stops once the slices would outnumber the
ranks (more would put two slices of a table on one rank); the row deal
needs at least one row per rank; plans are identified by their splits (the
order of the moves is irrelevant); plans that do not fit the memory cap
are kept in the beam, ranked by how many values did not fit, so a table
too big for any rank can be split on a later step.
"""
from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import numpy as np

Split = tuple  # ("whole", 1) | ("columns", k) | ("rows", k)

WHOLE: Split = ("whole", 1)


@dataclass
class SearchResult:
    placements: list          # per table: int shard (whole) | {"columns": [shard per slice]} | {"rows": [shard per phase]}
    splits: list              # per table: the Split used
    cost: float               # predicted plan cost (ms)
    serving_ms: list          # predicted serving cost per rank
    comm_ms: float            # predicted communication cost
    evaluations: int          # serving-cost calls that reached the model
    cache_hits: int           # serving-cost calls answered from the cache
    seconds: float            # search wall time


class _ServingCache:
    """The life-long cache of predicted serving ms per set of slices (Algorithm 2, lines 12-15).

    Slice objects are interned to small integer ids in the order first seen
    (equal objects share an id), and a rank's set is keyed by the sorted
    tuple of its ids: a multiset, so the key does not depend on the order
    the slices arrived in, and two equal slices (e.g. two column halves the
    model cannot tell apart) count twice. The model receives the slices in
    that sorted order. Misses of one request go to the model in one batched
    ``serving`` call; a set asked twice within one request reaches the model
    once (the second is counted as a hit).

    The empty set costs 0 by definition and is neither asked nor counted: a
    PS rank holding no slice receives no lookups and no gradients, so it
    does no serving work, and a learned model never saw an empty set in
    training (its prediction there would be extrapolation).
    """

    def __init__(self, serving: Callable[[list], list]):
        self._serving = serving
        self._ids: dict = {}
        self._objects: list = []
        self._ms: dict[tuple, float] = {}
        self.evaluations = 0
        self.hits = 0

    def intern(self, piece) -> int:
        cid = self._ids.get(piece)
        if cid is None:
            cid = self._ids[piece] = len(self._objects)
            self._objects.append(piece)
        return cid

    def costs(self, keys: list) -> list:
        """Predicted ms of each key (a sorted tuple of slice ids), misses asked in one batch."""
        out = [0.0] * len(keys)
        missing: dict[tuple, list[int]] = {}
        ms = self._ms
        for i, key in enumerate(keys):
            if not key:
                continue
            got = ms.get(key)
            if got is not None:
                out[i] = got
                self.hits += 1
            elif key in missing:
                missing[key].append(i)
                self.hits += 1
            else:
                missing[key] = [i]
        if missing:
            batch = list(missing)
            answers = list(self._serving([tuple(self._objects[c] for c in key) for key in batch]))
            if len(answers) != len(batch):
                raise ValueError(f"serving returned {len(answers)} costs for {len(batch)} sets")
            self.evaluations += len(batch)
            for key, value in zip(batch, answers):
                value = float(value)
                ms[key] = value
                for i in missing[key]:
                    out[i] = value
        return out


class _Piece(NamedTuple):
    """One slice of one table, as the inner loop sees it."""
    table: int
    part: int
    cid: int        # interned slice id (cache key element)
    width: int
    values: int     # memory: rows * width
    nbytes: float   # moved per iteration: 2 * distinct * width * itemsize
    pin: int        # rank a row-dealt slice is pinned to; -1: free


class _Plan(NamedTuple):
    overflow: int                 # values that fit on no rank (0: the plan respects the cap)
    cost: float                   # inf unless overflow == 0
    shards: tuple                 # per table: tuple of ranks, one per slice
    serving_ms: tuple
    comm_ms: float
    unplaced: tuple               # tables with a slice that fit nowhere

    @property
    def key(self) -> tuple:
        """Beam order: plans that fit first, then by cost."""
        return (self.overflow, self.cost)


class _Branch:
    """One greedy run's state: per rank its slices (cache key), width, values, bytes and predicted ms."""

    def __init__(self, n: int, where: dict, caps: list):
        self.keys: list = [()] * n
        self.dims = [0] * n
        self.used = [0] * n
        self.nbytes = [0.0] * n
        self.ms = [0.0] * n
        self.where = where          # table -> rank of each of its slices (-1: not yet placed)
        self.caps = caps            # indices of the device-dimension caps that share this run
        self.overflow = 0
        self.unplaced: list = []

    def add(self, p: _Piece, r: int) -> None:
        self.keys[r] = _insert(self.keys[r], p.cid)
        self.dims[r] += p.width
        self.used[r] += p.values
        self.nbytes[r] += p.nbytes
        self.where[p.table][p.part] = r

    def copy(self) -> _Branch:
        other = _Branch(0, {t: list(v) for t, v in self.where.items()}, self.caps)
        other.keys, other.dims, other.used = list(self.keys), list(self.dims), list(self.used)
        other.nbytes, other.ms = list(self.nbytes), list(self.ms)
        other.overflow, other.unplaced = self.overflow, list(self.unplaced)
        return other


def _insert(key: tuple, cid: int) -> tuple:
    j = bisect_left(key, cid)
    return key[:j] + (cid,) + key[j:]


def _lockstep(gens: list):
    """Advance cost-asking generators together: yield all their keys at once, split the costs back.

    Returns their return values, in order. Each generator yields a list of
    cache keys and is sent the list of their costs.
    """
    results: list = [None] * len(gens)
    asking: dict = {}
    for i, gen in enumerate(gens):
        try:
            asking[i] = next(gen)
        except StopIteration as done:
            results[i] = done.value
    while asking:
        costs = yield [key for keys in asking.values() for key in keys]
        at, nxt = 0, {}
        for i, keys in asking.items():
            part, at = costs[at:at + len(keys)], at + len(keys)
            try:
                nxt[i] = gens[i].send(part)
            except StopIteration as done:
                results[i] = done.value
        asking = nxt
    return results


class _Search:
    def __init__(self, n_tables, n_shards, dim, slices, serving, comm, cap_rows, grid_m, min_width,
                 row_wise, itemsize):
        self.n_tables, self.n_shards, self.dim = n_tables, n_shards, dim
        self._slices, self._comm = slices, comm
        self.cache = _ServingCache(serving)
        self.cap_rows = cap_rows
        self.cap = float("inf") if cap_rows is None else cap_rows * dim
        self.grid_m, self.min_width, self.row_wise, self.itemsize = grid_m, min_width, row_wise, itemsize
        self._info: dict[tuple, list] = {}
        self._plans: dict[tuple, _Plan] = {}

    # -- slices ---------------------------------------------------------------------------------------------
    def pieces(self, t: int, split: Split) -> list:
        """Table ``t``'s slices under ``split`` as (cid, width, values, bytes, rows), memoized."""
        got = self._info.get((t, split))
        if got is None:
            parts = split[1]
            objs = list(self._slices(t, split))
            if len(objs) != parts:
                raise ValueError(f"slices({t}, {split!r}) returned {len(objs)} slices, expected {parts}")
            got = [(self.cache.intern(s), int(s.width), int(s.rows) * int(s.width),
                    2.0 * float(s.distinct) * int(s.width) * self.itemsize, int(s.rows)) for s in objs]
            self._info[(t, split)] = got
        return got

    def can_split_columns(self, parts: int) -> bool:
        """Whether a table in ``parts`` column slices may be halved again.

        The width must stay an integer of at least ``min_width`` (FBGEMM's
        "divisible by 4" in the paper), and, beyond the paper, the slices
        must still fit on distinct ranks (``2 * parts <= n_shards``): two
        slices of one table on one rank cost more than the one slice they
        could have been, so such plans only waste search budget.
        """
        new = 2 * parts
        return new <= self.n_shards and self.dim % new == 0 and self.dim // new >= self.min_width

    def can_split_rows(self, t: int) -> bool:
        return self.row_wise and self.n_shards >= 2 and self.pieces(t, WHOLE)[0][4] >= self.n_shards

    def allowed_splits(self, t: int) -> list:
        out, parts = [WHOLE], 1
        while self.can_split_columns(parts):
            parts *= 2
            out.append(("columns", parts))
        if self.can_split_rows(t):
            out.append(("rows", self.n_shards))
        return out

    def check_capacity(self) -> None:
        """Raise ValueError when no plan can respect the memory cap, naming the table and the cap."""
        if self.cap_rows is None:
            return
        total = 0
        for t in range(self.n_tables):
            total += self.pieces(t, WHOLE)[0][2]
            smallest = min(max(p[2] for p in self.pieces(t, split)) for split in self.allowed_splits(t))
            if smallest > self.cap:
                raise ValueError(
                    f"table {t} ({self.pieces(t, WHOLE)[0][4]} rows of width {self.dim}) fits on no PS rank under "
                    f"the memory cap of {self.cap_rows} rows x {self.dim} values per rank, whole or split any "
                    f"allowed way (its smallest slice needs {smallest} values, the cap is {self.cap:.0f})")
        if total > self.n_shards * self.cap:
            raise ValueError(
                f"the {self.n_tables} tables need {total} values, more than {self.n_shards} PS ranks hold under "
                f"the memory cap of {self.cap_rows} rows x {self.dim} values per rank")

    # -- inner loop: Algorithm 2 ----------------------------------------------------------------------------
    #
    # The inner loop is written as generators that yield the sets they need costed (as cache keys) and
    # receive the costs: ``_lockstep`` advances many of them together (the ``grid_m`` greedy runs of one
    # column plan, and the inner loops of every column plan of one beam step, which are independent), so
    # one ``serving`` call carries every cache miss of one greedy step of all of them.

    def run(self, gen):
        """Drive a cost-asking generator to its return value, answering from the cache (batched)."""
        try:
            keys = next(gen)
            while True:
                keys = gen.send(self.cache.costs(keys))
        except StopIteration as done:
            return done.value

    def plans(self, many: list) -> list:
        """GreedyGridSearch for each column plan (as splits), in lockstep; memoized by the splits."""
        todo = [splits for splits in dict.fromkeys(many) if splits not in self._plans]
        for splits, got in zip(todo, self.run(_lockstep([self._grid(splits) for splits in todo]))):
            self._plans[splits] = got
        return [self._plans[splits] for splits in many]

    def _grid(self, splits: tuple):
        """Algorithm 2 for one column plan (a generator; returns the best ``_Plan``)."""
        n = self.n_shards
        pinned, free = [], []
        for t, split in enumerate(splits):
            for j, (cid, width, values, nbytes, _) in enumerate(self.pieces(t, split)):
                if split[0] == "rows":
                    pinned.append(_Piece(t, j, cid, width, values, nbytes, j % n))
                else:
                    free.append(_Piece(t, j, cid, width, values, nbytes, -1))
        # Slices by descending predicted cost alone (Algorithm 2, line 3); ties by table, then slice.
        alone = yield [(p.cid,) for p in free]
        order = [free[i] for i in sorted(range(len(free)), key=lambda i: (-alone[i], free[i].table, free[i].part))]
        start = (sum(p.width for p in pinned) + sum(p.width for p in free)) / n
        m = self.grid_m
        thresholds = [start] if m <= 1 else [start * (1 + 0.5 * i / (m - 1)) for i in range(m)]
        best = None
        for got in (yield from self._greedy(splits, pinned, order, thresholds)):
            if got is not None and (best is None or got.cost < best.cost):   # ties: the lower cap
                best = got
        if best is None:   # every device-dimension cap failed: memory alone constrains
            best = (yield from self._greedy(splits, pinned, order, [None]))[0]
        return best

    def _greedy(self, splits, pinned, order, thresholds):
        """The greedy assignment under each device-dimension cap in ``thresholds`` (None: memory only).

        A generator; returns one ``_Plan`` (or None) per cap. The runs for
        all caps share their work while they agree: one branch holds every
        cap whose candidate ranks have been the same so far, and a branch
        forks when its caps first admit different ranks (so at most
        ``len(thresholds)`` branches, usually far fewer lookups than one run
        per cap; the result is exactly that of separate runs).

        With a cap, a slice that fits on no rank fails that cap (None).
        Without one, it is left unplaced and counted as overflow, so the beam
        can still rank plans that do not fit yet (e.g. before an oversized
        table has been split).
        """
        n, cap = self.n_shards, self.cap
        results: list = [None] * len(thresholds)
        root = _Branch(n, {t: [-1] * len(self.pieces(t, split)) for t, split in enumerate(splits)},
                       list(range(len(thresholds))))
        for p in pinned:
            r = p.pin
            if root.used[r] + p.values > cap:
                root.caps = [i for i in root.caps if thresholds[i] is None]   # the others fail
                if not root.caps:
                    return results
                root.overflow += p.values
                root.unplaced.append(p.table)
                continue
            root.add(p, r)
        if pinned:
            root.ms = list((yield list(root.keys)))
        limits = [None if thr is None else thr + 1e-9 for thr in thresholds]
        branches = [root]
        for p in order:
            asks = []
            for branch in list(branches):
                room = [r for r in range(n) if branch.used[r] + p.values <= cap]
                groups: dict = {}
                for i in branch.caps:
                    lim = limits[i]
                    ranks = tuple(room) if lim is None else tuple(r for r in room if branch.dims[r] + p.width <= lim)
                    if ranks or lim is None:   # else this cap fails
                        groups.setdefault(ranks, []).append(i)
                branches.remove(branch)
                for ranks, caps in groups.items():
                    sub = branch if len(groups) == 1 else branch.copy()
                    sub.caps = caps
                    branches.append(sub)
                    if not ranks:   # memory only, and no rank has room: overflow
                        sub.overflow += p.values
                        sub.unplaced.append(p.table)
                        continue
                    siblings = sub.where[p.table]
                    if len(siblings) > 1 and len(ranks) > 1:
                        # Slices of one table on distinct ranks whenever the constraints allow it (fewest
                        # siblings first), else splitting only adds per-slice overhead on the same rank.
                        held = [siblings.count(r) for r in ranks]
                        fewest = min(held)
                        ranks = tuple(r for r, h in zip(ranks, held) if h == fewest)
                    asks.append((sub, ranks))
            if not branches:
                return results
            costs = yield [_insert(sub.keys[r], p.cid) for sub, ranks in asks for r in ranks]
            at = 0
            for sub, ranks in asks:
                after = costs[at:at + len(ranks)]
                at += len(ranks)
                i = min(range(len(ranks)), key=lambda i: (after[i], ranks[i]))
                sub.add(p, ranks[i])
                sub.ms[ranks[i]] = after[i]
        for branch in branches:
            if branch.overflow:
                got = _Plan(branch.overflow, float("inf"), (), tuple(branch.ms), float("nan"),
                            tuple(dict.fromkeys(branch.unplaced)))
            else:
                comm_ms = float(self._comm(np.asarray(branch.nbytes, dtype=np.float64)))
                shards = tuple(tuple(branch.where[t]) for t in range(len(splits)))
                got = _Plan(0, max(branch.ms, default=0.0) + comm_ms, shards, tuple(branch.ms), comm_ms, ())
            for i in branch.caps:
                results[i] = got
        return results

    # -- outer loop: Algorithm 1 ----------------------------------------------------------------------------
    def moves(self, splits: tuple, beam_n: int) -> list:
        """New splits from one column plan: candidates = top N by cost merged with top N by size.

        A table's cost and size are those of its current (largest) slice,
        the cost predicted alone via the cache. Only tables that can still be
        split are ranked. Each candidate gives a column halving if allowed
        and, for a whole table with ``row_wise``, a row deal over all ranks;
        a table split one way is never split the other way.
        """
        movable = []
        for t, (kind, parts) in enumerate(splits):
            cols = kind != "rows" and self.can_split_columns(parts)
            rows = kind == "whole" and self.can_split_rows(t)
            if cols or rows:
                movable.append((t, cols, rows))
        if not movable:
            return []
        pieces = [self.pieces(t, splits[t]) for t, _, _ in movable]
        flat = self.cache.costs([(p[0],) for ps in pieces for p in ps])
        cost, size, at = [], [], 0
        for ps in pieces:
            cost.append(max(flat[at:at + len(ps)]))
            size.append(max(p[2] for p in ps))
            at += len(ps)
        idx = range(len(movable))
        by_cost = sorted(idx, key=lambda i: (-cost[i], movable[i][0]))[:beam_n]
        by_size = sorted(idx, key=lambda i: (-size[i], movable[i][0]))[:beam_n]
        out = []
        for i in dict.fromkeys(by_cost + by_size):
            t, cols, rows = movable[i]
            if cols:
                out.append(splits[:t] + (("columns", 2 * splits[t][1]),) + splits[t + 1:])
            if rows:
                out.append(splits[:t] + (("rows", self.n_shards),) + splits[t + 1:])
        return out


def neuroshard_search(n_tables: int, n_shards: int, dim: int, *,
                      slices: Callable[[int, Split], list],
                      serving: Callable[[list], list],
                      comm: Callable[[np.ndarray], float],
                      cap_rows: Optional[int] = None,
                      beam_n: int = 10, beam_k: int = 3, steps: int = 10, grid_m: int = 10,
                      min_width: int = 4, row_wise: bool = True, itemsize: int = 4,
                      min_gain: float = 0.0) -> SearchResult:
    """Search a PS sharding plan for ``n_tables`` tables of width ``dim`` on ``n_shards`` ranks (NeuroShard).

    Outer loop (Algorithm 1, beam search): the column plan starts empty
    (every table whole); each of ``steps`` steps extends each of the
    ``beam_k`` best plans by one move on each candidate table (top
    ``beam_n`` by predicted cost merged with top ``beam_n`` by size, as the
    paper: only large or costly tables are worth splitting, and each split
    adds overall work, Observation 1), runs the inner loop on it, and keeps
    the ``beam_k`` cheapest. A move halves a table's column slices (while
    ``dim`` divides evenly, slices stay at least ``min_width`` wide and fit
    on distinct ranks) or, with ``row_wise``, deals a whole table's rows over
    all ranks (phase ``j`` on rank ``j``). Plans are identified by their
    splits, so the same splits reached by moves in another order are
    evaluated once and fill one beam slot. With ``row_wise`` the plan that
    deals every table it can over all ranks (round-robin, which ``steps``
    single moves cannot reach with more tables than steps) is a candidate
    too. The best plan seen at any step,
    the empty column plan included, is returned: never worse than the
    no-split greedy grid search. With ``min_gain`` a plan replaces the best
    only if it is predicted at least that fraction cheaper: a split costs
    work the models may not see (routing the pieces, one more operation per
    width), so a gain within the models' error is not worth it.

    Inner loop (Algorithm 2, greedy grid search): see ``_Search._grid``;
    ``grid_m`` device-dimension caps from the mean ``Ms`` (sum of slice
    widths / ranks) to ``1.5 Ms``; a cap under which some slice fits on no
    rank is skipped; if all are, memory alone constrains. Row-dealt slices
    are pinned and placed first.

    Memory: a slice uses ``rows * width`` values, a rank holds at most
    ``cap_rows * dim``; every returned plan respects it. ``ValueError`` if
    some table fits under no split, if all tables exceed the ranks' total,
    or if the search finds no plan that fits (greedy packing can miss a
    tight fit). Ties everywhere go to the lower rank, then table index.
    """
    t0 = time.perf_counter()
    if n_shards < 1:
        raise ValueError(f"n_shards must be at least 1, got {n_shards}")
    search = _Search(n_tables, n_shards, dim, slices, serving, comm, cap_rows, grid_m, min_width, row_wise,
                     itemsize)
    search.check_capacity()
    def better(plan, best) -> bool:
        """Fits where the best does not, or is cheaper by at least ``min_gain`` (see above)."""
        return plan.key < best.key and bool(plan.overflow or best.overflow or plan.cost < best.cost * (1 - min_gain))

    start = (WHOLE,) * n_tables
    best_splits, best = start, search.plans([start])[0]
    beam = [start]
    for _ in range(steps):
        children = list(dict.fromkeys(child for splits in beam for child in search.moves(splits, beam_n)))
        if not children:
            break
        plans = search.plans(children)
        for child, plan in zip(children, plans):   # strictly better only: ties keep the earlier plan
            if better(plan, best):
                best_splits, best = child, plan
        order = sorted(range(len(children)), key=lambda i: (plans[i].key, i))
        beam = [children[i] for i in order[:beam_k]]
    if row_wise and steps > 0:  # the row-wise plan itself: every table that can be dealt, beyond L steps' reach
        dealt = tuple(("rows", n_shards) if search.can_split_rows(t) else WHOLE for t in range(n_tables))
        plan = search.plans([dealt])[0]
        if better(plan, best):
            best_splits, best = dealt, plan
    if best.overflow:
        raise ValueError(
            f"no plan found that fits the memory cap of {cap_rows} rows x {dim} values per PS rank: the closest "
            f"leaves table(s) {list(best.unplaced)} unplaced ({best.overflow} values over)")
    placements = []
    for split, ranks in zip(best_splits, best.shards):
        kind = split[0]
        placements.append(ranks[0] if kind == "whole" else {kind: list(ranks)})
    return SearchResult(placements=placements, splits=list(best_splits), cost=best.cost,
                        serving_ms=list(best.serving_ms), comm_ms=best.comm_ms,
                        evaluations=search.cache.evaluations, cache_hits=search.cache.hits,
                        seconds=time.perf_counter() - t0)

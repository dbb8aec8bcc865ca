"""A literal, slow Python transcription of docs/design.md section 3, as a test oracle.

Sets and OrderedDicts instead of bitmasks and hash tables: the Cython cluster
state must produce exactly the same events, holder sets and cache contents.
"""
from collections import OrderedDict

PS = "PS"


class OracleState:
    def __init__(self, n_workers, n_rows, capacity, full_set, p2p=False, policy="lru", staleness=None):
        self.n, self.capacity, self.full_set, self.p2p = n_workers, capacity, full_set, p2p
        self.staleness = staleness  # HET: None, or s
        self.version = [0] * n_rows  # HET: updates pushed per row
        self.seen = [{} for _ in range(n_workers)]  # HET: row -> version its cached value has seen
        self.pending = [{} for _ in range(n_workers)]  # HET: row -> its updates not pushed yet
        self.lfu = policy == "lfu"
        self.holders = [{PS} for _ in range(n_rows)]
        self.caches = [OrderedDict() for _ in range(n_workers)]  # row -> slot, LRU first
        self.freq = [{} for _ in range(n_workers)]  # LFU: row -> accesses (saturating at 255)
        self.clock = 0
        self.last = [{} for _ in range(n_workers)]  # row -> time of last access
        self.free = [list(range(capacity)) for _ in range(n_workers)]
        self.needs = None

    def set_needs(self, rows, alloc):
        needs = [[] for _ in range(self.n)]  # per worker, first-appearance order
        seen = [set() for _ in range(self.n)]
        for i, w in enumerate(alloc):
            for e in rows[i]:
                e = int(e)
                if e not in seen[w]:
                    seen[w].add(e)
                    needs[w].append(e)
        self.needs = needs
        self.trainers = {}
        for w, rows_w in enumerate(needs):
            for e in rows_w:
                self.trainers.setdefault(e, set()).add(w)

    def train(self):
        if self.staleness is not None:
            return self._train_het()
        events, self.peers = [], []
        sources = {}  # (receiver, row) -> (sender, sender's slot): P2P, decided before any eviction
        if self.p2p:
            for v, rows_v in enumerate(self.needs):
                for e in rows_v:
                    holders = self.holders[e]
                    if len(holders) == 1 and PS not in holders and v not in holders:
                        (owner,) = holders
                        sources[v, e] = (owner, self.caches[owner][e])
                        holders.add(v)
        for w, rows_w in enumerate(self.needs):
            cache = self.caches[w]
            for e in rows_w:  # pin: touch cached rows needed now
                if e in cache:
                    cache.move_to_end(e)
                    self._access(w, e, self.freq[w][e] + 1)
            for e in rows_w:
                if (w, e) not in sources:
                    if w in self.holders[e]:
                        continue
                    assert PS in self.holders[e], f"row {e} needed by {w} is not at the PS"
                if e not in cache:
                    if self.free[w]:
                        slot = self.free[w].pop(0)
                    else:
                        victim = self._victim(w, rows_w)
                        slot = cache[victim]
                        if self.holders[victim] == {w}:
                            events.append(("writeback", w, victim, slot))
                            self.holders[victim] = {PS}
                        else:
                            self.holders[victim].discard(w)
                        del cache[victim]
                    cache[e] = slot
                    self._access(w, e, 1)
                if (w, e) in sources:
                    events.append(("p2p", w, e, cache[e]))
                    self.peers.append(sources[w, e])
                else:
                    events.append(("pull", w, e, cache[e]))
                    self.holders[e].add(w)
        for w, rows_w in enumerate(self.needs):
            for e in rows_w:
                slot = self.caches[w][e]
                if len(self.trainers[e]) >= 2:
                    events.append(("accumulate", w, e, slot))
                    self.holders[e] = {PS}
                elif self.full_set:
                    events.append(("full_set_push", w, e, slot))
                    self.holders[e] = {PS, w}
                else:
                    events.append(("local", w, e, slot))
                    self.holders[e] = {w}
        return events

    def _train_het(self):
        """HET's clocks: one event list with ("kind", worker, row, slot, value)."""
        events, sync, versions = [], set(), list(self.version)  # reads see the versions of the iteration's start
        self.peers = []
        for w, rows_w in enumerate(self.needs):
            cache, seen, pending = self.caches[w], self.seen[w], self.pending[w]
            for e in rows_w:
                if e in cache:
                    cache.move_to_end(e)
                    self._access(w, e, self.freq[w][e] + 1)
            for e in rows_w:
                if e in cache:
                    events.append(("version_check", w, e, cache[e], versions[e]))
                    if versions[e] - seen[e] <= self.staleness:
                        continue
                    if pending.get(e, 0) > 0:
                        sync.add((w, e))
                else:
                    if self.free[w]:
                        slot = self.free[w].pop(0)
                    else:
                        victim = self._victim(w, rows_w)
                        slot = cache.pop(victim)
                        if pending.get(victim, 0) > 0:
                            events.append(("delta_writeback", w, victim, slot, pending[victim]))
                            self.version[victim] += pending[victim]
                        pending.pop(victim, None)
                        seen.pop(victim, None)
                    cache[e] = slot
                    self._access(w, e, 1)
                events.append(("pull", w, e, cache[e], 0))
                seen[e] = versions[e]
        for w, rows_w in enumerate(self.needs):
            seen, pending = self.seen[w], self.pending[w]
            for e in rows_w:
                pending[e] = pending.get(e, 0) + 1
                if pending[e] > self.staleness or (w, e) in sync:
                    events.append(("delta_push", w, e, self.caches[w][e], pending[e]))
                    self.version[e] += pending[e]
                    seen[e] += pending[e]
                    pending[e] = 0
                else:
                    events.append(("local", w, e, self.caches[w][e], 0))
        return events

    def _access(self, w, e, count):
        self.clock += 1
        self.freq[w][e] = min(count, 255) if self.lfu else 0
        self.last[w][e] = self.clock

    def _victim(self, w, pinned):
        """Least frequently (LFU) or least recently used row that is not needed now."""
        candidates = [e for e in self.caches[w] if e not in pinned]
        return min(candidates, key=lambda e: (self.freq[w][e], self.last[w][e]))

    def eviction_order(self, w):
        """Rows from last to first to be evicted."""
        return sorted(self.caches[w], key=lambda e: (self.freq[w][e], self.last[w][e]), reverse=True)

    def plan(self, rows, alloc):
        self.set_needs(rows, alloc)
        events = []
        for v, rows_v in enumerate(self.needs):
            for e in rows_v:
                holders = self.holders[e]
                if self.p2p and len(self.trainers[e]) == 1:
                    continue  # sent peer to peer when the next iteration starts
                if len(holders) == 1 and PS not in holders:
                    (owner,) = holders
                    if owner != v:
                        events.append(("plan_push", owner, e, self.caches[owner][e]))
                        holders.add(PS)
        return events

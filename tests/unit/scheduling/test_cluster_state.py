"""The Cython cluster state follows docs/design.md section 3 exactly.

It is compared event for event with a literal Python transcription
(``state_oracle.py``) on random small instances, and the invariants the
design names are checked directly.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hybrid._ext.cluster_state import KIND_NAMES, PUSH_KINDS, ClusterState, StateError
from state_oracle import PS, OracleState


@st.composite
def instances(draw, max_workers=5):
    n_workers = draw(st.integers(1, max_workers))
    n_rows = draw(st.integers(2, 30))
    n_tables = draw(st.integers(1, 3))
    per_worker = draw(st.integers(1, 4))
    slack = draw(st.integers(0, 6))
    capacity = per_worker * n_tables + slack  # at least one iteration's working set
    iterations = draw(st.integers(1, 8))
    batch = n_workers * per_worker
    rows = [np.array(draw(st.lists(st.lists(st.integers(0, n_rows - 1), min_size=n_tables, max_size=n_tables),
                                   min_size=batch, max_size=batch)), dtype=np.int64)
            for _ in range(iterations)]
    balanced = [w for w in range(n_workers) for _ in range(per_worker)]  # the scheduler's capacity |B|/n
    allocs = [np.array(draw(st.permutations(balanced)), dtype=np.int32) for _ in range(iterations)]
    sync = draw(st.sampled_from(["full_set", "ps", "p2p"]))
    policy = draw(st.sampled_from(["lru", "lfu"]))
    # row -> slot entries' distance from home: 0 and 1 bit saturate at once, so deletions read the rows
    distance_bits = draw(st.sampled_from([0, 1, 6]))
    return n_workers, n_rows, capacity, sync, rows, allocs, policy, distance_bits


def _events(state):
    kind, worker, row, slot = state.events()
    return [(KIND_NAMES[k], int(w), int(e), int(s)) for k, w, e, s in zip(kind, worker, row, slot)]


WRITES = ("writeback", "accumulate", "full_set_push", "plan_push")


def _oracle_holders(oracle, n_workers):
    table = np.zeros((len(oracle.holders), 1 + n_workers), dtype=bool)
    for e, holders in enumerate(oracle.holders):
        for h in holders:
            table[e, 0 if h == PS else h + 1] = True
    return table


def _run_both(n_workers, n_rows, capacity, sync, rows, allocs, policy, distance_bits=6, check=None):
    full_set, p2p = sync == "full_set", sync == "p2p"
    state = ClusterState(n_workers=n_workers, n_rows=n_rows, capacity=capacity, full_set=full_set,
                         max_pairs=rows[0].size, p2p=p2p, policy=policy, distance_bits=distance_bits)
    oracle = OracleState(n_workers, n_rows, capacity, full_set, p2p, policy)
    state.set_needs(rows[0], allocs[0])
    oracle.set_needs(rows[0], allocs[0])
    written = set()  # rows the previous iteration wrote to the PS
    for t in range(len(rows)):
        before = state.holder_sets()
        state.train()
        trained = _events(state)
        assert trained == oracle.train()
        senders, sender_slots = state.peers()
        is_p2p = np.array([kind == "p2p" for kind, *_ in trained], dtype=bool)
        assert list(zip(senders[is_p2p].tolist(), sender_slots[is_p2p].tolist())) == oracle.peers
        assert (senders[~is_p2p] == -1).all()
        early = state.prefetchable()
        assert early.tolist() == [kind == "pull" and e not in written for kind, _, e, _ in trained]
        sent = {(int(w), e) for w, (kind, _, e, _) in zip(senders, trained) if kind == "p2p"}
        nxt = (rows[t + 1], allocs[t + 1]) if t + 1 < len(rows) else (None, None)
        state.plan(*nxt)
        planned = _events(state)
        assert planned == (oracle.plan(*nxt) if nxt[0] is not None else [])
        written = {e for kind, _, e, _ in trained + planned if kind in WRITES}
        assert np.array_equal(state.holder_sets(), _oracle_holders(oracle, n_workers))
        for w in range(n_workers):
            cached = {int(e): s for s, e in enumerate(state.cache_rows(w)) if e >= 0}
            assert cached == dict(oracle.caches[w])
            assert [state.cache_rows(w)[s] for s in state.lru_order(w)] == oracle.eviction_order(w)
        if check:
            check(state, t, before, trained, planned, rows, allocs, sent)
    return state


@settings(max_examples=300, deadline=None)
@given(instances())
def test_matches_the_literal_design(instance):
    _run_both(*instance)


@settings(max_examples=30, deadline=None)
@given(instances(max_workers=2).map(lambda i: (i[0] + 68,) + i[1:]))
def test_more_than_64_workers_use_multiword_holder_sets(instance):
    _run_both(*instance)


@pytest.mark.parametrize("capacity", [65_535, 65_536])
def test_replacement_links_of_16_and_32_bits_match_the_literal_design(capacity):
    # the largest cache whose slot numbers fit 16-bit links (65,535 is their "none"), and the smallest that
    # does not: filled, then evicting rows of a wider range, both with the design's evictions and LRU order
    rng = np.random.default_rng(capacity)
    n_rows = capacity + 4_000
    later = [np.concatenate([rng.choice(capacity, 20, replace=False), rng.choice(np.arange(capacity, n_rows), 20)])
             for _ in range(3)]  # half of each batch cached, half evicting
    rows = [np.arange(capacity, dtype=np.int64)[:, None]] + [rng.permutation(b)[:, None] for b in later]
    allocs = [np.zeros(len(batch), dtype=np.int32) for batch in rows]
    state = _run_both(1, n_rows, capacity, "ps", rows, allocs, "lru")
    # slot rows, links of 16 or 32 bits (and the other width's 1-entry stub), the replacement head, tail, lowest
    # bucket and fill count each on a 64-byte line of the worker's own, the unused LFU counts' stub
    assert state.memory_parts()["caches"] == capacity * 4 + 2 * capacity * (2 if capacity < 65_536 else 4) + \
        (4 if capacity < 65_536 else 2) + 4 * 64 + 4


def _invariants(state, t, before, trained, planned, rows, allocs, sent):
    n_workers = state.n_workers
    after = state.holder_sets()
    assert after.any(axis=1).all(), "every row has a holder of its latest value"
    for kind, w, e, s in trained:
        if kind == "pull":
            assert not before[e, w + 1], "a pulled row is never already fresh"
            assert before[e, 0], "pulls come from the PS, which holds the latest value"
    for w in range(n_workers):
        cached = set(int(e) for e in state.cache_rows(w) if e >= 0)
        assert len(cached) <= state.capacity
        fresh = set(np.flatnonzero(after[:, w + 1]))
        assert fresh <= cached, "a worker only holds latest values in its cache"
    trainers = {}
    for i, w in enumerate(allocs[t]):
        for e in rows[t][i]:
            trainers.setdefault(int(e), set()).add(int(w))
    for e, ws in trainers.items():
        if len(ws) >= 2:
            assert after[e, 0] and after[e].sum() == 1, "shared rows end at the PS only"
    written_back = {(w, e) for kind, w, e, s in trained if kind == "writeback"}
    for w in range(n_workers):
        for e in np.flatnonzero(before[:, w + 1]):
            dirty_before = before[e].sum() == 1
            if dirty_before and state.slot_of(w, int(e)) < 0:
                assert (w, int(e)) in written_back | sent, "an evicted dirty row is written back (or sent)"
    if t + 1 < len(rows):
        needers = {}
        for i, v in enumerate(allocs[t + 1]):
            for e in rows[t + 1][i]:
                needers.setdefault(int(e), set()).add(int(v))
        for e, vs in needers.items():
            holders = after[e]
            owner = np.flatnonzero(holders[1:])
            if holders.sum() == 1 and not holders[0]:  # dirty on one worker
                others = vs - {int(owner[0])}
                if state.p2p:  # only a single other worker may take it peer to peer
                    assert not others or (len(vs) == 1), "a row several workers need in t+1 is pushed"
                else:
                    assert not others, "a row needed by another worker in t+1 is not left dirty"


@settings(max_examples=200, deadline=None)
@given(instances())
def test_design_invariants(instance):
    _run_both(*instance, check=_invariants)


def test_shared_rows_end_at_the_ps_only():
    state = ClusterState(n_workers=2, n_rows=4, capacity=4, full_set=False, max_pairs=4)
    state.set_needs(np.array([[1], [1]], dtype=np.int64), np.array([0, 1], dtype=np.int32))
    counts = state.train()
    assert counts["pull"] == 2 and counts["accumulate"] == 2
    assert state.holder_sets()[1].tolist() == [True, False, False]


def test_single_trainer_keeps_a_dirty_row_until_another_worker_needs_it():
    state = ClusterState(n_workers=2, n_rows=4, capacity=4, full_set=False, max_pairs=2)
    one = np.array([[2], [3]], dtype=np.int64)
    state.set_needs(one, np.array([0, 1], dtype=np.int32))
    assert state.train()["local"] == 2
    assert state.plan(one, np.array([0, 1], dtype=np.int32))["plan_push"] == 0  # same places: stays dirty
    assert state.train() == dict.fromkeys(KIND_NAMES, 0) | {"local": 2}  # fresh hits, nothing moves
    assert state.plan(one, np.array([1, 0], dtype=np.int32))["plan_push"] == 2  # swapped: both pushed
    assert state.train()["pull"] == 2


def test_full_set_mode_never_leaves_dirty_rows():
    state = ClusterState(n_workers=2, n_rows=4, capacity=4, full_set=True, max_pairs=2)
    rows = np.array([[2], [3]], dtype=np.int64)
    state.set_needs(rows, np.array([0, 1], dtype=np.int32))
    assert state.train()["full_set_push"] == 2
    assert state.plan(rows, np.array([1, 0], dtype=np.int32))["plan_push"] == 0
    assert state.holder_sets()[2].tolist() == [True, True, False]


def test_p2p_sends_a_row_one_other_worker_needs_directly():
    state = ClusterState(n_workers=3, n_rows=8, capacity=4, full_set=False, max_pairs=3, p2p=True)
    state.set_needs(np.array([[5], [6], [7]], dtype=np.int64), np.array([0, 1, 2], dtype=np.int32))
    state.train()  # 5 dirty on 0, 6 on 1, 7 on 2
    # next: worker 1 alone needs 5 (P2P 0 -> 1); workers 0 and 2 both need 6 (PS push by 1)
    planned = state.plan(np.array([[6], [5], [6]], dtype=np.int64), np.array([0, 1, 2], dtype=np.int32))
    assert planned["plan_push"] == 1
    counts = state.train()
    assert counts["p2p"] == 1 and counts["pull"] == 2
    kind, worker, row, slot = state.events()
    senders, sender_slots = state.peers()
    p2p = np.flatnonzero(kind == 6)[0]
    assert (worker[p2p], row[p2p], senders[p2p], sender_slots[p2p]) == (1, 5, 0, 0)
    with pytest.raises(ValueError, match="on-demand"):
        ClusterState(n_workers=2, n_rows=4, capacity=2, full_set=True, max_pairs=2, p2p=True)


def test_lfu_keeps_frequent_rows_that_lru_would_evict():
    rows = [np.array([[r]], dtype=np.int64) for r in (1, 1, 1, 2, 3)]  # row 1 three times, then 2, 3
    kept = {}
    for policy in ("lru", "lfu"):
        state = ClusterState(n_workers=1, n_rows=5, capacity=2, full_set=True, max_pairs=1, policy=policy)
        for batch in rows:
            state.plan(batch, np.zeros(1, dtype=np.int32))
            state.train()
        kept[policy] = sorted(int(r) for r in state.cache_rows(0))
    assert kept == {"lru": [2, 3], "lfu": [1, 3]}


def test_too_small_cache_is_a_clear_error():
    state = ClusterState(n_workers=1, n_rows=10, capacity=2, full_set=False, max_pairs=3)
    state.set_needs(np.array([[1, 2, 3]], dtype=np.int64), np.array([0], dtype=np.int32))
    with pytest.raises(StateError, match="cannot hold this iteration's working set"):
        state.train()


def test_bad_inputs_name_what_is_wrong():
    state = ClusterState(n_workers=2, n_rows=10, capacity=4, full_set=False, max_pairs=4)
    with pytest.raises(ValueError, match=r"alloc\[1\] = 2 is not a worker"):
        state.set_needs(np.zeros((2, 1), dtype=np.int64), np.array([0, 2], dtype=np.int32))
    with pytest.raises(ValueError, match=r"rows\[0, 0\] = 10 is not a row"):
        state.set_needs(np.full((2, 1), 10, dtype=np.int64), np.array([0, 1], dtype=np.int32))
    with pytest.raises(ValueError, match=r"rows\[1, 0\] = -1 is not a row"):
        state.set_needs(np.array([[3], [-1]], dtype=np.int64), np.array([0, 1], dtype=np.int32))
    with pytest.raises(ValueError, match="exceeds max_pairs"):
        state.set_needs(np.zeros((5, 1), dtype=np.int64), np.zeros(5, dtype=np.int32))
    with pytest.raises(StateError, match="set_needs"):
        state.train()
    state.set_needs(np.array([[3], [4]], dtype=np.int64), np.array([0, 1], dtype=np.int32))
    with pytest.raises(ValueError, match="is not a row"):  # a refused batch leaves no needs behind
        state.set_needs(np.array([[5], [10]], dtype=np.int64), np.array([0, 1], dtype=np.int32))
    with pytest.raises(StateError, match="set_needs"):
        state.train()
    state.set_needs(np.array([[3], [4]], dtype=np.int64), np.array([0, 1], dtype=np.int32))
    assert state.train()["pull"] == 2
    with pytest.raises(ValueError, match="capacity"):
        ClusterState(n_workers=2, n_rows=10, capacity=0, full_set=False, max_pairs=4)


def test_flush_gives_every_dirty_row_to_the_ps():
    state = ClusterState(n_workers=2, n_rows=6, capacity=4, full_set=False, max_pairs=4)
    state.set_needs(np.array([[1, 2], [2, 3]], dtype=np.int64), np.array([0, 1], dtype=np.int32))
    state.train()  # 1 dirty on 0, 3 dirty on 1, 2 shared (at the PS)
    workers, rows, slots = state.flush_dirty()
    assert sorted(zip(workers.tolist(), rows.tolist())) == [(0, 1), (1, 3)]
    assert all(state.slot_of(int(w), int(r)) == s for w, r, s in zip(workers, rows, slots))
    holders = state.holder_sets()
    assert holders[:, 0].all() and holders[1, 1] and holders[3, 2]  # PS has all; owners stay fresh
    assert len(state.flush_dirty()[0]) == 0


@settings(max_examples=40, deadline=None)
@given(instances())
def test_a_copy_steps_exactly_like_the_original(instance):
    """The brute-force scheduler evaluates what-ifs on copies: a forgotten field would diverge."""
    n_workers, n_rows, capacity, sync, rows, allocs, policy, distance_bits = instance
    state = ClusterState(n_workers=n_workers, n_rows=n_rows, capacity=capacity, full_set=sync == "full_set",
                         max_pairs=rows[0].size, p2p=sync == "p2p", policy=policy, distance_bits=distance_bits)
    state.set_needs(rows[0], allocs[0])
    clone = state.copy()  # with needs set: the copy must carry them into train()
    for t in range(len(rows)):
        for s in (state, clone):
            s.train()
        assert [a.tolist() for a in state.events()] == [a.tolist() for a in clone.events()]
        assert [a.tolist() for a in state.peers()] == [a.tolist() for a in clone.peers()]
        assert state.prefetchable().tolist() == clone.prefetchable().tolist()  # the written rows came along
        assert state.event_digest == clone.event_digest
        assert state.digest() == clone.digest()
        assert all(state.lru_order(w) == clone.lru_order(w) for w in range(n_workers))
        if t + 1 < len(rows):
            for s in (state, clone):
                s.plan(rows[t + 1], allocs[t + 1])
            assert [a.tolist() for a in state.events()] == [a.tolist() for a in clone.events()]
            if t == 0:
                clone = clone.copy()  # and a copy of a copy mid-run


@settings(max_examples=100, deadline=None)
@given(instances(), st.integers(0, 4))
def test_a_worker_reads_its_own_share_of_each_iteration(instance, focus):
    """focus_needs and worker_events give one worker exactly its part of the events, batch-sized."""
    n_workers, n_rows, capacity, sync, rows, allocs, policy, distance_bits = instance
    focus %= n_workers
    state = ClusterState(n_workers=n_workers, n_rows=n_rows, capacity=capacity, full_set=sync == "full_set",
                         max_pairs=rows[0].size, p2p=sync == "p2p", policy=policy, focus=focus,
                         distance_bits=distance_bits)
    state.set_needs(rows[0], allocs[0])
    for t in range(len(rows)):
        state.train()
        samples, index, mine, slots = state.focus_needs()
        assert samples.tolist() == np.flatnonzero(allocs[t] == focus).tolist()
        assert np.array_equal(mine[index], rows[t][samples])
        assert len(set(mine.tolist())) == len(mine)
        assert slots.tolist() == [state.slot_of(focus, int(e)) for e in mine]
        groups = state.worker_events(focus)
        kind, worker, row, slot = state.events()
        moved = ~np.isin(kind, [KIND_NAMES.index("local"), KIND_NAMES.index("version_check")])
        assert state.worker_transmissions().tolist() == np.bincount(worker[moved], minlength=n_workers).tolist()
        for k, name in enumerate(KIND_NAMES):
            chosen = (worker == focus) & (kind == k)
            assert groups[name]["rows"].tolist() == row[chosen].tolist()
            assert groups[name]["slots"].tolist() == slot[chosen].tolist()
        updated = np.concatenate([groups[k]["pairs"] for k in ("local", "accumulate", "full_set_push")])
        assert sorted(updated.tolist()) == list(range(len(mine)))
        for k in ("local", "accumulate", "full_set_push"):
            assert mine[groups[k]["pairs"]].tolist() == groups[k]["rows"].tolist()
        assert groups["pull"]["early"].tolist() == state.prefetchable()[(worker == focus) & (kind == 0)].tolist()
        state.plan(*((rows[t + 1], allocs[t + 1]) if t + 1 < len(rows) else (None, None)))
        kind, worker, _, _ = state.events()
        assert state.worker_transmissions().tolist() == np.bincount(worker, minlength=n_workers).tolist()


@settings(max_examples=100, deadline=None)
@given(instances())
def test_a_p2p_sender_lists_each_receivers_rows_in_the_receivers_order(instance):
    """What w packs for v is v's P2P rows from w, in v's order: the message carries values only."""
    n_workers, n_rows, capacity, _, rows, allocs, policy, distance_bits = instance
    state = ClusterState(n_workers=n_workers, n_rows=n_rows, capacity=capacity, full_set=False,
                         max_pairs=rows[0].size, p2p=True, policy=policy, distance_bits=distance_bits)
    state.set_needs(rows[0], allocs[0])
    for t in range(len(rows)):
        before = [state.cache_rows(w) for w in range(n_workers)]
        state.train()
        received = {v: state.worker_events(v)["p2p"] for v in range(n_workers)}
        for w in range(n_workers):
            sends = state.p2p_sends(w)
            expected = [(v, e, int(s_w), int(s_v)) for v in range(n_workers)
                        for e, s_v, peer, s_w in zip(received[v]["rows"].tolist(), received[v]["slots"],
                                                     received[v]["peers"], received[v]["peer_slots"]) if peer == w]
            got = list(zip(sends["receivers"].tolist(), sends["rows"].tolist(), sends["slots"].tolist(),
                           sends["receiver_slots"].tolist()))
            assert got == expected
            assert all(before[w][s] == e for _, e, s, _ in got), "the sender's slot held the row when t began"
        state.plan(*((rows[t + 1], allocs[t + 1]) if t + 1 < len(rows) else (None, None)))
    with pytest.raises(StateError, match="before plan"):
        state.p2p_sends(0)


@settings(max_examples=100, deadline=None)
@given(instances())
def test_each_shared_row_has_one_accumulate_per_turn_in_worker_order(instance):
    """Turn k of a shared row is its (k+1)-th trainer by worker index; rounds = the most trainers of a row.

    The runtime adds turn 0, then turn 1, ... (train.deterministic): this is
    what makes every row's sum come out in one order on every run.
    """
    n_workers, n_rows, capacity, sync, rows, allocs, policy, distance_bits = instance
    state = ClusterState(n_workers=n_workers, n_rows=n_rows, capacity=capacity, full_set=sync == "full_set",
                         max_pairs=rows[0].size, p2p=sync == "p2p", policy=policy, distance_bits=distance_bits)
    state.set_needs(rows[0], allocs[0])
    for t in range(len(rows)):
        state.train()
        trainers = {}  # row -> [(worker, turn)]
        for w in range(n_workers):
            group = state.worker_events(w)["accumulate"]
            for e, turn in zip(group["rows"].tolist(), group["turns"].tolist()):
                trainers.setdefault(e, []).append((w, turn))
        for e, pairs in trainers.items():
            assert [turn for _, turn in pairs] == list(range(len(pairs)))
            assert len(pairs) == len({int(w) for w, r in zip(allocs[t], rows[t]) if e in r.tolist()}) >= 2
        assert state.accumulate_rounds == max((len(p) for p in trainers.values()), default=0)
        state.plan(*((rows[t + 1], allocs[t + 1]) if t + 1 < len(rows) else (None, None)))


def test_event_digest_changes_with_any_event():
    rows = np.array([[1, 2], [2, 3]], dtype=np.int64)
    digests = []
    for alloc in ([0, 1], [1, 0], [0, 1]):
        state = ClusterState(n_workers=2, n_rows=6, capacity=4, full_set=False, max_pairs=4)
        state.set_needs(rows, np.array(alloc, dtype=np.int32))
        state.train()
        digests.append(state.event_digest)
    assert digests[0] == digests[2] != digests[1]


@pytest.mark.parametrize("threads", [1, 3])
def test_the_needs_table_grows_and_shrinks_with_the_batches_distinct_rows(threads):
    """The needs table is sized by the last batch's distinct rows; a batch with far more is set again in a
    larger table, and every worker's needs are still its samples' distinct rows in first-use order."""
    rng = np.random.default_rng(3)
    n_workers, n_rows, tables = 3, 200_000, 4
    state = ClusterState(n_workers=n_workers, n_rows=n_rows, capacity=n_rows, full_set=False,
                         max_pairs=12_000 * tables, focus=1, threads=threads)
    for samples, spread in ((60, 50), (12_000, n_rows), (60, 50), (12_000, n_rows)):  # 60 rows, ~45,000
        rows = rng.integers(0, spread, size=(samples, tables)).astype(np.int64)
        alloc = (np.arange(samples) % n_workers).astype(np.int32)
        state.plan(rows, alloc)
        state.train()
        chosen, index, mine, _ = state.focus_needs()
        used = rows[chosen].reshape(-1)
        first_use = used[np.sort(np.unique(used, return_index=True)[1])]
        assert mine.tolist() == first_use.tolist()
        assert np.array_equal(mine[index], rows[chosen])
        assert state.counts()["accumulate"] + state.counts()["local"] == sum(
            len(np.unique(rows[alloc == w])) for w in range(n_workers))


@pytest.mark.parametrize("full_set", [False, True])
def test_pulls_are_prefetchable_exactly_when_the_previous_iteration_wrote_nothing_to_the_row(full_set):
    """The written-row tables start small and grow within a call (a full-set batch writes ~45,000 rows):
    a pull is prefetchable iff neither the previous train() nor its plan() wrote the row to the PS."""
    rng = np.random.default_rng(5)
    n_workers, n_rows, tables = 3, 200_000, 4
    state = ClusterState(n_workers=n_workers, n_rows=n_rows, capacity=30_000, full_set=full_set,
                         max_pairs=12_000 * tables)
    pushes = [KIND_NAMES.index(k) for k in PUSH_KINDS]
    written = set()
    batches = [rng.integers(0, spread, size=(samples, tables)).astype(np.int64)
               for samples, spread in ((60, 50), (12_000, n_rows), (12_000, 60_000), (60, 50), (12_000, n_rows))]
    state.set_needs(batches[0], np.zeros(len(batches[0]), dtype=np.int32))
    for t, rows in enumerate(batches):
        state.train()
        kind, _, row, _ = state.events()
        pulled = kind == KIND_NAMES.index("pull")
        assert state.prefetchable()[pulled].tolist() == [int(r) not in written for r in row[pulled]]
        written = set(row[np.isin(kind, pushes)].tolist())
        following = batches[t + 1] if t + 1 < len(batches) else None
        state.plan(following, None if following is None else (np.arange(len(following)) % n_workers).astype(np.int32))
        kind, _, row, _ = state.events()
        written |= set(row[np.isin(kind, pushes)].tolist())


def test_memory_parts_count_each_array_where_it_belongs():
    # 3 workers + the PS: one 64-bit word per holder set; 100 slots per worker; LRU keeps no frequencies
    state = ClusterState(n_workers=3, n_rows=1000, capacity=100, full_set=False, max_pairs=64)
    parts = state.memory_parts()
    assert parts["holder sets"] == 1000 * 8
    # slot rows (4 B), two LRU links (2 B each: 100 slots fit 16 bits, and a 4 B placeholder of the wide
    # links) per slot; a head, a tail, the lowest bucket and the slots used per worker (4 B each, each on a
    # 64-byte line of the worker's own: threads write them); one frequency placeholder
    assert parts["caches"] == 300 * 4 + 600 * 2 + 4 + 4 * 3 * 64 + 4
    assert parts["row-to-slot tables"] == 3 * (100 + 50 + 1) * 4  # load <= 2/3, 4-byte entries
    assert parts["HET versions"] == 8 + 8 + 4 + 1  # placeholders without HET
    het = ClusterState(n_workers=3, n_rows=1000, capacity=100, full_set=False, max_pairs=64, staleness=0)
    # a version per row, a seen version and a pending count per slot, a flag per pair
    assert het.memory_parts()["HET versions"] == 1000 * 8 + 300 * (8 + 4) + 64
    assert het.memory_parts()["events"] > parts["events"]  # HET: 4 events per pair, not 3


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_saved_replacement_fields_keep_their_packed_shape(policy):
    # each worker's heads, tails, lowest bucket and fill count sit on lines of its own in memory; a
    # checkpoint still holds them packed (as states saved before that layout), and restores the same order
    rng = np.random.default_rng(5)
    rows = [rng.integers(0, 400, (40, 2)) for _ in range(6)]
    allocs = [rng.integers(0, 3, 40).astype(np.int32) for _ in range(6)]
    state = _run_both(3, 400, 60, "ps", rows, allocs, policy)  # about 27 rows a worker a batch: caches fill
    arrays = state.save_arrays()
    buckets = 1 if policy == "lru" else 256
    assert arrays["lru_head"].shape == arrays["lru_tail"].shape == (3 * buckets,)
    assert arrays["used"].shape == arrays["lowest"].shape == (3,)
    assert arrays["used"].tolist() == [60, 60, 60]  # full: the last batches evicted
    loaded = ClusterState(n_workers=3, n_rows=400, capacity=60, full_set=False, max_pairs=80, policy=policy)
    loaded.load_arrays(arrays)
    assert loaded.digest() == state.digest() == state.copy().digest()
    assert all(loaded.lru_order(w) == state.lru_order(w) for w in range(3))


def test_need_records_follow_the_rows_a_batch_needs_not_max_pairs():
    # room for 500,000 pairs, but the needs table starts at 2**14 entries (8,192 rows at load 1/2) and its
    # records (8 B row, 8 B holder word, three 4 B fields, and the thread's 2 B stamp) with it, a block of
    # 64 per thread beyond; the thread's block claim and last stamp take a line each
    state = ClusterState(n_workers=3, n_rows=100_000, capacity=30_000, full_set=False, max_pairs=500_000)
    lines, table = 2 * 64, (2 << 14) * 8
    assert state.memory_parts()["needs"] == lines + table + (8_192 + 64) * 30  # not 500,064 records
    # 30,000 distinct rows fill it: it grows by 4x, records included, and the batch is trained whole
    rows = np.arange(30_000, dtype=np.int64)[:, None]
    state.set_needs(rows, (np.arange(30_000) % 3).astype(np.int32))
    assert state.memory_parts()["needs"] == lines + (2 << 16) * 8 + (32_768 + 64) * 30
    state.train()
    kind, worker, row, _ = state.events()
    pulled = kind == KIND_NAMES.index("pull")
    assert sorted(row[pulled].tolist()) == list(range(30_000))
    assert (worker[pulled] == row[pulled] % 3).all()


def _table_keys(rows, capacity, distance_bits=6):
    """(home, tag) of each row in a worker's row -> slot table of ``capacity`` slots, as the state computes
    them: the row's 64-bit mix, the home from its low 32 bits, the tag from the bits above that fit beside
    the slot and the distance."""
    x = rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    h = x ^ (x >> np.uint64(29))
    size = capacity + capacity // 2 + 1
    home = ((h & np.uint64(0xFFFFFFFF)) * np.uint64(size)) >> np.uint64(32)
    slot_bits = capacity.bit_length()
    tag_bits = 32 - slot_bits - min(distance_bits, (32 - slot_bits) // 2)
    return home, (h >> np.uint64(32)) & np.uint64((1 << tag_bits) - 1)


def test_rows_sharing_a_table_home_and_tag_keep_their_own_slots():
    # 2**20 slots leave a 6-bit tag: among 2**16 rows some pairs share both home and tag, so only the
    # confirmation in slot_row tells them apart (when found, and when one is evicted and the other moves back)
    capacity = 1 << 20
    candidates = np.arange(1 << 16, dtype=np.int64)
    home, tag = _table_keys(candidates, capacity)
    key = home * np.uint64(64) + tag
    order = np.argsort(key, kind="stable")
    same = np.flatnonzero(key[order][1:] == key[order][:-1])
    assert len(same), "no two rows share a home and a tag: the test needs more candidates"
    a, b = candidates[order[same[0]]], candidates[order[same[0] + 1]]
    state = ClusterState(n_workers=1, n_rows=1 << 21, capacity=capacity, full_set=True, max_pairs=capacity)
    others = np.arange(1 << 18, (1 << 18) + capacity - 2, dtype=np.int64)
    new = np.int64((1 << 18) + capacity)
    batches = [np.array([[a], [b]]), others[:, None], np.array([[new]])]
    state.set_needs(batches[0], np.zeros(2, dtype=np.int32))
    for t, rows in enumerate(batches):
        state.train()
        if t == 0:
            slots = {a: state.slot_of(0, a), b: state.slot_of(0, b)}
            assert sorted(slots.values()) == [0, 1]
        following = batches[t + 1] if t + 1 < len(batches) else None
        state.plan(following, None if following is None else np.zeros(len(following), dtype=np.int32))
    # the new row took the least recently used slot, a's; b is where it was
    assert state.slot_of(0, a) == -1
    assert state.slot_of(0, b) == slots[b]
    assert state.slot_of(0, new) == slots[a]
    cache = state.cache_rows(0)
    assert cache[slots[a]] == new and cache[slots[b]] == b


def test_a_thread_that_used_every_stamp_starts_again_from_clear_ones():
    # a thread tells a row's first use by its worker from a 16-bit stamp per (thread, need index), one
    # stamp per worker it collects: with 1,285 workers, worker 0 of the 52nd batch takes stamp 1 again,
    # as in the first. Need indices 1..99 were stamped then and never since: unless the stamps were
    # cleared, worker 0 would take rows 1..99 as already collected and pull row 0 only
    state = ClusterState(n_workers=1285, n_rows=1_000, capacity=200, full_set=False, max_pairs=1_000)
    many = np.arange(100, dtype=np.int64)[:, None]
    on_worker_0 = np.zeros(100, dtype=np.int32)
    state.set_needs(many, on_worker_0)
    for _ in range(50):
        state.set_needs(np.zeros((1, 1), dtype=np.int64), np.zeros(1, dtype=np.int32))
    state.set_needs(many, on_worker_0)
    state.train()
    kind, worker, row, _ = state.events()
    pulled = kind == KIND_NAMES.index("pull")
    assert sorted(row[pulled].tolist()) == list(range(100))
    assert (worker[pulled] == 0).all()

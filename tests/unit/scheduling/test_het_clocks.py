"""HET's staleness-bounded caches in the cluster state (docs/design.md section 7).

The Cython state is compared event for event (with each event's version or
update count) against the literal Python transcription in ``state_oracle``;
``staleness = 0`` must move exactly the rows of BSP's full-set
synchronization, and a larger staleness fewer.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hybrid._ext.cluster_state import KIND_NAMES, ClusterState, StateError
from state_oracle import OracleState
from test_cluster_state import instances


def _het_events(state):
    kind, worker, row, slot = state.events()
    values = np.zeros(len(kind), dtype=np.int64)
    for w in range(state.n_workers):  # the values come per worker and kind, in execution order
        mine = np.flatnonzero(worker == w)
        groups = state.worker_events(w) if state.staleness >= 0 else {}
        for name, group in groups.items():
            at = mine[kind[mine] == KIND_NAMES.index(name)]
            values[at] = group.get("versions", group.get("counts", np.zeros(len(at), np.int64)))
    return [(KIND_NAMES[k], int(w), int(e), int(s), int(v)) for k, w, e, s, v in zip(kind, worker, row, slot, values)]


def _state(n_workers, n_rows, capacity, rows, policy, staleness, distance_bits):
    return ClusterState(n_workers=n_workers, n_rows=n_rows, capacity=capacity, full_set=staleness is None,
                        max_pairs=rows[0].size, policy=policy, staleness=-1 if staleness is None else staleness,
                        distance_bits=distance_bits)


def _run(instance, staleness):
    """Step the state over the instance; per iteration its counts."""
    n_workers, n_rows, capacity, _, rows, allocs, policy, distance_bits = instance
    state = _state(n_workers, n_rows, capacity, rows, policy, staleness, distance_bits)
    state.set_needs(rows[0], allocs[0])
    counts = []
    for t in range(len(rows)):
        trained = state.train()
        planned = state.plan(rows[t + 1], allocs[t + 1]) if t + 1 < len(rows) else state.plan()
        counts.append({k: trained[k] + planned[k] for k in KIND_NAMES})
    return state, counts


@settings(max_examples=300, deadline=None)
@given(instances(), st.integers(0, 3))
def test_matches_the_literal_design(instance, staleness):
    n_workers, n_rows, capacity, _, rows, allocs, policy, distance_bits = instance
    state = _state(n_workers, n_rows, capacity, rows, policy, staleness, distance_bits)
    oracle = OracleState(n_workers, n_rows, capacity, False, policy=policy, staleness=staleness)
    state.set_needs(rows[0], allocs[0])
    oracle.set_needs(rows[0], allocs[0])
    written = set()
    for t in range(len(rows)):
        state.train()
        trained = _het_events(state)
        assert trained == oracle.train()
        early = state.prefetchable()
        assert early.tolist() == [kind == "pull" and e not in written for kind, _, e, _, _ in trained]
        written = {e for kind, _, e, _, _ in trained if kind in ("delta_push", "delta_writeback")}
        if t + 1 < len(rows):
            assert state.plan(rows[t + 1], allocs[t + 1])["plan_push"] == 0
            oracle.set_needs(rows[t + 1], allocs[t + 1])
        assert state.versions().tolist() == oracle.version
        for w in range(n_workers):
            cached = {int(e): s for s, e in enumerate(state.cache_rows(w)) if e >= 0}
            assert cached == dict(oracle.caches[w])


@settings(max_examples=200, deadline=None)
@given(instances())
def test_staleness_zero_moves_exactly_the_rows_of_bsp(instance):
    """Every update is pushed in its iteration and a row another worker pushed is read again."""
    _, bsp = _run(instance, None)
    _, het = _run(instance, 0)
    for vanilla, clocks in zip(bsp, het):
        assert clocks["pull"] == vanilla["pull"]
        assert clocks["delta_push"] == vanilla["full_set_push"] + vanilla["accumulate"]
        assert clocks["delta_writeback"] == clocks["local"] == 0
        assert clocks["version_check"] <= clocks["delta_push"], "only cached rows are checked"


@settings(max_examples=200, deadline=None)
@given(instances(), st.integers(1, 5))
def test_staleness_bounds_what_a_cache_keeps_and_never_pushes_more(instance, staleness):
    """No cached row holds more than s unpushed updates, and every push carries at least one update.

    (Whether a larger staleness also pulls fewer rows depends on the data:
    a late push can invalidate a copy that BSP would have refreshed
    earlier. The benchmarks measure it on real data.)
    """
    _, strict = _run(instance, 0)
    loose, counts = _run(instance, staleness)
    pushes = lambda c: sum(x["delta_push"] + x["delta_writeback"] for x in c)  # noqa: E731
    assert pushes(counts) <= pushes(strict)
    workers, rows, slots, pending = loose.flush_pending()
    assert (pending >= 1).all() and (pending <= staleness).all()
    assert loose.flush_pending()[0].size == 0, "flushed updates are pushed once"


def test_a_row_is_refetched_once_another_worker_pushed_more_than_s_updates():
    state = ClusterState(n_workers=2, n_rows=4, capacity=2, full_set=False, max_pairs=2, staleness=1)
    shared = np.array([[1], [1]], dtype=np.int64)
    both = np.array([0, 1], dtype=np.int32)
    state.set_needs(shared, both)
    assert state.train()["pull"] == 2 and state.counts()["local"] == 2  # 1 update each: kept (<= s)
    state.plan(shared, both)
    counts = state.train()  # second update each: 2 > s, pushed; the versions were still 0 when read
    assert (counts["version_check"], counts["pull"], counts["delta_push"]) == (2, 0, 2)
    assert state.versions()[1] == 4
    state.plan(shared, both)
    counts = state.train()  # each saw its own 2 of 4: 2 > s unseen -> refetched
    assert (counts["version_check"], counts["pull"]) == (2, 2)


def test_an_evicted_row_pushes_its_unpushed_updates():
    state = ClusterState(n_workers=1, n_rows=4, capacity=1, full_set=False, max_pairs=1, staleness=5)
    for row in (0, 1):
        state.set_needs(np.array([[row]], dtype=np.int64), np.zeros(1, np.int32))
        state.train()
    assert state.counts()["delta_writeback"] == 1
    assert state.worker_events(0)["delta_writeback"]["counts"].tolist() == [1]
    assert state.versions()[:2].tolist() == [1, 0]


def test_het_refuses_what_it_does_not_do():
    with pytest.raises(ValueError, match="replace full-set and P2P"):
        ClusterState(n_workers=2, n_rows=4, capacity=2, full_set=True, max_pairs=2, staleness=0)
    state = ClusterState(n_workers=2, n_rows=4, capacity=2, full_set=False, max_pairs=2, staleness=0)
    with pytest.raises(StateError, match="not checkpointed"):
        state.save_arrays()
    with pytest.raises(StateError, match="HET's"):
        ClusterState(n_workers=2, n_rows=4, capacity=2, full_set=False, max_pairs=2).flush_pending()

"""Allocation policies: balanced, deterministic, LAIA exactly as Algorithm 1."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hybrid._ext import laia
from hybrid._ext.cluster_state import ClusterState
from hybrid.allocation import (AdaptiveLaiaAllocation, ContiguousAllocation, LaiaAllocation, RandomAllocation,
                               TableProfiler, capacities, chunk_layout, interleaved_slots, margin_order)
from hybrid.brute_force import best_allocation, iteration_cost, scheduling_quality
from hybrid.counter_hash import hash3


@given(st.integers(1, 500), st.integers(1, 70))
def test_capacities_are_balanced_and_complete(n_samples, n_workers):
    cap = capacities(n_samples, n_workers)
    assert cap.sum() == n_samples and cap.max() - cap.min() <= 1
    slots = interleaved_slots(cap)
    assert np.array_equal(np.bincount(slots, minlength=n_workers), cap)


@given(st.integers(1, 300), st.integers(1, 9), st.integers(1, 12))
def test_chunks_split_samples_and_capacity_exactly(n_samples, n_workers, chunks):
    cap = capacities(n_samples, n_workers)
    starts, chunk_cap = chunk_layout(n_samples, cap, chunks)
    assert starts[0] == 0 and starts[-1] == n_samples
    assert np.array_equal(chunk_cap.sum(axis=1), np.diff(starts))
    assert np.array_equal(chunk_cap.sum(axis=0), cap)


def test_random_allocation_is_balanced_seeded_and_varies_per_iteration():
    policy = RandomAllocation(4, seed=1)
    rows = np.zeros((103, 2), dtype=np.int64)
    a0, a0_again, a1 = policy.allocate(rows, 0), policy.allocate(rows, 0), policy.allocate(rows, 1)
    assert np.array_equal(np.bincount(a0), capacities(103, 4))
    assert np.array_equal(a0, a0_again) and not np.array_equal(a0, a1)
    assert not np.array_equal(a0, RandomAllocation(4, seed=2).allocate(rows, 0))


def _state_with_history(n_workers, n_rows, rows_list, alloc_list, max_pairs):
    """A cluster state (on-demand mode) after training the given batches."""
    state = ClusterState(n_workers=n_workers, n_rows=n_rows, capacity=n_rows, full_set=False,
                         max_pairs=max_pairs)
    for rows, alloc in zip(rows_list, alloc_list):
        state.plan(rows, alloc)
        state.train()
    return state


@st.composite
def scored_batches(draw):
    n_workers = draw(st.integers(1, 6))
    per_worker = draw(st.integers(1, 5))
    n_tables = draw(st.integers(1, 4))
    n_rows = draw(st.integers(2, 40))
    seed = draw(st.integers(0, 2**32))
    shape = (n_workers * per_worker, n_tables)
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    history = [rng.integers(0, n_rows, size=shape) for _ in range(draw(st.integers(0, 3)))]
    allocs = [rng.permutation(np.repeat(np.arange(n_workers, dtype=np.int32), per_worker)) for _ in history]
    rows = rng.integers(0, n_rows, size=shape).astype(np.int64)
    return n_workers, n_rows, seed, history, allocs, rows


def _reference_algorithm_1(scores, capacity, seed, iteration):
    """Herald's Algorithm 1 in plain Python, with the documented tie-break hash."""
    remaining = list(capacity)
    stream = (iteration * 0x100000001B3 + 0x7A1E) % 2**64
    alloc = []
    for i, row in enumerate(scores):
        open_workers = [w for w in range(len(row)) if remaining[w] > 0]
        best = max(row[w] for w in open_workers)
        tied = [w for w in open_workers if row[w] == best]
        w = tied[int(hash3(seed, stream, i)) % len(tied)]
        remaining[w] -= 1
        alloc.append(w)
    return np.array(alloc, dtype=np.int32)


@settings(max_examples=150, deadline=None)
@given(scored_batches())
def test_laia_is_algorithm_1_on_fresh_counts(case):
    n_workers, n_rows, seed, history, allocs, rows = case
    state = _state_with_history(n_workers, n_rows, [h.astype(np.int64) for h in history], allocs, rows.size)
    holders = state.holder_sets()
    expected_scores = np.array([[holders[row, w + 1].sum() for w in range(n_workers)] for row in rows])
    policy = LaiaAllocation(state, seed)
    alloc = policy.allocate(rows, iteration=5)
    assert np.array_equal(policy._scores, expected_scores)
    assert np.array_equal(alloc, _reference_algorithm_1(expected_scores, capacities(len(rows), n_workers), seed, 5))
    assert np.array_equal(np.bincount(alloc, minlength=n_workers), capacities(len(rows), n_workers))


@settings(max_examples=60, deadline=None)
@given(scored_batches(), st.integers(1, 9))
def test_chunked_laia_does_not_depend_on_threads(case, chunks):
    n_workers, n_rows, seed, history, allocs, rows = case
    state = _state_with_history(n_workers, n_rows, [h.astype(np.int64) for h in history], allocs, rows.size)
    results = [LaiaAllocation(state, seed, chunks=chunks, threads=t).allocate(rows, 3) for t in (1, 2, 4)]
    assert all(np.array_equal(results[0], r) for r in results[1:])
    assert np.array_equal(np.bincount(results[0], minlength=n_workers), capacities(len(rows), n_workers))
    exact = LaiaAllocation(state, seed).allocate(rows, 3)
    assert np.array_equal(LaiaAllocation(state, seed, chunks=1).allocate(rows, 3), exact)


def test_laia_ties_follow_the_seed():
    state = ClusterState(n_workers=4, n_rows=10, capacity=10, full_set=False, max_pairs=64)
    rows = np.zeros((64, 1), dtype=np.int64)  # all scores 0: every choice is a tie
    a = LaiaAllocation(state, seed=1).allocate(rows, 0)
    assert np.array_equal(a, LaiaAllocation(state, seed=1).allocate(rows, 0))
    assert not np.array_equal(a, LaiaAllocation(state, seed=2).allocate(rows, 0))
    assert not np.array_equal(a, LaiaAllocation(state, seed=1).allocate(rows, 1))


def test_laia_sends_a_sample_where_its_rows_are_fresh():
    state = ClusterState(n_workers=2, n_rows=10, capacity=10, full_set=False, max_pairs=4)
    state.plan(np.array([[1, 2], [3, 4]], dtype=np.int64), np.array([0, 1], dtype=np.int32))
    state.train()  # rows 1, 2 dirty on worker 0; rows 3, 4 on worker 1
    alloc = LaiaAllocation(state, seed=0).allocate(np.array([[3, 9], [1, 2]], dtype=np.int64), 1)
    assert alloc.tolist() == [1, 0]


def test_score_kernel_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 3\)"):
        laia.score(holders=np.zeros(4, np.uint64), words=1, n_workers=3, rows=np.zeros((2, 1), np.int64),
                   tables=np.zeros(1, np.int32), out=np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError, match="capacities sum to 3, expected 2"):
        laia.allocate_exact(scores=np.zeros((2, 2), np.int32), capacity=np.array([2, 1]), seed=0, iteration=0)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.integers(2, 4), st.integers(4, 12))
def test_brute_force_is_never_worse_than_laia(seed, n_workers, n_rows):
    rng = np.random.default_rng(seed)
    state = ClusterState(n_workers=n_workers, n_rows=n_rows, capacity=n_rows, full_set=False,
                         max_pairs=n_workers * 2)
    batches = [rng.integers(0, n_rows, size=(n_workers, 2)).astype(np.int64) for _ in range(6)]
    quality = scheduling_quality(state, LaiaAllocation(state, seed), batches)
    assert quality.brute_force <= quality.heuristic
    assert 0 < quality.ratio <= 1.0


def test_brute_force_finds_the_obvious_optimum():
    state = ClusterState(n_workers=2, n_rows=6, capacity=6, full_set=False, max_pairs=4)
    state.plan(np.array([[0, 1], [2, 3]], dtype=np.int64), np.array([0, 1], dtype=np.int32))
    state.train()
    rows = np.array([[2, 3], [0, 1]], dtype=np.int64)
    best, cost = best_allocation(state, rows)
    assert best.tolist() == [1, 0] and cost == 0  # each sample back where its rows are dirty
    assert iteration_cost(state, rows, np.array([0, 1], dtype=np.int32)) == 8  # 4 plan pushes + 4 pulls


def test_profiler_degree_of_infrequency():
    profiler = TableProfiler([4, 3])  # rows 0-3 table 0, rows 4-6 table 1
    for _ in range(4):
        profiler.observe(np.array([[0, 4], [0, 5]], dtype=np.int64))  # row 0: 8 times, 4: 4, 5: 4
    profiler.observe(np.array([[1, 6]], dtype=np.int64))
    # 5 iterations: rows seen < 5 times are infrequent
    doi = profiler.degree_of_infrequency(np.array([0, 1, 4, 5, 6]))
    assert doi.tolist() == [0.5, 1.0]  # table 0: row 1 of rows {0, 1}; table 1: all of {4, 5, 6}


def test_adaptive_laia_scores_the_highest_doi_tables(criteo_like):
    from hybrid.data.store import BatchStore
    store = BatchStore(criteo_like)
    card = store.cardinalities
    offsets = np.concatenate([[0], np.cumsum(card)[:-1]])
    state = ClusterState(n_workers=4, n_rows=int(card.sum()), capacity=int(card.sum()) // 5, full_set=False,
                         max_pairs=64 * 26)
    adaptive = AdaptiveLaiaAllocation(state, 1, card, score_tables=4)
    for t, batch in zip(range(21), store.batches(64)):
        rows = batch.sparse.astype(np.int64) + offsets
        alloc = adaptive.allocate(rows, t)
        state.plan(rows, alloc)
        state.train()
    assert len(adaptive.tables) == 4
    chosen = set(adaptive.tables.tolist())
    assert min(adaptive.doi[list(chosen)]) >= max(np.delete(adaptive.doi, list(chosen)))
    assert adaptive.doi[[store.table_names.index("C3")]] > adaptive.doi[[store.table_names.index("C9")]]


def test_adaptive_laia_with_all_tables_is_laia():
    state = ClusterState(n_workers=3, n_rows=30, capacity=30, full_set=False, max_pairs=36)
    rng = np.random.default_rng(0)
    laia_policy = LaiaAllocation(state, 5)
    adaptive = AdaptiveLaiaAllocation(state, 5, [10, 10, 10])
    for t in range(25):
        rows = (rng.integers(0, 10, size=(12, 3)) + [0, 10, 20]).astype(np.int64)
        expected = laia_policy.allocate(rows, t)
        assert np.array_equal(adaptive.allocate(rows, t), expected)
        state.plan(rows, expected)
        state.train()


def test_a_budget_agreed_on_fixes_the_table_count_and_a_resume_keeps_it():
    """Training fixes k from the slowest rank's measured cost; measuring changes nothing the plans read."""
    state = ClusterState(n_workers=3, n_rows=40, capacity=40, full_set=False, max_pairs=48)
    rows = (np.random.default_rng(1).integers(0, 10, size=(12, 4)) + [0, 10, 20, 30]).astype(np.int64)
    adaptive = AdaptiveLaiaAllocation(state, 5, [10, 10, 10, 10], budget_ms=1.0)
    before = adaptive.save_arrays()
    assert adaptive.measure_cost_ms(rows) > 0
    assert np.array_equal(adaptive.save_arrays()["counts"], before["counts"]), "measuring counted accesses"
    assert adaptive.fix_table_count(0.3) == 3  # 1.0 ms // 0.3 ms per table
    adaptive.allocate(rows, 0)  # its own clock no longer changes the count
    assert adaptive.table_count() == 3
    resumed = AdaptiveLaiaAllocation(state, 5, [10, 10, 10, 10], budget_ms=1.0)
    resumed.load_arrays(adaptive.save_arrays())
    assert resumed.table_count() == 3


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(0, 2**32 - 1), st.data())
def test_the_confident_order_takes_the_largest_margins_first_and_respects_capacity(n_workers, n, seed, data):
    scores = np.array(data.draw(st.lists(st.lists(st.integers(0, 5), min_size=n_workers, max_size=n_workers),
                                         min_size=n, max_size=n)), dtype=np.int32).reshape(n, n_workers)
    order = margin_order(scores)
    assert sorted(order.tolist()) == list(range(n))
    if n_workers > 1:
        top = np.sort(scores, axis=1)
        margins = (top[:, -1] - top[:, -2])[order]
        assert (np.diff(margins) <= 0).all()
    capacity = capacities(n, n_workers)
    alloc = laia.allocate_exact(scores=scores, capacity=capacity, seed=seed, iteration=3, order=order)
    assert np.bincount(alloc, minlength=n_workers).tolist() == capacity.tolist()  # each sample once, capacity kept
    again = laia.allocate_exact(scores=scores, capacity=capacity, seed=seed, iteration=3, order=order)
    assert np.array_equal(alloc, again)


def test_when_capacity_allows_every_order_gives_each_sample_a_best_worker():
    scores = np.array([[3, 0], [0, 2], [1, 1], [2, 2]], dtype=np.int32)
    capacity = np.array([2, 2], dtype=np.int64)  # the two tied samples fit wherever the others go
    for order in (None, margin_order(scores)):
        alloc = laia.allocate_exact(scores=scores, capacity=capacity, seed=1, iteration=0, order=order)
        assert all(scores[i, alloc[i]] == scores[i].max() for i in range(4))
    with pytest.raises(ValueError, match="permutation"):
        laia.allocate_exact(scores=scores, capacity=capacity, seed=1, iteration=0, order=[0, 0, 1, 2])


def test_the_confident_order_allocates_alike_on_any_thread_count():
    allocations = []
    for threads in (1, 2):
        state = ClusterState(n_workers=4, n_rows=60, capacity=20, full_set=False, max_pairs=48)
        policy = LaiaAllocation(state, 9, threads=threads, confident=True)
        run = []
        for t in range(20):
            rows = (np.random.default_rng(t).integers(0, 20, size=(16, 3)) + [0, 20, 40]).astype(np.int64)
            alloc = policy.allocate(rows, t)
            state.plan(rows, alloc)
            state.train()
            run.append(alloc)
        allocations.append(np.stack(run))
    assert np.array_equal(*allocations)


def test_contiguous_allocation_gives_consecutive_shards():
    alloc = ContiguousAllocation(3).allocate(np.zeros((10, 2), dtype=np.int64), 0)
    assert alloc.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]

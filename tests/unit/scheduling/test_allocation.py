"""Allocation policies: balanced, deterministic, LAIA exactly as Algorithm 1."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hybrid._ext import laia
from hybrid._ext.laia import margin_order
from hybrid._ext.cluster_state import ClusterState
from hybrid.scheduling.allocation import (AdaptiveLaiaAllocation, ContiguousAllocation, LaiaAllocation, RandomAllocation,
                               TableProfiler, capacities, chunk_layout, interleaved_slots)
from hybrid.counter_hash import hash3
from hybrid.scheduling.brute_force import best_allocation, iteration_cost, scheduling_quality


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


def _reference_algorithm_1(scores, capacity, seed, iteration, samples=None):
    """Herald's Algorithm 1 in plain Python over a dense [samples, workers] score matrix, with the
    documented tie-break hash (of the sample's index in the batch: ``samples``, else its position)."""
    remaining = list(capacity)
    stream = (iteration * 0x100000001B3 + 0x7A1E) % 2**64
    alloc = []
    for i, row in enumerate(scores):
        open_workers = [w for w in range(len(row)) if remaining[w] > 0]
        best = max(row[w] for w in open_workers)
        tied = [w for w in open_workers if row[w] == best]
        w = tied[int(hash3(seed, stream, i if samples is None else int(samples[i]))) % len(tied)]
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


def _holder_words(bits):
    """Holder bits [rows, 64 * words] (bit 0 the PS, bit w + 1 worker w) as the state's uint64 words."""
    return np.packbits(bits, axis=1, bitorder="little").view(np.uint64).reshape(-1)


def _random_holder_bits(rng, n_rows, n_workers, density):
    """Each row's holders drawn at ``density``, in as many 64-bit words as PS + ``n_workers`` take."""
    words = (n_workers + 1 + 63) // 64
    bits = rng.random((n_rows, 64 * words)) < density
    bits[:, n_workers + 1:] = False
    return bits, words


def _holders_scoring(scores):
    """Holder words, word count and rows whose fresh counts are ``scores`` [samples, workers]: each
    count is that many rows fresh on that worker alone; row 0 (the PS's alone) pads the samples."""
    scores = np.asarray(scores)
    n, n_workers = scores.shape
    words = (n_workers + 1 + 63) // 64
    n_tables = max(1, int(scores.sum(axis=1).max()))
    rows = np.zeros((n, n_tables), dtype=np.int64)
    owners = [-1]  # the worker holding each row fresh
    for i in range(n):
        ids = [w for w in range(n_workers) for _ in range(scores[i, w])]
        rows[i, :len(ids)] = np.arange(len(owners), len(owners) + len(ids))
        owners += ids
    bits = np.zeros((len(owners), 64 * words), dtype=bool)
    bits[:, 0] = True
    for row, w in enumerate(owners[1:], start=1):
        bits[row] = False
        bits[row, w + 1] = True
    return dict(holders=_holder_words(bits), words=words, n_workers=n_workers, rows=rows,
                tables=np.arange(n_tables, dtype=np.int32))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([1, 2, 5, 63, 64, 70, 130]), st.integers(1, 60), st.integers(1, 4),
       st.sampled_from([0.01, 0.1, 0.5]), st.integers(0, 2**32 - 1), st.data())
def test_algorithm_1_from_the_holders_equals_it_on_the_dense_scores(n_workers, n, n_tables, density, seed, data):
    """The kernels count only the workers a sample's rows are fresh on; the reference scores every worker.
    Full workers (capacity 0 among them), ties, all-zero samples and several holder words included."""
    rng = np.random.default_rng(seed)
    bits, words = _random_holder_bits(rng, 40, n_workers, density)
    holders = _holder_words(bits)
    rows = rng.integers(0, 40, size=(n, n_tables)).astype(np.int64)
    tables = np.flatnonzero(rng.random(n_tables) < 0.7).astype(np.int32)  # adaptive LAIA scores a subset
    scores = bits[rows[:, tables]][:, :, 1:n_workers + 1].sum(axis=1)
    capacity = np.bincount(rng.integers(0, n_workers, size=n), minlength=n_workers).astype(np.int64)
    common = dict(holders=holders, words=words, n_workers=n_workers, rows=rows, tables=tables)
    order = data.draw(st.sampled_from([None, "margins", "random"]))
    if order == "margins":
        order = margin_order(laia.fresh_margins(**common))
    elif order == "random":
        order = rng.permutation(n).astype(np.int64)
    iteration = data.draw(st.integers(0, 100))
    alloc = laia.allocate_exact(capacity=capacity, seed=seed, iteration=iteration, order=order, **common)
    expected = _reference_algorithm_1(scores if order is None else scores[order], capacity, seed, iteration,
                                      samples=order)
    assert np.array_equal(alloc if order is None else alloc[order], expected)
    chunks = data.draw(st.integers(1, 5))
    starts, chunk_capacity = chunk_layout(n, capacities(n, n_workers), chunks)
    chunked = laia.allocate_chunked(chunk_capacity=chunk_capacity, chunk_start=starts, seed=seed,
                                    iteration=iteration, threads=2, **common)
    for c in range(len(starts) - 1):
        piece = slice(starts[c], starts[c + 1])
        assert np.array_equal(chunked[piece], _reference_algorithm_1(
            scores[piece], chunk_capacity[c], seed, iteration, samples=np.arange(starts[c], starts[c + 1])))


def test_allocation_kernels_reject_bad_input():
    common = _holders_scoring(np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match="capacities sum to 3, expected 2"):
        laia.allocate_exact(capacity=np.array([2, 1, 0]), seed=0, iteration=0, **common)
    with pytest.raises(ValueError, match=r"tables\[0\] = 5 is not a table"):
        laia.allocate_exact(capacity=np.array([1, 1, 0]), seed=0, iteration=0, **(common | {"tables": np.array([5], np.int32)}))
    with pytest.raises(ValueError, match="chunk_capacity: expected 3 workers, got 2"):
        laia.allocate_chunked(chunk_capacity=np.array([[1, 1]]), chunk_start=np.array([0, 2]), seed=0, iteration=0,
                              **common)
    with pytest.raises(ValueError, match="1 holder words cannot hold PS"):
        laia.allocate_exact(capacity=np.ones(64, np.int64), seed=0, iteration=0,
                            **(common | {"n_workers": 64, "rows": np.zeros((64, 1), np.int64)}))


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
    common = _holders_scoring(scores)
    gaps = laia.fresh_margins(**common)
    assert np.array_equal(gaps, laia.fresh_margins(threads=3, **common))
    order = margin_order(gaps)
    assert sorted(order.tolist()) == list(range(n))
    if n_workers > 1:
        top = np.sort(scores, axis=1)
        margins = (top[:, -1] - top[:, -2])[order]
        assert (np.diff(margins) <= 0).all()
        assert np.array_equal(order, np.argsort(top[:, -2] - top[:, -1], kind="stable"))  # ties: batch order
    capacity = capacities(n, n_workers)
    alloc = laia.allocate_exact(capacity=capacity, seed=seed, iteration=3, order=order, **common)
    assert np.bincount(alloc, minlength=n_workers).tolist() == capacity.tolist()  # each sample once, capacity kept
    again = laia.allocate_exact(capacity=capacity, seed=seed, iteration=3, order=order, **common)
    assert np.array_equal(alloc, again)


def _python_margins(holder_sets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per sample, its second-best fresh-row count over the workers less its best, in plain NumPy."""
    scores = holder_sets[rows][:, :, 1:].sum(axis=1)  # [samples, workers]
    if scores.shape[1] < 2:
        return np.zeros(len(rows), dtype=np.int32)
    top = np.sort(scores, axis=1)
    return (top[:, -2] - top[:, -1]).astype(np.int32)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 5, 70]), st.integers(1, 30), st.integers(1, 4), st.integers(0, 2**32 - 1),
       st.sampled_from([1, 3]))
def test_margins_read_from_the_holders_equal_the_margins_of_the_scores(n_workers, n, n_tables, seed, threads):
    """The orders read ``fresh_margins`` without a scores matrix; 70 workers: two holder words."""
    rng = np.random.default_rng(seed)
    n_rows = 50
    bits, words = _random_holder_bits(rng, n_rows, n_workers, 0.3)
    holders = _holder_words(bits)
    rows = rng.integers(0, n_rows, size=(n, n_tables)).astype(np.int64)
    tables = np.arange(n_tables, dtype=np.int32)[::2].copy()  # a subset of the tables, as adaptive LAIA scores
    common = dict(holders=holders, words=words, n_workers=n_workers, rows=rows, tables=tables)
    gaps = laia.fresh_margins(threads=threads, **common)
    assert np.array_equal(gaps, _python_margins(bits[:, :n_workers + 1], rows[:, tables]))


def test_when_capacity_allows_every_order_gives_each_sample_a_best_worker():
    scores = np.array([[3, 0], [0, 2], [1, 1], [2, 2]], dtype=np.int32)
    capacity = np.array([2, 2], dtype=np.int64)  # the two tied samples fit wherever the others go
    common = _holders_scoring(scores)
    for order in (None, margin_order(laia.fresh_margins(**common))):
        alloc = laia.allocate_exact(capacity=capacity, seed=1, iteration=0, order=order, **common)
        assert all(scores[i, alloc[i]] == scores[i].max() for i in range(4))
    with pytest.raises(ValueError, match="permutation"):
        laia.allocate_exact(capacity=capacity, seed=1, iteration=0, order=[0, 0, 1, 2], **common)


@pytest.mark.parametrize("choice", [{"confident": True}, {"cost": True}, {"cost": True, "confident": True},
                                    {"cost": True, "confident": True, "swap_rounds": 2}])
def test_the_new_orders_allocate_alike_on_any_thread_count(choice):
    allocations = []
    for threads in (1, 2):
        state = ClusterState(n_workers=4, n_rows=60, capacity=20, full_set=False, max_pairs=48)
        policy = LaiaAllocation(state, 9, threads=threads, **choice)
        run = []
        for t in range(20):
            rows = (np.random.default_rng(t).integers(0, 20, size=(16, 3)) + [0, 20, 40]).astype(np.int64)
            alloc = policy.allocate(rows, t)
            state.plan(rows, alloc)
            state.train()
            run.append(alloc)
        allocations.append(np.stack(run))
    assert np.array_equal(*allocations)


def _reference_cost_allocation(holders, rows, capacity, seed, iteration, order, full_set):
    """``laia.allocate_cost`` in plain Python, as its docstring states it (COMMON = 2, ties to the least loaded):
    one block that holds the whole batch."""
    return _reference_blocked_allocation(holders, rows, capacity, seed, iteration, order, full_set, 1, max(1, len(rows)))


@settings(max_examples=150, deadline=None)
@given(scored_batches(), st.booleans(), st.booleans())
def test_cost_scoring_places_each_sample_where_it_adds_the_fewest_reads(case, confident, full_set):
    n_workers, n_rows, seed, history, allocs, rows = case
    state = _state_with_history(n_workers, n_rows, [h.astype(np.int64) for h in history], allocs, rows.size)
    policy = LaiaAllocation(state, seed, cost=True, confident=confident, full_set=full_set)
    alloc = policy.allocate(rows, iteration=4)
    order = margin_order(_python_margins(state.holder_sets(), rows)) if confident else None
    expected = _reference_cost_allocation(state.holder_sets(), rows, capacities(len(rows), n_workers), seed, 4,
                                          order, full_set)
    assert np.array_equal(alloc, expected)
    assert np.array_equal(np.bincount(alloc, minlength=n_workers), capacities(len(rows), n_workers))


def _reference_blocked_allocation(holders, rows, capacity, seed, iteration, order, full_set, blocks, block_size):
    """``laia.allocate_cost(blocks=...)`` in plain Python, as ``place_blocks``' docstring states it: rounds of
    ``blocks`` contiguous blocks, each placing against the round's start plus its own placements, each worker
    keeping what its capacity allows in position order, the rest first in the next round."""
    n_workers = holders.shape[1] - 1
    seen = {r: (rows == r).sum() for r in np.unique(rows)}
    trains = {r: set() for r in seen}
    missing = dict.fromkeys(seen, 0)
    remaining, load = list(capacity), [0] * n_workers
    stream = (iteration * 0x100000001B3 + 0x7A1E) % 2**64
    alloc = np.full(len(rows), -1, dtype=np.int32)
    sequence, pending, pos = list(range(len(rows)) if order is None else order), [], 0

    def cost(r, w, my_trains, my_missing):
        if seen[r] >= 2 * n_workers or w in my_trains[r]:
            return 0
        if holders[r, w + 1]:
            return int(full_set)
        only_on_a_worker = holders[r].sum() == 1 and not holders[r, 0]
        return 1 + int(full_set) + int(only_on_a_worker and my_missing[r] == 0)

    def place(w, i, my_trains, my_missing):
        for r in rows[i]:
            if w not in my_trains[r]:
                my_trains[r].add(w)
                my_missing[r] += not holders[r, w + 1]

    while pos < len(sequence) or pending:
        taken = blocks * block_size - len(pending)
        now, pending, pos = pending + sequence[pos:pos + taken], [], pos + taken
        choice, added = {}, {}
        for b in range(blocks):
            my_trains, my_missing = {r: set(t) for r, t in trains.items()}, dict(missing)
            my_remaining, my_load = list(remaining), list(load)
            for p in range(b * len(now) // blocks, (b + 1) * len(now) // blocks):
                i = now[p]
                costs = {w: sum(cost(r, w, my_trains, my_missing) for r in rows[i])
                         for w in range(n_workers) if my_remaining[w] > 0}
                cheapest = [w for w, c in costs.items() if c == min(costs.values())]
                tied = [w for w in cheapest if my_load[w] == min(my_load[v] for v in cheapest)]
                w = choice[p] = tied[int(hash3(seed, stream, int(i))) % len(tied)]
                added[p] = costs[w]
                my_load[w] += costs[w]
                my_remaining[w] -= 1
                place(w, i, my_trains, my_missing)
        for p, i in enumerate(now):
            w = choice[p]
            if remaining[w] > 0:
                alloc[i], remaining[w], load[w] = w, remaining[w] - 1, load[w] + added[p]
                place(w, i, trains, missing)
            else:
                pending.append(i)
    return alloc


@settings(max_examples=150, deadline=None)
@given(scored_batches(), st.booleans(), st.booleans(), st.integers(2, 5), st.integers(1, 6), st.sampled_from([1, 3]))
def test_blocked_cost_scoring_places_as_its_rounds_say_on_any_thread_count(case, confident, full_set, blocks,
                                                                          block_size, threads):
    """Blocks place concurrently against the round's start; the result is the reference's whatever the threads."""
    n_workers, n_rows, seed, history, allocs, rows = case
    state = _state_with_history(n_workers, n_rows, [h.astype(np.int64) for h in history], allocs, rows.size)
    policy = LaiaAllocation(state, seed, cost=True, confident=confident, full_set=full_set, threads=threads,
                            blocks=blocks, block_size=block_size)
    alloc = policy.allocate(rows, iteration=4)
    order = margin_order(_python_margins(state.holder_sets(), rows)) if confident else None
    expected = _reference_blocked_allocation(state.holder_sets(), rows, capacities(len(rows), n_workers), seed, 4,
                                             order, full_set, blocks, block_size)
    assert np.array_equal(alloc, expected)
    assert np.array_equal(np.bincount(alloc, minlength=n_workers), capacities(len(rows), n_workers))


def test_blocks_need_cost_scoring_and_refuse_the_swap_pass():
    state = ClusterState(n_workers=2, n_rows=10, capacity=10, full_set=False, max_pairs=8)
    with pytest.raises(ValueError, match="scheduler.scoring=cost"):
        LaiaAllocation(state, seed=0, blocks=2)
    with pytest.raises(ValueError, match="swap_rounds needs scheduler.blocks=1"):
        LaiaAllocation(state, seed=0, cost=True, swap_rounds=1, blocks=2)
    with pytest.raises(ValueError, match="at least 1"):
        LaiaAllocation(state, seed=0, cost=True, block_size=0)
    rows, tables = np.array([[1, 2], [3, 4]], dtype=np.int64), np.arange(2, dtype=np.int32)
    with pytest.raises(ValueError, match="blocks=1"):
        laia.allocate_cost(holders=state.holder_words(), words=state.words, n_workers=2, rows=rows, tables=tables,
                           capacity=capacities(2, 2), seed=0, iteration=0, swap_rounds=1, blocks=2)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([2, 5, 70, 130]), st.integers(1, 60), st.integers(1, 4), st.sampled_from([0.02, 0.3]),
       st.integers(0, 2**32 - 1), st.sampled_from([1, 3]))
def test_cost_scoring_s_confident_order_reads_the_margins_of_the_holders(n_workers, n, n_tables, density, seed,
                                                                          threads):
    """``confident=True`` counts the margins from the batch's row records: the order of ``fresh_margins``."""
    rng = np.random.default_rng(seed)
    bits, words = _random_holder_bits(rng, 30, n_workers, density)
    common = dict(holders=_holder_words(bits), words=words,
                  n_workers=n_workers, rows=rng.integers(0, 30, size=(n, n_tables)).astype(np.int64),
                  tables=np.flatnonzero(rng.random(n_tables) < 0.7).astype(np.int32))
    placing = dict(capacity=capacities(n, n_workers), seed=seed, iteration=2, threads=threads)
    order = margin_order(laia.fresh_margins(**common))
    assert np.array_equal(laia.allocate_cost(confident=True, **placing, **common),
                          laia.allocate_cost(order=order, **placing, **common))
    with pytest.raises(ValueError, match="not both"):
        laia.allocate_cost(confident=True, order=order, **placing, **common)


def _batch_reads(holders, rows, alloc, full_set):
    """The cost model's reads of a whole allocation: per row (in under 2n samples) its pulls, the owner's plan
    push if anyone pulls, and with ``full_set`` one push per trainer."""
    n_workers = holders.shape[1] - 1
    total = 0
    for r in np.unique(rows):
        if (rows == r).sum() >= 2 * n_workers:
            continue
        trainers = set(alloc[(rows == r).any(axis=1)].tolist())
        pulls = sum(not holders[r, w + 1] for w in trainers)
        dirty = holders[r].sum() == 1 and not holders[r, 0]
        total += pulls + int(dirty and pulls > 0) + int(full_set) * len(trainers)
    return total


@settings(max_examples=150, deadline=None)
@given(scored_batches(), st.booleans(), st.integers(1, 3))
def test_the_swap_pass_only_makes_exchanges_that_lower_the_batch_s_reads(case, full_set, rounds):
    n_workers, n_rows, seed, history, allocs, rows = case
    state = _state_with_history(n_workers, n_rows, [h.astype(np.int64) for h in history], allocs, rows.size)
    greedy = LaiaAllocation(state, seed, cost=True, full_set=full_set).allocate(rows, 2)
    swapped = LaiaAllocation(state, seed, cost=True, full_set=full_set, swap_rounds=rounds).allocate(rows, 2)
    holders = state.holder_sets()
    assert np.array_equal(np.bincount(swapped, minlength=n_workers), capacities(len(rows), n_workers))
    moved = np.flatnonzero(greedy != swapped)
    assert rounds > 1 or len(moved) % 2 == 0  # one round: pairs exchange; later rounds may move a sample on
    if len(moved):
        assert _batch_reads(holders, rows, swapped, full_set) < _batch_reads(holders, rows, greedy, full_set)
    again = LaiaAllocation(state, seed, cost=True, full_set=full_set, swap_rounds=rounds).allocate(rows, 2)
    assert np.array_equal(swapped, again)


def test_the_swap_pass_exchanges_two_samples_the_greedy_order_misplaced():
    state = ClusterState(n_workers=2, n_rows=20, capacity=20, full_set=False, max_pairs=8)
    rows = np.array([[5], [6], [5], [6]], dtype=np.int64)  # nothing fresh: the greedy ties, then follows
    alloc = LaiaAllocation(state, seed=0, cost=True).allocate(rows, 0)
    swapped = LaiaAllocation(state, seed=0, cost=True, swap_rounds=1).allocate(rows, 0)
    assert _batch_reads(state.holder_sets(), rows, swapped, False) == 2  # each row read by one worker
    assert _batch_reads(state.holder_sets(), rows, alloc, False) >= 2
    with pytest.raises(ValueError, match="cost=True"):
        LaiaAllocation(state, seed=0, swap_rounds=1)


@settings(max_examples=100, deadline=None)
@given(scored_batches(), st.booleans())
def test_the_look_ahead_prices_the_next_batch_on_the_state_this_placement_leaves(case, full_set):
    n_workers, n_rows, seed, history, allocs, rows = case
    history = [h.astype(np.int64) for h in history]
    state = ClusterState(n_workers=n_workers, n_rows=n_rows, capacity=n_rows, full_set=full_set,
                         max_pairs=rows.size)  # no evictions: the look-ahead ignores them
    for h, a in zip(history, allocs):
        state.plan(h, a)
        state.train()
    upcoming = np.roll(rows, 1, axis=0)
    tables = np.arange(rows.shape[1], dtype=np.int32)
    alloc = LaiaAllocation(state, seed, cost=True, full_set=full_set).allocate(rows, 3)
    priced = laia.lookahead_cost(holders=state.holder_words(), words=state.words, n_workers=n_workers, rows=rows,
                                 alloc=alloc, rows_next=upcoming, tables=tables,
                                 capacity_next=capacities(len(upcoming), n_workers), seed=seed, iteration_next=4,
                                 full_set=full_set)
    before = _batch_reads(state.holder_sets(), rows, alloc, full_set)
    state.plan(rows, alloc)
    state.train()
    following = LaiaAllocation(state, seed, cost=True, full_set=full_set).allocate(upcoming, 4)
    assert priced == before + _batch_reads(state.holder_sets(), upcoming, following, full_set)


def test_looking_ahead_keeps_the_order_whose_pair_of_batches_reads_less():
    state = ClusterState(n_workers=3, n_rows=90, capacity=30, full_set=False, max_pairs=64)
    policy = LaiaAllocation(state, 5, cost=True, confident=True, lookahead=True)
    rng = np.random.default_rng(1)
    batches = [(rng.integers(0, 30, size=(12, 3)) + [0, 30, 60]).astype(np.int64) for _ in range(20)]
    chose_other = 0
    for t in range(len(batches) - 1):
        rows, upcoming = batches[t], batches[t + 1]
        alloc = policy.allocate(rows, t, upcoming)
        orders = {"confident": margin_order(_python_margins(state.holder_sets(), rows)), "arrival": None}
        candidates = {name: laia.allocate_cost(holders=state.holder_words(), words=state.words, n_workers=3,
                                               rows=rows, tables=np.arange(3, dtype=np.int32),
                                               capacity=capacities(12, 3), seed=5, iteration=t, order=order)
                      for name, order in orders.items()}
        priced = {name: laia.lookahead_cost(holders=state.holder_words(), words=state.words, n_workers=3,
                                            rows=rows, alloc=a, rows_next=upcoming,
                                            tables=np.arange(3, dtype=np.int32), capacity_next=capacities(12, 3),
                                            seed=5, iteration_next=t + 1) for name, a in candidates.items()}
        best = "confident" if priced["confident"] <= priced["arrival"] else "arrival"
        assert np.array_equal(alloc, candidates[best])
        chose_other += best == "arrival" and not np.array_equal(candidates["arrival"], candidates["confident"])
        assert np.array_equal(policy.allocate(rows, t), candidates["confident"])  # without the next batch
        state.plan(rows, alloc)
        state.train()
    assert chose_other > 0, "the test must see the look-ahead overrule the configured order"


def test_the_scheduler_hands_the_allocation_the_batch_after_next_only_when_it_looks_ahead():
    from hybrid.scheduling.scheduler import BatchStream
    batches = [np.full((2, 1), k) for k in range(3)]
    stream = BatchStream(batches, look_ahead=True)
    seen = []
    while (batch := stream.next()) is not None:
        following = stream.following()
        seen.append((int(batch[0, 0]), None if following is None else int(following[0, 0])))
    assert seen == [(0, 1), (1, 2), (2, None)]
    plain = BatchStream(batches, look_ahead=False)
    assert int(plain.next()[0, 0]) == 0 and plain.following() is None and int(plain.next()[0, 0]) == 1


def test_cost_scoring_keeps_a_batch_s_rare_rows_together_and_follows_dirty_rows():
    state = ClusterState(n_workers=2, n_rows=20, capacity=20, full_set=False, max_pairs=8)
    state.plan(np.array([[1], [2]], dtype=np.int64), np.array([0, 1], dtype=np.int32))
    state.train()  # row 1 dirty on worker 0, row 2 on worker 1
    rows = np.array([[7, 1], [7, 3], [8, 2], [8, 4]], dtype=np.int64)
    alloc = LaiaAllocation(state, seed=0, cost=True).allocate(rows, 1)
    assert alloc.tolist() == [0, 0, 1, 1]  # rows 7 and 8 each read once, rows 1 and 2 never
    with pytest.raises(ValueError, match="unchunked"):
        LaiaAllocation(state, seed=0, cost=True, chunks=2)


def test_contiguous_allocation_gives_consecutive_shards():
    alloc = ContiguousAllocation(3).allocate(np.zeros((10, 2), dtype=np.int64), 0)
    assert alloc.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("threads", [1, 2])
def test_cost_scoring_places_a_batch_larger_than_its_tables_as_the_reference(threads):
    """Cost scoring's tables are sized by the last batch's distinct rows (a reused scratch): a batch with
    many more fills them, is counted again in larger ones, and is placed as the plain-Python reference."""
    rng = np.random.default_rng(7)
    n_workers, n_rows, n_tables = 4, 40_000, 3
    history = [rng.integers(0, n_rows, size=(400, n_tables)).astype(np.int64) for _ in range(2)]
    allocs = [(np.arange(400) % n_workers).astype(np.int32) for _ in history]
    state = _state_with_history(n_workers, n_rows, history, allocs, 3000 * n_tables)
    scratch = laia.CostScratch()
    tables = np.arange(n_tables, dtype=np.int32)
    for samples, spread in ((40, 30), (3000, n_rows), (3000, 100)):  # 30 distinct rows, then ~8,500, then 100
        rows = rng.integers(0, spread, size=(samples, n_tables)).astype(np.int64)
        capacity = capacities(samples, n_workers)
        alloc = laia.allocate_cost(holders=state.holder_words(), words=state.words, n_workers=n_workers, rows=rows,
                                   tables=tables, capacity=capacity, seed=3, iteration=5, threads=threads,
                                   scratch=scratch)
        expected = _reference_cost_allocation(state.holder_sets(), rows, capacity, 3, 5, None, False)
        assert np.array_equal(alloc, expected)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("variant", [{}, {"confident": True}, {"swap_rounds": 1}])
def test_a_board_prepared_beside_the_batch_before_places_as_one_made_on_the_spot(threads, variant):
    """The pipeline of :class:`LaiaAllocation` with threads to spare: each batch's distinct rows are found
    while the batch before is placed (``beside``), then bound to the holders (``board``). Batches of 30,
    ~8,500 and 100 distinct rows make a board shaped beside fill the tables its scratch's history sizes."""
    rng = np.random.default_rng(11)
    n_workers, n_rows, n_tables = 4, 40_000, 3
    history = [rng.integers(0, n_rows, size=(400, n_tables)).astype(np.int64) for _ in range(2)]
    allocs = [(np.arange(400) % n_workers).astype(np.int32) for _ in history]
    state = _state_with_history(n_workers, n_rows, history, allocs, 3000 * n_tables)
    common = dict(holders=state.holder_words(), words=state.words, n_workers=n_workers, seed=3, threads=threads,
                  tables=np.arange(n_tables, dtype=np.int32), **variant)
    batches = [rng.integers(0, spread, size=(samples, n_tables)).astype(np.int64)
               for samples, spread in ((40, 30), (3000, n_rows), (3000, 100), (3000, n_rows), (40, 30))]
    scratches, board = [laia.CostScratch(), laia.CostScratch()], None
    for t, rows in enumerate(batches):
        capacity = capacities(len(rows), n_workers)
        beside = None if t + 1 == len(batches) else laia.next_board(
            rows=batches[t + 1], scratch=scratches[(t + 1) % 2],
            **{k: v for k, v in common.items() if k in ("words", "n_workers", "tables", "threads", "swap_rounds")})
        alloc = laia.allocate_cost(rows=rows, capacity=capacity, iteration=t, board=board, beside=beside,
                                   scratch=scratches[t % 2], **common)
        assert np.array_equal(alloc, laia.allocate_cost(rows=rows, capacity=capacity, iteration=t, **common)), t
        assert beside is None or (beside.shaped and not beside.bound)
        board = beside


def test_a_board_serves_one_allocation_of_its_own_batch():
    state = ClusterState(n_workers=2, n_rows=10, capacity=10, full_set=False, max_pairs=8)
    rows, tables = np.array([[1, 2], [3, 4]], dtype=np.int64), np.arange(2, dtype=np.int32)
    common = dict(holders=state.holder_words(), words=state.words, n_workers=2, tables=tables,
                  capacity=capacities(2, 2), seed=0, iteration=0)
    shaping = dict(words=state.words, n_workers=2, tables=tables)
    with pytest.raises(ValueError, match="another batch"):
        laia.allocate_cost(rows=rows, board=laia.next_board(rows=rows.copy(), **shaping), **common)
    with pytest.raises(ValueError, match="other tables"):
        laia.allocate_cost(rows=rows, board=laia.next_board(rows=rows, **{**shaping, "tables": tables[:1]}), **common)
    with pytest.raises(ValueError, match="pair_room=2"):
        laia.allocate_cost(rows=rows, board=laia.next_board(rows=rows, **shaping), swap_rounds=1, **common)
    scratch = laia.CostScratch()
    with pytest.raises(ValueError, match="scratch of its own"):
        laia.allocate_cost(rows=rows, board=laia.next_board(rows=rows, scratch=scratch, **shaping),
                           beside=laia.next_board(rows=rows, scratch=scratch, **shaping), **common)
    board = laia.next_board(rows=rows, **shaping)
    first = laia.allocate_cost(rows=rows, board=board, **common)
    assert np.array_equal(first, laia.allocate_cost(rows=rows, **common))
    with pytest.raises(ValueError, match="placed already"):
        laia.allocate_cost(rows=rows, board=board, **common)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-40_000, 40_000), max_size=300), st.integers(1, 40))
def test_margin_order_is_the_stable_sort_of_the_margins_whatever_their_range(values, spread):
    """The counting sort of margins spanning less than the batch and NumPy's stable sort give one order,
    ties in batch order; wider margins (no real batch has them) take the stable sort itself."""
    for gaps in (np.array(values, dtype=np.int32), np.array(values, dtype=np.int32) % spread - spread):
        assert np.array_equal(margin_order(gaps), np.argsort(gaps, kind="stable"))
        assert margin_order(gaps).dtype == np.int64


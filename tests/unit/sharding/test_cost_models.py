"""Cost models for shard planning: features that add up across a table's parts, order-free sets, fits that learn."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from hybrid.sharding.cost_models import (MAX_RANKS, N_BINS, N_FEATURES, CostModels, ServingCostModel, TableSlice,
                                access_histogram, comm_inputs, fit_comm, fit_serving, serving_inputs,
                                slice_features, split_indices, table_slice)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """These models are tiny: a second intra-op thread only adds overhead on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_access_histogram_known_bins():
    hist = access_histogram([1, 1, 2, 3, 4, 70000])
    expected = np.zeros(N_BINS)
    expected[[0, 1, 2, 16]] = [2 / 6, 2 / 6, 1 / 6, 1 / 6]
    assert hist.dtype == np.float64 and hist.shape == (N_BINS,)
    assert np.allclose(hist, expected)
    assert hist.sum() == pytest.approx(1.0)
    assert np.array_equal(access_histogram([]), np.zeros(N_BINS))
    with pytest.raises(ValueError, match=">= 1"):
        access_histogram([1, 0, 3])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 2**20), min_size=1, max_size=50))
def test_access_histogram_matches_bit_length(counts):
    expected = np.zeros(N_BINS)
    for c in counts:  # floor(log2(c)) is bit_length - 1, capped at the last bin
        expected[min(c.bit_length() - 1, N_BINS - 1)] += 1 / len(counts)
    assert np.allclose(access_histogram(np.array(counts, dtype=np.int64)), expected)


def test_table_slice_whole_table_known_values():
    s = table_slice([np.array([0, 0, 1, 5]), np.array([2, 2, 2])], 10, table=3, width=16, pooling=2.0)
    assert (s.table, s.rows, s.width, s.pooling, s.distinct, s.part) == (3, 10, 16, 2.0, 2.0, ("whole", 1, 0))
    expected = np.zeros(N_BINS)
    expected[:2] = [(2 / 3 + 0) / 2, (1 / 3 + 1) / 2]  # batch 1 counts 2,1,1; batch 2 count 3
    assert np.allclose(s.histogram, expected)


def test_table_slice_column_part_holds_every_row_at_the_given_width():
    batches = [np.array([0, 3, 3, 7])]
    whole = table_slice(batches, 8, table=0, width=64)
    cols = table_slice(batches, 8, table=0, width=16, part=("columns", 4, 1))
    assert (cols.rows, cols.width, cols.pooling, cols.distinct) == (8, 16, whole.pooling, whole.distinct)
    assert cols.histogram == whole.histogram


def test_table_slice_rejects_bad_input():
    with pytest.raises(ValueError, match="outside"):
        table_slice([np.array([0, 10])], 10, table=0, width=8)
    with pytest.raises(ValueError, match="index < parts"):
        table_slice([np.array([0])], 10, table=0, width=8, part=("rows", 2, 2))
    with pytest.raises(ValueError, match="kind"):
        table_slice([np.array([0])], 10, table=0, width=8, part=("diagonal", 2, 0))


@st.composite
def tables_and_batches(draw):
    cardinality = draw(st.integers(1, 60))
    ids = st.lists(st.integers(0, cardinality - 1), min_size=0, max_size=40)
    batches = [np.array(b, dtype=np.int64) for b in draw(st.lists(ids, min_size=1, max_size=4))]
    return cardinality, batches, draw(st.integers(1, 7)), draw(st.floats(0.5, 4.0))


@settings(max_examples=150, deadline=None)
@given(tables_and_batches())
def test_round_robin_row_parts_add_up_to_the_whole_table(case):
    cardinality, batches, k, pooling = case
    whole = table_slice(batches, cardinality, table=0, width=8, pooling=pooling)
    parts = [table_slice(batches, cardinality, table=0, width=8, pooling=pooling, part=("rows", k, j))
             for j in range(k)]
    assert sum(p.rows for p in parts) == cardinality
    assert whole.pooling == pooling
    assert sum(p.pooling for p in parts) == pytest.approx(pooling)
    assert sum(p.distinct for p in parts) == pytest.approx(whole.distinct)
    for b in batches:  # per batch the distinct rows split exactly
        one = [table_slice([b], cardinality, table=0, width=8, part=("rows", k, j)).distinct for j in range(k)]
        assert sum(one) == table_slice([b], cardinality, table=0, width=8).distinct
    for p in parts:
        assert sum(p.histogram) == pytest.approx(1.0 if p.distinct else 0.0)


def test_slices_are_hashable_cache_keys():
    a = table_slice([np.array([1, 2, 2])], 5, table=0, width=8)
    b = table_slice([np.array([1, 2, 2])], 5, table=0, width=8)
    cache = {frozenset([a]): 1.5}
    assert cache[frozenset([b])] == 1.5
    with pytest.raises(ValueError, match="bins"):
        TableSlice(table=0, rows=1, width=1, pooling=1.0, distinct=1.0, histogram=(1.0,))


def test_slice_features_scaling():
    hist = tuple(np.eye(N_BINS)[3])
    s = TableSlice(table=0, rows=2**16 - 1, width=64, pooling=0.5, distinct=2**10 - 1, histogram=hist)
    f = slice_features([s, s])
    assert f.dtype == np.float32 and f.shape == (2, N_FEATURES) and N_FEATURES == 21
    assert np.allclose(f[0], [0.5, 0.5, 0.5, 0.5, *hist])


def _random_slice(rng, table):
    rows = int(rng.integers(100, 1_000_000))
    return TableSlice(table=table, rows=rows, width=int(rng.choice([4, 8, 16, 32, 64, 128])),
                      pooling=float(rng.uniform(0.1, 1.0)), distinct=float(min(rows, rng.integers(1, 2048))),
                      histogram=tuple(rng.dirichlet(np.full(N_BINS, 0.3)).tolist()))


def test_deep_sets_ignore_order_and_padding():
    rng = np.random.default_rng(1)
    torch.manual_seed(0)
    model = ServingCostModel().eval()
    slices = [_random_slice(rng, t) for t in range(7)]
    x, mask = serving_inputs([slices, slices[::-1], slices[2:] + slices[:2], slices[:3]])
    x[3, 3:] = torch.randn(4, N_FEATURES) * 10  # garbage in the padding must not count
    with torch.no_grad():
        out = model(x, mask)
        alone = model(*serving_inputs([slices[:3]]))
        float_mask = model(x, mask.float())
    assert torch.allclose(out[:3], out[0].expand(3), rtol=1e-5, atol=1e-6)
    assert torch.allclose(out[3], alone[0], rtol=1e-5, atol=1e-6)
    assert torch.allclose(out, float_mask)
    empty_x, empty_mask = serving_inputs([[]])
    assert empty_x.shape == (1, 0, N_FEATURES) and model(empty_x, empty_mask).shape == (1,)


def test_comm_inputs_sort_pad_and_limit():
    x = comm_inputs([[2**8 - 1, 0, 2**16 - 1], []])
    assert x.shape == (2, MAX_RANKS)
    assert torch.allclose(x[0], torch.tensor([0.5, 0.25] + [0.0] * (MAX_RANKS - 2)))
    assert not x[1].any()
    with pytest.raises(ValueError, match="MAX_RANKS"):
        comm_inputs([[1] * (MAX_RANKS + 1)])


def test_split_is_seeded_and_holds_out_the_last_fifth():
    train, held = split_indices(10, 0.2, seed=3)
    again_train, again_held = split_indices(10, 0.2, seed=3)
    assert len(held) == 2 and sorted(train.tolist() + held.tolist()) == list(range(10))
    assert torch.equal(train, again_train) and torch.equal(held, again_held)


def _serving_cost(slices):
    return sum(0.002 * s.distinct * (1 + s.width / 64) for s in slices) + 0.05


def _comm_cost(bytes_per_rank):
    return 0.2 + max(bytes_per_rank) / 1e6  # a fixed latency plus the busiest rank at 1 GB/s


def _mean_baseline_error(y, train, held):
    """Held-out relative error of always predicting the mean training target (about 1.3 here)."""
    return float(np.mean(np.abs(y[held] - y[train].mean()) / y[held]))


@pytest.fixture(scope="module")
def serving_fit():
    rng = np.random.default_rng(0)
    sets = [[_random_slice(rng, t) for t in range(rng.integers(1, 13))] for _ in range(1500)]
    y = np.array([_serving_cost(s) for s in sets])
    return sets, y, fit_serving(sets, y, epochs=80, lr=3e-3, batch_size=128, seed=0)


@pytest.fixture(scope="module")
def comm_fit():
    rng = np.random.default_rng(0)
    bytes_lists = [10 ** rng.uniform(5, 7, size=rng.integers(1, MAX_RANKS + 1)) for _ in range(1500)]
    y = np.array([_comm_cost(b) for b in bytes_lists])
    return bytes_lists, y, fit_comm(bytes_lists, y, epochs=120, lr=3e-3, batch_size=128, seed=0)


def test_serving_model_learns_a_known_cost(serving_fit):
    sets, y, report = serving_fit
    train, held = split_indices(len(y), 0.2, seed=0)
    assert (report.n_train, report.n_held_out) == (1200, 300)
    assert report.held_out_mean_relative_error < 0.15  # measured 0.077 (seeds 0-4: 0.061-0.096)
    assert report.held_out_mean_relative_error < 0.2 * _mean_baseline_error(y, train.numpy(), held.numpy())
    models = CostModels(report.model, fit_comm([[1.0]], [1.0], epochs=0, held_out=0.0).model)
    pred = models.serving_ms_many([sets[i] for i in held.tolist()])
    assert np.mean(np.abs(pred - y[held.numpy()])) == pytest.approx(report.held_out_mean_abs_error_ms, rel=1e-4)
    assert models.serving_ms(sets[int(held[0])]) == pytest.approx(pred[0], rel=1e-6)


def test_comm_model_learns_a_known_cost(comm_fit):
    bytes_lists, y, report = comm_fit
    train, held = split_indices(len(y), 0.2, seed=0)
    assert report.held_out_mean_relative_error < 0.12  # measured 0.053 (seeds 0-4: 0.030-0.053)
    assert report.held_out_mean_relative_error < 0.2 * _mean_baseline_error(y, train.numpy(), held.numpy())
    models = CostModels(ServingCostModel(), report.model)
    b = bytes_lists[int(held[0])]
    assert models.comm_ms(b[::-1]) == models.comm_ms(b)  # which rank moves what does not matter


def test_fits_are_deterministic_per_seed():
    rng = np.random.default_rng(2)
    sets = [[_random_slice(rng, t) for t in range(rng.integers(1, 5))] for _ in range(40)]
    y = [_serving_cost(s) for s in sets]
    a, b = (fit_serving(sets, y, epochs=3, seed=5) for _ in range(2))
    c = fit_serving(sets, y, epochs=3, seed=6)
    x, mask = serving_inputs(sets)
    with torch.no_grad():
        assert torch.equal(a.model(x, mask), b.model(x, mask))
        assert not torch.equal(a.model(x, mask), c.model(x, mask))


def test_save_load_round_trip(serving_fit, comm_fit, tmp_path):
    sets, _, serving = serving_fit
    bytes_lists, _, comm = comm_fit
    models = CostModels.from_fits(serving, comm, collected_by="test", dim=64)
    path = tmp_path / "costs.pt"
    models.save(path)
    loaded = CostModels.load(path)
    assert np.array_equal(loaded.serving_ms_many(sets[:50]), models.serving_ms_many(sets[:50]))
    assert all(loaded.comm_ms(b) == models.comm_ms(b) for b in bytes_lists[:20])
    assert loaded.metadata["dim"] == 64 and loaded.metadata["collected_by"] == "test"
    assert loaded.metadata["serving_fit"]["held_out_mean_relative_error"] == serving.held_out_mean_relative_error


def test_loading_other_files_fails_clearly(tmp_path):
    text = tmp_path / "plan.json"
    text.write_text('{"not": "a model"}')
    tensor = tmp_path / "tensor.pt"
    torch.save({"weights": torch.zeros(3)}, tensor)
    for path in (text, tensor):
        with pytest.raises(ValueError, match="not a cost-model file"):
            CostModels.load(path)
    with pytest.raises(ValueError, match="plain JSON"):
        CostModels(ServingCostModel(), fit_comm([[1.0]], [1.0], epochs=0, held_out=0.0).model,
                   {"bad": object()}).save(tmp_path / "x.pt")

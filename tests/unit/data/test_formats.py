"""Each public format round-trips through ``preprocess``; malformed input fails with file:line."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hybrid.cli import main
from hybrid.data.formats import FormatError
from hybrid.data.preprocess import MISSING_ID, RARE_ID, preprocess, read_vocabulary
from hybrid.data.store import BatchStore

HEX = st.sampled_from(["", "68fd1e64", "80e26c9b", "fb936136", "7b4723c4", "25c83c98", "0a519c5c"])
DENSE = st.sampled_from(["", "0", "1", "5", "-1", "-3", "120", "98765"])
CRITEO_ROW = st.tuples(st.sampled_from(["0", "1"]), st.lists(DENSE, min_size=13, max_size=13),
                       st.lists(HEX, min_size=26, max_size=26))


def _decode(store_dir, store, table):
    vocab = read_vocabulary(store_dir, table)
    column = store.table_names.index(table)
    return [vocab[i] for i in store.sparse()[:, column]]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(CRITEO_ROW, min_size=1, max_size=40))
def test_criteo_round_trip(tmp_path_factory, rows):
    tmp = tmp_path_factory.mktemp("criteo")
    lines = ["\t".join([label, *dense, *cats]) for label, dense, cats in rows]
    (tmp / "day_0").write_text("\n".join(lines) + "\n")
    preprocess([tmp / "day_0"], tmp / "store", format_name="criteo")
    store = BatchStore(tmp / "store")
    assert store.n_samples == len(rows) and store.n_tables == 26 and store.n_dense == 13
    assert list(store.labels()) == [float(label) for label, _, _ in rows]
    for t in range(26):
        expected = [cats[t] or None for _, _, cats in rows]
        assert _decode(tmp / "store", store, f"C{t + 1}") == expected
    dense = np.asarray(np.load(tmp / "store" / "dense.npy"))
    expected_dense = [[np.log1p(max(float(x), 0.0)) if x else 0.0 for x in d] for _, d, _ in rows]
    assert np.allclose(dense, np.asarray(expected_dense, dtype=np.float32))


def test_ids_are_by_frequency_and_rare_values_share_one_id(tmp_path):
    cats = ["aa", "bb", "bb", "cc", "cc", "cc", "", "dd"]
    lines = ["\t".join(["1"] + ["1"] * 13 + [c] + ["0"] * 25) for c in cats]
    (tmp_path / "f").write_text("\n".join(lines) + "\n")
    preprocess([tmp_path / "f"], tmp_path / "all", format_name="criteo")
    preprocess([tmp_path / "f"], tmp_path / "min2", format_name="criteo", min_count=2)
    ids_all = BatchStore(tmp_path / "all").sparse()[:, 0]
    ids_min2 = BatchStore(tmp_path / "min2").sparse()[:, 0]
    # most frequent first, ties by value: cc=2, bb=3, aa=4, dd=5; missing = 0
    assert list(ids_all) == [4, 3, 3, 2, 2, 2, MISSING_ID, 5]
    assert list(ids_min2) == [RARE_ID, 3, 3, 2, 2, 2, MISSING_ID, RARE_ID]
    assert BatchStore(tmp_path / "min2").cardinalities[0] == 4


def test_several_files_are_concatenated_in_order(tmp_path):
    row = lambda label: "\t".join([label] + ["2"] * 13 + ["ab"] * 26)
    (tmp_path / "day_0").write_text(row("0") + "\n")
    (tmp_path / "day_1").write_text(row("1") + "\n" + row("1") + "\n")
    preprocess([tmp_path / "day_0", tmp_path / "day_1"], tmp_path / "s", format_name="criteo")
    assert list(BatchStore(tmp_path / "s").labels()) == [0, 1, 1]


def test_avazu_round_trip(tmp_path):
    header = "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category," \
             "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21"
    rows = [["1000009418151094273", "0", "14102100", "1005", "0", "1fbe01fe", "f3845767", "28905ebd",
             "ecad2386", "7801e8d9", "07d7df22", "a99f214a", "ddd2926e", "44956a24", "1", "2", "15706",
             "320", "50", "1722", "0", "35", "-1", "79"],
            ["10000169349117863715", "1", "14102100", "1005", "0", "1fbe01fe", "f3845767", "28905ebd",
             "ecad2386", "7801e8d9", "07d7df22", "a99f214a", "96809ac8", "711ee120", "1", "0", "15704",
             "320", "50", "1722", "0", "35", "100084", "79"]]
    (tmp_path / "train.csv").write_text(header + "\n" + "\n".join(",".join(r) for r in rows) + "\n")
    preprocess([tmp_path / "train.csv"], tmp_path / "s", format_name="avazu")
    store = BatchStore(tmp_path / "s")
    assert store.n_tables == 22 and store.n_dense == 0
    assert list(store.labels()) == [0.0, 1.0]
    assert _decode(tmp_path / "s", store, "device_ip") == ["ddd2926e", "96809ac8"]
    assert _decode(tmp_path / "s", store, "C20") == ["-1", "100084"]


@pytest.mark.parametrize("name, text", [
    ("u.data", "196\t242\t3\t881250949\n186\t302\t5\t881250000\n22\t377\t4\t881250001\n"),
    ("ratings.dat", "196::242::3::881250949\n186::302::5::881250000\n22::377::4::881250001\n"),
    ("ratings.csv", "userId,movieId,rating,timestamp\n196,242,3.0,881250949\n186,302,5.0,881250000\n"
                    "22,377,4.5,881250001\n"),
])
def test_movielens_variants_are_time_ordered(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    preprocess([tmp_path / name], tmp_path / "s", format_name="movielens")
    store = BatchStore(tmp_path / "s")
    user_table = store.table_names[0]
    assert _decode(tmp_path / "s", store, user_table) == ["186", "22", "196"]  # by timestamp
    assert list(store.labels()) == [1.0, 1.0, 0.0]  # rating >= 4
    preprocess([tmp_path / name], tmp_path / "f", format_name="movielens", keep_file_order=True)
    assert _decode(tmp_path / "f", BatchStore(tmp_path / "f"), user_table) == ["196", "186", "22"]


def test_criteo_search_round_trip_with_minus_one_missing(tmp_path):
    row1 = ["0", "-1", "-1", "1598891820", "1", "140.0"] + ["-1", "7E56C27BFF0305E788DA55A029EC4988"] + \
           ["-1"] * 11 + ["0A4D4D8B6B7E73AEC7E43BF7", "B9D5DA0D0A3B7F5D", "3F4C6B5E", "C0D3E4F5"]
    row2 = ["1", "10.5", "3600", "1598891821", "-1", "-1"] + ["4C", "7E56C27BFF0305E788DA55A029EC4988"] + \
           ["X"] * 11 + ["0A4D4D8B6B7E73AEC7E43BF7", "-1", "3F4C6B5E", "C0D3E4F5"]
    (tmp_path / "search.tsv").write_text("\t".join(row1) + "\n" + "\t".join(row2) + "\n")
    preprocess([tmp_path / "search.tsv"], tmp_path / "s", format_name="criteo-search")
    store = BatchStore(tmp_path / "s")
    assert store.n_tables == 17 and store.n_dense == 2
    assert list(store.labels()) == [0.0, 1.0]
    assert _decode(tmp_path / "s", store, "product_age_group") == [None, "4C"]
    assert _decode(tmp_path / "s", store, "product_title") == ["B9D5DA0D0A3B7F5D", None]
    dense = np.load(tmp_path / "s" / "dense.npy")
    assert np.allclose(dense, [[np.log1p(1), np.log1p(140.0)], [0.0, 0.0]])


CRITEO_OK = "\t".join(["1"] + ["3"] * 13 + ["a1b2c3d4"] * 26)


@pytest.mark.parametrize("fmt, name, text, message", [
    ("criteo", "day_0", CRITEO_OK + "\n" + CRITEO_OK + "\n" + "\t".join(["1"] * 39) + "\n",
     "day_0:3: expected 40 columns, found 39"),
    ("criteo", "day_0", CRITEO_OK + "\n" + CRITEO_OK.replace("a1b2c3d4", "zz-top", 1) + "\n",
     "day_0:2: column C1: invalid value 'zz-top'"),
    ("criteo", "day_0", CRITEO_OK + "\n" + CRITEO_OK.replace("\t3\t", "\tthree\t", 1) + "\n",
     "day_0:2: column I1: invalid value 'three'"),
    ("criteo", "day_0", CRITEO_OK + "\n\n" + CRITEO_OK + "\n", "day_0:2: empty line"),
    ("criteo", "day_0", "", "day_0: empty file"),
    ("movielens", "u.data", "1\t2\t5\t100\nx7\t2\t5\t101\n", "u.data:2: column user: invalid value 'x7'"),
    ("movielens", "ratings.csv", "1,2,5.0,100\n", "ratings.csv:1: expected the header"),
    ("avazu", "train.csv", "1,0," + ",".join(["a"] * 22) + "\n", "train.csv:1: expected the header"),
    ("criteo-search", "s.tsv", "\t".join(["2"] + ["1"] * 22) + "\n", "s.tsv:1: column Sale: invalid value '2'"),
])
def test_malformed_input_fails_with_file_line_and_leaves_nothing(tmp_path, fmt, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(FormatError) as info:
        preprocess([tmp_path / name], tmp_path / "out", format_name=fmt)
    assert message in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_line_numbers_count_lines_across_reader_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr("hybrid.data.formats.BLOCK_BYTES", 4096)
    lines = [CRITEO_OK] * 999 + [CRITEO_OK.replace("a1b2c3d4", "nothex!", 1)]
    (tmp_path / "day_0").write_text("\n".join(lines) + "\n")
    with pytest.raises(FormatError, match="day_0:1000: column C1"):
        preprocess([tmp_path / "day_0"], tmp_path / "out", format_name="criteo")


def test_cli_reports_bad_input_and_exits_non_zero(tmp_path, capsys):
    (tmp_path / "day_0").write_text("1\t2\n")
    code = main(["preprocess", "--format", "criteo", "--out", str(tmp_path / "out"), str(tmp_path / "day_0")])
    assert code != 0
    assert "day_0:1: expected 40 columns, found 2" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_truncated_gzip_input_is_named_and_leaves_nothing(tmp_path, monkeypatch):
    """An interrupted download: the error names the file and says what is wrong, and no store is written."""
    import gzip

    monkeypatch.setattr("hybrid.data.formats.BLOCK_BYTES", 4096)
    text = "".join(f"{u % 97}\t{u % 89}\t{1 + u % 5}\t{1000 + u}\n" for u in range(20000))
    whole = gzip.compress(text.encode())
    (tmp_path / "u.data.gz").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(FormatError) as info:
        preprocess([tmp_path / "u.data.gz"], tmp_path / "out", format_name="movielens")
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'u.data.gz'}: cannot be read past line ") and "truncated" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.data.gz"]

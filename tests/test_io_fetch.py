"""fetch / fetch_table: pointers to records in pointer order, across datasets and formats (issue #4)."""
import json
import os
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon import StaticMixtureWorkSource
from zephon.io import Dataset, block_span, fetch, fetch_table, take_rows
from zephon.io._take import chunk_of

PARQUET_COUNTS = [13, 0, 29, 7]
JSONL_COUNTS = [6, 11, 0]
RECORDS = [[{"id": 1000 + 10 * s + o, "text": f"mem {s}/{o}"} for o in range(n)] for s, n in enumerate([4, 2])]


def row_id(dataset, shard, offset):
    """The ``id`` column of a record: ``dataset * 10**6 + shard * 1000 + offset``."""
    return dataset * 10**6 + shard * 1000 + offset


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("fetch")
    for s, n in enumerate(PARQUET_COUNTS):
        ids = [row_id(0, s, o) for o in range(n)]
        table = pa.table({"id": pa.array(ids, pa.int64()), "text": [f"pq {i}" for i in ids]})
        os.makedirs(root / "pq", exist_ok=True)
        pq.write_table(table, root / "pq" / f"{s:03d}.parquet", row_group_size=5)
    for s, n in enumerate(JSONL_COUNTS):
        os.makedirs(root / "js", exist_ok=True)
        with open(root / "js" / f"{s:03d}.jsonl", "w") as file:
            for o in range(n):
                file.write(json.dumps({"id": row_id(1, s, o), "text": f"js {row_id(1, s, o)}"}) + "\n")
    cache = root / "cache"
    return {0: Dataset.from_path("pq", root / "pq", cache_dir=cache, cache_shards=2),
            1: Dataset.from_path("js", root / "js", cache_dir=cache),
            2: Dataset.from_records("mem", RECORDS)}


def expected(pointer):
    d, s, o = pointer
    if d == 2:
        return RECORDS[s][o]
    i = row_id(d, s, o)
    return {"id": i, "text": f"{'pq' if d == 0 else 'js'} {i}"}


@st.composite
def pointer_lists(draw):
    tables = {0: PARQUET_COUNTS, 1: JSONL_COUNTS, 2: [4, 2]}
    valid = [(d, s, o) for d, counts in tables.items() for s, n in enumerate(counts) for o in range(n)]
    return draw(st.lists(st.sampled_from(valid), max_size=60))


@given(pointer_lists())
def test_fetch_returns_exactly_the_rows_at_the_pointers_in_order(datasets, pointers):
    want = [expected(p) for p in pointers]
    assert fetch(datasets, pointers) == want
    assert fetch(datasets, np.array(pointers, dtype=np.int64).reshape(-1, 3)) == want
    table = fetch_table(datasets, pointers)
    assert table.num_rows == len(pointers)
    if pointers:
        assert table.to_pylist() == want
    assert fetch(datasets, pointers, columns=["id"]) == [{"id": w["id"]} for w in want]


@given(st.integers(0, 3), st.lists(st.integers(0, 10**6), max_size=40), st.sampled_from([None, ["text"]]))
def test_gather_hands_out_the_pieces_whose_rows_a_take_picks(datasets, shard, draws, columns):
    count = PARQUET_COUNTS[shard]
    offsets = np.array([d % count for d in draws] if count else [], dtype=np.int64)
    tables, rows = datasets[0].gather(shard, offsets, columns)
    want = datasets[0].read_table(shard, offsets, columns)
    assert pa.concat_tables(tables).take(pa.array(rows, pa.int64())).equals(want)
    assert len(tables) <= -(-count // 5) + (not len(offsets))  # each row group of 5 rows once at most
    js_tables, js_rows = datasets[1].gather(0, [5, 0], columns)  # not columnar: its read_table, as one table
    assert len(js_tables) == 1 and js_rows.tolist() == [0, 1]
    assert js_tables[0].equals(datasets[1].read_table(0, [5, 0], columns))


def test_fetch_table_combines_datasets_by_column_name(tmp_path):
    a = Dataset.from_records("a", [[{"id": 1, "x": "a"}, {"id": 2, "x": "b"}]])
    b = Dataset.from_records("b", [[{"id": 3}]])
    table = fetch_table({0: a, 1: b}, [(1, 0, 0), (0, 0, 1), (0, 0, 0)])
    assert table.to_pylist() == [{"id": 3, "x": None}, {"id": 2, "x": "b"}, {"id": 1, "x": "a"}]
    assert fetch({0: a, 1: b}, [(1, 0, 0), (0, 0, 1)]) == [{"id": 3}, {"id": 2, "x": "b"}]
    c = Dataset.from_records("c", [[{"id": "three"}]])
    with pytest.raises(ValueError, match="do not combine"):
        fetch_table({0: a, 1: c}, [(0, 0, 0), (1, 0, 0)])
    assert fetch_table({0: a}, []).num_rows == 0 and fetch({0: a}, []) == []


def test_bad_pointers_raise(datasets):
    with pytest.raises(IndexError, match="dataset 7.*ids \\[0, 1, 2\\]"):
        fetch(datasets, [(7, 0, 0)])
    with pytest.raises(IndexError, match="'pq', shard 3 .*003.parquet.*offset 7 is out of range \\[0, 7\\)"):
        fetch(datasets, [(0, 0, 0), (0, 3, 7)])
    with pytest.raises(IndexError, match="'js' has no shard 5"):
        fetch_table(datasets, [(1, 5, 0)])
    with pytest.raises(TypeError, match="\\(n, 3\\)"):
        fetch(datasets, [(0, 0)])
    with pytest.raises(TypeError, match="\\(n, 3\\)"):
        fetch(datasets, np.zeros((2, 3), dtype=np.float64))
    with pytest.raises(TypeError, match="count-only"):
        fetch({0: Dataset.from_counts("c", [3])}, [(0, 0, 1)])


def test_groups_run_in_order_of_their_last_pointer_so_the_next_chunks_shards_stay_cached(tmp_path):
    for s in range(3):
        os.makedirs(tmp_path / "d", exist_ok=True)
        pq.write_table(pa.table({"id": list(range(10))}), tmp_path / "d" / f"{s}.parquet")
    d = Dataset.from_path("d", tmp_path / "d", cache_shards=1)
    fetch({0: d}, [(0, 2, 0), (0, 0, 0), (0, 1, 0), (0, 0, 1)])  # shard 0 ends the chunk
    assert d.cache_info()["misses"] == 3
    fetch({0: d}, [(0, 0, 5)])
    assert d.cache_info()["misses"] == 3 and d.cache_info()["hits"] == 1


@pytest.mark.parametrize("shuffles", [{}, {"shuffle_within_shard": True},
                                      {"shuffle_within_shard": True, "shuffle_block_size": "auto"}])
def test_a_mixture_over_parquet_datasets_streams_records_whose_ids_match(tmp_path, shuffles):
    """A StaticMixtureWorkSource over Parquet datasets: every fetched record's ``id`` column matches its pointer."""
    counts = {"web": [40, 25, 0, 33], "code": [18, 30]}
    datasets = []
    for d, (name, shard_counts) in enumerate(counts.items()):
        for s, n in enumerate(shard_counts):
            os.makedirs(tmp_path / name, exist_ok=True)
            ids = [row_id(d, s, o) for o in range(n)]
            pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "name": [name] * n}),
                           tmp_path / name / f"part-{s:02d}.parquet", row_group_size=8)
        datasets.append(Dataset.from_path(name, tmp_path / name))
    source = StaticMixtureWorkSource(datasets, {"web": 0.6, "code": 0.4}, chunk_size=16, seed=3,
                                     exhausted_policy="redistribute", **shuffles)
    lane = source.clone_for_lane(0, 1)
    block = shuffles.get("shuffle_block_size")
    for dataset, plan in zip(datasets, lane.config.datasets):
        dataset.configure_cache(max_shards=block_span(dataset.counts(), plan.block_size if block else None))
    seen = Counter()
    while (chunk := lane.next_chunk()) is not None:
        for name, pointers in chunk.components.items():
            records = fetch(lane.datasets_by_id, pointers)
            assert [r["id"] for r in records] == [row_id(*map(int, p)) for p in pointers]
            assert {r["name"] for r in records} <= {name}
            table = fetch_table(lane.datasets_by_id, pointers, columns=["id"])
            assert table.column("id").to_pylist() == [r["id"] for r in records]
            seen.update(r["id"] for r in records)
    every = {row_id(d, s, o) for d, c in enumerate(counts.values()) for s, n in enumerate(c) for o in range(n)}
    assert set(seen) == every and set(seen.values()) == {1}  # one pass: every row exactly once


@given(st.lists(st.integers(0, 5), min_size=1, max_size=6), st.data())
def test_take_rows_is_arrows_take_without_joining_the_chunks(sizes, data):
    tables = [pa.table({"i": pa.array(range(100 * k, 100 * k + n), pa.int64()),
                        "s": pa.array([f"r{k}.{j}" for j in range(n)], pa.string())})
              for k, n in enumerate(sizes)]
    table = pa.concat_tables(tables)
    rows = np.array(data.draw(st.lists(st.integers(0, max(table.num_rows - 1, 0)), max_size=30))
                    if table.num_rows else [], dtype=np.int64)
    want = table.combine_chunks().take(pa.array(rows, pa.int64()))
    assert take_rows(table, rows).equals(want)
    assert take_rows(table.column("s"), rows).to_pylist() == want.column("s").to_pylist()


@given(st.lists(st.integers(0, 6), max_size=8), st.data())
def test_chunk_of_is_a_search_of_the_chunk_ends(lengths, data):
    """Both ways of ``chunk_of`` (a table of each row's chunk, taken when the rows are many
    beside the chunks', else a binary search) give ``searchsorted``'s chunks, empty chunks and
    rows outside them included."""
    ends = np.cumsum(lengths, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    anywhere = st.integers(-3, 60)
    inside = st.integers(0, total - 1) if total else anywhere
    rows = np.array(data.draw(st.lists(inside | anywhere, max_size=40) | st.lists(inside, max_size=40)),
                    dtype=np.int64)
    assert chunk_of(ends, rows).tolist() == np.searchsorted(ends, rows, side="right").tolist()


def plan_reference(pointers):
    """What ``_plan`` computes: positions grouped per (dataset, shard) in input order, the groups
    by (dataset, shard), then the groups' indices by their last position."""
    groups = {}
    for position in range(len(pointers)):
        groups.setdefault(tuple(pointers[position, :2].tolist()), []).append(position)
    groups = [groups[key] for key in sorted(groups)]
    return groups, sorted(range(len(groups)), key=lambda g: max(groups[g]))


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 9)), max_size=60),
       st.sampled_from([0, 70_000, 1 << 40, -(1 << 62)]))
def test_fetch_plans_shards_as_its_reference(pointers, spread):
    """One radix pass, two (a key of more than 16 bits) and the lexsort fallback (more than 32)."""
    from zephon.io._fetch import _plan

    array = np.array(pointers, dtype=np.int64).reshape(-1, 3)
    if len(array) and spread:
        array[0, 1] = spread  # a shard id far from the others
    groups, run_order = _plan(array)
    want_groups, want_order = plan_reference(array)
    assert [g.tolist() for g in groups] == want_groups and run_order == want_order

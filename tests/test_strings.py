"""The strings kernel (string columns gathered as bytes, then made str) against its twins, and its refusals."""
from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon._ext.strings import gather, strings
from zephon.io import gather_columns, take_records, take_rows
from zephon.io._take import Located, gather_reference, gather_strings, strings_reference
from zephon.torch._collate import Strings, gathered_columns


@st.composite
def columns(draw: st.DrawFn) -> tuple[list[pa.Array], np.ndarray]:
    """String chunks (some sliced, some large_string) and rows of their concatenation."""
    kind = draw(st.sampled_from([pa.string(), pa.large_string()]))
    chunks = []
    for values in draw(st.lists(st.lists(st.text(max_size=6), max_size=8), min_size=1, max_size=5)):
        array = pa.array(["pad"] + values + ["pad"], kind)
        chunks.append(array.slice(1, len(values)) if draw(st.booleans()) else pa.array(values, kind))
    total = sum(len(chunk) for chunk in chunks)
    rows = draw(st.lists(st.integers(0, total - 1), max_size=40)) if total else []
    return chunks, np.array(rows, dtype=np.int64)


@given(columns())
def test_gathered_rows_are_arrows_take_of_the_concatenation(case):
    chunks, rows = case
    offsets, data = gather_strings(chunks, Located(chunks, rows))
    want = pa.chunked_array(chunks, chunks[0].type).take(pa.array(rows, pa.int64())).to_pylist()
    assert strings(offsets, data) == strings_reference(offsets, data) == want
    cuts = sorted({0, len(rows), *rows.tolist()[:3]} & set(range(len(rows) + 1)))
    for a, b in zip(cuts[:-1], cuts[1:]):
        assert Strings(offsets[a:b + 1] - offsets[a], data[offsets[a]:offsets[b]]).values() == want[a:b]


@given(columns(), st.data())
def test_the_kernel_matches_its_twin(case, data):
    chunks, _ = case
    width = data.draw(st.sampled_from([np.int32, np.int64]))  # as Arrow keeps string and large_string offsets
    offsets = [np.cumsum([0] + [len(v.encode()) for v in chunk.to_pylist()], dtype=width) for chunk in chunks]
    blobs = [np.frombuffer("".join(chunk.to_pylist()).encode(), dtype=np.uint8) for chunk in chunks]
    pairs = [(c, r) for c, chunk in enumerate(chunks) for r in range(len(chunk))]
    picked = data.draw(st.lists(st.sampled_from(pairs), max_size=30)) if pairs else []
    chunk = np.array([c for c, _ in picked], dtype=np.int64)
    local = np.array([r for _, r in picked], dtype=np.int64)
    got, want = gather(offsets, blobs, chunk, local), gather_reference(offsets, blobs, chunk, local)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_an_empty_chunk_without_offsets_gathers_nothing():
    empty = pa.Array.from_buffers(pa.string(), 0, [None, pa.py_buffer(b""), pa.py_buffer(b"")])
    empty.validate(full=True)
    chunks = [empty, pa.array(["x"])]
    offsets, data = gather_strings(chunks, Located(chunks, np.array([0, 0])))
    assert strings(offsets, data) == ["x", "x"]


def test_a_batch_of_strings_crosses_a_pickle_as_its_bytes():
    chunks = [pa.array(["é", "", "ab"])]
    offsets, data = gather_strings(chunks, Located(chunks, np.array([2, 0, 1])))
    batch = pickle.loads(pickle.dumps(Strings(offsets, data), protocol=4))
    assert batch.values() == ["ab", "é", ""] and batch.data.tobytes() == "abé".encode()


def test_rows_and_offsets_outside_their_chunks_are_refused():
    offsets, data = [np.array([0, 2, 3], dtype=np.int64)], [np.frombuffer(b"abc", dtype=np.uint8)]
    with pytest.raises(ValueError, match="row 1 names row 2 of chunk 0, which does not exist"):
        gather(offsets, data, np.array([0, 0]), np.array([0, 2]))
    with pytest.raises(ValueError, match="names row 0 of chunk 1"):
        gather(offsets, data, np.array([1]), np.array([0]))
    with pytest.raises(ValueError, match="offsets 2..9 of row 1 are outside its 3 bytes"):
        gather([np.array([0, 2, 9], dtype=np.int64)], data, np.array([0]), np.array([1]))
    with pytest.raises(ValueError, match="2 offsets arrays for 1 data arrays"):
        gather(offsets * 2, data, np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match="offsets are float64, not int32 or int64"):
        gather([np.array([0.0, 2.0])], data, np.array([0]), np.array([0]))
    with pytest.raises(ValueError, match="1 chunk ids for 2 rows"):
        gather(offsets, data, np.array([0]), np.array([0, 1]))
    with pytest.raises(ValueError, match="row 1 spans bytes 2..1 of 3"):
        strings(np.array([0, 2, 1]), data[0])
    with pytest.raises(ValueError, match="start at 1"):
        strings(np.array([1, 2]), data[0])
    with pytest.raises(ValueError, match="no offsets"):
        strings(np.array([], dtype=np.int64), data[0])
    with pytest.raises(UnicodeDecodeError):
        strings(np.array([0, 1]), np.frombuffer(b"\xff", dtype=np.uint8))


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.lists(st.integers(1, 5), min_size=1, max_size=4),
       st.data())
def test_gathered_columns_are_the_tables_rows_whatever_each_columns_chunks(first, second, data):
    """Two string columns chunked alike or not, and a column of ints: each gathered column is
    Arrow's take of the table's rows."""
    rows_total = min(sum(first), sum(second))
    text = [f"r{i}·" * (i % 3) for i in range(rows_total)]

    def chunked(sizes, kind):
        cuts = [0, *[c for c in np.cumsum(sizes).tolist() if c < rows_total], rows_total]
        return pa.chunked_array([pa.array(text[a:b], kind) for a, b in zip(cuts[:-1], cuts[1:])], kind)

    table = pa.table({"a": chunked(first, pa.string()), "b": chunked(second, pa.large_string()),
                      "n": pa.chunked_array([pa.array(range(rows_total), pa.int64())])})
    rows = np.array(data.draw(st.lists(st.integers(0, rows_total - 1), max_size=20)), dtype=np.int64)
    got = gathered_columns(table, rows)
    want = table.take(pa.array(rows, pa.int64()))
    assert got["a"].values() == got["b"].values() == want.column("a").to_pylist()
    assert got["n"].to_pylist() == want.column("n").to_pylist()
    cut = data.draw(st.integers(0, len(rows)))
    assert got["a"].rows(0, cut).values() + got["a"].rows(cut, len(rows)).values() == want.column("a").to_pylist()


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    """Tables of string, large_string, dictionary, binary and int64 columns, some
    with nulls, each cut into its own chunks (slices of one array, so most start at an offset),
    their names drawn with repeats allowed."""
    kinds = {"s": pa.string(), "l": pa.large_string(), "d": pa.string(), "b": pa.binary(), "i": pa.int64()}
    makers = {"b": lambda i: b"x%d" % i, "i": lambda i: i}
    rows = draw(st.integers(0, 12))
    names = draw(st.lists(st.sampled_from(sorted(kinds)), max_size=5))
    columns = []
    for name in names:
        nulls = draw(st.booleans())
        make = makers.get(name, lambda i: "é" * (i % 3) + str(i))
        whole = pa.array([None if nulls and draw(st.booleans()) else make(draw(st.integers(0, 99))) for _ in range(rows)],
                         kinds[name])
        whole = whole.dictionary_encode() if name == "d" else whole
        cuts = sorted(draw(st.lists(st.integers(0, rows), max_size=3)))
        columns.append(pa.chunked_array([whole.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, rows])], whole.type))
    return pa.Table.from_arrays(columns, names=names) if names else pa.table({})


@given(tables(), st.data())
def test_taken_records_are_arrows_rows_as_python(table, data):
    """``take_records`` (strings gathered by the kernel, other columns taken by Arrow) makes
    the very records of Arrow's ``take`` and ``to_pylist``: values, types, key order."""
    rows = np.array(data.draw(st.lists(st.integers(0, table.num_rows - 1), max_size=20)) if table.num_rows else [],
                    dtype=np.int64)
    got = take_records(table, rows)
    want = take_rows(table, rows).to_pylist()
    assert got == want and [list(record) for record in got] == [list(record) for record in want]
    assert all(type(a) is type(b) for g, w in zip(got, want) for a, b in zip(g.values(), w.values()))


def test_records_of_a_table_without_columns_are_empty_and_rows_outside_are_refused():
    table = pa.table({"a": [1, 2, 3]})
    assert take_records(table.select([]), np.array([2, 0])) == [{}, {}]
    for row in (-1, 3):
        with pytest.raises(IndexError, match=f"row {row} is outside the table's 3 rows"):
            gather_columns(table, np.array([0, row]))

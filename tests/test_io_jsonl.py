"""JSONL datasets written by hand: the line index, blank lines, compression, bad lines (issue #4)."""
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.io import Dataset, _jsonl
from zephon.io._fs import Entry, locate


@pytest.fixture(autouse=True)
def _no_cache_env(monkeypatch, tmp_path):
    monkeypatch.delenv("ZEPHON_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def write(directory, name, text):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "wb") as file:
        file.write(text.encode() if isinstance(text, str) else text)
    return path


def lines(*records, end="\n"):
    return "".join(json.dumps(r) + end for r in records)


@pytest.mark.parametrize("text, rows", [
    ('{"a": 1}\n{"a": 2}\n', 2),  # trailing newline
    ('{"a": 1}\n{"a": 2}', 2),  # none
    ('{"a": 1}\n{"a": 2}\n\n', 2),  # a blank last line
    ('{"a": 1}\n{"a": 2}\n  \t\n\n', 2),  # several whitespace-only last lines
    ('{"a": 1}\r\n{"a": 2}\r\n', 2),  # CRLF
    ('\n\n{"a": 1}\n\n\n{"a": 2}\n', 2),  # blank lines anywhere are skipped
    ('', 0),  # empty file
    ('\n \n', 0),  # only blank lines
    ('  {"a": 1}  \n', 1),  # surrounding spaces are part of the record
])
def test_blank_lines_are_not_records_wherever_they_are(tmp_path, text, rows):
    write(tmp_path / "d", "a.jsonl", text)
    d = Dataset.from_path("d", tmp_path / "d")
    assert d.counts().tolist() == [rows]
    assert d.read(0, list(range(rows))) == [{"a": i + 1} for i in range(rows)]
    assert d.raw_bytes().tolist() == [len(text.encode())]


def _scan(path):
    location = locate(os.path.dirname(path))
    return _jsonl.scan(location, Entry(os.path.basename(path), os.path.getsize(path), 0))


def test_index_offsets_are_record_starts_then_the_length(tmp_path):
    path = write(tmp_path, "a.jsonl", '{"a": 1}\n\n{"b": 22}\n')
    scanned = _scan(path)
    assert scanned.index.tolist() == [0, 10, 20] and scanned.columns == (("a", "json"),)


@settings(max_examples=40)
@given(st.lists(st.sampled_from(["rec", "blank", "spaces"]), max_size=40), st.booleans(), st.integers(1, 64))
def test_the_blockwise_index_equals_a_line_by_line_reading(kinds, final_newline, block):
    import tempfile
    parts, records = [], []
    for i, kind in enumerate(kinds):
        if kind == "rec":
            records.append({"i": i, "pad": "x" * (i % 7)})
            parts.append(json.dumps(records[-1]))
        else:
            parts.append("" if kind == "blank" else " \t ")
    text = "\n".join(parts) + ("\n" if final_newline else "")
    with tempfile.TemporaryDirectory() as folder:
        path = write(folder, "a.jsonl", text)
        old, _jsonl.BLOCK = _jsonl.BLOCK, block
        try:
            index = _scan(path).index
        finally:
            _jsonl.BLOCK = old
    content = text.encode()
    assert len(index) == len(records) + 1 and index[-1] == len(content)
    assert [json.loads(content[s:e]) for s, e in zip(index[:-1], index[1:])] == records


def test_read_follows_the_order_asked_and_projects(tmp_path):
    write(tmp_path / "d", "0.jsonl", lines(*({"id": i, "t": str(i)} for i in range(5))))
    write(tmp_path / "d", "1.jsonl", lines(*({"id": 10 + i, "t": "x"} for i in range(3))))
    d = Dataset.from_path("d", tmp_path / "d")
    assert d.columns() == ("id", "t")
    assert [r["id"] for r in d.read(0, np.array([4, 0, 2, 2]))] == [4, 0, 2, 2]
    assert d.read(1, [2], columns=["id"]) == [{"id": 12}]
    table = d.read_table(0, [3, 1])
    assert isinstance(table, pa.Table) and table.column("id").to_pylist() == [3, 1]


def test_gzip_and_zstd_files_are_read_through_pyarrow_codecs(tmp_path):
    text = lines(*({"id": i} for i in range(7))) + "\n"
    write(tmp_path / "d", "a.jsonl.gz", gzip.compress(text.encode()))
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as stream:
        stream.write(text.encode())
    write(tmp_path / "d", "b.jsonl.zst", sink.getvalue().to_pybytes())
    write(tmp_path / "d", "c.jsonl", text)
    d = Dataset.from_path("d", tmp_path / "d")
    assert d.counts().tolist() == [7, 7, 7]
    assert d.raw_bytes()[0] == os.path.getsize(tmp_path / "d" / "a.jsonl.gz")
    for shard in range(3):
        assert d.read(shard, [6, 0]) == [{"id": 6}, {"id": 0}]
    assert d.cache_info()["bytes"] == 0  # only the last shard (plain, memory-mapped) is held


def test_invalid_json_line_raises_naming_file_and_line_only_when_read(tmp_path):
    write(tmp_path / "d", "a.jsonl", '{"a": 1}\n\n{"a": 2}\n{"a": oops}\n{"a": 4}\n')
    d = Dataset.from_path("d", tmp_path / "d")
    assert d.counts().tolist() == [4]
    assert d.read(0, [0, 1, 3]) == [{"a": 1}, {"a": 2}, {"a": 4}]  # byte ranges: line 4 is never parsed
    with pytest.raises(ValueError, match="a.jsonl, line 4: invalid JSON"):
        d.read(0, [2])


def test_an_invalid_first_line_is_reported_when_cataloging(tmp_path):
    write(tmp_path / "d", "a.jsonl", '\n{"a": \n')
    with pytest.raises(ValueError, match="a.jsonl, line 2: invalid JSON"):
        Dataset.from_path("d", tmp_path / "d")


def test_lines_that_are_not_objects_raise(tmp_path):
    write(tmp_path / "d", "a.jsonl", '{"a": 1}\n[1, 2]\n')
    d = Dataset.from_path("d", tmp_path / "d")
    with pytest.raises(ValueError, match="a.jsonl, line 2: expected a JSON object per line, got list"):
        d.read(0, [1])
    write(tmp_path / "e", "a.jsonl", '3\n')
    with pytest.raises(ValueError, match="line 1: expected a JSON object"):
        Dataset.from_path("e", tmp_path / "e")


def test_invalid_utf8_raises_naming_the_line(tmp_path):
    write(tmp_path / "d", "a.jsonl", b'{"a": 1}\n{"a": "\xff\xfe"}\n')
    d = Dataset.from_path("d", tmp_path / "d")
    with pytest.raises(ValueError, match="a.jsonl, line 2"):
        d.read(0, [1])


def test_a_missing_projected_column_raises_naming_file_line_and_column(tmp_path):
    write(tmp_path / "d", "a.jsonl", '{"a": 1, "b": 2}\n{"a": 3}\n')
    d = Dataset.from_path("d", tmp_path / "d")
    assert d.read(0, [0], columns=["b"]) == [{"b": 2}]
    with pytest.raises(ValueError, match="a.jsonl, line 2: no column 'b'"):
        d.read(0, [1], columns=["b"])


def test_keys_differing_across_files_raise_naming_both_files_and_the_column(tmp_path):
    write(tmp_path / "d", "a.jsonl", lines({"id": 1, "text": "x"}))
    write(tmp_path / "d", "b.jsonl", lines({"id": 2, "body": "y"}))
    write(tmp_path / "d", "c.jsonl", "")
    with pytest.raises(ValueError, match="'text'.*a.jsonl.*b.jsonl"):
        Dataset.from_path("d", tmp_path / "d")
    assert Dataset.from_path("d", tmp_path / "d", check_schema=False).counts().tolist() == [1, 1, 0]


def test_corrupted_compressed_file_raises_naming_it(tmp_path):
    write(tmp_path / "d", "a.jsonl.gz", b"\x1f\x8b this is not gzip")
    with pytest.raises(ValueError, match="a.jsonl.gz"):
        Dataset.from_path("d", tmp_path / "d")


def test_out_of_range_offsets_raise_index_error(tmp_path):
    write(tmp_path / "d", "a.jsonl", lines({"a": 1}, {"a": 2}))
    d = Dataset.from_path("notes", tmp_path / "d")
    with pytest.raises(IndexError, match="'notes', shard 0 .*a.jsonl.*offset 2 is out of range \\[0, 2\\)"):
        d.read(0, [2])


def test_a_file_changed_under_a_reused_catalog_is_detected_on_read(tmp_path):
    write(tmp_path / "d", "a.jsonl", lines({"a": 1}, {"a": 2}))
    d = Dataset.from_path("d", tmp_path / "d")
    write(tmp_path / "d", "a.jsonl", lines({"a": 1}))
    with pytest.raises(ValueError, match="a.jsonl.*changed since its catalog"):
        d.read(0, [0])


REWRITE = """
import json, sys
from zephon.io import Dataset, ShardChangedError
path = sys.argv[1] + "/a.jsonl"
d = Dataset.from_path("d", sys.argv[1])
assert d.read(0, [0]) == [{"id": 0, "text": "x" * 20}]
with open(path, "w") as file:  # rewritten in place, shorter: the mapped pages past its new end are gone
    file.write(json.dumps({"id": 0}) + "\\n")
try:
    d.read(0, [199])
except ShardChangedError as error:
    print("changed:", error)
"""


def test_a_local_file_rewritten_in_place_between_reads_is_a_shard_changed_error_not_a_crash(tmp_path):
    write(tmp_path / "d", "a.jsonl", lines(*({"id": i, "text": "x" * 20} for i in range(200))))
    done = subprocess.run([sys.executable, "-c", REWRITE, str(tmp_path / "d")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr  # reading the mapping past the file's new end: SIGBUS (-7)
    assert "changed: Dataset 'd', shard 0" in done.stdout and "the file changed" in done.stdout

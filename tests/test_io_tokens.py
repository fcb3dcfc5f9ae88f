"""Token files (Megatron .bin/.idx, datatrove .ds/.ds.index, flat files): every document read back
exactly, from any offsets, local and in object storage; bad files refused naming the file."""
import os
import struct

import numpy as np
import pyarrow.fs as pafs
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import zephon.io._tokens as token_io
import zephon.io.catalog as catalog
from zephon.io import Dataset, fetch

from helpers import write_datatrove, write_megatron
from s3_server import s3_client


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def small_pieces(monkeypatch):
    """Pieces of 3 documents, so a few documents cross piece boundaries."""
    monkeypatch.setattr(token_io, "PIECE_DOCUMENTS", 3)


documents = st.lists(st.lists(st.integers(0, 60000), max_size=12), max_size=20)
files_of_documents = st.lists(documents, min_size=1, max_size=3)


def every_document(dataset, rng):
    """Each shard's documents read back in a random order, as lists, in shard order."""
    out = []
    for shard, count in zip(dataset.ids().tolist(), dataset.counts().tolist()):
        order = rng.permutation(count)
        records = dataset.read(shard, order)
        docs = [None] * count
        for i, record in zip(order.tolist(), records):
            assert record["num_tokens"] == len(record["input_ids"])
            docs[i] = record["input_ids"].tolist()
        out.append(docs)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=files_of_documents, split=st.integers(1, 3), dtype=st.sampled_from(["uint16", "int32"]),
       seed=st.integers(0, 2**16))
def test_megatron_documents_read_back_exactly(tmp_path_factory, small_pieces, files, split, dtype, seed):
    folder = tmp_path_factory.mktemp("megatron")
    for i, docs in enumerate(files):
        write_megatron(folder / f"part_{i}_text_document", docs, dtype, split)
    dataset = Dataset.from_megatron("web", folder / "part_*_text_document")
    assert dataset.counts().tolist() == [len(docs) for docs in files]
    assert dataset.tokens().tolist() == [sum(map(len, docs)) for docs in files]
    assert dataset.exact_tokens_per_byte() == 1 / np.dtype(dtype).itemsize
    assert every_document(dataset, np.random.default_rng(seed)) == files


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=files_of_documents, token_size=st.sampled_from([2, 4]), seed=st.integers(0, 2**16))
def test_datatrove_documents_read_back_exactly(tmp_path_factory, small_pieces, files, token_size, seed):
    folder = tmp_path_factory.mktemp("datatrove")
    for i, docs in enumerate(files):
        write_datatrove(folder / f"{i:05d}_shuffled.ds", docs, token_size)
    (folder / "00000_shuffled.ds.metadata").write_text("tokenizer\n0\n0")
    dataset = Dataset.from_token_files("web", folder)
    assert dataset.counts().tolist() == [len(docs) for docs in files]
    assert every_document(dataset, np.random.default_rng(seed)) == files


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=documents, seed=st.integers(0, 2**16))
def test_flat_files_cut_at_eos_or_at_given_lengths(tmp_path_factory, small_pieces, docs, seed):
    folder = tmp_path_factory.mktemp("flat")
    eos = 60001
    with_eos = [d + [eos] for d in docs]
    path = folder / "tokens.bin"
    path.write_bytes(np.array(sum(with_eos, []), dtype="<u2").tobytes())
    by_eos = Dataset.from_token_files("web", path, dtype="uint16", eos_id=eos)
    assert every_document(by_eos, np.random.default_rng(seed)) == [with_eos]
    by_length = Dataset.from_token_files("web", path, dtype="uint16", doc_lengths=[len(d) for d in with_eos])
    assert by_length.fingerprint() == by_eos.fingerprint()
    assert every_document(by_length, np.random.default_rng(seed)) == [with_eos]


def test_tokens_after_the_last_eos_are_a_last_document(tmp_path):
    path = tmp_path / "tokens.bin"
    path.write_bytes(np.array([5, 0, 6, 7, 0, 8, 9], dtype="<u4").tobytes())
    dataset = Dataset.from_token_files("web", path, dtype="uint32", eos_id=0)
    assert [r["input_ids"].tolist() for r in dataset.read(0, [0, 1, 2])] == [[5, 0], [6, 7, 0], [8, 9]]


def test_a_record_is_a_read_only_view_and_a_table_keeps_the_dtype(tmp_path):
    write_megatron(tmp_path / "web", [[1, 2, 3], [4], []], "int32")
    dataset = Dataset.from_megatron("web", tmp_path / "web.idx")
    record = dataset.read(0, [0])[0]
    assert record["input_ids"].dtype == np.dtype("<i4") and not record["input_ids"].flags.writeable
    table = dataset.read_table(0, [2, 0, 1])
    assert table.column("input_ids").to_pylist() == [[], [1, 2, 3], [4]]
    assert str(table.schema.field("input_ids").type) == "list<item: int32>"
    assert table.column("num_tokens").to_pylist() == [0, 3, 1]
    assert dataset.read(0, [1], columns=["num_tokens"]) == [{"num_tokens": 1}]
    with pytest.raises(ValueError, match="no column 'text'"):
        dataset.read(0, [1], columns=["text"])


def test_fetch_reads_documents_of_several_token_datasets(tmp_path):
    write_megatron(tmp_path / "a", [[1], [2, 2]])
    write_datatrove(tmp_path / "b.ds", [[3, 3, 3], [4]])
    datasets = {0: Dataset.from_megatron("a", tmp_path / "a"), 1: Dataset.from_token_files("b", tmp_path / "b.ds")}
    records = fetch(datasets, [(1, 0, 1), (0, 0, 1), (1, 0, 0), (0, 0, 0)])
    assert [r["input_ids"].tolist() for r in records] == [[4], [2, 2], [3, 3, 3], [1]]


def test_prefixes_globs_and_directories_name_the_same_pairs(tmp_path):
    for name in ("web_a_text_document", "web_b_text_document", "code_text_document"):
        write_megatron(tmp_path / name, [[1, 2]])
    def files(spec):
        return [os.path.basename(Dataset.from_megatron("d", spec).path(k)) for k in range(2 if "*" in str(spec) else 1)]
    assert files(tmp_path / "web_*") == ["web_a_text_document.bin", "web_b_text_document.bin"]
    assert files(tmp_path / "web_*_text_document.idx") == files(tmp_path / "web_*")
    assert files(tmp_path / "code_text_document") == ["code_text_document.bin"]
    assert Dataset.from_megatron("d", tmp_path).shard_count() == 3
    with pytest.raises(FileNotFoundError, match="no file matches .*books"):
        Dataset.from_megatron("d", tmp_path / "books_text_document")
    with pytest.raises(ValueError, match="wildcard"):
        Dataset.from_megatron("d", tmp_path / "*" / "web")


def test_the_catalogs_of_globs_in_one_directory_are_kept_apart_and_reused(tmp_path, monkeypatch):
    """Two globs of one directory are two catalogs: each is built once, not rebuilt at every load."""
    monkeypatch.setattr(catalog, "RACY_NS", 0)  # trust files written just before a build
    for name in ("web_a_text_document", "web_b_text_document", "code_text_document"):
        write_megatron(tmp_path / name, [[1, 2]])
    for scanned in (1, 0, 0):
        web, code = Dataset.from_megatron("web", tmp_path / "web_*"), Dataset.from_megatron("code", tmp_path / "code_*")
        assert (web.catalog.scanned, code.catalog.scanned) == (2 * scanned, scanned)
        assert web.catalog.location != code.catalog.location and (web.shard_count(), code.shard_count()) == (2, 1)


def test_object_storage_reads_equal_the_local_files(endpoint, tmp_path, small_pieces):
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 50000, rng.integers(0, 30)).tolist() for _ in range(40)]
    write_megatron(tmp_path / "web_text_document", docs, split=2)
    write_datatrove(tmp_path / "00000.ds", docs, 4)
    fs = s3_client(endpoint)
    fs.create_dir("tokens")
    for name in ("web_text_document.bin", "web_text_document.idx", "00000.ds", "00000.ds.index"):
        pafs.copy_files(str(tmp_path / name), f"tokens/{name}", destination_filesystem=fs)
    remote = [Dataset.from_megatron("web", "s3://tokens/web_*"), Dataset.from_token_files("web", "s3://tokens/*.ds")]
    for dataset in remote:
        assert not dataset.reader.shards.location.is_local
        assert every_document(dataset, rng) == [docs]


def write_bad_megatron(tmp_path, edit):
    """A valid pair with ``edit(idx bytes) -> idx bytes`` applied to its index."""
    write_megatron(tmp_path / "web", [[1, 2, 3], [4, 5], [6]] * 3, split=2)
    idx = tmp_path / "web.idx"
    idx.write_bytes(edit(idx.read_bytes()))
    return tmp_path / "web"


HEADER = 34
SEQUENCES = 15  # what write_bad_megatron writes: 9 documents, two sequences but for the one-token ones


@pytest.mark.parametrize("edit, message", [
    (lambda b: b"NOTMEGA\x00\x00" + b[9:], "no b'MMIDIDX"),
    (lambda b: b[:9] + struct.pack("<Q", 2) + b[17:], "version 2"),
    (lambda b: b[:17] + bytes([9]) + b[18:], "unknown dtype code 9"),
    (lambda b: b[:17] + bytes([7]) + b[18:], "float32.*holds no token ids"),
    (lambda b: b[:-8], "truncated"),
    (lambda b: b + bytes(SEQUENCES), "multimodal"),
    (lambda b: b[:-8] + struct.pack("<q", 14), "document indices run from 0 to 14"),
    (lambda b: b[:HEADER + 4 * 14] + struct.pack("<i", 9) + b[HEADER + 4 * 15:], "do not belong together"),
], ids=["magic", "version", "code", "float", "truncated", "multimodal", "documents", "lengths"])
def test_a_damaged_index_is_refused_naming_it(tmp_path, edit, message):
    prefix = write_bad_megatron(tmp_path, edit)
    with pytest.raises(ValueError, match=message) as error:
        Dataset.from_megatron("web", prefix)
    assert "web.idx" in str(error.value) and "Dataset 'web'" in str(error.value)


def test_a_truncated_bin_or_a_missing_idx_is_refused(tmp_path):
    write_megatron(tmp_path / "web", [[1, 2, 3], [4, 5]])
    bin_path = tmp_path / "web.bin"
    bin_path.write_bytes(bin_path.read_bytes()[:-2])
    with pytest.raises(ValueError, match="do not belong together"):
        Dataset.from_megatron("web", tmp_path / "web")
    os.remove(tmp_path / "web.idx")
    with pytest.raises(ValueError, match="web.idx is missing"):
        Dataset.from_megatron("web", tmp_path / "web")


def test_sequences_out_of_place_are_refused_when_read(tmp_path, small_pieces):
    """The scan checks only the arrays' ends: a pointer wrong in the middle is caught by its piece."""
    pointers = HEADER + 4 * SEQUENCES
    prefix = write_bad_megatron(tmp_path, lambda b: b[:pointers + 8 * 7] + struct.pack("<q", 2) + b[pointers + 8 * 8:])
    dataset = Dataset.from_megatron("web", prefix)
    assert [r["input_ids"].tolist() for r in dataset.read(0, [0, 1, 2])] == [[1, 2, 3], [4, 5], [6]]
    with pytest.raises(ValueError, match="web.bin.*do not lie back to back"):
        dataset.read(0, [4])


def test_datatrove_and_flat_files_refuse_what_does_not_add_up(tmp_path):
    write_datatrove(tmp_path / "a.ds", [[1, 2], [3]])
    (tmp_path / "a.ds").write_bytes(b"\x00" * 10)
    with pytest.raises(ValueError, match="a.ds: .*not 3 tokens of 2 or 4 bytes"):
        Dataset.from_token_files("web", tmp_path / "a.ds")
    write_datatrove(tmp_path / "b.ds", [[1, 2], [3]], 4)
    with pytest.raises(ValueError, match="dtype='uint16', but the files' sizes say .*uint32"):
        Dataset.from_token_files("web", tmp_path / "b.ds", dtype="uint16")
    with pytest.raises(ValueError, match="drop eos_id"):
        Dataset.from_token_files("web", tmp_path / "b.ds", eos_id=0)
    flat = tmp_path / "flat.bin"
    flat.write_bytes(np.arange(7, dtype="<u2").tobytes())
    with pytest.raises(ValueError, match="need dtype="):
        Dataset.from_token_files("web", flat, eos_id=0)
    with pytest.raises(ValueError, match="exactly one of eos_id"):
        Dataset.from_token_files("web", flat, dtype="uint16")
    with pytest.raises(ValueError, match="not a whole number of uint32 tokens"):
        Dataset.from_token_files("web", flat, dtype="uint32", eos_id=0)
    with pytest.raises(ValueError, match="add up to 6 tokens but the file holds 7"):
        Dataset.from_token_files("web", flat, dtype="uint16", doc_lengths=[3, 3])
    with pytest.raises(ValueError, match="eos_id=70000 must be an int in 0 .. 65535"):
        Dataset.from_token_files("web", flat, dtype="uint16", eos_id=70000)
    with pytest.raises(ValueError, match="dtype='float32' is not a token dtype"):
        Dataset.from_token_files("web", flat, dtype="float32", eos_id=0)

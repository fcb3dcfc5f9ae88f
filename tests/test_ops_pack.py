"""The packing operators as pure steps: tokens conserved, documents kept whole where promised,
the strict mixture's prefix bound, and a JSON state that replays exactly at every cut."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, strategies as st

from zephon.ops import Packing, mixture, pack
from zephon.ops.pack import Doc

lengths = st.lists(st.integers(0, 90), min_size=1, max_size=40)


def docs_of(sizes, kinds=3):
    return [Doc(i, (i % kinds, 0, i), i % kinds, np.arange(n, dtype=np.int64) + 1000 * i) for i, n in enumerate(sizes)]


def run(packing: Packing, docs, cut=None, take=3):
    """Every row of ``docs`` through ``packing``, taking ``take`` rows after each document; with
    ``cut``, the state goes through JSON after document ``cut`` (documents counted from its oldest)."""
    state, rows = packing.init(), []
    for k, doc in enumerate(docs):
        state = packing.step(state, doc)
        got, state = packing.take(state, take)
        rows += got
        if k == cut:
            base = packing.oldest(state)
            base = k + 1 if base is None else base
            data = packing.to_json(state, base, k + 1 - base)
            held = packing.documents_held(data)
            assert (held is None) == (k + 1 == base) and (held is None or held[0] == 0 and held[1] <= k + 1 - base)
            state = packing.from_json(data, docs[base:k + 1])
    state, dropped = packing.finish(state)
    got, state = packing.take(state, 10 ** 9)
    return rows + got, dropped


def spans(rows):
    return [(p.doc.index, p.start, p.end) for row in rows for p in row]


def tiles(rows, docs, dropped=0):
    """Each document's tokens appear exactly once (less what was dropped at the end)."""
    seen = {}
    for index, start, end in spans(rows):
        seen.setdefault(index, []).append((start, end))
    for doc in docs:
        parts = sorted(seen.get(doc.index, []))
        covered = sum(b - a for a, b in parts)
        assert all(a < b for a, b in parts)
        assert all(parts[i][1] == parts[i + 1][0] for i in range(len(parts) - 1)), parts
        assert not parts or parts[0][0] == 0
        dropped -= len(doc.tokens) - covered
    assert dropped == 0


@given(lengths, st.integers(1, 64))
def test_concat_cuts_the_concatenation(sizes, seq_len):
    docs = docs_of(sizes)
    packing = Packing(pack.config(seq_len, pad_id=0))
    rows, dropped = run(packing, docs)
    assert dropped == 0
    assert all(pack.used(row) == seq_len for row in rows[:-1]) and all(0 < pack.used(r) <= seq_len for r in rows)
    ids = np.concatenate([pack.arrays(packing.pack, [row])["input_ids"][0, :pack.used(row)] for row in rows]) \
        if rows else np.zeros(0, dtype=np.int64)
    assert np.array_equal(ids, np.concatenate([d.tokens for d in docs]))
    tiles(rows, docs)


@given(lengths, st.integers(1, 64), st.integers(1, 4))
def test_best_fit_keeps_short_documents_whole(sizes, seq_len, pool):
    docs = docs_of(sizes)
    packing = Packing(pack.config(seq_len, "best_fit", pad_id=0, pool=pool))
    rows, _ = run(packing, docs)
    tiles(rows, docs)
    for index, start, end in spans(rows):
        size = len(docs[index].tokens)
        assert (end - start == size) if size < seq_len else (start % seq_len == 0 and end - start <= seq_len)
    assert all(0 < pack.used(row) <= seq_len for row in rows)


@given(lengths, st.integers(1, 48), st.sampled_from(["concat", "best_fit"]), st.sampled_from(["pad", "drop"]),
       st.data())
def test_json_state_replays_at_every_cut(sizes, seq_len, strategy, final, data):
    docs = docs_of(sizes)
    packing = Packing(pack.config(seq_len, strategy, pad_id=0, final=final, pool=3))
    whole, dropped = run(packing, docs)
    cut = data.draw(st.integers(0, len(docs) - 1))
    rows, dropped_after = run(packing, docs, cut=cut)
    assert spans(rows) == spans(whole) and dropped_after == dropped
    tiles(whole, docs, dropped)


def test_arrays_mark_documents_and_padding():
    docs = docs_of([3, 2])
    packing = pack.config(8, pad_id=7, bos_id=1)
    rows = [(pack.Piece(docs[0], 0, 3), pack.Piece(docs[1], 0, 2))]
    out = pack.arrays(packing, rows)
    assert out["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 0, 0, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 0, 0]]
    assert out["input_ids"][0, 5:].tolist() == [7, 7, 7]
    assert pack.token_counts(rows, 3).tolist() == [[3, 2, 0]]
    assert pack.document(packing, 0, (0, 0, 0), 0, np.array([5, 6])).tokens.tolist() == [1, 5, 6]


def strict(shares, seq_len, queue):
    names = {f"c{k}": k for k in range(len(shares))}
    config = mixture.config("strict", dict(zip(names, shares)), names, 0.01, queue)
    return Packing(pack.config(seq_len, pad_id=0), config)


@pytest.mark.parametrize("ended", [False, True])
def test_strict_leaves_a_restored_document_of_an_unweighted_component_queued(ended):
    """A state restored with a document of a component now weighted 0 (or a share edited to 0)
    fills from the weighted components only; that document stays queued."""
    packing = strict([0.5, 0.5, 0.0], 8, queue=1)
    stray = Doc(0, (0, 0, 0), 2, np.ones(5, dtype=np.int64))
    state = dataclasses.replace(packing.init(), queues=((), (), (mixture.Piece(stray, 0, 5),)), ended=ended)
    state = packing.step(state, Doc(1, (0, 0, 1), 0, np.ones(3, dtype=np.int64)))
    assert state.queues[2] == (mixture.Piece(stray, 0, 5),) and state.placed[2] == 0


@given(st.lists(st.integers(1, 300), min_size=60, max_size=200), st.integers(8, 64), st.data())
def test_strict_holds_every_prefix_within_a_sequence(sizes, seq_len, data):
    """With each component's next document always queued, every prefix of the packed rows holds
    each component within one sequence of its target share."""
    shares = [0.6, 0.3, 0.1]
    packing = strict(shares, seq_len, queue=10 ** 4)
    cycle = data.draw(st.permutations([0, 1, 2]))
    docs = [Doc(i, (0, 0, i), cycle[i % 3], np.ones(n, dtype=np.int64)) for i, n in enumerate(sizes)]
    state = packing.init()
    rows = []
    for doc in docs:
        state = packing.step(state, doc)
        got, state = packing.take(state, 10 ** 9)
        rows += got
    supplied = [sum(len(d.tokens) for d in docs if d.component == c) for c in range(3)]
    realized = np.zeros(3)
    for row in rows:
        realized += pack.token_counts([row], 3)[0]
        total = realized.sum()
        if all(realized[c] < supplied[c] for c in range(3)):  # every component can still be served
            assert np.all(np.abs(realized - np.array(shares) * total) <= seq_len + 1), (realized, total)


@given(st.lists(st.integers(1, 200), min_size=1, max_size=60), st.integers(4, 32), st.integers(1, 8), st.data())
def test_strict_state_replays_at_every_cut(sizes, seq_len, queue, data):
    packing = strict([0.5, 0.3, 0.2], seq_len, queue)
    docs = docs_of(sizes)
    whole, dropped = run(packing, docs)
    rows, dropped_after = run(packing, docs, cut=data.draw(st.integers(0, len(docs) - 1)))
    assert spans(rows) == spans(whole) and dropped_after == dropped
    tiles(whole, docs, dropped)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="pad_id"):
        pack.config(16, "best_fit")
    with pytest.raises(ValueError, match="seq_len"):
        pack.config(0)
    with pytest.raises(ValueError, match="strategy"):
        pack.config(8, "greedy")
    for name in ("pad_id", "bos_id", "eos_id"):
        with pytest.raises(ValueError, match=rf"pack\({name}=9223372036854775808\).*\[0, 2\*\*63 - 1\]"):
            pack.config(8, **{name: 2**63})
    names = {"a": 0, "b": 1}
    with pytest.raises(ValueError, match="weights"):
        mixture.config("strict", {"z": 1.0}, names, 0.01, 8)
    with pytest.raises(ValueError, match="concat"):
        mixture.init(mixture.config("strict", {"a": 1.0}, names, 0.01, 8), pack.config(8, "best_fit", pad_id=0))


def test_corrupted_states_are_refused():
    packing = Packing(pack.config(8, pad_id=0))
    docs = docs_of([5])
    with pytest.raises(ValueError, match="does not fit"):
        packing.from_json({"open": [[[0, 0, 6]]], "ready": [], "rest": None}, docs)
    with pytest.raises(ValueError, match="an open sequence of 9 tokens, outside 1 .. 7"):
        packing.documents_held({"open": [[[0, 0, 9]]], "ready": [], "rest": None})
    with pytest.raises(ValueError, match="every piece must be"):
        packing.documents_held({"open": [], "ready": [], "rest": []})
    with pytest.raises(ValueError, match="pack state"):
        packing.from_json({"open": "x", "ready": []}, docs)
    with pytest.raises(ValueError, match="tokens, outside"):
        packing.from_json({"open": [], "ready": [[]], "rest": None}, docs)
    with pytest.raises(ValueError, match="overlap"):
        packing.from_json({"open": [[[0, 0, 3]]], "ready": [[[0, 2, 5]]], "rest": None}, docs)
    with pytest.raises(ValueError, match="rest"):
        packing.from_json({"open": [], "ready": [], "rest": [0, 0, 5]}, docs)

"""Packed pipelines through the runtime and the DataLoader: exact resumes on the same topology,
no token lost or repeated on another, the ledger's operator states, counts and stats."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.core.checkpoint import sealed
from zephon.runtime import PackedReader, Snapshots, initial_entries, initial_operator
from zephon.work import TokenEstimation


def corpus(seed=0, scale=1):
    rng = np.random.default_rng(seed)

    def docs(name, n, lo, hi):
        return Dataset.from_records(name, [[{"text": " ".join(f"{name}{s}{i}x{j}" for j in range(rng.integers(lo, hi)))}
                                            for i in range(n * scale)] for s in range(3)])
    return [docs("web", 40, 1, 20), docs("code", 20, 10, 40), docs("books", 8, 40, 160)]


def words(text):
    return [len(w) + 7 * (w[0] == "b") for w in text.split()]


def pipeline(seq_len=32, strategy="concat", seed=0, filter_short=False, **mix):
    source = StaticMixtureWorkSource(corpus(seed), {"web": 0.6, "code": 0.3, "books": 0.1}, chunk_size=16, seed=seed,
                                     exhausted_policy="stop")
    p = Pipeline(source)
    if filter_short:
        p = p.filter(lambda item: len(item["text"]) > 40)
    p = p.tokenize(words, eos_id=0).pack(seq_len, strategy, pad_id=0)
    return p.ensure_mixture(**mix) if mix else p


def sequence_keys(batch):
    return [tuple(tuple(piece) for piece in doc) for doc in batch["_documents"]]


def run(p, cut=None, state=None, **kwargs):
    kwargs.setdefault("even_batches", False)
    loader = zt.DataLoader(p, batch_size=3, canonical_replicas=4, **kwargs)
    if state is not None:
        loader.load_state_dict(state)
    batches = []
    for batch in loader:
        batches.append(batch)
        if cut is not None and len(batches) == cut:
            break
    return batches, loader.state_dict(), loader


def pieces(batches):
    return [piece for batch in batches for doc in batch["_documents"] for piece in doc]


def assert_tiles(all_pieces):
    """Every document's pieces tile its tokens exactly once from 0."""
    spans = {}
    for d, s, o, _, a, b in all_pieces:
        spans.setdefault((d, s, o), []).append((a, b))
    for key, parts in spans.items():
        parts.sort()
        assert parts[0][0] == 0 and all(x[1] == y[0] for x, y in zip(parts, parts[1:])), (key, parts)


def test_iterating_a_pipeline_is_lane_zero_of_one():
    p = pipeline()
    items = list(p)
    reader = PackedReader(p, p.packing, [0], 1, initial_entries(p.source, [0], 1), {0: initial_operator(p.packing)}, 1)
    rows = []
    while (turn := reader.turn()) is not None:
        rows += turn[1]
    assert len(items) == len(rows) and items[0]["input_ids"].shape == (32,)
    assert_tiles([piece for item in items for piece in item["_documents"]])


@settings(max_examples=12)
@given(st.integers(1, 30), st.sampled_from(["concat", "best_fit"]))
def test_reader_replays_from_any_snapshot(cut, strategy):
    """The ledger after any turn (entries and operator states) restores a reader whose turns are
    the uninterrupted run's."""
    p = pipeline(strategy=strategy, filter_short=True)
    lanes = [0, 1, 2]
    entries, operators = initial_entries(p.source, lanes, 3), {lane: initial_operator(p.packing) for lane in lanes}
    reader = PackedReader(p, p.packing, lanes, 3, entries, operators, 2)
    turns, snaps = [], []
    while (turn := reader.turn()) is not None:
        turns.append((turn[0], [[(q.doc.pointer, q.start, q.end) for q in row] for row in turn[1]]))
        snaps.append(turn[2])
    cut = min(cut, len(snaps))
    ledger = Snapshots(entries, operators)
    ledger.extend(snaps[:cut])
    position = snaps[cut - 1].position
    resumed = PackedReader(p, p.packing, lanes, 3, ledger.entries_at(position), ledger.operators_at(position), 2)
    rest = []
    while (turn := resumed.turn()) is not None:
        rest.append((turn[0], [[(q.doc.pointer, q.start, q.end) for q in row] for row in turn[1]]))
    assert rest == turns[cut:]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_on_the_same_topology_gives_the_same_batches(workers):
    p = pipeline()
    whole, _, _ = run(p, num_workers=workers)
    first, state, _ = run(p, cut=5, num_workers=workers)
    rest, _, _ = run(p, state=json.loads(json.dumps(state)), num_workers=workers)
    assert [sequence_keys(b) for b in first + rest] == [sequence_keys(b) for b in whole]
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(first + rest, whole))


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_resume_on_other_topologies_loses_and_repeats_no_token(strategy):
    p = pipeline(strategy=strategy)
    whole, _, _ = run(p)
    first, state, _ = run(p, cut=4)
    later = []
    for rank in range(3):
        batches, _, _ = run(p, state=state, rank=rank, world_size=3, num_workers=1)
        later += batches
    assert sorted(pieces(first + later)) == sorted(pieces(whole))
    assert_tiles(pieces(whole))


def test_checkpoint_holds_pointers_not_tokens_and_is_checked():
    p = pipeline()
    _, state, _ = run(p, cut=3)
    per_lane = len(json.dumps(state)) / 4
    assert per_lane < 1024
    operators = state["operators"]
    assert list(operators) == ["pack"]
    with pytest.raises(ValueError, match="operators"):
        zt.DataLoader(Pipeline(p.source), batch_size=3, canonical_replicas=4).load_state_dict(state)
    with pytest.raises(ValueError, match="operators"):
        zt.DataLoader(pipeline(mode="strict"), batch_size=3, canonical_replicas=4).load_state_dict(state)


def test_a_corrupted_operator_state_is_refused_before_anything_changes():
    from zephon.runtime import make_state, parse_state

    p = pipeline()
    _, state, loader = run(p, cut=3)
    parsed = parse_state(state)
    ops = {lane: dict(op) for lane, op in parsed.operators["pack"].items()}
    ops[0] = {"window": 0, "state": {"open": [[[5, 0, 3]]], "ready": [], "rest": None}}
    bad = make_state(4, parsed.entries, parsed.datasets, parsed.topology, run=parsed.run, operators={"pack": ops})
    fresh = zt.DataLoader(p, batch_size=3, canonical_replicas=4, even_batches=False)
    before = fresh.state_dict()
    with pytest.raises(ValueError, match="window"):
        fresh.load_state_dict(bad)
    assert fresh.state_dict() == before


def test_even_batches_counts_packed_batches_on_every_rank():
    p = pipeline()
    _, state, _ = run(p, cut=2)
    lengths, yielded = [], []
    for rank in range(2):
        loader = zt.DataLoader(p, batch_size=3, canonical_replicas=4, rank=rank, world_size=2)
        loader.load_state_dict(state)
        lengths.append(len(loader))
        yielded.append(sum(1 for _ in loader))
    assert lengths[0] == lengths[1] == yielded[0] + 2 == yielded[1] + 2 > 2  # the epoch: 2 batches were before the cut


def test_stats_count_the_tokens_received():
    p = pipeline(mode="report")
    batches, _, loader = run(p)
    tokens = loader.stats()["tokens"]
    for name in ("web", "code", "books"):
        assert tokens["received"][name] == sum(int(b["_tokens"][name].sum()) for b in batches)
    real = sum(int((b["segment_ids"] > 0).sum()) for b in batches)
    assert tokens["padding"] == sum(b["input_ids"].numel() for b in batches) - real
    assert sum(tokens["received"].values()) == real and tokens["target"]["web"] == pytest.approx(0.6)


@pytest.mark.parametrize("mode", ["report", "strict"])
def test_strict_mixture_reaches_the_target_share_of_tokens(mode):
    """A token-aware, endless source: its estimates leave the realized token shares a few percent
    off (``"report"`` measures that); strict ensure_mixture brings them within 1 % (relative)."""
    source = StaticMixtureWorkSource(corpus(1), {"web": 0.6, "code": 0.3, "books": 0.1}, chunk_size=64, seed=3,
                                     exhausted_policy="repeat",
                                     token_estimation=TokenEstimation(primer="measure", tokenizer=words))
    source.prime()
    p = Pipeline(source).tokenize(words, eos_id=0).pack(64, pad_id=0).ensure_mixture(mode, queue=512)
    loader = zt.DataLoader(p, batch_size=4, canonical_replicas=2)
    for k, _ in enumerate(loader):
        if k == 400:
            break
    stats = loader.stats()["tokens"]
    total = sum(stats["received"].values())
    error = max(abs(stats["received"][name] / total / target - 1) for name, target in stats["target"].items())
    assert (error < 0.01) if mode == "strict" else (error > 0.02), stats
    assert stats["late"] == ({"web": 0, "code": 0, "books": 0} if mode == "strict" else None)


def test_pack_is_the_last_step_and_needs_token_ids():
    p = pipeline()
    with pytest.raises(ValueError, match="after pack"):
        p.map(lambda item: item)
    with pytest.raises(TypeError, match="input_ids"):
        list(Pipeline(p.source).pack(8))
    with pytest.raises(TypeError, match="DataLoader"):
        p.to_torch_dataset()
    assert not p.is_indexable


def test_a_packed_run_migrates_to_new_weights():
    p = pipeline()
    _, state, _ = run(p, cut=4)
    source = StaticMixtureWorkSource(corpus(0), {"web": 0.3, "code": 0.3, "books": 0.4}, chunk_size=16, seed=0,
                                     exhausted_policy="stop")
    new = Pipeline(source).tokenize(words, eos_id=0).pack(32, pad_id=0)
    migration = zt.migrate_checkpoint(state, new)
    assert migration.report["packers"]["pack"]["documents_held"] > 0
    batches, _, _ = run(new, state=migration.state)
    assert batches and batches[0]["input_ids"].shape == (3, 32)


def _token_spans(batches):
    """Per document, the token offsets the batches hold."""
    spans = {}
    for batch in batches:
        for doc in batch["_documents"]:
            for d, s, o, _, a, b in doc:
                spans.setdefault((d, s, o), set()).update(range(a, b))
    return spans


@settings(max_examples=12, deadline=None)
@given(packing=st.sampled_from([{}, {"strategy": "best_fit"}, {"mode": "strict"}]), cut=st.integers(1, 12),
       requeue=st.booleans())
def test_a_migration_serves_no_document_the_loop_received_whole_again(packing, cut, requeue):
    whole = _token_spans(run(pipeline(**packing))[0])
    before, state, _ = run(pipeline(**packing), cut=cut)
    migration = zt.migrate_checkpoint(state, pipeline(**packing), requeue=requeue)
    after = _token_spans(run(pipeline(**packing), state=migration.state)[0])
    received = _token_spans(before)
    again = [doc for doc in after if doc in received]
    assert all(received[doc] != whole[doc] for doc in again)  # only documents a packer held
    assert len(again) <= migration.report["packers"][pipeline(**packing).packing.name]["documents_held"]
    if requeue:  # a document the loop received in part is served again, whole
        assert all(after.get(doc) == whole[doc] for doc in received if received[doc] != whole[doc])


@pytest.mark.parametrize("packing", [{}, {"strategy": "best_fit"}, {"mode": "strict"}])
def test_stats_count_as_read_the_documents_the_loop_received_whole(packing):
    """A packer holds documents back while later ones reach the loop whole: those count as read,
    the held ones (partly received, or queued) as unread."""
    whole = _token_spans(run(pipeline(**packing))[0])
    for cut in (1, 4, 9):
        loader = zt.DataLoader(pipeline(**packing), batch_size=3, canonical_replicas=1, even_batches=False)
        batches = iter(loader)
        received = _token_spans([next(batches) for _ in range(cut)])
        read = sum(figures["position"] for figures in loader.stats()["datasets"].values())  # one pass
        assert read == sum(received[doc] == whole[doc] for doc in received)


def test_a_curriculum_packs_and_resumes_exactly():
    from zephon.work import Phase, PhasedMixtureWorkSource

    phases = [Phase({"web": 1, "code": 1}, until_chunk=6), Phase({"books": 1, "web": 1})]
    source = PhasedMixtureWorkSource(corpus(2), phases, chunk_size=16, seed=4, exhausted_policy="stop")
    p = Pipeline(source).tokenize(words, eos_id=0).pack(32, pad_id=0).ensure_mixture(
        "report", weights={"web": 0.5, "code": 0.25, "books": 0.25})
    whole, _, _ = run(p, num_workers=1)
    first, state, _ = run(p, cut=6, num_workers=1)
    rest, _, _ = run(p, state=state, num_workers=1)
    assert [sequence_keys(b) for b in first + rest] == [sequence_keys(b) for b in whole]
    assert {piece[3] for b in whole[:3] for doc in b["_documents"] for piece in doc} <= {"web", "code"}


def test_collate_stacks_packed_sequences_and_the_loader_batch_matches_it():
    p = pipeline()
    items = list(p)[:3]
    batch = zt.collate(items)
    assert batch["input_ids"].shape == (3, 32) and batch["_documents"] == [i["_documents"] for i in items]
    first = next(iter(zt.DataLoader(p, batch_size=3, canonical_replicas=1, even_batches=False)))
    for key in ("input_ids", "segment_ids", "position_ids"):
        assert torch.equal(first[key], batch[key])
    assert all(torch.equal(first["_tokens"][k], batch["_tokens"][k]) for k in batch["_tokens"])
    assert [[tuple(x) for x in doc] for doc in first["_documents"]] == batch["_documents"]
    with_collate = next(iter(zt.DataLoader(p, batch_size=3, canonical_replicas=1, even_batches=False,
                                           collate_fn=zt.collate)))
    assert torch.equal(with_collate["input_ids"], batch["input_ids"])


def test_strict_says_once_when_a_component_falls_behind_with_none_queued(caplog):
    p = pipeline(mode="strict", queue=2)
    with caplog.at_level("WARNING", logger="zephon"):
        _, _, loader = run(p)
    late = loader.stats()["tokens"]["late"]
    said = [r.getMessage() for r in caplog.records if "fell behind" in r.getMessage()]
    assert sum(late.values()) > 0
    assert sorted(name for name, count in late.items() if count) == sorted(m.split("'")[1] for m in said)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_with_a_lag_is_the_state_of_an_earlier_batch(packed, workers):
    """``state_dict(lag=k)`` after n batches resumes at batch n - k + 1, as a framework that
    fetched k batches ahead of its step needs."""
    p = pipeline() if packed else Pipeline(pipeline().source)

    def key(batch):
        return json.dumps(batch["_documents"] if packed else batch["_sample_id"].tolist())

    def loader():
        return zt.DataLoader(p, batch_size=3, canonical_replicas=4, num_workers=workers, even_batches=False)
    whole = [key(b) for b in loader()]
    for cut, lag in ((1, 1), (5, 2), (6, 4)):
        first = loader()
        it = iter(first)
        for _ in range(cut):
            next(it)
        state = first.state_dict(lag=lag)
        again = loader()
        again.load_state_dict(state)
        assert [key(b) for b in again] == whole[cut - lag:]
    with pytest.raises(ValueError, match="lag"):
        first.state_dict(lag=7)
    with pytest.raises(ValueError, match="no iteration"):
        loader().state_dict(lag=1)


def test_what_is_filtered_or_dropped_at_a_lanes_end_is_counted_once_when_received():
    source = pipeline().source
    order = [item["_sample_id"] for item in Pipeline(source)]
    tail = set(order[-3:])
    p = Pipeline(source).filter(lambda item: item["_sample_id"] not in tail).tokenize(words, eos_id=0).pack(32)
    assert p.packing.pack.final == "drop"
    loader = zt.DataLoader(p, batch_size=3, canonical_replicas=1, even_batches=False)
    it = iter(loader)
    next(it)
    assert loader.stats()["tokens"]["dropped"] == 0
    state = loader.state_dict()
    for _ in it:
        pass
    stats = loader.stats()
    assert stats["filtered"] == 3 and stats["tokens"]["dropped"] > 0
    resumed = zt.DataLoader(p, batch_size=3, canonical_replicas=1, even_batches=False)
    resumed.load_state_dict(state)
    for _ in resumed:
        pass
    assert resumed.stats()["tokens"]["dropped"] == stats["tokens"]["dropped"]
    assert resumed.stats()["filtered"] == 3


def _other_tokenizer(p):
    return Pipeline(p.source).tokenize(lambda text: [len(w) for w in text.split()], eos_id=0).pack(32, pad_id=0)


@pytest.mark.parametrize("base, other, named", [
    (pipeline, lambda: pipeline(seq_len=64), "pack.seq_len: 32 in the checkpoint, 64 now"),
    (pipeline, lambda: pipeline(strategy="best_fit"), "pack.strategy: 'concat' in the checkpoint, 'best_fit' now"),
    (pipeline, lambda: _other_tokenizer(pipeline()), r"tokenize\[0\]\.tokenizer: '.*words.*' in the checkpoint"),
    (lambda: pipeline(mode="strict"), lambda: pipeline(mode="strict", tolerance=0.2),
     "ensure_mixture.tolerance: '0.01' in the checkpoint, '0.2' now"),
])
def test_a_checkpoint_restores_only_into_the_same_packing_settings_and_names_those_that_differ(base, other, named):
    _, state, _ = run(base(), cut=2)
    loader = zt.DataLoader(other(), batch_size=3, canonical_replicas=4, even_batches=False)
    with pytest.raises(ValueError, match=rf"packed with other settings \(.*{named}"):
        loader.load_state_dict(state)
    assert [sequence_keys(b) for b in loader] == [sequence_keys(b) for b in run(other())[0]]


def test_a_report_only_mixture_rule_does_not_change_the_packing_settings():
    _, state, _ = run(pipeline(), cut=2)
    rest, _, _ = run(pipeline(mode="report"), state=state)
    assert [sequence_keys(b) for b in rest] == [sequence_keys(b) for b in run(pipeline())[0][2:]]


def _as_digest(state, digest):
    """``state`` as checkpoints before the packer's settings were spelled out held it."""
    operators = state["operators"]["pack"]["fields"]
    return sealed({**state, "operators": {"pack": {"fields": {**operators, "packer": {"same": digest}}}}})


def test_a_checkpoint_holding_the_settings_digest_still_restores_into_the_same_settings():
    full, _, _ = run(pipeline())
    _, state, _ = run(pipeline(), cut=2)
    rest, _, _ = run(pipeline(), state=_as_digest(state, pipeline().packing.digest))
    assert [sequence_keys(b) for b in rest] == [sequence_keys(b) for b in full[2:]]
    with pytest.raises(ValueError, match="packed with other settings .seq_len, strategy"):
        run(pipeline(), state=_as_digest(state, pipeline(seq_len=64).packing.digest))


def _fast_tokenizers():
    """Two ``transformers`` tokenizers of one type, name and vocabulary size that encode otherwise."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    texts = [record["text"] for dataset in corpus() for shard in range(3) for record in dataset.read(shard, range(8))]
    made = []
    for pre in (pre_tokenizers.Whitespace(), pre_tokenizers.Split("", "isolated")):
        backend = Tokenizer(models.BPE(unk_token="[UNK]"))
        backend.pre_tokenizer = pre
        backend.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]", "[EOS]"],
                                                               show_progress=False))
        made.append(transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="[EOS]"))
    return made


def _tokenized(tokenizer):
    return Pipeline(pipeline().source).tokenize(tokenizer).pack(32, pad_id=0)


def test_a_checkpoint_tells_transformers_tokenizers_of_one_name_apart():
    ours, other = _fast_tokenizers()
    _, state, _ = run(_tokenized(ours), cut=2)
    with pytest.raises(ValueError, match=r"tokenize\[0\]\.tokenizer: 'transformers\..*:tokenizers:\w+' in the checkpoint"):
        run(_tokenized(other), state=state)
    operators = state["operators"]["pack"]["fields"]  # as written before the vocabularies counted:
    named = {"fields": {key: {"same": value} for key, value in _tokenized(ours).packing.named}}
    named = sealed({**state, "operators": {"pack": {"fields": {**operators, "packer": named}}}})
    with pytest.warns(RuntimeWarning, match="only their names were checked"):
        rest, _, _ = run(_tokenized(ours), state=named)
    assert [sequence_keys(b) for b in rest] == [sequence_keys(b) for b in run(_tokenized(ours))[0][2:]]


def test_a_tokenizer_that_pads_is_refused():
    ours, _ = _fast_tokenizers()
    backend = ours.backend_tokenizer
    backend.enable_padding(pad_id=0)
    with pytest.raises(ValueError, match=r"the tokenizer pads .*no_padding\(\)"):
        Pipeline(pipeline().source).tokenize(backend, eos_id=1)


def test_a_lambda_tokenizer_reaches_spawned_workers():
    p = Pipeline(pipeline().source).tokenize(lambda text: [len(w) for w in text.split()], eos_id=0).pack(32)
    spawned = zt.DataLoader(p, batch_size=3, canonical_replicas=2, num_workers=1, even_batches=False,
                            multiprocessing_context="spawn")
    forked = zt.DataLoader(p, batch_size=3, canonical_replicas=2, num_workers=1, even_batches=False)
    assert [sequence_keys(b) for b in spawned] == [sequence_keys(b) for b in forked]

"""Token-aware mixtures: weights in tokens, priming, checkpointed ratios (issue 6)."""
import functools
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon._ext import tokens as kernel
from zephon.core.checkpoint import sealed
from zephon.core.config import COST_UNITS, MAX_COST
from zephon.core.tokens import WEIGHT_SCALE, deficit_bound, draw_reference, weight_units
from zephon.io import fetch
from zephon.testing import assert_lanes_partition, assert_replay_equivalent, collect
from zephon.work.tokens import TokenEstimation

from helpers import write_jsonl

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()


def words(rng, n):
    return " ".join(rng.choice(WORDS, n))


@pytest.fixture(scope="module")
def bpe():
    """A small BPE tokenizer trained offline on generated text."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    rng = np.random.default_rng(0)
    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"], show_progress=False)
    tokenizer.train_from_iterator((words(rng, 30) for _ in range(500)), trainer)
    return tokenizer


@pytest.fixture(scope="module")
def short_and_long(tmp_path_factory):
    rng = np.random.default_rng(1)
    root = tmp_path_factory.mktemp("docs")
    short = write_jsonl(root / "short", [[words(rng, 10) for _ in range(300)] for _ in range(6)])
    long = write_jsonl(root / "long", [[words(rng, 40) for _ in range(300)] for _ in range(6)])
    mixed = write_jsonl(root / "mixed", [[words(rng, 10 if j % 2 else 40) for j in range(300)] for _ in range(6)])
    return {"short": short, "long": long, "mixed": mixed}


def realised_shares(source, tokenizer, chunks=20):
    datasets = source.datasets_by_id
    tokens = Counter()
    for chunk in collect(source.clone_for_lane(0, 1), chunks):
        for name, pointers in chunk.components.items():
            tokens[name] += sum(len(tokenizer.encode(r["text"]).ids) for r in fetch(datasets, pointers))
    total = sum(tokens.values())
    return {name: count / total for name, count in tokens.items()}


def in_memory(name, directory):
    """The JSONL files of ``directory`` as an in-memory dataset (one shard per file)."""
    files = sorted(directory.glob("*.jsonl"))
    return Dataset.from_records(name, [[json.loads(line) for line in f.read_text().splitlines()] for f in files])


@pytest.mark.parametrize("load", [Dataset.from_path, in_memory])
@pytest.mark.parametrize("names, tolerance", [(("short", "long"), 0.005), (("mixed", "short"), 0.01)])
def test_realised_token_shares_match_the_weights(bpe, short_and_long, tmp_path, monkeypatch, names, tolerance, load):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))
    datasets = [load(n, short_and_long[n]) for n in names]
    source = StaticMixtureWorkSource(datasets, {n: 0.5 for n in names}, chunk_size=512, seed=3,
                                     token_estimation=TokenEstimation(tokenizer=bpe), exhausted_policy="repeat")
    assert source.requires_token_priming
    source.prime()
    assert not source.requires_token_priming
    shares = realised_shares(source, bpe)
    assert all(abs(shares[n] - 0.5) <= tolerance for n in names), shares


def test_whitespace_tokenizer_and_measure_callable(short_and_long, tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))
    for estimation in (TokenEstimation(tokenizer=str.split), TokenEstimation(measure=lambda r: len(r["text"].split()))):
        data = [Dataset.from_path(n, short_and_long[n]) for n in ("short", "long")]
        source = StaticMixtureWorkSource(data, {"short": 0.5, "long": 0.5}, chunk_size=256, token_estimation=estimation)
        source.prime()
        for d in source.config.datasets:
            files = sorted(short_and_long[d.name].glob("*.jsonl"))
            words_on_disk = sum(len(json.loads(line)["text"].split()) for f in files for line in f.read_text().splitlines())
            exact = words_on_disk / sum(f.stat().st_size for f in files)
            assert d.ratio_origin == "measured" and abs(d.token_ratio / exact - 1) < 0.03


def test_unprimed_sources_refuse_to_run_and_priming_is_idempotent(short_and_long, tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))
    calls = Counter()

    def measure(record):
        calls["n"] += 1
        return len(record["text"].split())

    data = [Dataset.from_path("short", short_and_long["short"])]
    source = StaticMixtureWorkSource(data, {"short": 1}, chunk_size=64, token_estimation=TokenEstimation(measure=measure))
    lane = source.clone_for_lane(0, 1)
    with pytest.raises(RuntimeError, match="prime"):
        lane.next_chunk()
    with pytest.raises(RuntimeError, match="prime"):
        len(source)
    source.prime()
    measured = calls["n"]
    source.prime()
    assert calls["n"] == measured > 0
    again = StaticMixtureWorkSource(data, {"short": 1}, chunk_size=64, token_estimation=TokenEstimation(measure=measure))
    again.prime()  # the node cache answers: nothing is tokenized again
    assert calls["n"] == measured
    assert again.config.datasets[0].token_ratio == source.config.datasets[0].token_ratio


def pinned_source(**overrides):
    data = [Dataset.from_counts("a", [50] * 8, raw_bytes=[3000] * 8),
            Dataset.from_counts("b", [40, 60, 30], raw_bytes=[10000, 30000, 9000]),
            Dataset.from_counts("c", [20] * 5, raw_bytes=[500, 9000] * 2 + [100])]
    kwargs = dict(datasets=data, mixture={"a": 0.5, "b": 0.3, "c": 0.2}, chunk_size=16, seed=5,
                  token_estimation=TokenEstimation(primer={"a": 0.2, "b": 0.25, "c": 0.3}), stop_after_passes=2)
    kwargs.update(overrides)
    return StaticMixtureWorkSource(**kwargs)


@given(st.integers(1, 4), st.lists(st.integers(0, 60), min_size=1, max_size=4))
def test_restore_equals_the_uninterrupted_stream_and_lanes_partition(replicas, cuts):
    assert_replay_equivalent(lambda: pinned_source().clone_for_lane(0, replicas), cuts, max_chunks=80)
    assert_lanes_partition(pinned_source, replicas, max_chunks=80)


@pytest.mark.parametrize("policies", [{"exhausted_policy": "stop", "stop_after_passes": None},
                                      {"exhausted_policy": {"a": "repeat", "b": "redistribute", "c": "repeat"},
                                       "max_repeats": {"a": 2, "c": 3}, "stop_after_passes": None}])
def test_policies_behave_as_in_sample_mode(policies):
    source = pinned_source(**policies)
    chunks = collect(source.clone_for_lane(0, 1))
    assert chunks and source.clone_for_lane(0, 1).next_chunk() == chunks[0]
    lane = source.clone_for_lane(0, 1)
    collect(lane)
    saved = lane.state_dict()
    assert lane.next_chunk() is None and lane.state_dict() == saved
    assert all(c.target_mixture is not None for c in chunks)
    assert all(len(c) == 16 for c in chunks[:-1] if "b" not in c.source_exhausted)


@pytest.mark.parametrize("policies", [{"exhausted_policy": "stop", "stop_after_passes": None},
                                      {"exhausted_policy": {"a": "repeat", "b": "redistribute", "c": "repeat"},
                                       "max_repeats": {"a": 2, "c": 3}, "stop_after_passes": None}])
@given(replicas=st.integers(1, 3), cut=st.integers(0, 30))
def test_length_and_remaining_samples_count_the_lane(policies, replicas, cut):
    lane = pinned_source(**policies).clone_for_lane(0, replicas)
    assert len(lane) == sum(len(c) for c in collect(pinned_source(**policies).clone_for_lane(0, replicas)))
    read = sum(len(c) for c in collect(lane, cut))
    assert lane.remaining_samples() == len(lane) - read


def test_ratios_survive_restore_and_are_never_measured_again():
    lane = pinned_source().clone_for_lane(0, 1)
    collect(lane, 7)
    state = json.loads(json.dumps(lane.state_dict()))
    assert state["token_ratios"]["b"] == {"ratio": 0.25, "origin": "pinned"}

    def refuse(record):
        raise AssertionError("a restored source must not measure")

    fresh = pinned_source(token_estimation=TokenEstimation(measure=refuse)).clone_for_lane(0, 1)
    assert fresh.requires_token_priming
    fresh.load_state_dict(state)
    assert not fresh.requires_token_priming
    assert collect(fresh, 5) == collect(lane, 5)


@pytest.mark.parametrize("alloc", [[1, -1, 1], [0.0, 0, 0], [2**62, -2**62, 0], [0, 0], "x"])
def test_corrupted_token_deficits_are_refused(alloc):
    lane = pinned_source().clone_for_lane(0, 1)
    collect(lane, 3)
    state = json.loads(json.dumps(lane.state_dict()))
    assert sum(state["state"]["alloc"]) == 0 and all(type(d) is int for d in state["state"]["alloc"])
    state["state"]["alloc"] = alloc
    with pytest.raises(ValueError, match="token deficits"):
        pinned_source().clone_for_lane(0, 1).load_state_dict(sealed(state))


def test_version_1_checkpoints_are_refused_with_their_version():
    lane = pinned_source().clone_for_lane(0, 1)
    state = lane.state_dict()
    state["version"] = 1
    with pytest.raises(ValueError, match="version 1"):
        pinned_source().clone_for_lane(0, 1).load_state_dict(state)


def test_sample_and_token_checkpoints_do_not_mix():
    token_lane = pinned_source().clone_for_lane(0, 1)
    sample_lane = pinned_source(token_estimation=None).clone_for_lane(0, 1)
    with pytest.raises(ValueError, match="mode"):
        token_lane.load_state_dict(sample_lane.state_dict())
    with pytest.raises(ValueError, match="mode"):
        sample_lane.load_state_dict(token_lane.state_dict())


def test_poor_coverage_falls_back_with_a_warning(short_and_long, tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))

    def broken(record):
        raise ValueError("cannot tokenize")

    data = [Dataset.from_path("short", short_and_long["short"])]
    source = StaticMixtureWorkSource(data, {"short": 1}, chunk_size=64,
                                     token_estimation=TokenEstimation(measure=broken, fallback_tokens_per_byte=0.3))
    with pytest.warns(RuntimeWarning, match="'short'.*0.3"):
        source.prime()
    assert (source.config.datasets[0].token_ratio, source.config.datasets[0].ratio_origin) == (0.3, "fallback")


@pytest.mark.parametrize("kwargs, error", [
    ({"primer": "guess"}, ValueError), ({"primer": 0.0}, ValueError), ({"primer": {"a": -1}}, ValueError),
    ({"primer": True}, ValueError), ({"tokenizer": 42}, TypeError), ({"measure": "len"}, TypeError),
    ({"calibration_samples": 0}, ValueError), ({"calibration_shards_min": 5, "calibration_shards_max": 4}, ValueError),
    ({"fallback_tokens_per_byte": float("nan")}, ValueError), ({"text_field": ""}, ValueError),
    ({"calibration_shards_min": 2**40, "calibration_shards_max": 2**40}, ValueError),
    ({"calibration_samples": 2**17}, ValueError),
])
def test_bad_token_estimations_raise(kwargs, error):
    with pytest.raises(error):
        TokenEstimation(**kwargs)


def test_token_settings_are_checked_against_the_source():
    with pytest.raises(ValueError, match="neither tokenizer nor measure"):
        pinned_source(token_estimation=TokenEstimation())
    with pytest.raises(ValueError, match="unknown datasets"):
        pinned_source(token_estimation=TokenEstimation(primer={"zzz": 0.2}))
    with pytest.raises(ValueError, match="allocation"):
        pinned_source(allocation="fixed")
    with pytest.raises(TypeError):
        pinned_source(token_estimation="tokens")


def _as_runs(costs: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-draw costs as the kernel's run tables (runs of equal cost, back to back)."""
    ends, table, first = [], [], [0]
    for row in costs:
        last = [j for j in range(len(row)) if j + 1 == len(row) or row[j + 1] != row[j]]
        ends += [j + 1 for j in last]
        table += [row[j] for j in last]
        first.append(len(ends))
    return (np.array(ends, dtype=np.int64), np.array(table, dtype=np.int64), np.array(first, dtype=np.int64))


@given(st.lists(st.floats(1e-9, 1.0), min_size=1, max_size=11), st.integers(1, 200), st.data())
def test_draw_kernel_matches_reference(weights, target, data):
    """Both kernel paths (up to 8 datasets in registers, more on the heap), inactive datasets,
    carried deficits, costs that change within a chunk, the largest costs, and candidates given
    in pieces (the kernel stops for more, as planning extends them): the same draws and deficits."""
    n = len(weights)
    weights = [0.0 if data.draw(st.booleans()) and c else w for c, w in enumerate(weights)]
    units = weight_units(tuple(w / sum(weights) for w in weights))
    cost = st.sampled_from([COST_UNITS, 40, 112, MAX_COST]) | st.integers(COST_UNITS, MAX_COST)
    costs = [data.draw(st.lists(cost, max_size=target)) for _ in range(n)]
    start = [data.draw(st.integers(-MAX_COST, MAX_COST)) if u else 0 for u in units]
    start[0] -= sum(start)  # deficits sum to 0
    ref_deficits, ref_drawn = list(start), [0] * n
    expected = draw_reference(ref_deficits, units, costs, [len(c) for c in costs], ref_drawn, target)
    given = [data.draw(st.integers(0, len(c))) for c in costs]
    deficits, drawn = np.array(start, dtype=np.int64), np.zeros(n, dtype=np.int64)
    while True:
        status = kernel.draw(deficits, np.array(units, dtype=np.int64),
                             *_as_runs([row[:g] for row, g in zip(costs, given)]), drawn, target)
        if status == -1 or given[status] == len(costs[status]):
            break
        given[status] = len(costs[status])
    assert status == expected and drawn.tolist() == ref_drawn and deficits.tolist() == ref_deficits
    assert sum(ref_deficits) == 0 and max(map(abs, ref_deficits)) <= deficit_bound(n)


def test_draw_kernel_checks_its_arguments():
    ends, costs, first = _as_runs([[16, 16], [32]])
    one = np.ones(2, dtype=np.int64)
    with pytest.raises(ValueError, match="run offsets"):
        kernel.draw(np.zeros(2, dtype=np.int64), one, ends, costs, first[:2], np.zeros(2, dtype=np.int64), 3)
    with pytest.raises(ValueError, match="at least one dataset"):
        kernel.draw(np.zeros(2, dtype=np.int64), 0 * one, ends, costs, first, np.zeros(2, dtype=np.int64), 3)


@given(st.lists(st.floats(0.0, 1.0) | st.just(1e-12), min_size=1, max_size=40).filter(lambda w: sum(w) > 0))
def test_weight_units_sum_to_the_scale_and_keep_every_active_dataset(weights):
    normalised = [w / sum(weights) for w in weights]
    units = weight_units(tuple(normalised))
    assert sum(units) == WEIGHT_SCALE
    assert all((u >= 1) == (w > 0) for u, w in zip(units, normalised))
    assert all(abs(u - w * WEIGHT_SCALE) <= len(units) for u, w in zip(units, normalised))


class _Encoding:
    """A tiktoken-like encoding: its name says which vocabulary it encodes with."""

    def __init__(self, name):
        self.name = name

    def encode(self, text):
        return text.split()


def _split(text, limit):
    return text.split()[:limit]


def test_the_node_cache_tells_measure_functions_apart():
    from zephon.work import tokenizer_identity

    def words(r):
        return len(r["text"].split())
    assert tokenizer_identity(words) != tokenizer_identity(lambda r: len(r["text"]))
    assert tokenizer_identity(words) == tokenizer_identity(words)
    encodings = [_Encoding("small"), _Encoding("large")]
    assert tokenizer_identity(encodings[0].encode) != tokenizer_identity(encodings[1].encode)
    assert tokenizer_identity(encodings[0].encode) == tokenizer_identity(_Encoding("small").encode)
    split = [functools.partial(_split, limit=n) for n in (2, 3, 3)]
    assert tokenizer_identity(split[0]) != tokenizer_identity(split[1]) == tokenizer_identity(split[2])
    vocabularies = [_Vocabulary({b"a": 0, b"b": 1}), _Vocabulary({b"a": 1, b"b": 0}), _Vocabulary({b"a": 0, b"b": 1})]
    assert tokenizer_identity(vocabularies[0]) != tokenizer_identity(vocabularies[1])  # one name, other vocabularies
    assert tokenizer_identity(vocabularies[0].encode) == tokenizer_identity(vocabularies[2].encode)


class _Vocabulary(_Encoding):
    """A tokenizer whose ``get_vocab()`` keys are bytes (as tiktoken-style ones give)."""

    def __init__(self, vocabulary):
        super().__init__("one-name")
        self._vocabulary = vocabulary

    def get_vocab(self):
        return self._vocabulary


def test_a_cache_that_cannot_be_written_is_said_and_skipped(short_and_long, tmp_path, monkeypatch):
    data = [Dataset.from_path("short", short_and_long["short"])]
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "file" / "cache"))
    source = StaticMixtureWorkSource(data, {"short": 1}, chunk_size=64, token_estimation=TokenEstimation(tokenizer=str.split))
    with pytest.warns(RuntimeWarning, match="could not cache a token ratio"):
        source.prime()
    assert source.config.datasets[0].ratio_origin == "measured"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize("entry", ['{"ratio": 1e300, "origin": "measured"}', '{"ratio": -2.0, "origin": "measured"}',
                                   '{"ratio": 0.3, "origin": "guessed"}',
                                   "[" * 100_000 + "]" * 100_000])
def test_a_damaged_ratio_cache_entry_is_measured_again(short_and_long, tmp_path, monkeypatch, entry):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))
    data = [Dataset.from_path("short", short_and_long["short"])]

    def make():
        return StaticMixtureWorkSource(data, {"short": 1}, chunk_size=64,
                                       token_estimation=TokenEstimation(measure=lambda r: len(r["text"].split())))

    first = make()
    first.prime()
    entries = list((tmp_path / "token-ratios").glob("*.json"))
    assert len(entries) == 1
    entries[0].write_text(entry)
    again = make()
    again.prime()
    assert again.config.datasets[0].token_ratio == first.config.datasets[0].token_ratio
    assert json.loads(entries[0].read_text())["ratio"] == first.config.datasets[0].token_ratio


def _raising(record):
    raise KeyError("no such field: body")


@pytest.mark.parametrize("measure, cause", [
    (_raising, r"could be tokenized.*the first skipped record raised KeyError: 'no such field: body'"),
    (lambda record: 0, r"measured 0 tokens per byte, outside 0"),
])
def test_records_that_cannot_be_counted_fall_back_and_the_warning_names_why(short_and_long, tmp_path, monkeypatch,
                                                                           measure, cause):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))
    data = [Dataset.from_path("short", short_and_long["short"])]
    source = StaticMixtureWorkSource(data, {"short": 1}, chunk_size=64, token_estimation=TokenEstimation(measure=measure))
    with pytest.warns(RuntimeWarning, match=f"'short' falls back .*{cause}"):
        source.prime()
    assert source.config.datasets[0].ratio_origin == "fallback"


@pytest.mark.parametrize("measure, got", [
    (lambda record: -5, "got -5"),
    (lambda record: -1 if len(record["text"]) % 3 == 0 else len(record["text"]), "got -1"),
    (lambda record: 10**30, "got 10+"),
    (lambda record: float("nan"), "got nan"),
    (lambda record: "12", "got '12'"),
    (lambda record: True, "got True"),
    (lambda record: np.bool_(True), "got np.True_"),
    (lambda record: np.array([3, 4]), r"got array\(\[3, 4\]\)"),
])
def test_a_measure_that_returns_no_count_is_refused_naming_the_dataset(short_and_long, tmp_path, monkeypatch,
                                                                       measure, got):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))
    data = [Dataset.from_path("short", short_and_long["short"])]
    source = StaticMixtureWorkSource(data, {"short": 1}, chunk_size=64, token_estimation=TokenEstimation(measure=measure))
    before = source.config
    with pytest.raises(ValueError, match=rf"dataset 'short': the token measure is wrong .*{got}.*fix the measure"):
        source.prime()
    assert source.config == before and not list(tmp_path.rglob("token-ratios/*"))


@pytest.mark.parametrize("measure", [
    lambda record: len(record["text"]) / 4,
    lambda record: np.int64(len(record["text"])),
    lambda record: np.ones(len(record["text"]), dtype=np.int32).sum(),
    lambda record: np.array(len(record["text"]) / 3),
])
def test_a_measure_may_estimate_fractional_counts_and_return_numpy_scalars(short_and_long, tmp_path, monkeypatch,
                                                                           measure):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))
    data = [Dataset.from_path("short", short_and_long["short"])]
    source = StaticMixtureWorkSource(data, {"short": 1}, chunk_size=64, token_estimation=TokenEstimation(measure=measure))
    source.prime()
    assert source.config.datasets[0].ratio_origin == "measured"


def test_a_measure_may_return_a_torch_scalar():
    import torch
    estimate = TokenEstimation(measure=lambda record: torch.ones(len(record)).sum())
    assert estimate.count_tokens("abcde") == 5.0
    with pytest.raises(ValueError, match="must be a number"):
        TokenEstimation(measure=lambda record: torch.tensor(True)).count_tokens("abc")


def test_a_checkpoint_made_under_one_pinned_ratio_is_refused_by_a_source_that_pins_another():
    lane = pinned_source().clone_for_lane(0, 1)
    lane.next_chunk()
    state = lane.state_dict()
    changed = pinned_source(token_estimation=TokenEstimation(primer={"a": 0.2, "b": 2.5, "c": 0.3})).clone_for_lane(0, 1)
    with pytest.raises(ValueError, match=r"token ratio of 'b' is 0\.25, but this source pins 2\.5.*migrate"):
        changed.load_state_dict(state)
    same = pinned_source().clone_for_lane(0, 1)
    same.load_state_dict(state)
    assert same.next_chunk() == lane.next_chunk()

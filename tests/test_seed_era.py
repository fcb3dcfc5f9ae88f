"""What code written against the seed-era API relies on (issue 18), as its users would test it."""
import logging
import pickle
import threading
import warnings
from collections import Counter

import numpy as np
import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.io import fetch
from zephon.testing import collect
from zephon.work import MixtureSpec, TokenEstimation

from helpers import write_jsonl


@pytest.fixture(scope="module")
def short_and_long(tmp_path_factory):
    rng = np.random.default_rng(5)
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    root = tmp_path_factory.mktemp("docs")
    return [Dataset.from_path(name, write_jsonl(root / name, [[" ".join(rng.choice(words, n)) for _ in range(80)]
                                                             for _ in range(4)]))
            for name, n in (("short", 8), ("long", 40))]


def count_words(record):
    return len(record["text"].split())


def test_a_small_calibration_measures_what_was_asked(short_and_long, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))
    source = StaticMixtureWorkSource(short_and_long, {"short": 0.5, "long": 0.5}, chunk_size=64,
                                     exhausted_policy="repeat",
                                     token_estimation=TokenEstimation(measure=count_words, calibration_samples=16))
    with warnings.catch_warnings(), caplog.at_level(logging.INFO, logger="zephon"):
        warnings.simplefilter("error")
        source.prime()
    assert [d.ratio_origin for d in source.config.datasets] == ["measured", "measured"]
    assert "standard error" in caplog.text
    tokens = Counter()
    for chunk in collect(source.clone_for_lane(0, 1), 30):
        for name, pointers in chunk.components.items():
            tokens[name] += sum(count_words(r) for r in fetch(source.datasets_by_id, pointers))
    share = tokens["short"] / (tokens["short"] + tokens["long"])
    assert abs(share - 0.5) < 0.02, share


def test_a_scalar_max_repeats_applies_to_the_repeating_datasets_without_a_warning():
    data = [Dataset.from_counts("a", [50]), Dataset.from_counts("b", [10])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        source = StaticMixtureWorkSource(data, {"a": 0.5, "b": 0.5}, chunk_size=4,
                                         exhausted_policy={"a": "stop", "b": "repeat"}, max_repeats=3)
    assert not [w for w in caught if "max_repeats" in str(w.message)]
    b_pointers = [p for c in collect(source.clone_for_lane(0, 1)) for p in c.components.get("b", [])]
    assert len(b_pointers) == 4 * 10  # the first pass and three repeats, then the stream ends


@pytest.mark.parametrize("unset", [{"max_repeats": {"a": None}}, {"reshuffle_on_repeat": {"a": True}},
                                   {"pass_tail": {"a": "carry"}}, {"max_repeats": None}])
def test_a_setting_given_its_unset_value_does_not_warn(unset):
    data = [Dataset.from_counts("a", [50]), Dataset.from_counts("b", [10])]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StaticMixtureWorkSource(data, {"a": 0.5, "b": 0.5}, chunk_size=4,
                                exhausted_policy={"a": "stop", "b": "repeat"}, **unset)


@pytest.mark.parametrize("unset", [{}, {"max_repeats": None}, {"max_repeats": {"a": None}},
                                   {"max_repeats": {"a": None, "b": None}}, {"exhausted_policy": {}}])
def test_settings_that_set_nothing_keep_the_one_pass_default(unset):
    data = [Dataset.from_counts("a", [50]), Dataset.from_counts("b", [10])]
    source = StaticMixtureWorkSource(data, {"a": 0.5, "b": 0.5}, chunk_size=4, **unset)
    assert source.config.stop_after_passes == 1
    samples = sum(len(c) for c in collect(source.clone_for_lane(0, 1)))
    assert samples >= 100  # 'a' completes its pass of 50, 'b' repeats to keep the mixture


@pytest.mark.parametrize("kwargs, message", [
    ({"exhausted_policy": "stop", "max_repeats": 3}, "max_repeats=3 has no effect on .a.: its policy is .stop."),
    ({"exhausted_policy": {"a": "stop", "b": "repeat"}, "max_repeats": {"a": 2}}, r"max_repeats\['a'\]=2"),
    ({"exhausted_policy": {"a": "stop", "b": "repeat"}, "reshuffle_on_repeat": {"a": False}},
     r"reshuffle_on_repeat\['a'\]=False"),
])
def test_a_setting_that_cannot_take_effect_still_warns(kwargs, message):
    data = [Dataset.from_counts("a", [50]), Dataset.from_counts("b", [10])]
    with pytest.warns(RuntimeWarning, match=message):
        StaticMixtureWorkSource(data, {"a": 0.5, "b": 0.5}, chunk_size=4, **kwargs)


def add_length(item):
    return dict(item, length=len(item["text"]))


def test_lambdas_pickle_by_value_and_come_back_as_themselves(short_and_long):
    estimation = TokenEstimation(measure=lambda r: len(r["text"].split()))
    restored = pickle.loads(pickle.dumps(estimation))
    assert restored.measure({"text": "a b c"}) == 3 and restored.calibration_samples == estimation.calibration_samples
    pipeline = Pipeline(StaticMixtureWorkSource(short_and_long, {"short": 1, "long": 1}, chunk_size=8))
    pipeline = pipeline.map(lambda item: dict(item, tag=item["_component"][0]))
    assert [item["tag"] for item in pickle.loads(pickle.dumps(pipeline))][:4] == [i["tag"] for i in pipeline][:4]
    with pytest.raises(TypeError):
        pickle.dumps(pipeline.map(lambda item, lock=threading.Lock(): item))


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_a_spawn_dataloader_runs_a_lambda_map_and_a_lambda_measure(short_and_long, tmp_path, monkeypatch):
    zt = pytest.importorskip("zephon.torch")
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path))

    def pipeline():
        source = StaticMixtureWorkSource(short_and_long, {"short": 0.5, "long": 0.5}, chunk_size=16, seed=2,
                                         token_estimation=TokenEstimation(measure=lambda r: len(r["text"].split())))
        source.prime()  # on the driver, before the workers start
        return Pipeline(source).map(lambda item: dict(item, words=len(item["text"].split())))

    def read(**kwargs):
        return [(tuple(map(tuple, b["_sample_id"].tolist())), b["words"].tolist())
                for b in zt.DataLoader(pipeline(), batch_size=8, num_workers=1, even_batches=False, **kwargs)]

    spawned = read(multiprocessing_context="spawn")
    assert spawned and spawned == read()


def test_continues_after_exhaustion_is_a_frozenset_of_names():
    data = [Dataset.from_counts(n, [40]) for n in "abc"]
    source = StaticMixtureWorkSource(data, {"a": 1, "b": 1, "c": 1}, chunk_size=6,
                                     exhausted_policy={"a": "redistribute", "b": "stop", "c": "redistribute"})
    assert source.continues_after_exhaustion() == {"a", "c"}
    assert isinstance(source.continues_after_exhaustion(), frozenset) and "b" not in source.continues_after_exhaustion()


def test_mixture_spec_normalized_is_a_property():
    spec = MixtureSpec({"a": 3.0, "b": 1.0})
    assert spec.normalized["a"] == 0.75 and spec.normalized == {"a": 0.75, "b": 0.25}
    assert spec.normalized is spec.normalized  # computed once
    with pytest.raises(TypeError):
        spec.normalized["a"] = 0.0  # read-only: the spec stays as it was
    assert spec.normalized["a"] == 0.75
    import copy

    assert pickle.loads(pickle.dumps(spec)) == spec == copy.deepcopy(spec)


def test_mixture_spec_validates_against_components():
    spec = MixtureSpec({"a": 3.0, "b": 1.0, "x": 1.0})
    with pytest.raises(ValueError, match=r"no weight for components \['c'\]"):
        spec.validate_for(["a", "b", "c"])  # missing names are reported before unknown ones
    with pytest.raises(ValueError, match=r"unknown components \['x'\]"):
        spec.validate_for(["a", "b"])
    MixtureSpec({"a": 1, "b": 2}).validate_for(["b", "a"])


def test_mixture_spec_normalized_for_follows_the_given_order():
    spec = MixtureSpec({"a": 3.0, "b": 1.0, "x": 4.0})
    got = spec.normalized_for(["b", "a"])  # names outside the components are ignored
    assert got == {"b": 0.25, "a": 0.75} and list(got) == ["b", "a"]
    with pytest.raises(ValueError, match="'c'"):
        spec.normalized_for(["a", "c"])


def test_a_finite_source_says_its_total_samples():
    source = StaticMixtureWorkSource([Dataset.from_counts("a", [5, 7]), Dataset.from_counts("b", [4])],
                                     {"a": 0.5, "b": 0.5}, chunk_size=3, exhausted_policy="stop")
    lane = source.clone_for_lane(0, 1)
    assert source.total_samples == len(source) == lane.total_samples == sum(len(c) for c in iter(lane.next_chunk, None))

"""A mixture as a file: from_config(to_config()) rebuilds the same source, for every setting."""
import json
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import three_datasets
from hypothesis import assume, given
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.testing import collect
from zephon.work import TokenEstimation

NAMES = ("web", "code", "math")


def per_dataset(values):
    """A value for every dataset, or a mapping for some of them."""
    return st.one_of(values, st.dictionaries(st.sampled_from(NAMES), values, max_size=3))


@st.composite
def settings(draw):
    out = {
        "chunk_size": draw(st.integers(1, 40)), "seed": draw(st.integers(-5, 2**70)),
        "shuffle_shards": draw(st.booleans()), "shuffle_within_shard": draw(st.booleans()),
        "shuffle_block_size": draw(st.sampled_from([None, "auto", "global", 1, 17, 500])),
        "lane_assignment": draw(st.sampled_from(["permute", "modulo"])),
        "allocation": draw(st.sampled_from(["accumulator", "fixed"])),
    }
    optional = {
        "exhausted_policy": per_dataset(st.sampled_from(["stop", "repeat", "redistribute"])),
        "max_repeats": per_dataset(st.none() | st.integers(0, 3)),
        "reshuffle_on_repeat": per_dataset(st.booleans()),
        "pass_tail": per_dataset(st.sampled_from(["carry", "drop"])),
        "stop_after_passes": st.sampled_from([None, "auto", 1, 2]),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            out[key] = draw(strategy)
    return out


def build(kwargs, mixture=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return StaticMixtureWorkSource(three_datasets(), mixture or {"math": 1, "web": 5, "code": 3},
                                       **{"chunk_size": 10, **kwargs})


def rebuild(config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return StaticMixtureWorkSource.from_config(json.loads(json.dumps(config)))


@given(settings())
def test_every_setting_round_trips_through_json(kwargs):
    try:
        source = build(kwargs)
    except ValueError:
        assume(False)
    config = source.to_config()
    again = rebuild(config)
    assert again.config.fingerprint() == source.config.fingerprint()
    assert again.to_config() == config
    assert collect(again.clone_for_lane(1, 2), 30) == collect(source.clone_for_lane(1, 2), 30)


def test_the_mixture_order_and_uneven_shards_survive():
    source = build({"shuffle_block_size": "auto", "max_repeats": {"code": 2}, "exhausted_policy": "repeat",
                    "pass_tail": {"web": "drop"}})
    config = source.to_config()
    assert list(config["mixture"]) == ["math", "web", "code"]
    assert config["shuffle_block_size"] == "auto"
    assert config["datasets"][0] == {"name": "web", "shards": 10, "rows_per_shard": 100, "pass_tail": "drop"}
    assert config["datasets"][1]["counts"] == [40] * 5 + [0, 7]
    assert config["datasets"][1]["max_repeats"] == 2 and "max_repeats" not in config["datasets"][0]
    assert [d["pass_tail"] for d in config["datasets"]] == ["drop", "carry", "carry"]


def test_shard_ids_and_byte_sizes_round_trip():
    data = [Dataset.from_counts("a", [5, 6], shard_ids=[3, 9], raw_bytes=[50, 70])]
    source = StaticMixtureWorkSource(data, {"a": 1.0}, chunk_size=4)
    entry = source.to_config()["datasets"][0]
    assert entry == {"name": "a", "counts": [5, 6], "shard_ids": [3, 9], "raw_bytes": [50, 70]}
    assert rebuild(source.to_config()).config.fingerprint() == source.config.fingerprint()


def test_pinned_token_ratios_round_trip():
    data = [Dataset.from_counts(n, [100] * 4, raw_bytes=[4000] * 4) for n in ("a", "b")]
    source = StaticMixtureWorkSource(data, {"a": 0.5, "b": 0.5}, chunk_size=16,
                                     token_estimation=TokenEstimation(primer={"a": 0.2, "b": 0.3}))
    again = rebuild(source.to_config())
    assert again.to_config() == source.to_config()
    assert collect(again.clone_for_lane(0, 1), 5) == collect(source.clone_for_lane(0, 1), 5)


def write_parquet(directory, files, rows):
    directory.mkdir(parents=True)
    for f in range(files):
        pq.write_table(pa.table({"text": [f"{f}-{r}" for r in range(rows)]}), directory / f"part-{f:03}.parquet")


def test_a_toml_file_loads_with_paths_relative_to_it(tmp_path):
    write_parquet(tmp_path / "data" / "web", files=3, rows=20)
    (tmp_path / "mix.toml").write_text(
        'chunk_size = 8\nseed = 3\nstop_after_passes = 2\n\n[mixture]\nweb = 2.0\ncode = 1.0\n\n'
        '[[datasets]]\nname = "web"\npath = "data/web"\n\n'
        '[[datasets]]\nname = "code"\nshards = 4\nrows_per_shard = 10\nreshuffle_on_repeat = false\n')
    source = StaticMixtureWorkSource.from_config(tmp_path / "mix.toml")
    assert [d.total() for d in source.datasets_by_id.values()] == [60, 40]
    assert source.config.stop_after_passes == 2
    assert [d.reshuffle_on_repeat for d in source.config.datasets] == [True, False]
    config = source.to_config()
    assert config["datasets"][0]["path"] == str(tmp_path / "data" / "web")
    (tmp_path / "mix.json").write_text(json.dumps(config))
    again = StaticMixtureWorkSource.from_config(str(tmp_path / "mix.json"))
    assert again.config.fingerprint() == source.config.fingerprint()


@pytest.mark.parametrize("config, error, words", [
    ({"datasets": [{"name": "a", "shards": 1, "rows_per_shard": 5}], "mixture": {"a": 1}, "chunk": 4},
     ValueError, "unknown keys \\['chunk'\\]"),
    ({"datasets": [{"name": "a", "counts": [5], "shards": 1}], "mixture": {"a": 1}}, ValueError, "exactly one"),
    ({"datasets": [{"name": "a", "counts": [5], "weight": 1}], "mixture": {"a": 1}}, ValueError, "'weight'"),
    ({"datasets": [], "mixture": {}}, ValueError, "non-empty list 'datasets'"),
    ({"datasets": [{"name": "a", "counts": [5]}]}, ValueError, "'mixture' table"),
    ({"datasets": [{"name": "a", "shards": 2, "rows_per_shard": -1}], "mixture": {"a": 1}}, ValueError, "rows_per_shard"),
    ({"datasets": [{"name": "a", "counts": [5]}], "mixture": {"a": 1}, "token_estimation": {"tokenizer": "x"}},
     ValueError, "unknown keys \\['tokenizer'\\]"),
    ({"datasets": [{"name": "a", "counts": [50]}], "mixture": {"a": 1}, "chunk_size": 0}, ValueError, "chunk_size"),
    ({"datasets": [{"name": "a", "counts": [[5, 6], [7]]}], "mixture": {"a": 1}}, TypeError,
     r"Dataset 'a': counts must be a 1-D sequence of ints, got \[\[5, 6\], \[7\]\]"),
    ({"datasets": [{"name": "a", "counts": [5, [6]]}], "mixture": {"a": 1}}, TypeError, "Dataset 'a': counts must"),
    ({"datasets": [{"name": "a", "counts": [5, 6], "shard_ids": [[0], [1, 2]]}], "mixture": {"a": 1}}, TypeError,
     "Dataset 'a': shard_ids must"),
    ({"datasets": [{"name": "a", "counts": [5, 6], "raw_bytes": [[9], 9]}], "mixture": {"a": 1}}, TypeError,
     "Dataset 'a': raw_bytes must"),
    ({"datasets": [{"name": "a", "counts": None}], "mixture": {"a": 1}}, TypeError,
     r"datasets\[0\] \('a'\): counts must be a list of rows per shard"),
])
def test_bad_configs_raise_naming_the_key(config, error, words):
    with pytest.raises(error, match=words):
        StaticMixtureWorkSource.from_config(config)


@pytest.mark.parametrize("entry, key, owners", [
    ({"path": "/no/such/dir", "shard_ids": [7, 8]}, "shard_ids", "counts or shards"),
    ({"path": "/no/such/dir", "rows_per_shard": 5}, "rows_per_shard", "shards"),
    ({"path": "/no/such/dir", "raw_bytes": [1, 2]}, "raw_bytes", "counts or shards"),
    ({"counts": [30, 40], "rows_per_shard": 5}, "rows_per_shard", "shards"),
    ({"counts": [30, 40], "format": "parquet"}, "format", "path"),
    ({"shards": 2, "rows_per_shard": 5, "format": "jsonl"}, "format", "path"),
])
def test_a_key_that_does_not_go_with_how_a_dataset_names_its_data_is_refused(entry, key, owners):
    config = {"chunk_size": 8, "mixture": {"a": 1}, "datasets": [{"name": "a", **entry}]}
    with pytest.raises(ValueError, match=rf"datasets\[0\] \('a'\): '{key}' goes with a dataset named by {owners}, "):
        StaticMixtureWorkSource.from_config(config)  # before the path is looked at


def test_equal_shards_keep_their_ids_and_byte_sizes():
    source = StaticMixtureWorkSource([Dataset.from_counts("a", [5, 5], shard_ids=[3, 9], raw_bytes=[50, 70])],
                                     {"a": 1}, chunk_size=4)
    entry = source.to_config()["datasets"][0]
    assert entry == {"name": "a", "shards": 2, "rows_per_shard": 5, "shard_ids": [3, 9], "raw_bytes": [50, 70]}
    assert StaticMixtureWorkSource.from_config(source.to_config()).datasets_by_id[0].ids().tolist() == [3, 9]


def test_what_a_file_cannot_hold_is_refused(tmp_path):
    records = StaticMixtureWorkSource([Dataset.from_records("r", [[1, 2, 3]])], {"r": 1}, chunk_size=2)
    with pytest.raises(ValueError, match="in-memory records"):
        records.to_config()
    (tmp_path / "mix.yaml").write_text("")
    with pytest.raises(ValueError, match=".toml or .json"):
        StaticMixtureWorkSource.from_config(tmp_path / "mix.yaml")


def test_defaults_are_real_values_in_the_signature():
    import inspect

    parameters = inspect.signature(StaticMixtureWorkSource).parameters
    assert parameters["reshuffle_on_repeat"].default is True
    assert parameters["stop_after_passes"].default == "auto"
    assert build({"stop_after_passes": "auto", "exhausted_policy": "repeat"}).config.stop_after_passes is None
    assert build({"stop_after_passes": "auto"}).config.stop_after_passes == 1


@pytest.mark.parametrize("name, content, message", [
    ("empty.json", "", r"does not parse as JSON: Expecting value: line 1"),
    ("bad.toml", "chunk_size = = 3\n", r"does not parse as TOML: .*line 1"),
    ("latin.json", b'{"seed": "\xe9"}', r"does not parse as JSON"),
    ("deep.json", "[" * 100_000 + "]" * 100_000, r"nests its values too deeply"),
])
def test_a_config_that_does_not_parse_is_refused_with_its_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=f"mixture config '{path}' {message}"):
        StaticMixtureWorkSource.from_config(path)


def test_a_config_with_more_shards_than_a_dataset_may_have_is_refused_before_allocating(tmp_path):
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({"datasets": [{"name": "a", "shards": 100_000_000_000, "rows_per_shard": 1}],
                                "mixture": {"a": 1}}))
    with pytest.raises(ValueError, match=r"shards = 100000000000 is more than the \d+ .*MAX_SHARDS"):
        StaticMixtureWorkSource.from_config(path)


@pytest.mark.parametrize("mixture", [5, ["web"], "web"])
def test_a_mixture_that_is_not_a_table_of_weights_is_refused_by_name(mixture):
    config = {"datasets": [{"name": "web", "counts": [50] * 4}], "mixture": mixture}
    with pytest.raises(ValueError, match=r"needs a 'mixture' table of weights \(name -> weight\).*got"):
        StaticMixtureWorkSource.from_config(config)


def test_a_seed_too_long_to_write_in_a_checkpoint_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"seed has about 5000 digits.*no checkpoint could hold it"):
        StaticMixtureWorkSource([Dataset.from_counts("a", [50] * 4)], {"a": 1}, chunk_size=8, seed=10**5000)
    long = StaticMixtureWorkSource([Dataset.from_counts("a", [50] * 4)], {"a": 1}, chunk_size=8, seed=10**4000)
    assert long.clone_for_lane(0, 1).state_dict()["fingerprint"]  # any int a checkpoint can hold is a seed

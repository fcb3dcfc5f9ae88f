"""The core's configs are values (frozen, hashable, equal by value) that refuse what kernels cannot run."""
from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
from helpers import three_datasets

from zephon import StaticMixtureWorkSource
from zephon.core import DatasetPlan, SourceConfig, initial_state, step
from zephon.core.alloc import BUILT_IN, state_from_json
from zephon.core.cache import Bounded, scheduler


def _config(**kwargs) -> SourceConfig:
    return StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=10, **kwargs).config


def test_configs_are_values():
    a, b = _config(seed=3), _config(seed=3)
    assert a is not b and a == b and hash(a) == hash(b)
    assert a.datasets[0] == b.datasets[0] and hash(a.datasets[0]) == hash(b.datasets[0])
    assert {a: "found"}[b] == "found"
    assert a != _config(seed=4)
    assert a != dataclasses.replace(a, lane=1, canonical_replicas=2)
    copy = pickle.loads(pickle.dumps(a))
    assert copy == a and hash(copy) == hash(a)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.chunk_size = 5  # type: ignore[misc]


def test_plans_compare_their_shard_tables():
    plan = _config().datasets[2]
    counts = plan.shard_counts.copy()
    counts[0] += 1
    assert dataclasses.replace(plan, shard_counts=counts) != plan
    assert dataclasses.replace(plan, shard_counts=plan.shard_counts.copy()) == plan


def test_a_configs_lanes_share_its_kernels_one_per_lane():
    """Kept in the config's derived table, which the lanes ``for_lane`` makes share: a kernel per
    lane binding, made once, over the config's tables, made once for all its lanes; a config made
    apart, even an equal one, makes its own."""
    a = _config(seed=3)
    kernel = scheduler(a.for_lane(1, 2))
    tables, lane, replicas, *_ = kernel.__reduce__()[1]
    assert scheduler(a.for_lane(1, 2)) is kernel and (lane, replicas) == (1, 2)  # its lane binding
    assert scheduler(a.for_lane(0, 2)) is not kernel and scheduler(a) is not kernel
    assert scheduler(a.for_lane(0, 2)).__reduce__()[1][0] is tables and scheduler(a).__reduce__()[1][0] is tables
    assert scheduler(_config(seed=3).for_lane(1, 2)) is not kernel
    assert scheduler(_config(seed=3).for_lane(1, 2)).__reduce__()[1][0] is not tables
    clone = pickle.loads(pickle.dumps(kernel))  # a kernel pickles with its tables
    assert clone.__reduce__()[1][1:] == kernel.__reduce__()[1][1:]
    assert all(np.array_equal(x, y) for x, y in zip(clone.__reduce__()[1][0].__reduce__()[1], tables.__reduce__()[1]))
    size = len(pickle.dumps(a))
    for lane in range(50):
        scheduler(a.for_lane(lane, 50))
    assert len(pickle.dumps(a)) == size  # kernels are made again where a pickled config is used
    copy = pickle.loads(pickle.dumps(a.for_lane(1, 2)))
    assert scheduler(copy) is not kernel and scheduler(copy).__reduce__()[1][1:3] == (1, 2)
    assert scheduler(dataclasses.replace(a, allocator=pickle.loads(pickle.dumps(BUILT_IN["accumulator"])))) is not None


@pytest.mark.parametrize("change, error, words", [
    ({"chunk_size": 0}, ValueError, "chunk_size must be >= 1"),
    ({"chunk_size": 2.5}, TypeError, "chunk_size must be an int"),
    ({"chunk_size": True}, TypeError, "chunk_size must be an int"),
    ({"seed": "7"}, TypeError, "seed must be an int"),
    ({"stop_after_passes": 0}, ValueError, "stop_after_passes must be >= 1"),
    ({"lane_assignment": "random"}, ValueError, "lane_assignment must be one of"),
    ({"shuffle_shards": 1}, TypeError, "shuffle_shards must be True or False"),
    ({"allocator": "accumulator"}, TypeError, "allocator must be an Allocator"),
    ({"datasets": ()}, TypeError, "datasets must be a non-empty tuple"),
    ({"weight_order": (0, 0, 1)}, ValueError, "weight_order must be"),
    ({"lane": 2, "canonical_replicas": 2}, ValueError, "lane must be < canonical_replicas"),
    ({"lane": 0}, ValueError, "set together"),
])
def test_source_config_refuses_what_kernels_cannot_run(change, error, words):
    with pytest.raises(error, match=words):
        dataclasses.replace(_config(), **change)


@pytest.mark.parametrize("lane, replicas", [(0, 1), (3, 4), (4095, 4096)])
def test_for_lane_is_the_config_rebuilt_with_the_binding(lane, replicas):
    config = _config(seed=5)
    bound, rebuilt = config.for_lane(lane, replicas), dataclasses.replace(config, lane=lane, canonical_replicas=replicas)
    assert bound == rebuilt and hash(bound) == hash(rebuilt) and bound.lane_binding == (lane, replicas)
    assert (bound.normalised, bound.chunk_key, bound.lane_key) == (rebuilt.normalised, rebuilt.chunk_key,
                                                                   rebuilt.lane_key)
    assert config.lane is None and pickle.loads(pickle.dumps(bound)) == bound


@pytest.mark.parametrize("lane, replicas, words", [(2, 2, "lane must be < canonical_replicas"),
                                                   (-1, 2, "lane must be >= 0"), (0, 0, "canonical_replicas must be >= 1"),
                                                   (True, 2, "lane must be an int")])
def test_for_lane_refuses_a_binding_that_does_not_exist(lane, replicas, words):
    with pytest.raises((ValueError, TypeError), match=words):
        _config().for_lane(lane, replicas)


def test_a_paused_dataset_has_weight_zero_but_not_every_one():
    config = _config()
    paused = dataclasses.replace(config, datasets=(dataclasses.replace(config.datasets[0], weight=0.0),
                                                   *config.datasets[1:]))
    assert paused.normalised[0] == 0.0 and paused != config
    with pytest.raises(ValueError, match="at least one dataset a weight > 0"):
        dataclasses.replace(config, datasets=tuple(dataclasses.replace(d, weight=0.0) for d in config.datasets))


@pytest.mark.parametrize("change, error, words", [
    ({"shard_counts": np.array([3, -1])}, ValueError, "shard_counts must be >= 0"),
    ({"shard_counts": np.array([3])}, TypeError, "one entry per shard"),
    ({"shard_ids": np.array([4, 2])}, ValueError, "ascending and unique"),
    ({"shard_ids": np.array([0.5, 1.5])}, TypeError, "integer array"),
    ({"weight": -1.0}, ValueError, "weight must be finite and >= 0"),
    ({"weight": float("nan")}, ValueError, "weight must be finite and >= 0"),
    ({"policy": "loop"}, ValueError, "policy must be one of"),
    ({"max_repeats": -1}, ValueError, "max_repeats must be >= 0"),
    ({"block_size": None}, TypeError, "block_size must be an int"),
    ({"reshuffle_on_repeat": None}, TypeError, "reshuffle_on_repeat must be True or False"),
    ({"token_ratio": -2.0, "shard_bytes": np.array([10, 10])}, ValueError, "token_ratio must be a finite float > 0"),
    ({"order": (1, -1, True, True)}, ValueError, "order must be None or"),
    ({"order": [1, 0, True, True]}, ValueError, "order must be None or"),
])
def test_dataset_plan_refuses_what_kernels_cannot_run(change, error, words):
    plan = DatasetPlan(name="d", shard_ids=np.array([0, 1]), shard_counts=np.array([3, 4]), weight=1.0,
                       policy="stop", max_repeats=None, reshuffle_on_repeat=True, block_size=0)
    with pytest.raises(error, match=words):
        dataclasses.replace(plan, **change)


def test_step_runs_on_a_config_built_in_the_core():
    plan = DatasetPlan(name="d", shard_ids=np.arange(3), shard_counts=np.array([3, 4, 5]), weight=1.0,
                       policy="stop", max_repeats=None, reshuffle_on_repeat=True, block_size=0)
    config = SourceConfig(datasets=(plan,), chunk_size=4, seed=1, shuffle_shards=True, shuffle_within_shard=False,
                          stop_after_passes=None, lane_assignment="permute", allocator=BUILT_IN["accumulator"])
    chunk, state = step(initial_state(config), config)
    assert chunk is not None and len(chunk) == 4 and state.chunk_index == 1


def test_bounded_cache_keeps_the_most_recent():
    cache, built = Bounded(2), []

    def build(key):
        return lambda: built.append(key) or key

    for letter in "abacab":
        key = letter * 3  # a fresh but equal object each time: found by value
        assert cache.get(key, build(key)) == key
    assert built == ["aaa", "bbb", "ccc", "bbb"]  # "bbb" was the least recently used when "ccc" came
    same = ("x",)
    assert cache.get(same, lambda: ["built"]) is cache.get(same, lambda: ["again"])


class _Picky:
    """A fork's allocator that answers for its checkpoints and weights (the optional methods)."""

    name = "picky"
    reads = 0  # checkpoints this class was asked to read

    def init(self, num_datasets):
        return [0] * num_datasets

    def allocate(self, state, weights, chunk_size):
        quotas = [0] * len(weights)
        quotas[max(range(len(weights)), key=lambda c: weights[c])] = chunk_size
        return tuple(quotas), state

    def state_from_json(self, value, num_datasets):
        type(self).reads += 1
        if value != [0] * num_datasets:
            raise ValueError(f"picky: bad state {value!r}")
        return value

    def check_weights(self, weights, chunk_size, names):
        if len(set(weights)) != len(weights):
            raise ValueError(f"picky: tied weights for {list(names)}")


def test_an_allocator_answers_its_own_checkpoint_and_weight_questions():
    datasets = three_datasets()
    with pytest.raises(ValueError, match="picky: tied weights"):
        StaticMixtureWorkSource(datasets, {"web": 1, "code": 1, "math": 2}, chunk_size=10, allocation=_Picky())
    source = StaticMixtureWorkSource(datasets, {"web": 5, "code": 3, "math": 2}, chunk_size=10,
                                     allocation=_Picky(), exhausted_policy="repeat").clone_for_lane(0, 1)
    source.load_state_dict(source.state_dict())
    assert _Picky.reads == 1  # the checkpoint reader asked the allocator
    with pytest.raises(ValueError, match="picky: bad state"):
        state_from_json(_Picky(), [1, 0, 0], 3)

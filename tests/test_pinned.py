"""Pinned streams: the sha256 of the first pointers of a few configurations.

Changing any of these hashes changes the order users' runs see: it breaks checkpoint
compatibility and needs a new checkpoint version (zephon.core.checkpoint.VERSION).
"""
import hashlib

import numpy as np
import pytest

from helpers import three_datasets
from zephon import StaticMixtureWorkSource
from zephon.testing import collect

CONFIGS = {
    "default": {},
    "within+auto": {"shuffle_within_shard": True, "shuffle_block_size": "auto"},
    "global, lane 1 of 3": {"shuffle_block_size": "global", "lane": (1, 3)},
    "modulo, fixed, no reshuffle": {"lane_assignment": "modulo", "allocation": "fixed",
                                    "reshuffle_on_repeat": False, "stop_after_passes": 2},
}

PINNED = {
    "default": "7517b0e61b04b89c2cc7d80e5ae9444bf90cb5097a3f14536e59ff7f861eded4",
    "within+auto": "d1acb4651a922f6c0facc01d7f7413d18a2bd677688c6851ab7a3bea56b2fd73",
    "global, lane 1 of 3": "36ad7390769266785d08119d5c99caaa3f1dd33422541b5c5855afe4efe67441",
    "modulo, fixed, no reshuffle": "6bb57b21e59e134d552bb55f706b875197d5482c33c7625bf5e635791ccd1bdd",
}


def digest(name: str) -> str:
    kwargs = dict(CONFIGS[name])
    lane_id, replicas = kwargs.pop("lane", (0, 1))
    source = StaticMixtureWorkSource(three_datasets(), {"web": 5, "code": 3, "math": 2}, chunk_size=17,
                                     seed=2024, **kwargs).clone_for_lane(lane_id, replicas)
    h = hashlib.sha256()
    for chunk in collect(source, 40):
        pointers, components = chunk.read_order()
        h.update(pointers.astype("<i8").tobytes())
        h.update(components.astype("<i8").tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_stream_is_pinned(name):
    assert digest(name) == PINNED[name]

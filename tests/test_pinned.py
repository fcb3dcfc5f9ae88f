"""Pinned streams: the sha256 of the first pointers of a few configurations.

Changing any of these hashes changes the order users' runs see: it breaks checkpoint
compatibility and needs a new checkpoint version (zephon.core.checkpoint.VERSION).
"""
import hashlib

import pytest
from helpers import three_datasets

from zephon import Dataset, StaticMixtureWorkSource
from zephon.testing import collect
from zephon.work import TokenEstimation


def sized_datasets() -> list[Dataset]:
    """three_datasets with bytes on disk, for token mode."""
    return [Dataset.from_counts(d.name, d.counts(),
                                raw_bytes=[(700 + 900 * k) * int(n) for k, n in enumerate(d.counts())])
            for d in three_datasets()]


CONFIGS = {
    "default": {},
    "within+auto": {"shuffle_within_shard": True, "shuffle_block_size": "auto"},
    "global, lane 1 of 3": {"shuffle_block_size": "global", "lane": (1, 3)},
    "modulo, fixed, no reshuffle": {"lane_assignment": "modulo", "allocation": "fixed",
                                    "reshuffle_on_repeat": False, "stop_after_passes": 2},
    "tokens, pinned ratios": {"token_estimation": TokenEstimation(primer={"web": 0.2, "code": 0.3, "math": 0.25}),
                              "datasets": sized_datasets},
}

PINNED = {  # pass_tail="drop": zephon 0.2.0's streams
    "default": "74035c2b08f13a429112a34a510c95c8b5903cc798a553886a9515af8d68ffca",
    "within+auto": "f5901f9f7739714c13965edbd1540dcdfe08f8034ac36e1d66478beb8765642f",
    "global, lane 1 of 3": "b29d1b378cc4e2267940a17c7876952d5a07b28d2d334f9dfd79539c628a2bcc",
    "modulo, fixed, no reshuffle": "f1fb0a295f27f44544f0f2b6e52164495e7e8a103b99921b0b365d1a8266c0b4",
    "tokens, pinned ratios": "124fff056faebdc9fd7199f94823a9a4cd30de06ea47204481b35e6978eb9926",
}

PINNED_CARRY = {  # pass_tail="carry" (the default)
    "default": "68e03dff08c74a7baf5e692c8d6c380b7e9291ea485905da3c0c9887326a4d3a",
    "within+auto": "97ab5f892c70e36707fec7890a6156bcd2e21af32af23097e83233af78c0e8a4",
    "global, lane 1 of 3": "c1043ec8048b28737468cabe6018b581b3859fb2d4d8d70242b949b160446cf4",
    # the fixed quotas meet no pass tail within these 40 chunks: the same as "drop"
    "modulo, fixed, no reshuffle": "f1fb0a295f27f44544f0f2b6e52164495e7e8a103b99921b0b365d1a8266c0b4",
    "tokens, pinned ratios": "11354cb594e68c1e2809ab3b0878f49a0d422672aa387075b927a98dbe69df07",
}


def digest(name: str, pass_tail: str) -> str:
    kwargs = dict(CONFIGS[name], pass_tail=pass_tail)
    lane_id, replicas = kwargs.pop("lane", (0, 1))
    datasets = kwargs.pop("datasets", three_datasets)()
    source = StaticMixtureWorkSource(datasets, {"web": 5, "code": 3, "math": 2}, chunk_size=17,
                                     seed=2024, **kwargs).clone_for_lane(lane_id, replicas)
    h = hashlib.sha256()
    for chunk in collect(source, 40):
        pointers, components = chunk.read_order()
        h.update(pointers.astype("<i8").tobytes())
        h.update(components.astype("<i8").tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("pass_tail, pinned", [("drop", PINNED), ("carry", PINNED_CARRY)])
def test_stream_is_pinned(name, pass_tail, pinned):
    assert digest(name, pass_tail) == pinned[name]

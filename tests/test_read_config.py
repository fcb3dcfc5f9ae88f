"""MixtureReadConfig: validated on construction, frozen, and the default when none is given."""
from __future__ import annotations

import pytest

from zephon.core.read_config import (
    DEFAULT_READ,
    ComponentOrder,
    MixtureReadConfig,
    MixtureReadMode,
    read_config_or_default,
)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(mode="weighted_random"), "MixtureReadMode.WEIGHTED_RANDOM"),
        (dict(within_component="shuffle"), "ComponentOrder.SHUFFLE"),
        (dict(seed=False), "seed"),
        (dict(seed=2.0), "seed"),
        (dict(precompute=1), "precompute"),
    ],
)
def test_read_config_refuses_bad_fields(kwargs, match):
    with pytest.raises(TypeError, match=match):
        MixtureReadConfig(**kwargs)


def test_read_config_is_frozen():
    with pytest.raises(AttributeError):
        MixtureReadConfig().seed = 1  # type: ignore[misc]



def test_the_default_is_weighted_round_robin_as_stored():
    assert read_config_or_default(None) is DEFAULT_READ
    assert DEFAULT_READ == MixtureReadConfig(MixtureReadMode.WEIGHTED_ROUND_ROBIN, None, False,
                                             ComponentOrder.AS_IS)
    config = MixtureReadConfig(seed=3)
    assert read_config_or_default(config) is config


@pytest.mark.parametrize("bad", ["weighted_random", 1, MixtureReadMode.WEIGHTED_RANDOM])
def test_anything_but_a_config_or_none_is_refused(bad):
    with pytest.raises(TypeError, match="MixtureReadConfig or None"):
        read_config_or_default(bad)

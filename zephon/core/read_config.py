"""How a chunk is read: the interleaving of its components and the order inside each.

``MixtureReadConfig`` names the choice; ``zephon/core/readorder.py`` computes the order it
names. ``DEFAULT_READ`` (weighted round robin, components as stored) is the order a chunk
is read in when no config is given.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from zephon.core.chunk_checks import check_seed


class MixtureReadMode(Enum):
    """How a chunk interleaves its components."""

    WEIGHTED_ROUND_ROBIN = "weighted_round_robin"
    WEIGHTED_RANDOM = "weighted_random"


class ComponentOrder(Enum):
    """Order of the samples inside one component."""

    AS_IS = "as_is"
    SHUFFLE = "shuffle"


def _check_enum(name: str, value: Any, kind: type[Enum]) -> None:
    """Refuse a field ``name`` of ``MixtureReadConfig`` that is not a member of ``kind``."""
    if not isinstance(value, kind):
        choices = ", ".join(f"{kind.__name__}.{member.name}" for member in kind)
        raise TypeError(f"MixtureReadConfig.{name}={value!r} must be one of {choices}")


@dataclass(frozen=True, slots=True)
class MixtureReadConfig:
    """How to read a chunk; validated on construction.

    Parameters
    ----------
    mode : MixtureReadMode, default MixtureReadMode.WEIGHTED_ROUND_ROBIN
        Interleave components by smooth weighted round robin, or draw one per sample.
    seed : int or None, default None
        The seed of random choices; ``None``: the chunk's seed, or 0 when it has none.
    precompute : bool, default False
        Keep the ``(sample_id, name)`` pairs on the chunk for reuse.
    within_component : ComponentOrder, default ComponentOrder.AS_IS
        Read each component's pointers as stored, or shuffled first.
    """

    mode: MixtureReadMode = MixtureReadMode.WEIGHTED_ROUND_ROBIN
    seed: int | None = None  # None: the chunk's seed, or 0 when the chunk has none
    precompute: bool = False  # keep the (sample_id, name) pairs on the chunk for reuse
    within_component: ComponentOrder = ComponentOrder.AS_IS

    def __post_init__(self) -> None:
        _check_enum("mode", self.mode, MixtureReadMode)
        _check_enum("within_component", self.within_component, ComponentOrder)
        check_seed("MixtureReadConfig.seed", self.seed)
        if not isinstance(self.precompute, bool):
            raise TypeError(
                f"MixtureReadConfig.precompute={self.precompute!r} must be a bool; "
                "pass True or False"
            )


DEFAULT_READ = MixtureReadConfig()


def read_config_or_default(config: Any) -> MixtureReadConfig:
    """``config``, or ``DEFAULT_READ`` when it is None; a ``TypeError`` for anything else."""
    if config is None:
        return DEFAULT_READ
    if not isinstance(config, MixtureReadConfig):
        raise TypeError(
            f"config={config!r} must be a MixtureReadConfig or None; "
            "pass MixtureReadConfig(mode=..., within_component=...)"
        )
    return config


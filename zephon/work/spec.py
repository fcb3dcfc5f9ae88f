"""MixtureSpec: the weights of a mixture, validated once."""
from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from zephon.limits import show


def check_weight(name: str, weight: Any) -> float:
    """A positive finite weight as float, or a ``ValueError``/``TypeError`` naming it."""
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
        raise TypeError(f"mixture weight of {show(name)} must be a positive number, got {show(weight)}; pass e.g. 0.5")
    try:
        value = float(weight)
    except OverflowError:
        value = math.inf
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"mixture weight of {show(name)} must be positive and finite (at most {sys.float_info.max:.4g}), "
                         f"got {show(weight)}; pass e.g. 0.5")
    return value


@dataclass(frozen=True, slots=True)
class MixtureSpec:
    """``weights``: component name → positive finite weight (normalised by the source; order kept)."""

    weights: Mapping[str, float]

    def __post_init__(self) -> None:
        if not isinstance(self.weights, Mapping) or not self.weights:
            raise ValueError(f"MixtureSpec weights must be a non-empty mapping name -> weight, got {show(self.weights)}")
        checked = {}
        for name, weight in self.weights.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"MixtureSpec names must be non-empty str, got {show(name)}")
            checked[name] = check_weight(name, weight)
        object.__setattr__(self, "weights", checked)

    def normalized(self) -> dict[str, float]:
        """Weights divided by their sum (taken in insertion order)."""
        total = 0.0
        for weight in self.weights.values():
            total += weight
        return {name: weight / total for name, weight in self.weights.items()}

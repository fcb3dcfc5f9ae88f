"""MixtureSpec: the weights of a mixture, validated once."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping


def check_weight(name: str, weight: Any) -> float:
    """A positive finite weight as float, or a ``ValueError``/``TypeError`` naming it."""
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
        raise TypeError(f"mixture weight of {name!r} must be a positive number, got {weight!r}; pass e.g. 0.5")
    value = float(weight)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"mixture weight of {name!r} must be positive and finite, got {weight!r}; pass e.g. 0.5")
    return value


@dataclass(frozen=True, slots=True)
class MixtureSpec:
    """Component name → positive finite weight (normalised by the source; order kept)."""

    weights: Mapping[str, float]

    def __post_init__(self) -> None:
        if not isinstance(self.weights, Mapping) or not self.weights:
            raise ValueError(f"MixtureSpec weights must be a non-empty mapping name -> weight, got {self.weights!r}")
        checked = {}
        for name, weight in self.weights.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"MixtureSpec names must be non-empty str, got {name!r}")
            checked[name] = check_weight(name, weight)
        object.__setattr__(self, "weights", checked)

    def normalized(self) -> dict[str, float]:
        """Weights divided by their sum (taken in insertion order)."""
        total = 0.0
        for weight in self.weights.values():
            total += weight
        return {name: weight / total for name, weight in self.weights.items()}

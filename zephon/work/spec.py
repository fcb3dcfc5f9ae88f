"""MixtureSpec: the weights of a mixture, validated once."""
from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

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
    """Component name → positive finite weight (normalised by the source; order kept).

    Parameters
    ----------
    weights : Mapping[str, float]
        Positive finite weights by component name; not necessarily summing to 1.
    """

    weights: Mapping[str, float]
    _normalized: Mapping[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.weights, Mapping) or not self.weights:
            raise ValueError(f"MixtureSpec weights must be a non-empty mapping name -> weight, got {show(self.weights)}")
        checked = {}
        for name, weight in self.weights.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"MixtureSpec names must be non-empty str, got {show(name)}")
            checked[name] = check_weight(name, weight)
        object.__setattr__(self, "weights", checked)
        object.__setattr__(self, "_normalized", MappingProxyType(_normalise(checked)))

    def __reduce__(self) -> tuple[Any, ...]:
        return MixtureSpec, (dict(self.weights),)  # the read-only view is made again, not pickled

    @property
    def normalized(self) -> Mapping[str, float]:
        """Weights divided by their sum (taken in insertion order): computed once, the same
        read-only mapping on every access."""
        return self._normalized

    def validate_for(self, components: Iterable[str]) -> None:
        """Raise ``ValueError`` unless the names are exactly ``components``: missing ones first, then unknown."""
        names = list(components)
        missing = [n for n in names if n not in self.weights]
        if missing:
            raise ValueError(f"MixtureSpec has no weight for components {show(missing)}; give every component a weight")
        unknown = [n for n in self.weights if n not in names]
        if unknown:
            raise ValueError(f"MixtureSpec names unknown components {show(unknown)}; known: {show(names)}")

    def normalized_for(self, components: Iterable[str]) -> dict[str, float]:
        """The weights of ``components``, in that order, divided by their sum (name -> weight).

        Names of the spec that are not in ``components`` are ignored; a component without a
        weight raises ``ValueError``.
        """
        names = list(components)
        missing = [n for n in names if n not in self.weights]
        if missing:
            raise ValueError(f"MixtureSpec has no weight for components {show(missing)}; give every component a weight")
        return _normalise({n: self.weights[n] for n in names})


def _normalise(weights: Mapping[str, float]) -> dict[str, float]:
    """Weights divided by their sum, the sum taken in insertion order."""
    total = 0.0
    for weight in weights.values():
        total += weight
    return {name: weight / total for name, weight in weights.items()}

"""Checks of a chunk's arguments: pointer arrays, component names, seed, target, exhausted names,
the arrays ``read_order_into`` writes.

Each check raises a ``TypeError`` or ``ValueError`` naming the argument, its value and the
fix; those that convert (pointer arrays, target, exhausted names) return the value in the
form a ``WorkChunk`` stores it. They run before a chunk is built, so a refused argument
leaves nothing half made.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from numbers import Integral, Real
from typing import Any

import numpy as np

INT64_MAX = np.iinfo(np.int64).max  # the largest id a pointer may hold
_NORMALISED = 1e-12  # a target whose sum is this close to 1 is kept as given


def describe(value: Any) -> str:
    """Short description of an argument for error messages."""
    if isinstance(value, np.ndarray):
        return f"array(shape={value.shape}, dtype={value.dtype})"
    return repr(value)


def check_seed(name: str, seed: Any) -> None:
    """Refuse a ``seed`` (called ``name`` in the message) that is neither None nor an int."""
    if seed is not None and (not isinstance(seed, Integral) or isinstance(seed, bool)):
        raise TypeError(f"{name}={seed!r} must be None or an int; pass an integer seed")


def _check_name(name: Any) -> None:
    """Refuse a component name that is not a non-empty str."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"component name {name!r} must be a non-empty str; rename it")


def check_names(names: tuple[Any, ...]) -> None:
    """Refuse component names that are not non-empty strs or that repeat."""
    for name in names:
        _check_name(name)
    if len(set(names)) != len(names):
        raise ValueError(f"names={names!r} repeat a component; give each a unique name")


def pointer_array(name: Any, value: Any) -> np.ndarray:
    """``value`` as an ``(n, 3)`` int64 array of non-negative ids, or a clear error."""
    _check_name(name)
    fix = "pass a list of (dataset_id, shard_id, offset) triples or an (n, 3) integer array"
    try:
        array = np.asarray(value)
    except ValueError as error:
        raise ValueError(f"components[{name!r}] is ragged ({error}); {fix}") from None
    if array.shape == (0,):
        return np.empty((0, 3), dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"components[{name!r}]={describe(array)} is not integer; {fix}")
    if array.ndim != 2 or array.shape[1] != 3:
        raise ValueError(f"components[{name!r}]={describe(array)} is not (n, 3); {fix}")
    if array.size and (array.min() < 0 or array.max() > INT64_MAX):
        raise ValueError(
            f"components[{name!r}] holds ids outside [0, 2**63); ids are non-negative int64"
        )
    return array.astype(np.int64, copy=False)


def writable_order(array: np.ndarray) -> bool:
    """Whether the read order kernel can write ``array`` as it is: int64, C-contiguous, writable."""
    return array.dtype == np.int64 and array.flags.c_contiguous and array.flags.writeable


def order_arrays(pointers: Any, component: Any, n: int) -> None:
    """Refuse arrays ``read_order_into`` cannot write a chunk of ``n`` samples' order into."""
    for name, array, shape in (("pointers", pointers, (n, 3)), ("component", component, (n,))):
        if not (isinstance(array, np.ndarray) and array.shape == shape and writable_order(array)):
            raise ValueError(f"read_order_into: {name}={describe(array)} must be a writable C-contiguous int64 "
                             f"array of shape {shape}; pass np.empty({shape}, dtype=np.int64)")


def target_mixture(target: Any) -> dict[str, float] | None:
    """Validated target shares scaled to sum to 1 (kept as given when they already do)."""
    if target is None:
        return None
    if not isinstance(target, Mapping):
        raise TypeError(
            f"target_mixture={target!r} must be a mapping name -> weight or None; "
            "pass e.g. {'web': 0.7, 'code': 0.3}"
        )
    for name, weight in target.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"target_mixture key {name!r} must be a non-empty str")
        if (not isinstance(weight, Real) or isinstance(weight, bool)
                or not math.isfinite(weight) or weight < 0):
            raise ValueError(
                f"target_mixture[{name!r}]={weight!r} must be a finite number >= 0"
            )
    total = math.fsum(float(w) for w in target.values())
    if total <= 0:
        raise ValueError(f"target_mixture={dict(target)!r} must have a positive sum")
    scale = 1.0 if abs(total - 1.0) <= _NORMALISED else total
    return {name: float(weight) / scale for name, weight in target.items()}


def source_exhausted(names: Any) -> tuple[str, ...]:
    """Unique non-empty names, sorted."""
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(
            f"source_exhausted={names!r} must be a collection of names; "
            "pass e.g. ['web'], not a single string"
        )
    names = list(names)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"source_exhausted entry {name!r} must be a non-empty str")
    if len(set(names)) != len(names):
        raise ValueError(f"source_exhausted={names!r} repeats a name; list each once")
    return tuple(sorted(names))

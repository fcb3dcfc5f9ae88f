"""Interleaved read order of a chunk: the readable definition of the readorder kernel.

A chunk stores its components back to back in one ``(N, 3)`` buffer. Its read order says,
for every step ``t``, which component is read (``component[t]``) and which buffer row
(``rows[t]``). Components are interleaved by exact weighted round robin or by a seeded
weighted draw; inside a component rows go in stored order or through the keyed permutation
of ``zephon/core/perm.py``. ``read_order_reference`` is the pure Python twin of the kernel;
``read_order`` runs the kernel, and ``read_pointers`` also copies the rows out of the buffer.

**Compatibility**: both interleavings, the draw and the keys are frozen; they define the
order in which every chunk is read.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate

import numpy as np

from zephon._ext import readorder as _kernel
from zephon.core.keys import DOMAIN_READ_RANDOM, DOMAIN_READ_SHUFFLE, derive, purpose_key
from zephon.core.perm import perm_reference

MAX_CHUNK = 2**31  # most pointers per chunk: keeps n_k * t - E_k * N inside int64 (must match lookup.pyx)
UNIT = 2.0**-53  # must match UNIT in _ext/readorder.pyx


def random_key(seed: int) -> int:
    """Key of the weighted-random component draws under ``seed``."""
    return purpose_key(seed, DOMAIN_READ_RANDOM)


def shuffle_key(seed: int, position: int) -> int:
    """Key of the within-component shuffle of the component at ``position``."""
    return purpose_key(seed, DOMAIN_READ_SHUFFLE, position)


def round_robin_reference(counts: Sequence[int]) -> list[int]:
    """Component of every step under exact weighted round robin (pure).

    Emit from the component with samples left that maximises ``n_k·max(1, t) − E_k·N``
    (``N`` times ``T_k·max(1, t) − E_k``, kept in integers so it is bit-reproducible);
    ties go to the earlier component.
    """
    total = sum(counts)
    emitted = [0] * len(counts)
    order = []
    for t in range(total):
        left = [k for k, n in enumerate(counts) if emitted[k] < n]
        k = max(left, key=lambda k: counts[k] * max(1, t) - emitted[k] * total)
        emitted[k] += 1
        order.append(k)
    return order


def weighted_random_reference(counts: Sequence[int], key: int) -> list[int]:
    """Component of every step under seeded weighted draws (pure).

    Step ``t`` draws ``u = (derive(key, t) >> 11)·2**-53`` and ``x = ⌊u·W⌋`` (at most
    ``W − 1``), where ``W`` sums the original counts of the components with samples left,
    and emits the first such component whose running count sum exceeds ``x``.
    """
    left = list(counts)
    order = []
    for t in range(sum(counts)):
        u = (derive(key, t) >> 11) * UNIT
        weight = sum(n for n, remaining in zip(counts, left) if remaining)
        x = min(int(u * weight), weight - 1)
        running = 0
        for k, n in enumerate(counts):
            running += n if left[k] else 0
            if running > x:
                break
        left[k] -= 1
        order.append(k)
    return order


def read_order_reference(
    counts: Sequence[int], *, weighted_random: bool, shuffle: bool, seed: int
) -> tuple[list[int], list[int]]:
    """``(component, rows)`` of every step: the pure Python twin of the kernel.

    The component at position ``k`` emits its ``j``-th sample from buffer row
    ``start_k + j``, or ``start_k + perm(shuffle_key(seed, k), n_k)(j)`` when ``shuffle``.
    """
    components = (
        weighted_random_reference(counts, random_key(seed))
        if weighted_random
        else round_robin_reference(counts)
    )
    starts = [0, *accumulate(counts)]
    emitted = [0] * len(counts)
    rows = []
    for k in components:
        j = emitted[k]
        emitted[k] += 1
        if shuffle:
            j = perm_reference(shuffle_key(seed, k), counts[k], j)
        rows.append(starts[k] + j)
    return components, rows


def _checked_counts(counts: Sequence[int] | np.ndarray) -> np.ndarray:
    """``counts`` as a 1-D int64 array, after the checks every kernel door relies on."""
    array = np.ascontiguousarray(counts, dtype=np.int64)
    values = array.tolist() if array.ndim == 1 else None  # Python ints: the sum cannot wrap
    if values is None or min(values, default=0) < 0 or sum(values) > MAX_CHUNK:
        raise ValueError(
            f"read_order: counts={counts!r} must be a 1-D array of non-negative counts "
            f"summing to at most {MAX_CHUNK}; split larger chunks"
        )
    return array


def _kernel_args(counts: np.ndarray, weighted_random: bool, shuffle: bool,
                 seed: int) -> tuple[int, np.ndarray | None]:
    """The draw key (0 when unused) and the shuffle keys (None when unused) of a read."""
    keys = (
        np.array([shuffle_key(seed, k) for k in range(len(counts))], dtype=np.uint64)
        if shuffle
        else None
    )
    return (random_key(seed) if weighted_random else 0), keys


def read_order(
    counts: Sequence[int] | np.ndarray, *, weighted_random: bool, shuffle: bool, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(component, rows)`` int64 arrays of every step, computed by the kernel.

    Same meaning as ``read_order_reference``; ``counts`` are non-negative, one per component.
    """
    counts = _checked_counts(counts)
    draw_key, keys = _kernel_args(counts, weighted_random, shuffle, seed)
    return _kernel.read_order(counts, weighted_random, draw_key, keys)


def read_pointers(
    buffer: np.ndarray, counts: Sequence[int] | np.ndarray, *, weighted_random: bool,
    shuffle: bool, seed: int, out: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(pointers, component)``: ``buffer[rows]`` and ``component`` of ``read_order``.

    ``buffer`` is a C-contiguous ``(N, 3)`` int64 array holding the components back to back
    as ``counts`` says (it may be read-only). ``out``: C-contiguous ``(N, 3)`` and ``(N,)``
    int64 arrays to write them into (and return), instead of new ones.
    """
    counts = _checked_counts(counts)
    draw_key, keys = _kernel_args(counts, weighted_random, shuffle, seed)
    return _kernel.read_pointers(buffer, counts, weighted_random, draw_key, keys, *(out or ()))


def iter_pairs(
    pointers: np.ndarray, component: np.ndarray, names: tuple[str, ...]
) -> Iterator[tuple[tuple[int, int, int], str]]:
    """``((dataset_id, shard_id, offset), names[component[t]])`` for every step, as Python values.

    Takes ``read_pointers``' arrays, which must not change while it runs. Like ``zip``, it
    refills a pair for a later step once nothing else holds it; a pair or id that a caller
    keeps never changes.
    """
    return _kernel.iter_pairs(pointers, component, names)

"""Allocators: how many pointers each dataset contributes to one chunk.

An allocator is a pure step ``allocate(state, weights, chunk_size) -> (quotas, state')``
with a JSON-able state. ``weights`` are normalised over the *active* datasets and are exactly
``0.0`` for inactive ones, which must get a quota of 0. Quotas sum to ``chunk_size``.

| allocator | ``name`` | state |
|---|---|---|
| :class:`AccumulatorAllocator` (default) | ``"accumulator"`` | one float per dataset |
| :class:`FixedAllocator` (legacy) | ``"fixed"`` | none |
| your own (see :class:`Allocator`) | any string | any JSON value |

The built-in allocators also run inside the scheduling kernel (``_ext/schedule.pyx``);
these classes are the definition the kernel is tested against.

**Compatibility**: the accumulator's arithmetic is fixed (double precision, in the order given
below) and reproduced bit for bit by the kernel.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Protocol, Sequence, runtime_checkable

from zephon.limits import show

Quotas = tuple[int, ...]


@runtime_checkable
class Allocator(Protocol):
    """The allocator protocol a research fork implements in plain Python.

    ``name`` joins the checkpoint fingerprint; ``init`` returns the starting state (JSON:
    str/int/float/bool/None/list/dict); ``allocate`` must be pure and deterministic.

    Two optional methods let an allocator answer for itself (see :func:`state_from_json` and
    :func:`check_weights`): ``state_from_json(value, num_datasets)`` validates a checkpoint's
    state, and ``check_weights(weights, chunk_size, names)`` refuses weights it cannot serve.
    """

    name: str

    def init(self, num_datasets: int) -> Any: ...

    def allocate(self, state: Any, weights: Sequence[float], chunk_size: int) -> tuple[Quotas, Any]: ...


class _Settingless:
    """A built-in allocator has no settings: all its instances are one allocator (equal, same
    hash), so configs holding one compare by value, also after pickling."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self).__qualname__)


class AccumulatorAllocator(_Settingless):
    """Carry each dataset's fractional share forward, so the mixture is exact in the limit.

    Per chunk, over the active datasets in order: ``acc += w·cs``; the integer part is the
    base quota; a largest-remainder correction makes the quotas sum to ``cs`` and is debited
    back into the accumulators. If an inactive dataset still holds a non-zero accumulator
    (it has just retired) every accumulator is zeroed first.
    """

    name = "accumulator"

    def init(self, num_datasets: int) -> tuple[float, ...]:
        return (0.0,) * num_datasets

    def state_from_json(self, value: Any, num_datasets: int) -> tuple[float, ...]:
        if not is_accumulator_state(value, num_datasets):
            raise ValueError(f"checkpoint alloc must be {num_datasets} accumulators, floats >= -1 whose sum "
                             f"lies in [-1, 1), got {show(value)}; the checkpoint is corrupted")
        return tuple(value)

    def allocate(self, state: Sequence[float], weights: Sequence[float], chunk_size: int) -> tuple[Quotas, tuple[float, ...]]:
        acc = list(state)
        active = [c for c, w in enumerate(weights) if w > 0.0]
        if any(weights[c] == 0.0 and acc[c] != 0.0 for c in range(len(acc))):
            acc = [0.0] * len(acc)
        quotas = [0] * len(acc)
        for c in active:
            acc[c] = acc[c] + weights[c] * chunk_size
            quotas[c] = math.trunc(acc[c])
            acc[c] -= quotas[c]
        _correct(quotas, acc, active, chunk_size - sum(quotas))
        return tuple(quotas), tuple(acc)

    def allocate_many(self, state: Sequence[float], weights: Sequence[float], chunk_size: int,
                      n: int) -> tuple[Quotas, tuple[float, ...]] | None:
        """``n`` (>= 1) chunks at constant weights at once: the quotas summed over them and the state
        after them, or None where this closed form does not hold (call ``allocate`` n times).

        It holds where every active share ``w·cs`` is >= 1 and lies, with its accumulator, on a
        grid 2^-m where the double arithmetic is exact, and every correction on the way is a
        regular one. Then dataset c's remainder is the fractional part of ``acc + n·share`` and
        the corrected datasets are those with the largest remainders (derivation in
        docs/performance.md). The kernel skips other lanes' chunks so.
        """
        active = [c for c, w in enumerate(weights) if w > 0.0]
        shares = {c: Fraction(weights[c] * chunk_size) for c in active}
        if any(state[c] != 0.0 for c, w in enumerate(weights) if w == 0.0) or not all(
                _exact_on_grid(shares[c], state[c]) for c in active):
            return None
        start, drift = sum(Fraction(state[c]) for c in active), sum(shares.values()) - chunk_size
        if not all(-1 <= start + t * drift < 1 for t in (1, n)):
            return None
        quotas, acc = [0] * len(state), list(state)
        for c in active:
            x = Fraction(state[c]) + n * shares[c]
            quotas[c] = math.floor(x)
            acc[c] = float(x - quotas[c])
        deficit = n * chunk_size - sum(quotas)
        if not 0 <= deficit <= len(active):
            return None
        for c in sorted(active, key=lambda c: (-acc[c], c))[:deficit]:
            quotas[c] += 1
            acc[c] -= 1.0
        return tuple(quotas), tuple(acc)


def is_accumulator_state(value: Any, num_datasets: int) -> bool:
    """``value`` holds accumulators as every chunk leaves them: a list of ``num_datasets``
    floats, each >= -1, summing to a value in [-1, 1) (a chunk moves the sum only by rounding).
    From a state outside, a chunk could get a negative quota."""
    return (isinstance(value, list) and len(value) == num_datasets
            and all(type(v) is float and math.isfinite(v) and v >= -1.0 for v in value)
            and -1.0 <= math.fsum(value) < 1.0)


def _exact_on_grid(share: Fraction, acc: float) -> bool:
    """``acc + share`` is a double for this ``acc`` and for every one in [-1, 1) on ``share``'s
    grid 2^-m (m <= 52), and this ``acc`` lies on it in [-1, 2]: ``share`` >= 1 and
    (share + 1)·2^m <= 2^53."""
    m = share.denominator.bit_length() - 1
    return (share >= 1 and m <= 52 and (share + 1) * 2**m <= 2**53 and -1 <= acc <= 2
            and (acc * 2**m).is_integer() and (acc + share) * 2**m <= 2**53)


def _correct(quotas: list[int], acc: list[float], active: list[int], d: int) -> None:
    """The largest-remainder correction, in place: quotas then sum to the chunk size."""
    if d > 0:
        order = sorted(active, key=lambda c: (-acc[c], c))
        for i in range(d):
            c = order[i % len(order)]
            quotas[c] += 1
            acc[c] -= 1.0
    elif d < 0:
        order = sorted(active, key=lambda c: (acc[c], c))
        while d < 0:
            for c in order:
                if d < 0 and quotas[c] > 0:
                    quotas[c] -= 1
                    acc[c] += 1.0
                    d += 1


class FixedAllocator(_Settingless):
    """The legacy strategy: the same quotas every chunk (while the active set is unchanged).

    Every active dataset gets one slot; then, by descending weight (ties by position), up to
    ``floor(max(0, w·cs − 1))`` more while slots remain; the rest one each by largest
    fractional part of ``w·cs`` (ties by position). ``w·cs < 1`` is refused at construction.
    """

    name = "fixed"

    def init(self, num_datasets: int) -> tuple[()]:
        return ()

    def state_from_json(self, value: Any, num_datasets: int) -> tuple[()]:
        if value != []:
            raise ValueError(f"checkpoint alloc must be [] for the fixed allocator, got {show(value)}")
        return ()

    def check_weights(self, weights: Sequence[float], chunk_size: int, names: Sequence[str]) -> None:
        total = sum(weights)
        for name, weight in zip(names, weights):
            if weight / total * chunk_size < 1:
                raise ValueError(
                    f"allocation='fixed' needs weight x chunk_size >= 1 for every dataset, {name!r} has less; "
                    f"raise chunk_size or use allocation='accumulator'"
                )

    def allocate(self, state: tuple[()], weights: Sequence[float], chunk_size: int) -> tuple[Quotas, tuple[()]]:
        active = [c for c, w in enumerate(weights) if w > 0.0]
        quotas = [1 if w > 0.0 else 0 for w in weights]
        left = chunk_size - len(active)
        for c in sorted(active, key=lambda c: (-weights[c], c)):
            extra = min(left, math.floor(max(0.0, weights[c] * chunk_size - 1.0)))
            quotas[c] += extra
            left -= extra
        by_fraction = sorted(active, key=lambda c: (-math.modf(weights[c] * chunk_size)[0], c))
        for i in range(left):
            quotas[by_fraction[i % len(by_fraction)]] += 1
        return tuple(quotas), state


def state_from_json(allocator: Allocator, value: Any, num_datasets: int) -> Any:
    """The allocator's state from a checkpoint: its own ``state_from_json`` if it has one, else as stored."""
    read = getattr(allocator, "state_from_json", None)
    return value if read is None else read(value, num_datasets)


def check_weights(allocator: Allocator, weights: Sequence[float], chunk_size: int, names: Sequence[str]) -> None:
    """Refuse weights the allocator cannot serve (its own ``check_weights``, if it has one)."""
    check = getattr(allocator, "check_weights", None)
    if check is not None:
        check(weights, chunk_size, names)


BUILT_IN: dict[str, Allocator] = {"accumulator": AccumulatorAllocator(), "fixed": FixedAllocator()}
KERNEL_CODES: dict[type, int] = {AccumulatorAllocator: 0, FixedAllocator: 1}  # the scheduling kernel's codes

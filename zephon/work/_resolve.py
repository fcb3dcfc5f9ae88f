"""Turn StaticMixtureWorkSource's arguments into a validated SourceConfig.

Every check raises before anything is built, naming the parameter, the value and the fix.
"""
from __future__ import annotations

import math
import numbers
import sys
import warnings
from typing import Any, Callable, Mapping, Sequence

from zephon.core.alloc import BUILT_IN, Allocator, check_weights
from zephon.core.config import (
    CARRY,
    EXACT,
    MODULO,
    PASS_TAILS,
    PERMUTE,
    PINNED,
    POLICIES,
    REDISTRIBUTE,
    REPEAT,
    STOP,
    DatasetPlan,
    SourceConfig,
)
from zephon.core.tokens import MAX_DATASETS as MAX_TOKEN_DATASETS
from zephon.core.tokens import token_shares
from zephon.io import Dataset
from zephon.limits import (
    MAX_CHUNK_SIZE,
    MAX_DATASETS,
    MAX_PASSES,
    MAX_STREAM_SAMPLES,
    MIN_SHARE,
    show,
)
from zephon.work.spec import MixtureSpec
from zephon.work.tokens import TokenEstimation


AUTO = "auto"  # stop_after_passes: 1, unless exhausted_policy or max_repeats is given


def _int(parameter: str, value: Any, minimum: int, example: str, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; bools, floats and arrays are refused."""
    if type(value) is bool or not isinstance(value, numbers.Integral):
        raise TypeError(f"{parameter} must be an int >= {minimum}, got {show(value)}; pass e.g. {example}")
    number = int(value)
    if number < minimum or (maximum is not None and number > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{parameter} must be {bound}, got {show(number)}; pass e.g. {example}")
    return number


def _bool(parameter: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{parameter} must be True or False, got {show(value)}")
    return value


def _per_dataset(parameter: str, value: Any, names: Sequence[str], default: Any,
                 check: Callable[[str, Any], Any]) -> list[Any]:
    """Expand a value or a mapping name → value (omitted names take ``default``) to a list."""
    if isinstance(value, Mapping):
        known = set(names)
        unknown = [k for k in value if k not in known]
        if unknown:
            raise ValueError(f"{parameter} names unknown datasets {show(unknown)}; known: {show(list(names))}")
        return [check(f"{parameter}[{n!r}]", value[n]) if n in value else default for n in names]
    return [check(parameter, value)] * len(names)


def _policy(parameter: str, value: Any) -> str:
    if not isinstance(value, str) or value not in POLICIES:
        raise ValueError(f"{parameter} must be one of {list(POLICIES)}, got {show(value)}")
    return value


def _pass_tail(parameter: str, value: Any) -> str:
    if not isinstance(value, str) or value not in PASS_TAILS:
        raise ValueError(f"{parameter} must be one of {list(PASS_TAILS)}, got {show(value)}; pass 'carry' to read "
                         f"every pass completely or 'drop' to skip a pass's short tail (the earlier rule)")
    return value


def _max_repeats(parameter: str, value: Any) -> int | None:
    return None if value is None else _int(parameter, value, 0, "3", MAX_PASSES)


def _datasets(datasets: Any) -> list[Dataset]:
    if isinstance(datasets, (str, bytes)) or not isinstance(datasets, Sequence) or not datasets:
        raise ValueError(f"datasets must be a non-empty list of Dataset, got {show(datasets)}")
    if len(datasets) > MAX_DATASETS:
        raise ValueError(f"datasets may hold at most {MAX_DATASETS} datasets, got {len(datasets)}; merge some")
    names: set[str] = set()
    for d in datasets:
        if not isinstance(d, Dataset):
            raise TypeError(f"datasets must hold zephon.io.Dataset objects, got {show(d)}; build one with "
                            "Dataset.from_counts")
        if d.name in names:
            raise ValueError(f"dataset names must be unique, {show(d.name)} appears twice; rename one")
        names.add(d.name)
    if sum(d.total() for d in datasets) > MAX_STREAM_SAMPLES:
        raise ValueError(f"datasets hold more than {MAX_STREAM_SAMPLES} (2**52) samples together; a source may "
                         "mix at most that many: split the run into several sources")
    return list(datasets)


def _weights(mixture: Any, names: list[str]) -> tuple[list[float], tuple[int, ...]]:
    """The weights in dataset order, and the datasets in the mixture's order (for summing)."""
    if not isinstance(mixture, (MixtureSpec, Mapping)):
        raise TypeError(f"mixture must be a MixtureSpec or a mapping name -> weight, got {show(mixture)}; "
                        f"pass e.g. {{{names[0]!r}: 1.0}}")
    spec = mixture if isinstance(mixture, MixtureSpec) else MixtureSpec(mixture)
    position = {n: i for i, n in enumerate(names)}
    missing = [n for n in names if n not in spec.weights]
    unknown = [n for n in spec.weights if n not in position]
    if missing or unknown:
        raise ValueError(
            f"mixture names must equal the dataset names {show(names)}: missing {show(missing)}, unknown "
            f"{show(unknown)}; give every dataset exactly one weight"
        )
    weights = [spec.weights[n] for n in names]
    _check_shares(spec.weights)
    return weights, tuple(position[n] for n in spec.weights)


def _check_shares(weights: Mapping[str, float]) -> None:
    """Refuse weights whose sum overflows or whose smallest share is below double resolution."""
    total = 0.0
    for w in weights.values():
        total += w
    if not math.isfinite(total):
        raise ValueError(f"mixture weights must have a finite sum, got {show(dict(weights))}; scale them down "
                         "(only their ratios matter)")
    name = min(weights, key=weights.__getitem__)
    if weights[name] / total < MIN_SHARE:
        raise ValueError(f"mixture weight of {show(name)} is {weights[name] / total:.3g} of the total, below the smallest "
                         f"share {MIN_SHARE:.3g} (2**-50); raise it or drop the dataset")


def _block_sizes(value: Any, datasets: list[Dataset]) -> list[int]:
    totals = [d.total() for d in datasets]
    if value is None:
        return [0] * len(datasets)
    if not isinstance(value, (str, numbers.Integral)):
        raise TypeError(f"shuffle_block_size must be None, an int >= 1, 'auto' or 'global', got {show(value)}")
    if value == "global":
        return totals
    if value == "auto":
        largest = max(d.max_count() for d in datasets)
        if largest == 0:
            raise ValueError("shuffle_block_size='auto' needs a non-empty shard; every shard is empty")
        return [min(8 * largest, t) for t in totals]
    if isinstance(value, str):
        raise ValueError(f"shuffle_block_size must be None, an int >= 1, 'auto' or 'global', got {show(value)}")
    size = _int("shuffle_block_size", value, 1, "'auto' or 65536")
    return [min(size, t) for t in totals]


def _allocator(allocation: Any) -> Allocator:
    if isinstance(allocation, str):
        if allocation not in BUILT_IN:
            raise ValueError(f"allocation must be one of {list(BUILT_IN)} or an allocator object, got {show(allocation)}")
        return BUILT_IN[allocation]
    if not isinstance(allocation, Allocator) or not isinstance(getattr(allocation, "name", None), str):
        raise TypeError(
            f"allocation must be 'accumulator', 'fixed' or an object with name, init() and allocate(), "
            f"got {show(allocation)}; see zephon.core.alloc.Allocator"
        )
    return allocation


def _stopping(exhausted_policy: Any, max_repeats: Any, stop_after_passes: Any) -> tuple[int | None, str]:
    """``stop_after_passes`` and the default policy, from which arguments were given."""
    if stop_after_passes == AUTO:
        passes = None if (_given(exhausted_policy) or _given(max_repeats)) else 1
    else:
        passes = None if stop_after_passes is None else _int("stop_after_passes", stop_after_passes, 1, "2", MAX_PASSES)
    return passes, (REPEAT if passes is not None else STOP)


def _given(value: Any) -> bool:
    """Whether a per-dataset setting sets anything: a mapping of only None values sets nothing."""
    if isinstance(value, Mapping):
        return any(v is not None for v in value.values())
    return value is not None


def _check_stopping(passes: int | None, policies: list[str], repeats: list[int | None], names: list[str]) -> None:
    if passes is None:
        return
    bad = [n for n, p in zip(names, policies) if p != REPEAT]
    if bad:
        raise ValueError(
            f"stop_after_passes={passes} needs exhausted_policy='repeat', but {bad} do not repeat; "
            f"drop stop_after_passes or let them repeat"
        )
    capped = [n for n, r in zip(names, repeats) if r is not None]
    if capped:
        raise ValueError(f"stop_after_passes={passes} cannot be combined with max_repeats (set for {capped}); use one of them")


def _no_effect(parameter: str, value: Any, plans: list[DatasetPlan],
               why_useless: Callable[[DatasetPlan], str | None]) -> None:
    """Warn when a value given for ``parameter`` can have no effect.

    A mapping entry warns for its dataset; a scalar applies to the datasets it can apply to,
    so it warns only when it can apply to none of them. ``why_useless(plan)`` says why the
    value cannot change that dataset's stream, or returns None when it can.
    """
    if isinstance(value, Mapping):
        for d in plans:
            why = why_useless(d) if d.name in value else None
            if why:
                warnings.warn(f"{parameter}[{d.name!r}]={show(value[d.name])} has no effect on {d.name!r}: {why}",
                              RuntimeWarning, stacklevel=5)
        return
    reasons = [why_useless(d) for d in plans]
    if all(reasons):
        for d, why in zip(plans, reasons):
            warnings.warn(f"{parameter}={show(value)} has no effect on {d.name!r}: {why}", RuntimeWarning, stacklevel=5)


def _warn_no_effect(plans: list[DatasetPlan], shuffles: bool, max_repeats: Any, reshuffle_on_repeat: Any,
                    pass_tail: Any) -> None:
    """Warn about given settings that cannot change the stream."""
    def repeats_not(d: DatasetPlan) -> str | None:
        return f"its policy is {d.policy!r}" if d.policy != REPEAT and d.max_repeats is not None else None

    def tail_useless(d: DatasetPlan) -> str | None:
        never_repeats = d.policy != REPEAT or d.max_repeats == 0
        return "it never repeats" if d.pass_tail != CARRY and never_repeats else None

    def reshuffle_useless(d: DatasetPlan) -> str | None:
        if d.reshuffle_on_repeat:
            return None
        if d.policy != REPEAT or d.max_repeats == 0:
            return "it never repeats"
        return None if shuffles else "no shuffle is enabled"

    if max_repeats is not None:
        _no_effect("max_repeats", max_repeats, plans, repeats_not)
    if reshuffle_on_repeat is not True:
        _no_effect("reshuffle_on_repeat", reshuffle_on_repeat, plans, reshuffle_useless)
    if pass_tail != CARRY:
        _no_effect("pass_tail", pass_tail, plans, tail_useless)


def check_liveness(plans: Sequence[DatasetPlan], chunk_size: int, allocator: Allocator,
                   shares: Sequence[float] | None = None) -> None:
    """Refuse datasets that can never fill their share of a chunk.

    ``shares`` replaces the weights in token mode (effective sample shares).
    """
    if all(d.total == 0 for d in plans):
        raise ValueError("every dataset is empty; give at least one dataset samples")
    redistributing = any(d.policy == REDISTRIBUTE for d in plans)
    shares = [d.weight for d in plans] if shares is None else list(shares)
    weight_sum = 0.0
    for d, share in zip(plans, shares):
        if not (redistributing and d.policy == REDISTRIBUTE):
            weight_sum += share
    for d in plans:
        if d.policy == STOP and d.total == 0:
            raise ValueError(f"dataset {d.name!r} is empty and its exhausted_policy is 'stop'; drop it or give it samples")
    check_weights(allocator, [d.weight for d in plans], chunk_size, [d.name for d in plans])
    for d, share in zip(plans, shares):
        if d.policy != REPEAT:
            continue
        x = share / weight_sum * chunk_size
        required = int(x) if x == int(x) else min(math.ceil(x) + 1, chunk_size)
        if d.total < required:
            raise ValueError(
                f"dataset {d.name!r} repeats but holds {d.total} samples, fewer than the {required} one chunk "
                f"may draw from it (share x chunk_size = {x:.6g}); lower chunk_size or its weight, or add data"
            )


def resolve(
    datasets: Any, mixture: Any, *, chunk_size: Any, seed: Any, shuffle_shards: Any, shuffle_within_shard: Any,
    shuffle_block_size: Any, exhausted_policy: Any, reshuffle_on_repeat: Any, max_repeats: Any,
    stop_after_passes: Any, lane_assignment: Any, allocation: Any, token_estimation: Any, pass_tail: Any = CARRY,
    liveness: bool = True,
) -> SourceConfig:
    """Validate every argument and build the template's SourceConfig (``liveness=False``: the
    caller checks liveness itself, e.g. per phase)."""
    datasets = _datasets(datasets)
    names = [d.name for d in datasets]
    weights, weight_order = _weights(mixture, names)
    chunk_size = _int("chunk_size", chunk_size, 1, "16384", MAX_CHUNK_SIZE)
    if type(seed) is bool or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {show(seed)}; pass e.g. 0")
    try:
        str(seed)  # a checkpoint holds the seed as JSON digits
    except ValueError:
        raise ValueError(f"seed has about {int(int(seed).bit_length() * 0.30103)} digits, more than Python writes "
                         f"as text (sys.get_int_max_str_digits() = {sys.get_int_max_str_digits()}), so no checkpoint "
                         "could hold it; pass a shorter seed") from None
    shuffle_shards = _bool("shuffle_shards", shuffle_shards)
    shuffle_within_shard = _bool("shuffle_within_shard", shuffle_within_shard)
    if not isinstance(lane_assignment, str) or lane_assignment not in (PERMUTE, MODULO):
        raise ValueError(f"lane_assignment must be 'permute' or 'modulo', got {show(lane_assignment)}")
    allocator = _allocator(allocation)
    passes, default_policy = _stopping(exhausted_policy, max_repeats, stop_after_passes)
    policies = _per_dataset("exhausted_policy", default_policy if exhausted_policy is None else exhausted_policy,
                            names, default_policy, _policy)
    repeats = _per_dataset("max_repeats", max_repeats, names, None, _max_repeats)
    reshuffle = _per_dataset("reshuffle_on_repeat", reshuffle_on_repeat, names, True, _bool)
    tails = _per_dataset("pass_tail", pass_tail, names, CARRY, _pass_tail)
    _check_stopping(passes, policies, repeats, names)
    blocks = _block_sizes(shuffle_block_size, datasets)
    pinned = _pinned_ratios(token_estimation, allocation, datasets)
    plans = [
        DatasetPlan(name=d.name, shard_ids=d.ids(), shard_counts=d.counts(), weight=w, policy=p,
                    max_repeats=r, reshuffle_on_repeat=s, block_size=b, data_fingerprint=d.fingerprint(),
                    shard_bytes=d.raw_bytes(), token_ratio=pinned[d.name][0] if d.name in pinned else None,
                    ratio_origin=pinned[d.name][1] if d.name in pinned else None, pass_tail=t)
        for d, w, p, r, s, b, t in zip(datasets, weights, policies, repeats, reshuffle, blocks, tails)
    ]
    if liveness and (token_estimation is None or len(pinned) == len(plans)):
        check_liveness(plans, chunk_size, allocator, token_shares(plans) if token_estimation else None)
    _warn_no_effect(plans, shuffle_shards or shuffle_within_shard or any(d.block_size > 1 for d in plans),
                    max_repeats, reshuffle_on_repeat, pass_tail)
    config = SourceConfig(
        datasets=tuple(plans), chunk_size=chunk_size, seed=int(seed), shuffle_shards=shuffle_shards,
        shuffle_within_shard=shuffle_within_shard, stop_after_passes=passes,
        lane_assignment=lane_assignment, allocator=allocator, token_mode=token_estimation is not None,
        weight_order=weight_order,
    )
    return config


def _pinned_ratios(estimation: Any, allocation: Any, datasets: list[Dataset]) -> dict[str, tuple[float, str]]:
    """The token ratios fixed at construction and their origins (token files' exact ones, then
    the primer's); checks the token settings."""
    if estimation is None:
        return {}
    names = [d.name for d in datasets]
    if not isinstance(estimation, TokenEstimation):
        raise TypeError(f"token_estimation must be a TokenEstimation, got {show(estimation)}")
    if allocation != "accumulator":
        raise ValueError(f"token_estimation replaces the allocator; drop allocation={show(allocation)}")
    if len(names) > MAX_TOKEN_DATASETS:
        raise ValueError(f"token_estimation supports at most {MAX_TOKEN_DATASETS} datasets (exact int64 token deficits), "
                         f"got {len(names)}; merge datasets or use sample weights")
    exact = {d.name: (ratio, EXACT) for d in datasets if (ratio := d.exact_tokens_per_byte()) is not None}
    primer = estimation.primer if isinstance(estimation.primer, Mapping) else {}
    named = [n for n in exact if n in primer and float(primer[n]) != exact[n][0]]
    if named:
        raise ValueError(f"TokenEstimation primer pins {named[0]!r} at {primer[named[0]]!r} tokens per byte, but its "
                         f"token files hold exactly {exact[named[0]][0]}; drop it from primer")
    pinned = {n: (ratio, PINNED) for n, ratio in estimation.pinned(names).items()}
    unmeasured = [n for n in names if n not in pinned and n not in exact]
    if unmeasured and not estimation.can_measure():
        raise ValueError(
            f"token_estimation must measure {unmeasured} but has neither tokenizer nor measure; "
            f"pass one, or pin their ratios with primer"
        )
    return {**pinned, **exact}

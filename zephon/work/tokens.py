"""TokenEstimation: how a token-aware source learns each dataset's tokens per raw byte.

``primer`` pins ratios (a float for every dataset, or a mapping for some) or asks for a
measurement (``"measure"``): ``prime()`` tokenizes a seeded sample of records drawn across
shards and estimates the ratio, see ``zephon.work._priming``.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from zephon.limits import MAX_CALIBRATION, MAX_RECORD_TOKENS, show
from zephon.work._portable import by_value

MEASURE = "measure"


class TokenCountError(ValueError):
    """A tokenizer or ``measure`` returned what cannot be a record's token count (its bug, not the record's)."""


def _positive(parameter: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and float(value) > 0):
        raise ValueError(f"TokenEstimation {parameter} must be a positive finite number, got {value!r}")
    return float(value)


def _count(parameter: str, value: Any) -> int:
    if type(value) is not int or not 1 <= value <= MAX_CALIBRATION:
        raise ValueError(f"TokenEstimation {parameter} must be an int in 1 .. {MAX_CALIBRATION} "
                         f"(zephon.limits.MAX_CALIBRATION), got {show(value)}")
    return value


@dataclass(frozen=True)
class TokenEstimation:
    """Settings of the token-aware strategy (pass it as ``token_estimation=``).

    ``primer``: ``"measure"``, a float (tokens per byte for every dataset: no measurement, no
    tokenizer) or a mapping dataset → tokens per byte (pin some, measure the rest).
    ``tokenizer``: a callable ``str -> sequence of ids`` or an object with ``.encode``;
    ``measure``: a callable ``record -> token count`` that replaces text extraction and
    tokenization. ``text_field`` names the text of a record (dict records).
    ``calibration_samples``: records tokenized per dataset (default 2048), spread over
    ``calibration_shards_min``..``calibration_shards_max`` shard draws; a measurement needs
    ``min(32, calibration_samples)`` tokenized records, else the dataset falls back to
    ``fallback_tokens_per_byte`` with a warning. Each measured ratio is logged on the
    ``zephon`` logger with its standard error over the shard draws.

    Pickles with ``tokenizer`` and ``measure`` by value (cloudpickle), so a lambda reaches
    spawned DataLoader workers.
    """

    primer: str | float | Mapping[str, float] = MEASURE
    tokenizer: Any = None
    text_field: str = "text"
    measure: Callable[[Any], float] | None = None
    calibration_samples: int = 2048
    calibration_shards_min: int = 4
    calibration_shards_max: int = 16
    fallback_tokens_per_byte: float = 0.25

    def __post_init__(self) -> None:
        if isinstance(self.primer, Mapping):
            for name, ratio in self.primer.items():
                _positive(f"primer[{name!r}]", ratio)
        elif self.primer != MEASURE:
            _positive("primer", self.primer)
        if self.tokenizer is not None and not (callable(self.tokenizer) or hasattr(self.tokenizer, "encode")):
            raise TypeError(f"TokenEstimation tokenizer must be callable or have .encode, got {self.tokenizer!r}")
        if self.measure is not None and not callable(self.measure):
            raise TypeError(f"TokenEstimation measure must be callable (record -> token count), got {self.measure!r}")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ValueError(f"TokenEstimation text_field must be a non-empty str, got {self.text_field!r}")
        _count("calibration_samples", self.calibration_samples)
        low = _count("calibration_shards_min", self.calibration_shards_min)
        if _count("calibration_shards_max", self.calibration_shards_max) < low:
            raise ValueError(
                f"TokenEstimation calibration_shards_max={self.calibration_shards_max} is below "
                f"calibration_shards_min={low}; raise it"
            )
        _positive("fallback_tokens_per_byte", self.fallback_tokens_per_byte)

    def __reduce__(self) -> tuple[Any, ...]:
        callables = ("tokenizer", "measure")
        return type(self), tuple(by_value(getattr(self, f.name)) if f.name in callables else getattr(self, f.name)
                                 for f in fields(self))

    def pinned(self, names: list[str]) -> dict[str, float]:
        """The ratios the primer fixes, by dataset name (raises on unknown names)."""
        if isinstance(self.primer, Mapping):
            unknown = [n for n in self.primer if n not in names]
            if unknown:
                raise ValueError(f"TokenEstimation primer names unknown datasets {unknown}; known: {names}")
            return {n: float(r) for n, r in self.primer.items()}
        if self.primer == MEASURE:
            return {}
        return {n: float(self.primer) for n in names}

    def can_measure(self) -> bool:
        return self.tokenizer is not None or self.measure is not None

    def count_tokens(self, record: Any) -> float:
        """Tokens of one record (raises if the record cannot be tokenized, ``TokenCountError``
        if the tokenizer or ``measure`` returns something that is not a count: a ``measure``
        may estimate, so a fractional count is taken as it is)."""
        if self.measure is not None:
            count = self.measure(record)
        else:
            text = record[self.text_field] if isinstance(record, Mapping) else record
            if not isinstance(text, str):
                raise TypeError(f"field {self.text_field!r} is {type(text).__name__}, not str")
            encode = self.tokenizer.encode if hasattr(self.tokenizer, "encode") else self.tokenizer
            ids = encode(text)
            count = len(getattr(ids, "ids", ids))
        value = _as_count(count)
        if value is None or not 0 <= value <= MAX_RECORD_TOKENS:
            raise TokenCountError(f"a record's token count must be a number in 0 .. {MAX_RECORD_TOKENS} "
                                  f"(zephon.limits.MAX_RECORD_TOKENS), got {show(count)}")
        return value


def _as_count(count: Any) -> float | None:
    """``count`` as a float when it is one number (an int, a float, a numpy or torch scalar such
    as ``mask.sum()``), None for anything else (a bool, a string, an array of several values)."""
    if isinstance(count, (bool, str, bytes)) or getattr(count, "ndim", 0) != 0:
        return None
    dtype = getattr(count, "dtype", None)
    if str(dtype) == "torch.bool" or getattr(dtype, "kind", None) in ("b", "U", "S", "O"):  # numpy: bool, text, objects
        return None
    try:
        return float(count)
    except (TypeError, ValueError):
        return None

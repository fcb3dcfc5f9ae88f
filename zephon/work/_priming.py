"""Measure tokens per raw byte for a dataset, by tokenizing a seeded sample of its records.

Estimator (Hansen–Hurwitz): shards are drawn with probability proportional to their bytes
(with replacement, ``k`` draws); in each drawn shard ``m`` rows are read at keyed random
offsets and tokenized. With ``t_j`` the drawn shard's estimated tokens (rows × mean tokens per
sampled row), ``b_j`` its bytes and ``p_j = b_j / B`` its draw probability, ``T̂ = (1/k) Σ
t_j / p_j`` is unbiased for the dataset's total tokens, so ``ratio = T̂ / B = (1/k) Σ t_j /
b_j``. Size-proportional draws put the reading where the bytes (and tokens) are. ``k`` grows
from ``calibration_shards_min`` toward ``calibration_shards_max`` with the coefficient of
variation of bytes per row between shards: more shards when they differ more.

Results are cached per node in ``$ZEPHON_CACHE_DIR`` (else ``$XDG_CACHE_HOME/zephon``, else
``~/.cache/zephon``), keyed by
everything that affects them: seed, settings, tokenizer identity and the dataset's content
fingerprint; datasets without a fingerprint (in memory, count-only) are not cached.
"""
from __future__ import annotations

import functools
import hashlib
from typing import Any
import json
import logging
import marshal
import math
import types
import warnings
from pathlib import Path

import numpy as np

from zephon.core.config import FALLBACK, MEASURED, ORIGINS
from zephon.core.keys import DOMAIN_CALIBRATION, derive, purpose_key
from zephon.core.perm import perm_range
from zephon.io import Dataset
from zephon.io.atomic import write_atomically
from zephon.limits import MAX_TOKEN_RATIO
from zephon.io.catalog import cache_root
from zephon.io.progress import Progress
from zephon.work.tokens import TokenCountError, TokenEstimation

MIN_MEASURED = 32  # fewer tokenized records than this (or than the calibration asks for, if fewer) falls back
RATIO_CACHE_VERSION = 2  # 2: a measure's fractional counts are summed as they are (1 truncated them)

logger = logging.getLogger("zephon")


def tokenizer_identity(thing: Any, content: bool = True) -> str:
    """A stable name for what counts tokens (part of cache keys and checkpoints).

    A function is named by its module, qualified name and a digest of its code and constants
    (so two lambdas differ); a bound method by its object and name; a ``functools.partial`` by
    its function and arguments; a tokenizer object by a digest of its serialisation when it has
    one (``tokenizers.Tokenizer``, and the backend of a ``transformers`` fast tokenizer), else of
    its vocabulary (``get_vocab()``), with its type and name attributes: two tokenizers of one
    name or path but other vocabularies or rules differ. ``content=False`` leaves those two
    digests out: the identity checkpoints written before them hold.
    """
    if hasattr(thing, "to_str"):
        return "tokenizers:" + _digest(thing.to_str())
    backend: Any = getattr(thing, "backend_tokenizer", None)
    if content and hasattr(backend, "to_str"):
        return f"{_named(thing)}:tokenizers:{_digest(backend.to_str())}"
    if content and callable(getattr(thing, "get_vocab", None)):
        vocabulary = sorted((repr(token), repr(i)) for token, i in thing.get_vocab().items())  # str or bytes tokens
        return f"{_named(thing)}:vocab:{_digest(repr(vocabulary))}"
    owner = getattr(thing, "__self__", None)
    if owner is not None and not isinstance(owner, types.ModuleType):  # e.g. encoding.encode: whose it is counts
        return f"{tokenizer_identity(owner, content)}.{getattr(thing, '__name__', '')}"
    if isinstance(thing, functools.partial):
        arguments = [*(_argument(v, content) for v in thing.args),
                     *(f"{k}={_argument(v, content)}" for k, v in sorted(thing.keywords.items()))]
        return f"partial({tokenizer_identity(thing.func, content)}, {', '.join(arguments)})"
    code = getattr(thing, "__code__", None)
    if code is not None:
        digest = hashlib.sha256(marshal.dumps((code.co_code, code.co_consts, code.co_names))).hexdigest()[:16]
        return f"{thing.__module__}.{thing.__qualname__}:{digest}"
    return _named(thing)


def _named(thing: Any) -> str:
    """An object's type, qualified name and name attributes (a tokenizer's path, vocabulary size)."""
    kind = type(thing) if not isinstance(thing, type) else thing
    names = [str(getattr(thing, a, "")) for a in ("name_or_path", "name", "vocab_size", "n_vocab")]
    return f"{kind.__module__}.{kind.__qualname__}:{getattr(thing, '__qualname__', '')}:" + ":".join(names)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _argument(value: Any, content: bool) -> str:
    """A partial's argument in an identity: plain values as written, others by their identity."""
    return repr(value) if type(value) in (int, float, str, bool, type(None)) else tokenizer_identity(value, content)


def _shards_to_draw(dataset: Dataset, estimation: TokenEstimation) -> int:
    counts, sizes = dataset.counts(), dataset.raw_bytes()
    usable = (counts > 0) & (sizes > 0)
    per_row = sizes[usable] / counts[usable]
    spread = float(per_row.std() / per_row.mean()) if per_row.size else 0.0
    low, high = estimation.calibration_shards_min, estimation.calibration_shards_max
    return min(high, max(low, math.ceil(low * (1.0 + spread))))


def _unit(key: int) -> float:
    return (key >> 11) * 2.0 ** -53


def _draw_shards(dataset: Dataset, draws: int, key: int) -> list[int]:
    """Shard indices drawn with probability proportional to bytes, with replacement."""
    cumulative = np.cumsum(dataset.raw_bytes() * (dataset.counts() > 0))
    return [int(np.searchsorted(cumulative, _unit(derive(key, j)) * cumulative[-1], side="right"))
            for j in range(draws)]


def _calibration_keys(seed: int, dataset_id: int) -> tuple[int, int]:
    """Keys of the shard draws and of the rows read in each drawn shard."""
    key = purpose_key(seed, DOMAIN_CALIBRATION, dataset_id)
    return derive(key, 1), derive(key, 2)


def measure_ratio(dataset: Dataset, dataset_id: int, estimation: TokenEstimation, seed: int,
                  progress: bool | None = None) -> tuple[float, str]:
    """``(tokens per byte, origin)`` of one dataset; falls back (with a warning) on poor coverage."""
    counts, sizes = dataset.counts(), dataset.raw_bytes()
    if not ((counts > 0) & (sizes > 0)).any():
        return _fallback(dataset, estimation, "no shard has both rows and bytes on disk")
    shard_key, row_key = _calibration_keys(seed, dataset_id)
    draws = _shards_to_draw(dataset, estimation)
    per_shard = max(1, estimation.calibration_samples // draws)
    estimates, measured, skipped, first_error = [], 0, 0, ""
    bar = Progress(draws, f"measuring tokens/byte of {dataset.name!r}", progress)
    for j, k in enumerate(_draw_shards(dataset, draws, shard_key)):
        rows = int(counts[k])
        offsets = perm_range(derive(row_key, j), rows, 0, min(per_shard, rows))
        try:
            records = dataset.read(int(dataset.ids()[k]), offsets.tolist())
        except TypeError as error:  # a count-only dataset has nothing to read
            bar.close()
            return _fallback(dataset, estimation, str(error))
        tokens = []
        for record in records:
            try:
                tokens.append(estimation.count_tokens(record))
            except TokenCountError as error:
                bar.close()
                what = "measure" if estimation.measure is not None else "tokenizer"
                raise ValueError(f"dataset {dataset.name!r}: the token {what} is wrong for a record of shard "
                                 f"{int(dataset.ids()[k])}: {error}; fix the {what}") from None
            except Exception as error:  # a record the tokenizer cannot handle is skipped, counted and named
                skipped += 1
                first_error = first_error or f"{type(error).__name__}: {str(error)[:200]}"
        measured += len(tokens)
        if tokens:
            estimates.append(rows * float(np.mean(tokens)) / float(sizes[k]))
        bar.advance()
    bar.close()
    needed = min(MIN_MEASURED, per_shard * draws)  # a small calibration_samples is taken at its word
    if measured < needed or not estimates:
        cause = f"; the first skipped record raised {first_error}" if first_error else ""
        return _fallback(dataset, estimation, f"only {measured} records could be tokenized ({skipped} skipped), "
                                              f"{needed} needed{cause}")
    ratio = float(np.mean(estimates))
    if not 0 < ratio <= MAX_TOKEN_RATIO:
        return _fallback(dataset, estimation, f"it measured {ratio:.3g} tokens per byte, outside 0 .. "
                                              f"{MAX_TOKEN_RATIO} (zephon.limits.MAX_TOKEN_RATIO)")
    spread = float(np.std(estimates, ddof=1) / math.sqrt(len(estimates))) if len(estimates) > 1 else math.inf
    logger.info("tokens/byte of dataset %r: %.6g, standard error %.3g (%d shard draws, %d records, %d skipped)",
                dataset.name, ratio, spread, len(estimates), measured, skipped)
    return ratio, MEASURED


def _fallback(dataset: Dataset, estimation: TokenEstimation, why: str) -> tuple[float, str]:
    warnings.warn(
        f"token ratio of dataset {dataset.name!r} falls back to {estimation.fallback_tokens_per_byte} "
        f"tokens/byte: {why}", RuntimeWarning, stacklevel=3)
    return estimation.fallback_tokens_per_byte, FALLBACK


def _cache_path(dataset: Dataset, estimation: TokenEstimation, seed: int) -> Path | None:
    fingerprint = dataset.fingerprint()
    if fingerprint is None:
        return None
    settings = {
        "version": RATIO_CACHE_VERSION, "seed": seed, "dataset": dataset.name, "data": fingerprint,
        "tokenizer": tokenizer_identity(estimation.measure if estimation.measure is not None else estimation.tokenizer),
        "text_field": estimation.text_field, "samples": estimation.calibration_samples,
        "shards": [estimation.calibration_shards_min, estimation.calibration_shards_max],
        "fallback": estimation.fallback_tokens_per_byte,
    }
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:24]
    return Path(cache_root()) / "token-ratios" / f"{digest}.json"


def cached_ratio(dataset: Dataset, dataset_id: int, estimation: TokenEstimation, seed: int,
                 progress: bool | None = None) -> tuple[float, str]:
    """``measure_ratio``, reusing (and writing atomically) this node's cached result."""
    path = _cache_path(dataset, estimation, seed)
    if path is not None and path.exists():
        try:
            saved = json.loads(path.read_text())
            ratio, origin = float(saved["ratio"]), saved["origin"]
            if 0 < ratio <= MAX_TOKEN_RATIO and origin in ORIGINS:
                return ratio, origin
        except (ValueError, KeyError, TypeError, RecursionError, OSError):
            pass  # a damaged cache entry is measured again and rewritten
    ratio, origin = measure_ratio(dataset, dataset_id, estimation, seed, progress)
    if path is not None:
        _save(path, json.dumps({"ratio": ratio, "origin": origin}).encode())
    return ratio, origin


def _save(path: Path, data: bytes) -> None:
    """Cache a measured ratio; a cache that cannot be written is said and skipped (it is an
    optimisation: the next run measures again)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data)
    except OSError as error:
        warnings.warn(f"zephon: could not cache a token ratio ({error}); it will be measured again next time; set "
                      "ZEPHON_CACHE_DIR to a writable directory", RuntimeWarning, stacklevel=3)

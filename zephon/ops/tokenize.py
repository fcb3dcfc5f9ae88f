"""tokenize: text to token ids, a stateless operator (it has no state to checkpoint).

:func:`tokenize_items` gives each item ``input_ids`` (an int64 array) and ``num_tokens``, a
block of items at once (a Hugging Face ``tokenizers.Tokenizer`` then encodes them in one
``encode_batch_fast`` or ``encode_batch`` call). The result is a pure function of the text and
the tokenizer: replaying an item gives the same ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from zephon.limits import MAX_TOKEN_ID

KEY_IDS, KEY_COUNT = "input_ids", "num_tokens"


@dataclass(frozen=True)
class TokenizeConfig:
    """What :func:`step` does: read ``field``, encode it with ``tokenizer``, append ``eos_id``
    (None: nothing appended)."""

    tokenizer: Any
    field: str = "text"
    eos_id: int | None = None


def config(tokenizer: Any, field: str = "text", add_eos: bool = True, eos_id: int | None = None) -> TokenizeConfig:
    """Check the settings of ``Pipeline.tokenize`` (see there) and resolve the EOS id."""
    if not (callable(tokenizer) or callable(getattr(tokenizer, "encode", None))):
        raise TypeError(f"tokenize(tokenizer): pass a callable str -> ids or an object with .encode (a Hugging Face "
                        f"tokenizer), got {type(tokenizer).__name__}")
    if getattr(tokenizer, "padding", None) is not None and hasattr(tokenizer, "no_padding"):
        raise ValueError(f"tokenize(tokenizer): the tokenizer pads ({tokenizer.padding}), so a text's ids would depend "
                         "on the texts encoded beside it; call tokenizer.no_padding() first (pack() pads sequences)")
    if not isinstance(field, str):
        raise TypeError(f"tokenize(field={field!r}): the field must be a str, e.g. 'text'")
    if type(add_eos) is not bool:
        raise ValueError(f"tokenize(add_eos={add_eos!r}) must be True or False")
    if eos_id is None and add_eos:
        eos_id = getattr(tokenizer, "eos_token_id", None)
        if eos_id is None:
            raise ValueError(f"tokenize(add_eos=True): {type(tokenizer).__name__} has no eos_token_id; pass "
                             "eos_id=<the id of your end-of-document token>, or add_eos=False")
    if eos_id is not None and (type(eos_id) is not int or not 0 <= eos_id <= MAX_TOKEN_ID):
        raise ValueError(f"tokenize(eos_id={eos_id!r}) must be an int in [0, 2**63 - 1]")
    return TokenizeConfig(tokenizer, field, eos_id if add_eos else None)


def _text(config: TokenizeConfig, item: Any) -> str:
    text = item.get(config.field) if type(item) is dict or isinstance(item, Mapping) else None
    if not isinstance(text, str):
        raise TypeError(f"tokenize: item {item.get('_sample_id') if isinstance(item, Mapping) else item!r} has "
                        f"{type(text).__name__} under {config.field!r}, not a str; pass field=<the text field>")
    return text


def _ids(encoded: Any) -> list[int]:
    """Ids of what a tokenizer returned: a list, an array, or an object with ``.ids``."""
    return getattr(encoded, "ids", encoded)  # type: ignore[no-any-return]


def encode_all(config: TokenizeConfig, texts: Sequence[str]) -> list[np.ndarray]:
    """The ids of ``texts`` (each an int64 array, EOS appended when set), in one batch call
    when the tokenizer has ``encode_batch_fast`` (the same ids, no character offsets) or
    ``encode_batch``."""
    tokenizer = config.tokenizer
    batch: Callable[[Sequence[str]], Any] | None = getattr(tokenizer, "encode_batch_fast",
                                                           getattr(tokenizer, "encode_batch", None))
    if batch is not None and len(texts) > 1:
        encoded = batch(list(texts))
    else:
        encode = tokenizer.encode if callable(getattr(tokenizer, "encode", None)) else tokenizer
        encoded = [encode(text) for text in texts]
    if config.eos_id is None:
        return [np.array(_ids(e), dtype=np.int64) for e in encoded]
    out = []
    for e in encoded:
        ids = _ids(e)
        array = np.empty(len(ids) + 1, dtype=np.int64)
        array[:-1] = ids
        array[-1] = config.eos_id
        out.append(array)
    return out


def tokenize_items(config: TokenizeConfig, items: Sequence[Any]) -> list[Any]:
    """``items`` with ``input_ids`` and ``num_tokens`` added (new dicts)."""
    out = [{**item} for item in items]
    tokenize_own(config, out)
    return out


def tokenize_own(config: TokenizeConfig, items: list[Any]) -> None:
    """:func:`tokenize_items` in place, for items the caller made (plain dicts stay those dicts)."""
    ids = encode_all(config, [_text(config, item) for item in items])
    for k, (item, i) in enumerate(zip(items, ids)):
        if type(item) is dict:
            item[KEY_IDS], item[KEY_COUNT] = i, len(i)
        else:
            items[k] = {**item, KEY_IDS: i, KEY_COUNT: len(i)}

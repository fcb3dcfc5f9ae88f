"""Operators after the source: tokenize, pack and ensure_mixture, each a step over a small JSON state.

| module | operator |
|---|---|
| :mod:`zephon.ops.tokenize` | text -> ``input_ids`` (stateless) |
| :mod:`zephon.ops.pack` | documents -> fixed-length sequences (``"concat"``, ``"best_fit"``) |
| :mod:`zephon.ops.mixture` | the token mixture of packed sequences, measured or enforced |
| :class:`Packing` | a pipeline's packing stage (pack, and strict mixture over it) as one operator |

``pack`` and ``mixture`` offer ``init`` / ``step`` and ``state_to_json`` / ``state_from_json``; a state
names documents by their place in the lane (pointers and token offsets), never holds tokens.
"""
from zephon.ops import mixture, pack, tokenize
from zephon.ops.chain import Packing, held_documents
from zephon.ops.mixture import MixtureConfig
from zephon.ops.pack import Doc, PackConfig, Row
from zephon.ops.tokenize import TokenizeConfig

__all__ = ["Doc", "MixtureConfig", "PackConfig", "Packing", "Row", "TokenizeConfig", "held_documents", "mixture", "pack",
           "tokenize"]

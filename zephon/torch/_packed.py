"""The worker side of a packed pipeline: a reader's batches of packed sequences, in bundles.

A reader (``zephon.runtime.PackedReader``) gives turns of ``batch_size`` sequences of one lane;
each turn becomes one batch (``(B, seq_len)`` tensors, see :func:`packed_batch`) and brings a
snapshot of its lane's ledger and packer state, which the trainer folds in as the loop takes
the batch (``zephon.runtime.Snapshots``). Positions count sequences.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import torch

from zephon.ops import Packing, Row, pack
from zephon.runtime import PackedReader, sequence_items

TOKENS_PER_BUNDLE = 1 << 16  # a bundle holds about this many tokens (at least one batch)


def packed_batch(packing: Packing, rows: Sequence[Row], names: Sequence[str | None]) -> dict[str, Any]:
    """``rows`` as a batch: ``input_ids``, ``segment_ids``, ``position_ids`` ``(B, seq_len)`` int64
    tensors, ``_documents`` (per sequence, its pieces as ``(dataset, shard, offset, component,
    start, end)``) and ``_tokens`` (component -> ``(B,)`` int64 real tokens)."""
    batch: dict[str, Any] = {key: torch.from_numpy(value) for key, value in pack.arrays(packing.pack, rows).items()}
    batch["_documents"] = [[(d, s, o, names[c], a, b) for d, s, o, c, a, b in row] for row in pack.pieces(rows)]
    tokens = pack.token_counts(rows, len(names))
    batch["_tokens"] = {name: torch.from_numpy(tokens[:, c].copy()) for c, name in enumerate(names) if name is not None}
    return batch


def _unit(plan: Any, packing: Packing, rows: list[Row], names: Sequence[str | None]) -> Any:
    """What the loop receives for one turn: an item (``batch_size=None``) or a batch."""
    if plan.batch_size is None:
        item = sequence_items(packing, rows, names)[0]
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in item.items()}
    if plan.collate_fn is not None:
        return plan.collate_fn(sequence_items(packing, rows, names))
    return packed_batch(packing, rows, names)


class _Frame:
    """One bundle's contents as they are made."""

    def __init__(self) -> None:
        self.units: list[Any] = []
        self.ends: list[int] = []
        self.snapshots: list[Any] = []
        self.started: list[int] = []  # component ids of the documents whose first token a unit holds
        self.bounds = [0]
        self.tokens: list[np.ndarray] = []
        self.filtered: list[int] = []
        self.skipped: list[int] = []
        self.waiting_skip = 0  # sequences drop_last dropped before the next unit


def packed_bundles(plan: Any, worker: int, lanes: Sequence[int], bundle_type: Any) -> Iterator[Any]:
    """The bundles of reader ``worker``'s packed lanes (``bundle_type``: the loader's Bundle)."""
    pipeline = plan.pipeline
    packing: Packing = pipeline.packing
    names = list(pipeline.component_names(np.arange(pipeline.kinds)))
    unit = plan.batch_size or 1
    reader = PackedReader(pipeline, packing, lanes, plan.replicas, plan.entries, plan.operators, unit,
                          pipeline.readahead())
    per_bundle = max(1, TOKENS_PER_BUNDLE // (unit * packing.pack.seq_len))
    filtered = dropped = 0
    while True:
        start, frame = reader.position, _Frame()
        while len(frame.units) < per_bundle and (turn := reader.turn()) is not None:
            _, rows, snapshot = turn
            frame.snapshots.append(snapshot)
            if plan.drop_last and len(rows) < unit:  # a lane's short last batch: dropped, its ledger still moves
                frame.waiting_skip += len(rows)
                continue
            frame.units.append(_unit(plan, packing, rows, names))
            frame.ends.append(reader.position)
            frame.started += [p.doc.component for row in rows for p in row if p.start == 0]
            frame.bounds.append(len(frame.started))
            real = pack.token_counts(rows, len(names)).sum(axis=0)
            frame.tokens.append(np.append(real, len(rows) * packing.pack.seq_len - real.sum()))
            frame.filtered.append(reader.filtered - filtered)
            frame.skipped.append(frame.waiting_skip)
            filtered, frame.waiting_skip = reader.filtered, 0
        if frame.units:  # the last unit passes over what drop_last dropped after it
            frame.ends[-1] = reader.position
            frame.skipped[-1] += frame.waiting_skip
        bundle = bundle_type(worker, start, [], frame.snapshots, reader.exhausted)
        bundle.stop, bundle.units, bundle.ends, bundle.bounds = reader.position, frame.units, frame.ends, frame.bounds
        bundle.components = np.array(frame.started, dtype=np.int64)
        bundle.tokens = np.array(frame.tokens, dtype=np.int64).reshape(len(frame.units), len(names) + 1)
        bundle.dropped, bundle.skipped = frame.filtered, frame.skipped
        bundle.tokens_dropped, dropped = reader.dropped_tokens - dropped, reader.dropped_tokens
        yield bundle
        if bundle.last:
            return

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
from zephon.runtime import PackedReader, documents, sequence_items

TOKENS_PER_BUNDLE = 1 << 16  # a bundle holds about this many tokens (at least one batch)


def packed_batch(packing: Packing, rows: Sequence[Row], names: Sequence[str | None],
                 tokens: np.ndarray) -> dict[str, Any]:
    """``rows`` as a batch: ``input_ids``, ``segment_ids``, ``position_ids`` ``(B, seq_len)`` int64
    tensors, ``_documents`` (per sequence, its pieces as ``(dataset, shard, offset, component,
    start, end)``) and ``_tokens`` (component -> ``(B,)`` int64 real tokens; ``tokens`` is
    ``pack.token_counts`` of the rows)."""
    batch: dict[str, Any] = {key: torch.from_numpy(value) for key, value in pack.arrays(packing.pack, rows).items()}
    batch["_documents"] = documents(rows, names)
    batch["_tokens"] = {name: torch.from_numpy(tokens[:, c].copy()) for c, name in enumerate(names) if name is not None}
    return batch


def _unit(plan: Any, packing: Packing, rows: list[Row], names: Sequence[str | None], tokens: np.ndarray) -> Any:
    """What the loop receives for one turn: an item (``batch_size=None``) or a batch."""
    if plan.batch_size is None:
        item = sequence_items(packing, rows, names)[0]
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in item.items()}
    if plan.collate_fn is not None:
        return plan.collate_fn(sequence_items(packing, rows, names))
    return packed_batch(packing, rows, names, tokens)


class _Frame:
    """One bundle's contents as they are made. What a unit's turn filtered, or dropped at a
    lane's end, is counted with that unit (with the bundle's last unit what comes after it)."""

    def __init__(self, kinds: int) -> None:
        self.units: list[Any] = []
        self.ends: list[int] = []
        self.snapshots: list[Any] = []
        self.started: list[int] = []  # component ids of the documents whose first token a unit holds
        self.bounds = [0]
        self.tokens: list[np.ndarray] = []  # per unit: real tokens per component, padding, tokens dropped
        self.filtered: list[int] = []
        self.skipped: list[int] = []
        self.kinds = kinds
        self.waiting = np.zeros(3, dtype=np.int64)  # not yet counted: sequences drop_last dropped, filtered, dropped

    def count(self, reader: PackedReader) -> None:
        """Take over what the reader filtered and dropped since the last call."""
        self.waiting += (0, reader.filtered, reader.dropped_tokens)
        reader.filtered = reader.dropped_tokens = 0

    def add(self, unit: Any, rows: list[Row], tokens: np.ndarray, position: int, seq_len: int) -> None:
        self.units.append(unit)
        self.ends.append(position)
        self.started += [p.doc.component for row in rows for p in row if p.start == 0]
        self.bounds.append(len(self.started))
        real = tokens.sum(axis=0)
        skipped, filtered, dropped = self.waiting.tolist()
        self.tokens.append(np.concatenate([real, [len(rows) * seq_len - real.sum(), dropped]]))
        self.skipped.append(skipped)
        self.filtered.append(filtered)
        self.waiting[:] = 0

    def close(self, bundle: Any, position: int) -> None:
        """Fill ``bundle``: the last unit passes over (and counts) what came after it."""
        skipped, filtered, dropped = self.waiting.tolist()
        if self.units:
            self.ends[-1] = position
            self.skipped[-1] += skipped
            self.filtered[-1] += filtered
            self.tokens[-1][-1] += dropped
        else:
            bundle.filtered_left, bundle.tokens_dropped = filtered, dropped
        bundle.stop, bundle.units, bundle.ends, bundle.bounds = position, self.units, self.ends, self.bounds
        bundle.components = np.array(self.started, dtype=np.int64)
        bundle.tokens = np.array(self.tokens, dtype=np.int64).reshape(len(self.units), self.kinds + 2)
        bundle.dropped, bundle.skipped = self.filtered, self.skipped


def units_per_bundle(unit: int, seq_len: int) -> int:
    """Batches (or items) of ``unit`` sequences in a bundle: about :data:`TOKENS_PER_BUNDLE` tokens."""
    return max(1, TOKENS_PER_BUNDLE // (unit * seq_len))


def packed_bundles(plan: Any, worker: int, lanes: Sequence[int], bundle_type: Any) -> Iterator[Any]:
    """The bundles of reader ``worker``'s packed lanes (``bundle_type``: the loader's Bundle)."""
    pipeline = plan.pipeline
    packing: Packing = pipeline.packing
    names = list(pipeline.component_names(np.arange(pipeline.kinds)))
    unit, seq_len = plan.batch_size or 1, packing.pack.seq_len
    reader = PackedReader(pipeline, packing, lanes, plan.replicas, plan.entries, plan.operators, unit,
                          pipeline.readahead())
    per_bundle = units_per_bundle(unit, seq_len)
    while True:
        start, frame = reader.position, _Frame(len(names))
        while len(frame.units) < per_bundle and (turn := reader.turn()) is not None:
            _, rows, snapshot = turn
            frame.snapshots.append(snapshot)
            frame.count(reader)
            if plan.drop_last and len(rows) < unit:  # a lane's short last batch: dropped, its ledger still moves
                frame.waiting[0] += len(rows)
                continue
            tokens = pack.token_counts(rows, len(names))
            frame.add(_unit(plan, packing, rows, names, tokens), rows, tokens, reader.position, seq_len)
        frame.count(reader)  # a lane's last turn may give no sequence, yet filter or drop
        bundle = bundle_type(worker, start, [], frame.snapshots, reader.exhausted)
        frame.close(bundle, reader.position)
        yield bundle
        if bundle.last:
            return

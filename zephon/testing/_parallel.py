"""What the ranks of a job with model parallelism read: replicas' peers identical, replicas disjoint.

A job with tensor, pipeline or context parallelism reads data per data-parallel replica: the
ranks of a replica must receive the same batches, the replicas different ones, and together
the stream. Each rank records a digest of every batch it receives (:func:`batch_digest`, the
same in every process); :func:`assert_parallel_reads` checks the records.
"""
from __future__ import annotations

import collections
import hashlib
import json
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

DIGEST_TAG = b"zephon.batch_digest/1\0"


def _canonical(value: Any, out: Any) -> None:
    """Feed ``value`` to the hash ``out``: arrays (and tensors) by dtype, shape and bytes;
    mappings by sorted key; sequences in order; anything else by its JSON."""
    if hasattr(value, "detach"):  # a torch tensor: its values on the CPU
        tensor = value.detach().cpu().contiguous()
        try:
            value = tensor.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16, ...): its bytes
            import torch

            out.update(f"t{tensor.dtype}{tuple(tensor.shape)}".encode())
            out.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
            return
    if hasattr(value, "__array__"):
        array = np.ascontiguousarray(np.asarray(value))
        if array.dtype == object:  # objects: by value, not by address
            _canonical(array.tolist(), out)
            return
        out.update(f"a{array.dtype.str}{array.shape}".encode())
        out.update(array.tobytes())
    elif isinstance(value, Mapping):
        out.update(b"m%d" % len(value))
        for key in sorted(value, key=lambda k: (type(k).__name__, str(k))):
            out.update(f"{type(key).__name__}:{json.dumps(str(key))}".encode())
            _canonical(value[key], out)
    elif isinstance(value, (list, tuple)):
        out.update(b"l%d" % len(value))
        for item in value:
            _canonical(item, out)
    else:
        out.update(b"j" + json.dumps(value, sort_keys=True, default=str).encode())


def batch_digest(batch: Any) -> str:
    """A stable hex digest of a batch: its tensors' (or arrays') dtype, shape and bytes, and
    its other fields, by key; the same for the same batch in any process."""
    out = hashlib.sha256(DIGEST_TAG)
    _canonical(batch, out)
    return out.hexdigest()


def _first_difference(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def assert_parallel_reads(reads: Mapping[int, Sequence[Hashable]], replicas: Iterable[Sequence[int]],
                          stream: Iterable[Hashable] | None = None) -> None:
    """The ranks of each data-parallel replica read the same batches; replicas read none in
    common; together they read ``stream`` (when given), each batch once.

    Parameters
    ----------
    reads : mapping of int to sequence
        Per global rank, what it received, in order: one hashable key per batch, e.g.
        :func:`batch_digest` of each.
    replicas : iterable of sequences of int
        The global ranks of each data-parallel replica (its tensor / pipeline / context
        ranks), e.g. ``mesh.mesh.tolist()`` for a ``("dp", "tp")`` mesh (a row per
        data-parallel rank). Every rank of ``reads`` must be in exactly one. Replicas must
        not share a batch, so keys must tell batches apart (a digest of their sample ids does).
    stream : iterable or None, default None
        The batches the whole job should read (any order), e.g. those of one process per
        data-parallel rank of a reference run on the same data-parallel size (with
        ``even_batches``, the surplus held back depends on it).
    """
    groups = [list(group) for group in replicas]
    placed = [rank for group in groups for rank in group]
    if sorted(placed) != sorted(reads) or len(set(placed)) != len(placed):
        twice = sorted({r for r in placed if placed.count(r) > 1})
        raise AssertionError(f"replicas {groups} must hold every rank of reads exactly once: ranks not in a replica "
                             f"{sorted(set(reads) - set(placed))}, in no reads {sorted(set(placed) - set(reads))}, "
                             f"in two replicas {twice}")
    owner: dict[Hashable, int] = {}
    for group in groups:
        first = group[0]
        for peer in group[1:]:
            if list(reads[peer]) != list(reads[first]):
                k = _first_difference(reads[first], reads[peer])
                raise AssertionError(f"ranks {first} and {peer} of one replica part at batch {k}: "
                                     f"{_at(reads[first], k)} vs {_at(reads[peer], k)} "
                                     f"({len(reads[first])} and {len(reads[peer])} batches)")
        for k, key in enumerate(reads[first]):
            if owner.setdefault(key, first) != first:
                raise AssertionError(f"batch {key!r} (batch {k} of rank {first}) was also read by rank {owner[key]}, "
                                     "of another replica: data-parallel replicas must read disjoint data")
    if stream is None:
        return
    read = collections.Counter(key for group in groups for key in reads[group[0]])
    expected = collections.Counter(stream)
    if read != expected:
        missing, extra = expected - read, read - expected
        raise AssertionError(f"the replicas read {sum(read.values())} batches, the stream has "
                             f"{sum(expected.values())}: {sum(missing.values())} not read (e.g. "
                             f"{next(iter(missing), None)!r}), {sum(extra.values())} not in it (e.g. "
                             f"{next(iter(extra), None)!r})")


def _at(keys: Sequence[Hashable], k: int) -> str:
    return repr(keys[k]) if k < len(keys) else "nothing (it ended)"

"""``replicate="broadcast"``: a data-parallel replica's first rank reads, its other ranks receive.

By default every rank of a replica reads its lanes itself (the stream is a pure function of
the seed and the lane, so they agree without talking). For pipelines whose reading costs
more than sending (heavy decoding or tokenizing), the replica's first rank reads alone and
sends every bundle it takes from its readers to the replica's other ranks
(``broadcast_object_list`` over the replica's process group). The ranks fold the same bundles
in the same order, so their batches, ``state_dict()`` and ``stats()`` are the same.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch.distributed as dist

COMPUTE, BROADCAST = "compute", "broadcast"


def replicas_of(mesh: Any, dp_dims: Sequence[str]) -> list[list[int]]:
    """The global ranks of each data-parallel replica of ``mesh``, one list per data-parallel
    rank (row-major over ``dp_dims``), each from its first rank (every other coordinate 0)."""
    if mesh.mesh.numel() != dist.get_world_size():
        raise ValueError(f"replicate='broadcast' needs the mesh of the whole job ({dist.get_world_size()} ranks), "
                         f"not a part of it ({mesh.mesh.numel()} ranks): pass the world's mesh with dp_dims")
    names = list(mesh.mesh_dim_names)
    order = [names.index(d) for d in dp_dims] + [k for k, d in enumerate(names) if d not in dp_dims]
    size = math.prod(mesh.size(names.index(d)) for d in dp_dims)
    ranks: list[list[int]] = mesh.mesh.permute(order).reshape(size, -1).tolist()
    return ranks


class Relay:
    """This rank's end of its replica's broadcast: ``source`` (a global rank) reads and sends."""

    def __init__(self, replicas: list[list[int]]):
        self.group, _ = dist.new_subgroups_by_enumeration(replicas)  # type: ignore[no-untyped-call]  # a collective
        me = dist.get_rank()
        self.source = next(ranks[0] for ranks in replicas if me in ranks)
        self.reads = me == self.source

    def next(self, base: Any) -> Any:
        """The next bundle: from ``base`` on the source (sent on), received on the others.
        The source's end of ``base`` reaches the others as their ``StopIteration``."""
        box: list[Any] = [None]
        if self.reads:
            try:
                box[0] = next(base).land()
            finally:
                dist.broadcast_object_list(box, src=self.source, group=self.group)
        else:
            dist.broadcast_object_list(box, src=self.source, group=self.group)
        if box[0] is None:
            raise StopIteration
        return box[0]

"""Where this process sits: its data-parallel rank and size, and its DataLoader worker.

zephon's readers are the *data-parallel* ranks. In a job that also runs tensor, pipeline or
context parallelism, the ranks of one data-parallel replica (its "peers") read the same lanes
and so receive identical batches, with no broadcast; only the replica's first rank writes
checkpoint files. The data-parallel rank comes from a ``DeviceMesh`` (its ``dp_dims``), a
data-parallel process group, explicit numbers, or, in a pure data-parallel job, the world.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch.distributed as dist
from torch.utils.data import get_worker_info


@dataclass(frozen=True, slots=True)
class Topology:
    """Where a reader sits.

    ``rank`` / ``world_size``: its data-parallel rank (``0 <= rank < world_size``) and the
    number of data-parallel ranks; ``local_rank``: the process's rank on its node
    (``LOCAL_RANK``, 0 when unknown); ``origin``: where they came from (``"explicit"``,
    ``"device_mesh"``, ``"dp_group"``, ``"torch.distributed"``, ``"environment"`` or
    ``"single process"``); ``peers``: the processes of its data-parallel replica, which read the
    same lanes (1 in a pure data-parallel job); ``writes``: whether it writes its replica's
    checkpoint files (the replica's first rank).
    """

    rank: int
    world_size: int
    local_rank: int
    origin: str
    peers: int = 1
    writes: bool = True


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be an int (torchrun sets it)") from None


def _checked_ints(**values: Any) -> None:
    for name, value in values.items():
        if value is not None and (type(value) is not int or value < 0):
            raise ValueError(f"{name}={value!r} must be an int >= 0")


def _world() -> tuple[int | None, int, str]:
    """The process's global rank (None where the environment cannot tell it: see
    :func:`_rank_from_node`) and world size, and where they were found."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), "torch.distributed"
    world = _env_int("WORLD_SIZE")
    if world is None:
        return 0, 1, "single process"
    rank = _env_int("RANK")
    if rank is None and world > 1:
        return _rank_from_node(), world, "environment"
    return rank or 0, world, "environment"


def _rank_from_node() -> int | None:
    """The global rank of a process whose launcher set ``WORLD_SIZE`` but no ``RANK``, as
    Lightning's own DDP launcher does (it sets ``NODE_RANK`` and ``LOCAL_RANK``): ranks are
    numbered node by node, as torchrun and Lightning number them, so it is ``LOCAL_RANK`` on
    node 0 and ``NODE_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK`` where ``LOCAL_WORLD_SIZE`` says
    how many processes a node runs. Anything less would be a guess, and a wrong guess makes
    two ranks read the same lanes: None (:func:`_unknown_rank` says why)."""
    local, per_node = _env_int("LOCAL_RANK"), _env_int("LOCAL_WORLD_SIZE")
    node = _env_int("NODE_RANK")
    node = _env_int("GROUP_RANK") if node is None else node
    if local is not None and node == 0:
        return local
    if local is not None and node is not None and per_node is not None:
        return node * per_node + local
    return None


def _unknown_rank(world: int) -> ValueError:
    """The error for a rank the environment does not tell (see :func:`_rank_from_node`)."""
    shown = ", ".join(f"{name}={os.environ.get(name)!r}"
                      for name in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE"))
    return ValueError(f"WORLD_SIZE={world} but RANK is not set ({shown}), so zephon cannot tell which rank this "
                      "process is, and a guess could make two ranks read the same data. Build the loader after "
                      "torch.distributed is initialised (zephon.lightning.DataModule builds it in Trainer.fit), set "
                      "RANK (or LOCAL_RANK with NODE_RANK and LOCAL_WORLD_SIZE), or pass rank= and world_size= (to count "
                      "before Trainer.fit: DataModule.remaining(world_size=N))")


def dp_dim_names(dp_dims: str | Sequence[str]) -> tuple[str, ...]:
    """``dp_dims`` as a tuple of names."""
    return (dp_dims,) if isinstance(dp_dims, str) else tuple(dp_dims)


def _from_mesh(mesh: Any, dp_dims: str | Sequence[str]) -> tuple[int, int, int, bool]:
    """Data-parallel rank and size, peers and whether this rank writes, from a ``DeviceMesh``."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if not names or not hasattr(mesh, "get_local_rank"):
        raise ValueError(f"device_mesh={mesh!r} must be a torch.distributed DeviceMesh with named dimensions "
                         "(init_device_mesh(..., mesh_dim_names=(\"dp\", \"tp\")))")
    dims = dp_dim_names(dp_dims)
    unknown = [d for d in dims if d not in names]
    if not dims or unknown or len(set(dims)) != len(dims):
        raise ValueError(f"dp_dims={dp_dims!r} must name distinct dimensions of the mesh, which has {list(names)} (for "
                         "a dimension flattened from others, e.g. torchtitan's 'dp', name those it was made of)")
    rank = 0
    for d in dims:  # row-major over the data-parallel dimensions
        rank = rank * mesh.size(names.index(d)) + mesh.get_local_rank(d)
    size = math.prod(mesh.size(names.index(d)) for d in dims)
    others = [d for d in names if d not in dims]
    peers = math.prod(mesh.size(names.index(d)) for d in others)
    return rank, size, peers, all(mesh.get_local_rank(d) == 0 for d in others)


def _from_group(group: Any) -> tuple[int, int, int, bool]:
    """Data-parallel rank and size, peers and whether this rank writes, from a process group:
    the group that holds global rank 0 writes (its ranks are the first of their replicas)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("dp_group= needs an initialised torch.distributed process group")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError(f"dp_group={group!r} does not hold this process (global rank {dist.get_rank()}); pass the "
                         "data-parallel group this rank belongs to")
    return rank, size, max(1, dist.get_world_size() // size), 0 in dist.get_process_group_ranks(group)


def detect_topology(rank: int | None = None, world_size: int | None = None, *, device_mesh: Any = None,
                    dp_dims: str | Sequence[str] = ("dp",), dp_group: Any = None, dp_rank: int | None = None,
                    dp_size: int | None = None) -> Topology:
    """This process's data-parallel rank and size.

    One of: ``device_mesh`` (a ``DeviceMesh``; its ``dp_dims``, default ``("dp",)``, are the
    data-parallel dimensions, several taken row-major, e.g. ``("dp_replicate", "dp_shard")``);
    ``dp_group`` (the data-parallel process group of this rank); ``dp_rank`` and ``dp_size``
    (with them zephon cannot tell a replica's first rank, so every rank writes its replica's
    checkpoint files, the same bytes); ``rank`` / ``world_size`` (the same as ``dp_rank`` /
    ``dp_size``); else the world: ``torch.distributed`` when it is initialised, else torchrun's
    ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``, else a single process. Without ``RANK`` (Lightning's
    DDP launcher sets ``WORLD_SIZE``, ``NODE_RANK`` and ``LOCAL_RANK``) the rank is ``LOCAL_RANK``
    on node 0 and ``NODE_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK`` where ``LOCAL_WORLD_SIZE`` is set;
    otherwise, with ``WORLD_SIZE`` above 1, ``ValueError`` (a guessed rank could read another
    rank's data).
    """
    _checked_ints(rank=rank, world_size=world_size, dp_rank=dp_rank, dp_size=dp_size)
    given = [name for name, value in (("device_mesh", device_mesh), ("dp_group", dp_group),
                                      ("dp_rank/dp_size", dp_rank if dp_size is None else dp_size),
                                      ("rank/world_size", rank if world_size is None else world_size))
             if value is not None]
    if len(given) > 1:
        raise ValueError(f"give one of device_mesh, dp_group, dp_rank/dp_size or rank/world_size, not {given}")
    if (dp_rank is None) != (dp_size is None):
        raise ValueError(f"dp_rank={dp_rank!r} and dp_size={dp_size!r}: give both (this rank's data-parallel rank and "
                         "the number of data-parallel ranks)")
    local_rank = _env_int("LOCAL_RANK") or 0
    world_rank, world, origin = _world()
    peers, writes = 1, True
    r: int | None  # None: the environment cannot tell it (see _rank_from_node)
    if device_mesh is not None:
        r, w, peers, writes = _from_mesh(device_mesh, dp_dims)
        origin = "device_mesh"
    elif dp_group is not None:
        r, w, peers, writes = _from_group(dp_group)
        origin = "dp_group"
    elif given:
        given_rank, given_size = (dp_rank, dp_size) if given[0].startswith("dp") else (rank, world_size)
        r = world_rank if given_rank is None else given_rank
        w = world if given_size is None else given_size
        origin = "explicit"
        if w and world > w and world % w == 0:
            peers = world // w
    else:
        r, w = world_rank, world
    if r is None:
        raise _unknown_rank(world)
    if w < 1 or not 0 <= r < w:
        raise ValueError(f"rank={r} and world_size={w} do not fit: need 0 <= rank < world_size and world_size >= 1")
    return Topology(r, w, local_rank, origin, peers, writes)


def current_worker() -> tuple[int, int]:
    """``(worker id, number of workers)`` inside a DataLoader worker, ``(0, 1)`` elsewhere."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)

"""Where this process sits: rank and world size, and its DataLoader worker."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist
from torch.utils.data import get_worker_info


@dataclass(frozen=True, slots=True)
class Topology:
    rank: int  # 0 <= rank < world_size
    world_size: int  # >= 1
    local_rank: int  # the rank on this node (LOCAL_RANK), 0 when unknown
    origin: str  # "explicit", "torch.distributed", "environment" or "single process"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be an int (torchrun sets it)") from None


def detect_topology(rank: int | None = None, world_size: int | None = None) -> Topology:
    """Rank and world size: the explicit values, else ``torch.distributed`` when it is initialised,
    else torchrun's ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``, else a single process."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (type(value) is not int or value < 0):
            raise ValueError(f"{name}={value!r} must be an int >= 0")
    local_rank = _env_int("LOCAL_RANK") or 0
    found: tuple[int, int | None, str]
    if dist.is_available() and dist.is_initialized():
        found = dist.get_rank(), dist.get_world_size(), "torch.distributed"
    elif _env_int("WORLD_SIZE") is not None:
        found = _env_int("RANK") or 0, _env_int("WORLD_SIZE"), "environment"
    else:
        found = 0, 1, "single process"
    if rank is None and world_size is None:
        r, w, origin = found
    else:
        r = found[0] if rank is None else rank
        w = found[1] if world_size is None else world_size
        origin = "explicit"
    assert w is not None  # WORLD_SIZE was set when it was read
    if w < 1 or not 0 <= r < w:
        raise ValueError(f"rank={r} and world_size={w} do not fit: need 0 <= rank < world_size and world_size >= 1")
    return Topology(r, w, local_rank, origin)


def current_worker() -> tuple[int, int]:
    """``(worker id, number of workers)`` inside a DataLoader worker, ``(0, 1)`` elsewhere."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)

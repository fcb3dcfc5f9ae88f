"""Collective checkpoint helpers over torch.distributed (gloo and nccl)."""
from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from zephon.runtime import LOADER_STATE_KIND, LoaderStateDict, merge_states


def collective_device(group: Any) -> torch.device:
    """Where the collective's tensors live: the current CUDA device for NCCL, else the CPU."""
    backend = str(dist.get_backend(group)).lower()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_state(state: LoaderStateDict, group: Any = None) -> LoaderStateDict:
    """Every rank's loader state merged into one global state, on every rank (a collective).

    Call it on all ranks of ``group`` (default: the world) with each rank's
    ``loader.state_dict()``; the states travel as JSON bytes (no pickle). Works with gloo
    and nccl (for nccl, set the current CUDA device first, as torch requires). Without an
    initialised process group it returns ``merge_states([state])``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return merge_states([state])
    payload = json.dumps(state, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")
    device = collective_device(group)
    world = dist.get_world_size(group)
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    mine = mine.to(device)
    gathered = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    states = [json.loads(bytes(t[:int(s.item())].cpu().numpy())) for t, s in zip(gathered, sizes)]
    return merge_states(states)


def stateful_dataloader_state(state: Any) -> LoaderStateDict:
    """The zephon state inside a torchdata ``StatefulDataLoader.state_dict()``: its readers'
    :class:`StreamDataset` states (one per worker, or the main process's), merged into the
    rank's state. Feed it to :func:`all_gather_state` for a global checkpoint."""
    found: list[dict[str, Any]] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("kind") == LOADER_STATE_KIND:
                found.append(value)
                return
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(state)
    if not found:
        raise ValueError("no zephon state in this StatefulDataLoader state; was its dataset a "
                         "zephon StreamDataset (pipeline.to_torch_dataset())?")
    return merge_states(found)

"""The states a path holds, whatever kind of checkpoint it is (``zephon inspect``).

| path | read |
|---|---|
| a zephon checkpoint file or a JSON ``state_dict()`` | that state |
| a Lightning checkpoint file (``.ckpt``, a torch zip) | the data module's loader state |
| a checkpoint directory (``step-*`` folders) | its newest complete step |
| a step folder of one (``complete.ckpt``) | that step |
| a ``transformers`` ``checkpoint-N`` folder, or the output folder holding them | the (newest) one's loader state |
| a DCP checkpoint folder (``.metadata``) | every zephon loader in it |
| a folder of Lightning checkpoints | ``last.ckpt``, else the newest |
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

from zephon.io import open_regular
from zephon.runtime import CHECKPOINT_MARKER as MARKER
from zephon.runtime import HF_STATE_FILE, STEP_FOLDER, check_checkpoint_size, load_checkpoint, load_checkpoint_dir

ZIP = b"PK\x03\x04"  # how a torch.save file (Lightning's checkpoints) starts
HF_FOLDER = re.compile(r"checkpoint-(\d+)")
DCP_METADATA = ".metadata"

Found = list[tuple[str, dict[str, Any]]]  # (what was read, its state)


def states_in(path: str) -> Found:
    """The states ``path`` holds, each with a line saying what was read."""
    try:
        os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file or directory") from None
    if os.path.isdir(path):
        return _folder(path)
    return [_file(path)]


def _file(path: str, why: str = "") -> tuple[str, dict[str, Any]]:
    """What the file ``path`` is (``why`` it was chosen, if it was) and its state."""
    with open_regular(path, "state or checkpoint") as f:
        zipped = f.read(len(ZIP)) == ZIP
        if not zipped:
            check_checkpoint_size(os.fstat(f.fileno()).st_size, path)
            f.seek(0)
            data = f.read()
    if zipped:
        from zephon.torch import load_lightning_state

        return f"Lightning checkpoint {path}{why}", dict(load_lightning_state(path))
    return f"file {path}{why}", _state(path, data)


def _state(path: str, data: bytes) -> dict[str, Any]:
    """A JSON state, or a zephon checkpoint file's."""
    try:
        state = json.loads(data)
    except ValueError:
        return load_checkpoint(path)
    except RecursionError:
        raise ValueError(f"{path} nests its values too deeply to be a state") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds {type(state).__name__}, not a state dict")
    return state


def _folder(path: str) -> Found:
    names = sorted(os.listdir(path))
    if MARKER in names:
        return [_file(os.path.join(path, MARKER), " (the step folder's marker: the whole step)")]
    if any(STEP_FOLDER.fullmatch(name) and os.path.isdir(os.path.join(path, name)) for name in names):
        return [(f"checkpoint directory {path}: its newest complete step", dict(load_checkpoint_dir(path)))]
    if HF_STATE_FILE in names:
        return [_file(os.path.join(path, HF_STATE_FILE), " (of a transformers checkpoint)")]
    if DCP_METADATA in names:
        from zephon.torch import load_dcp_states

        return [(f"DCP checkpoint {path}, entry {key!r}", dict(state)) for key, state in load_dcp_states(path).items()]
    steps = sorted((int(m.group(1)), name) for name in names if (m := HF_FOLDER.fullmatch(name))
                   and os.path.isfile(os.path.join(path, name, HF_STATE_FILE)))
    if steps:
        newest = os.path.join(path, steps[-1][1], HF_STATE_FILE)
        return [_file(newest, f" (of the newest of {len(steps)} transformers checkpoints)")]
    files = [name for name in names if name.endswith(".ckpt") and os.path.isfile(os.path.join(path, name))]
    if files:
        chosen = "last.ckpt" if "last.ckpt" in files else max(files, key=lambda n: os.path.getmtime(os.path.join(path, n)))
        return [_file(os.path.join(path, chosen), f" (the newest of {len(files)} .ckpt files)")]
    raise ValueError(f"{path} is a folder that holds no checkpoint zephon reads (a checkpoint directory's step-* "
                     f"folders, {MARKER}, {HF_STATE_FILE} or checkpoint-* folders, DCP's {DCP_METADATA}, .ckpt "
                     "files); pass a checkpoint file or one of those folders")

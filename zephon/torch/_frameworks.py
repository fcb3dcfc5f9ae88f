"""Reading a loader state back from a Lightning checkpoint without Lightning (``zephon inspect``):
``zephon.lightning`` keeps it under ``LIGHTNING_KEY`` of its data module's entry."""
from __future__ import annotations

import pickle
from typing import cast

from zephon.runtime import LoaderStateDict, parse_state
from zephon.runtime import LIGHTNING_KEY


def load_lightning_state(path: str) -> LoaderStateDict:
    """The loader state a ``zephon.lightning.DataModule`` saved in the Lightning checkpoint
    file ``path``, read without Lightning by torch's ``weights_only`` unpickler (tensors and
    plain containers: nothing the file names is run). Raises ``ValueError`` when the file is
    not such a checkpoint."""
    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{path}: torch cannot read it as a checkpoint of plain data ({first})") from None
    found = [entry[LIGHTNING_KEY] for entry in (checkpoint.values() if isinstance(checkpoint, dict) else ())
             if isinstance(entry, dict) and isinstance(entry.get(LIGHTNING_KEY), dict)]
    if not found:
        raise ValueError(f"{path} is a torch checkpoint without a zephon loader's state (no data module entry "
                         f"with {LIGHTNING_KEY!r}: it was not saved through zephon.lightning.DataModule)")
    parse_state(found[0])
    return cast(LoaderStateDict, found[0])

"""Reading a loader state back from a Lightning checkpoint without Lightning (``zephon inspect``):
``zephon.lightning`` keeps it under ``LIGHTNING_KEY`` of its data module's entry."""
from __future__ import annotations

import pickle
from typing import cast

from zephon.limits import brief, show
from zephon.runtime import LIGHTNING_KEY, LoaderStateDict, parse_state


def load_lightning_state(path: str) -> LoaderStateDict:
    """The loader state a ``zephon.lightning.DataModule`` saved in the Lightning checkpoint
    file ``path``, read without Lightning by torch's ``weights_only`` unpickler (tensors and
    plain containers: nothing the file names is run). Raises ``ValueError`` when the file is
    not such a checkpoint."""
    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as error:
        raise ValueError(f"{path}: torch's weights_only loader cannot read it as a checkpoint of plain data "
                         f"({brief(error)})") from None
    found = [entry[LIGHTNING_KEY] for entry in (checkpoint.values() if isinstance(checkpoint, dict) else ())
             if isinstance(entry, dict) and LIGHTNING_KEY in entry]
    if not found:
        raise ValueError(f"{path} is a torch checkpoint without a zephon loader's state (no data module entry "
                         f"with {LIGHTNING_KEY!r}: it was not saved through zephon.lightning.DataModule)")
    if not isinstance(found[0], dict):
        raise ValueError(f"{path}: its data module saved no loader state ({LIGHTNING_KEY!r} is {show(found[0])}: "
                         "it was saved before the data module built its loader)")
    parse_state(found[0])
    return cast(LoaderStateDict, found[0])

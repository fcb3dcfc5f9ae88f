"""Pausing Python's cyclic garbage collector while a large, short-lived object graph is built."""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run the block with the cyclic garbage collector off (and on again after, if it was on).

    The state of thousands of lanes is built from about ten dicts a lane that live until it is
    done; the full collections they set off walk every object of the process (0.25 s in one
    that reads 16,384 lanes), several times a state. A reader's bundle of records (thousands
    of dicts, mapped and collated) sets off collections that walk them again and again. Reference
    counting still frees them; cycles wait for the next collection after the block.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

"""User callables that survive pickling: lambdas and closures travel by value.

Spawned DataLoader workers (the default on macOS, the safe choice with some CUDA set-ups)
receive the pipeline and its source by pickle. Standard pickle stores a function by
reference (module and name), so a lambda, a closure or a function defined in a notebook
cannot be sent. :func:`by_value` wraps such a callable so that it is pickled with
cloudpickle, which stores the code itself; an importable function is still stored by
reference. Unpickling needs nothing but the standard library and cloudpickle installed.
"""
from __future__ import annotations

import pickle
from typing import Any


class _ByValue:
    """Stands in for a callable while it is pickled: the callable's cloudpickle bytes."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes):
        self.payload = payload

    def __reduce__(self) -> tuple[Any, ...]:
        return pickle.loads, (self.payload,)


def by_value(thing: Any) -> Any:
    """``thing`` ready to be pickled: a callable (or tokenizer) goes by value, None stays None.

    Use it in ``__reduce__`` / ``__getstate__`` of an object that holds user callables; the
    unpickled object holds the original callable again, not a wrapper.
    """
    if thing is None:
        return None
    import cloudpickle

    return _ByValue(cloudpickle.dumps(thing))

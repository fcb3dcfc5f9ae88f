"""How much of each dataset a stream has read, from the state alone: O(datasets), no walk.

Under ``pass_tail="carry"`` a dataset's draws are the plain concatenation of its passes, so
``k = epoch · total + position − tails`` samples of it have been read (``draw_start``), every
pass before the current one completely. Under ``"drop"`` the cursor is where the draws are,
and ``tails`` are exactly the samples its pass starts skipped: never read.
"""
from __future__ import annotations

from typing import TypedDict

from zephon.core.config import CARRY, DatasetPlan, SourceConfig
from zephon.core.schedule import CursorState, SourceState


class DatasetCoverage(TypedDict):
    """What a stream has read of one dataset (a source's ``coverage()``, per dataset name)."""

    passes_completed: int  # passes read completely
    position: int  # samples read of the current pass
    pass_length: int  # samples in a pass (the dataset's size)
    never_read: int  # samples of its passes so far that were skipped (pass_tail="drop"), not read


def dataset_coverage(plan: DatasetPlan, cursor: CursorState) -> DatasetCoverage:
    """One dataset's ``passes_completed``, ``position`` (in the current pass), ``pass_length``
    and ``never_read`` (samples of its passes so far that were skipped, not read)."""
    if plan.total == 0:
        return {"passes_completed": 0, "position": 0, "pass_length": 0, "never_read": 0}
    if plan.pass_tail == CARRY:
        passes, position = divmod(cursor.epoch * plan.total + cursor.position - cursor.tails, plan.total)
        never_read = 0
    else:
        passes, position = divmod(cursor.epoch * plan.total + cursor.position, plan.total)
        never_read = cursor.tails
    return {"passes_completed": passes, "position": position, "pass_length": plan.total, "never_read": never_read}


def coverage(state: SourceState, config: SourceConfig) -> dict[str, DatasetCoverage]:
    """Per dataset name, what the stream up to ``state`` has read of it (``dataset_coverage``).

    For a lane the state counts every chunk of the global schedule before its position, the
    other lanes' included: the figures describe the lanes together.
    """
    return {d.name: dataset_coverage(d, cur) for d, cur in zip(config.datasets, state.cursors)}

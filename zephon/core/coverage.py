"""How much of each dataset a stream has read, from the state alone: O(datasets), no walk.

A cursor says what was read: ``epoch · total + position`` samples of the dataset's passes,
every pass before ``epoch`` to its end. Under ``pass_tail="carry"`` all of them were read;
under ``"drop"`` ``tails`` of them are the pass tails skipped: never read.
"""
from __future__ import annotations

from typing import Sequence, TypedDict

from zephon.core.config import REPEAT, DatasetPlan, SourceConfig
from zephon.core.schedule import CursorState, SourceState


class DatasetCoverage(TypedDict):
    """What a stream has read of one dataset (a source's ``coverage()``, per dataset name)."""

    passes_completed: int  # passes read to their end (or, under pass_tail="drop", ended by a skipped tail)
    position: int  # samples read of the pass in progress (0: none in progress)
    pass_length: int  # samples in a pass (the dataset's size)
    unread_in_pass: int  # samples of the pass in progress not read (yet, or ever, once the stream ended)
    never_read: int  # samples of its passes so far that were skipped (pass_tail="drop"), not read


def dataset_coverage(plan: DatasetPlan, cursor: CursorState) -> DatasetCoverage:
    """One dataset's ``passes_completed``, ``position`` and ``unread_in_pass`` (the pass in
    progress), ``pass_length`` and ``never_read`` (samples of its passes so far that were skipped)."""
    return read_figures(plan, cursor.epoch * plan.total + cursor.position, cursor.tails)


def read_figures(plan: DatasetPlan, read: int, never_read: int) -> DatasetCoverage:
    """The coverage figures of a dataset whose passes so far hold ``read`` samples (counting the
    ``never_read`` ones skipped in them)."""
    if plan.total == 0:
        return {"passes_completed": 0, "position": 0, "pass_length": 0, "unread_in_pass": 0, "never_read": 0}
    passes, position = divmod(read, plan.total)
    return {"passes_completed": passes, "position": position, "pass_length": plan.total,
            "unread_in_pass": plan.total - position if position else 0, "never_read": never_read}


def coverage(state: SourceState, config: SourceConfig) -> dict[str, DatasetCoverage]:
    """Per dataset name, what the stream up to ``state`` has read of it (``dataset_coverage``).

    For a lane the state counts every chunk of the global schedule before its position, the
    other lanes' included: the figures describe the lanes together.
    """
    return {d.name: dataset_coverage(d, cur) for d, cur in zip(config.datasets, state.cursors)}


def end_report(plans: Sequence[DatasetPlan], stop_after_passes: int | None,
               covered: dict[str, DatasetCoverage]) -> str:
    """What the end of a stream left unread, per dataset: passes completed, the samples of the
    pass in progress left unread, and the rule that stopped it there."""
    parts = []
    for d in plans:
        figures = covered[d.name]
        unread = figures["unread_in_pass"]
        done = figures["passes_completed"]
        part = f"{d.name!r}: {done:,} pass{'' if done == 1 else 'es'} completed, "
        part += f"{unread:,} of {d.total:,} samples of pass {done} unread" if unread else \
            "no pass in progress"
        if figures["never_read"]:
            part += f", {figures['never_read']:,} skipped in pass tails (pass_tail='drop')"
        parts.append(f"{part} ({_rule(d, stop_after_passes)})")
    return "; ".join(parts)


def _rule(plan: DatasetPlan, stop_after_passes: int | None) -> str:
    if plan.policy != REPEAT:
        return f"exhausted_policy={plan.policy!r}"
    if plan.max_repeats is not None:
        return f"max_repeats={plan.max_repeats}"
    if stop_after_passes is None:
        return "exhausted_policy='repeat', no limit"
    return f"stop_after_passes={stop_after_passes}"

"""The pure functional core: frozen configs and states, pure steps, Cython kernels behind them.

| use | for |
|---|---|
| :func:`step` | ``(state, config) -> (chunk | None, state')``: one chunk of a lane |
| :func:`initial_state` | the state at the start of a stream |
| :class:`SourceConfig`, :class:`SourceState` | what a source is, and where it stands |
| ``zephon.core.alloc`` | allocators and the allocator protocol |
| ``zephon.core.perm`` | random-access permutations |
| ``zephon.core.checkpoint`` | JSON checkpoints |

Nothing here imports the shell, io or torch.
"""
from zephon.core.config import DatasetPlan, SourceConfig
from zephon.core.schedule import CursorState, SourceState, initial_state
from zephon.core.step import step

__all__ = ["CursorState", "DatasetPlan", "SourceConfig", "SourceState", "initial_state", "step"]

from collections.abc import Callable

import numpy as np

from zephon._ext.layout import PassLayout
from zephon._ext.schedule import Scheduler

class Lookup:
    """One lane's random access over its snapshot index: the samples at any stream indices."""

    def __init__(self, scheduler: Scheduler, ints: np.ndarray, acc: np.ndarray, every: int, length: int,
                 chunk_size: int, reshuffle: np.ndarray, layout_of: Callable[[int, int], PassLayout],
                 max_shapes: int = 64, shape_budget: int = 32 << 20) -> None: ...
    @property
    def shapes_cached(self) -> int: ...
    def samples_at(self, targets: np.ndarray, out: np.ndarray) -> None: ...
    def sample_at(self, target: int) -> tuple[int, int, int]: ...

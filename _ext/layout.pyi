import numpy as np

class PassLayout:
    """One pass of one dataset as the pointer kernels read it."""

    table: ShardTable
    epoch: int
    @property
    def uniform(self) -> bool: ...
    @property
    def materialised(self) -> bool: ...
    def materialise(self) -> None: ...

class ShardTable:
    """One dataset's shard table and key prefixes (u > 0: uniform shards, odd = -1: none)."""

    def __init__(self, shard_ids: np.ndarray, counts: np.ndarray, u: int, odd: int, t: int,
                 shuffle: bool, within: bool, order_prefix: int, within_prefix: int,
                 block_prefix: int, block_size: int) -> None: ...
    @property
    def uniform(self) -> bool: ...
    def layout(self, epoch: int) -> PassLayout: ...

import numpy as np

class ScheduleTables:
    """One config's scheduling tables, shared by the kernels of its lanes."""

    def __init__(self, allocator: int, raw_weights: np.ndarray, totals: np.ndarray, policies: np.ndarray,
                 max_repeats: np.ndarray, carry: np.ndarray, sum_order: np.ndarray, stop_after: int,
                 chunk_size: int) -> None: ...

class Scheduler:
    """One lane's scheduling kernel: its config's tables and the lane's binding; its methods walk a
    state in place."""

    def __init__(self, tables: ScheduleTables, lane: int, replicas: int, routing: int, lane_key: int) -> None: ...
    def plan_next(self, chunk_index: int, acc: np.ndarray, epochs: np.ndarray, positions: np.ndarray,
                  tails: np.ndarray, out: np.ndarray, weights: np.ndarray,
                  budget: int = ...) -> tuple[bool, int, int]: ...
    def skip_quiet(self, acc: np.ndarray, epochs: np.ndarray, positions: np.ndarray,
                   count: int) -> tuple[int, int]: ...
    def index(self, chunk_index: int, acc: np.ndarray, epochs: np.ndarray, positions: np.ndarray,
              tails: np.ndarray, own: int, samples: int, every: int, snap_ints: np.ndarray, snap_acc: np.ndarray,
              budget: int) -> tuple[int, int, int, int, bool]: ...
    def count_lanes(self, chunk_index: int, acc: np.ndarray, epochs: np.ndarray, positions: np.ndarray,
                    tails: np.ndarray, replicas: int, routing: int, lane_key: int, starts: np.ndarray,
                    totals: np.ndarray, stop: int) -> tuple[int, bool]: ...

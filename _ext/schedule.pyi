import numpy as np

class Scheduler:
    """One config's scheduling tables and lane binding; its methods walk a state in place."""

    lane: int
    replicas: int
    routing: int
    lane_key: int

    def __init__(self, allocator: int, raw_weights: np.ndarray, totals: np.ndarray, policies: np.ndarray,
                 max_repeats: np.ndarray, carry: np.ndarray, sum_order: np.ndarray, stop_after: int,
                 chunk_size: int, lane: int, replicas: int, routing: int, lane_key: int) -> None: ...
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

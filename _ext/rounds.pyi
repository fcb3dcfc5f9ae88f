import numpy as np

def interleave(pointers: np.ndarray, components: np.ndarray, lane_pointers: np.ndarray, lane_components: np.ndarray,
               lane: int, lanes: int, unit: int, stream: bool) -> None: ...

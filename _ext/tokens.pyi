import numpy as np

def draw(deficits: np.ndarray, weights: np.ndarray, ends: np.ndarray, costs: np.ndarray, first: np.ndarray,
         drawn: np.ndarray, target: int) -> int: ...

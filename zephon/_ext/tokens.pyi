import numpy as np

def draw(deficits: np.ndarray, weights: np.ndarray, costs: np.ndarray, available: np.ndarray,
         drawn: np.ndarray, target: int) -> int: ...

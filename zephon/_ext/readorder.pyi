import numpy as np

def read_order(
    counts: np.ndarray, weighted_random: bool, random_key: int, shuffle_keys: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]: ...

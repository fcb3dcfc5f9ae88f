from collections.abc import Iterator

import numpy as np

def read_order(
    counts: np.ndarray, weighted_random: bool, random_key: int, shuffle_keys: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]: ...
def read_pointers(
    buffer: np.ndarray, counts: np.ndarray, weighted_random: bool, random_key: int,
    shuffle_keys: np.ndarray | None, pointers: np.ndarray | None = None, component: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]: ...
def iter_pairs(
    pointers: np.ndarray, component: np.ndarray, names: tuple[str, ...]
) -> Iterator[tuple[tuple[int, int, int], str]]: ...

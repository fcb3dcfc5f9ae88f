from collections import deque
from typing import Any

class Cursor:
    bundle: Any
    units: list[Any]
    ends: Any
    names: Any
    make: Any
    next: int
    count: int
    counted: int

class RoundRobin:
    rotation: list[int]
    turn: int
    cursors: dict[int, Any]
    positions: dict[int, int]
    recent: deque[tuple[int, int]]
    even: Any
    yielded: int
    def __init__(self, rotation: list[int], positions: dict[int, int], lag: int, keys: tuple[str, str],
                 even: Any = None) -> None: ...
    @property
    def keys(self) -> tuple[str, str]: ...
    def __iter__(self) -> RoundRobin: ...
    def __next__(self) -> Any: ...
    def upcoming(self) -> int | None: ...

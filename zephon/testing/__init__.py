"""Property-testing tools for zephon sources (needs the ``zephon[testing]`` extra: hypothesis).

| use | for |
|---|---|
| :func:`datasets`, :func:`mixtures`, :func:`source_configs`, :func:`cut_points` | hypothesis strategies |
| :func:`assert_replay_equivalent` | restoring any checkpoint replays the rest exactly |
| :func:`assert_lanes_partition` | lanes are disjoint and merge into the single-lane stream |
| :func:`collect` | a source's chunks as a list |
"""
try:
    import hypothesis as _hypothesis  # noqa: F401  (the optional dependency of the strategies)
except ModuleNotFoundError as missing:
    if missing.name != "hypothesis":
        raise
    raise ImportError("zephon.testing needs hypothesis, which is not installed: pip install 'zephon[testing]'") \
        from missing

from zephon.testing._assertions import assert_lanes_partition, assert_replay_equivalent, collect
from zephon.testing._strategies import cut_points, datasets, mixtures, source_configs

__all__ = [
    "assert_lanes_partition", "assert_replay_equivalent", "collect",
    "cut_points", "datasets", "mixtures", "source_configs",
]
assert sorted(__all__) == sorted(n for n in dir() if not n.startswith("_") and n not in ("annotations",)), __all__

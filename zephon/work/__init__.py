"""The object shell: work sources and the chunks they produce.

| use | for |
|---|---|
| :class:`StaticMixtureWorkSource` | fixed datasets in fixed proportions (the built-in source) |
| :class:`PhasedMixtureWorkSource`, :class:`Phase` | a curriculum: mixtures that change at set points of the run |
| :func:`migrate`, :class:`Migration` | continue a run under a new mixture or datasets (a report of what was unread) |
| :class:`WorkSource` | the interface to implement for a custom curriculum |
| :class:`DatasetCoverage` | what ``coverage()`` of a mixture source reports per dataset |
| :func:`received` | the same figures for what a run's readers received, from its lanes' states |
| :class:`StaticMixtureStateDict`, :class:`PhasedMixtureStateDict` | the JSON ``state_dict()`` of the built-in sources, with :class:`SourceStateDict`, :class:`CursorStateDict`, :class:`TokenRatioDict`, :class:`MigrationRecord` inside |
| :func:`check_lane`, :func:`check_replicas` | the checks of a lane binding (``lane_id``, ``canonical_replicas``) |
| :class:`WorkChunk`, :class:`WorkChunkStateDict` | a bundle of sample pointers grouped by component, and its JSON ``state_dict()`` |
| :class:`MixtureSpec` | validated mixture weights |
| :class:`MixtureReadConfig` and its enums | how a chunk's pointers are interleaved when read |
| :class:`PointerSequence` | a map-style view (``len``, ``[i]``) of an indexable source |
| :class:`TokenEstimation` | token-aware mixtures: weights in tokens, ratios measured or pinned |
| ``zephon.work.mixture_config`` | a mixture as a TOML / JSON file (``StaticMixtureWorkSource.from_config``) |
| :func:`by_value` | a user callable ready to pickle by value (lambdas to spawned workers) |
"""
from zephon.core.checkpoint import (
    CursorStateDict, MigrationRecord, SourceStateDict, StaticMixtureStateDict, TokenRatioDict,
)
from zephon.core.chunk import SampleId, WorkChunk
from zephon.core.chunk_state import WorkChunkStateDict
from zephon.core.coverage import DatasetCoverage
from zephon.core.read_config import ComponentOrder, MixtureReadConfig, MixtureReadMode
from zephon.work._portable import by_value
from zephon.work._priming import tokenizer_identity
from zephon.work.phased_mixture import Phase, PhasedMixtureStateDict, PhasedMixtureWorkSource
from zephon.work.migration import Migration, migrate, received
from zephon.work.sequence import PointerSequence
from zephon.work.source import WorkSource, check_lane, check_replicas
from zephon.work.spec import MixtureSpec
from zephon.work.static_mixture import StaticMixtureWorkSource
from zephon.work.tokens import TokenEstimation

__all__ = [
    "ComponentOrder", "CursorStateDict", "DatasetCoverage", "MigrationRecord", "MixtureReadConfig", "MixtureReadMode",
    "Migration", "MixtureSpec", "Phase", "PhasedMixtureStateDict", "PhasedMixtureWorkSource", "PointerSequence",
    "SampleId", "SourceStateDict", "StaticMixtureStateDict", "StaticMixtureWorkSource", "TokenEstimation",
    "TokenRatioDict", "WorkChunk", "WorkChunkStateDict", "WorkSource", "check_lane", "check_replicas", "migrate", "by_value",
    "received", "tokenizer_identity",
]

"""The WorkSource interface: what zephon calls on a curriculum, with the lane-binding rules."""
from __future__ import annotations

import abc
import copy
from typing import Any, Mapping, cast

import numpy as np

from zephon.core.checkpoint import KEY_LANE, KEY_REPLICAS
from zephon.core.chunk import SampleId, WorkChunk
from zephon.io import Dataset
from zephon.limits import MAX_REPLICAS, show


def check_replicas(canonical_replicas: Any) -> int:
    """Refuse a number of lanes that is not an int >= 1 (the one check of ``canonical_replicas``)."""
    if type(canonical_replicas) is not int:
        raise TypeError(f"canonical_replicas must be an int, got {show(canonical_replicas)}; pass the number of lanes")
    if not 1 <= canonical_replicas <= MAX_REPLICAS:
        raise ValueError(f"canonical_replicas must be in [1, {MAX_REPLICAS}], got {show(canonical_replicas)}; "
                         "pass the number of lanes")
    return canonical_replicas


def check_lane(lane_id: Any, canonical_replicas: Any) -> None:
    """Refuse a lane binding outside ``0 <= lane_id < canonical_replicas``, ``R >= 1``."""
    check_replicas(canonical_replicas)
    if type(lane_id) is not int:
        raise TypeError(f"lane_id must be an int, got {show(lane_id)}")
    if not 0 <= lane_id < canonical_replicas:
        raise ValueError(
            f"lane_id must be in [0, canonical_replicas={canonical_replicas}), got {show(lane_id)}; pick one of the lanes"
        )


class WorkSource(abc.ABC):
    """A deterministic stream of :class:`WorkChunk` per lane.

    Required: ``next_chunk``, ``component_ids``, ``datasets_by_id``, ``state_dict``,
    ``load_state_dict``. ``clone_for_lane`` binds a lane once (the default deep-copies, so a
    subclass must be deepcopy-safe or override it); the unbound template never produces
    chunks. The optional hooks below have the defaults the seeds describe.
    """

    _lane: int | None = None
    _replicas: int | None = None

    @abc.abstractmethod
    def next_chunk(self) -> WorkChunk | None:
        """The lane's next chunk, or None once the source is exhausted."""

    @abc.abstractmethod
    def component_ids(self) -> Mapping[str, int]:
        """Every component name the source can emit, mapped to a unique non-negative int."""

    @property
    @abc.abstractmethod
    def datasets_by_id(self) -> Mapping[int, Dataset]:
        """The dataset behind each dataset id used in pointers."""

    @abc.abstractmethod
    def state_dict(self) -> Mapping[str, Any]:
        """A JSON-able checkpoint of everything that drives ``next_chunk`` (a dict; the built-in
        sources type theirs: :class:`StaticMixtureStateDict`, :class:`PhasedMixtureStateDict`)."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint; the source then continues exactly as the saved one would."""

    def restore_checked(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint that was already checked for this source: zephon restores each
        reader's lanes from states it made or checked when they were loaded. The default is
        ``load_state_dict``; the built-in sources do not check again what was checked."""
        self.load_state_dict(state)

    def state_token(self) -> Any:
        """The state before the next chunk, as cheaply as the source can give it and picklable:
        readers record one per chunk and seal only the few a checkpoint needs, with
        ``state_from_token``. The default is ``state_dict()`` itself; an override must not
        return a mapping (a mapping is taken for the sealed state)."""
        return self.state_dict()

    def state_from_token(self, token: Any) -> Mapping[str, Any]:
        """The ``state_dict()`` of the moment ``state_token()`` returned ``token``; called on a
        clone of the same lane restored to a state of the same run. The default returns the
        token (``state_dict()``'s value)."""
        return cast(Mapping[str, Any], token)  # the default token is the state dict itself

    @property
    def lane_id(self) -> int | None:
        return self._lane

    @property
    def canonical_replicas(self) -> int | None:
        return self._replicas

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> WorkSource:
        """A copy bound to lane ``lane_id`` of ``canonical_replicas``; it produces only its chunks."""
        self._check_can_clone(lane_id, canonical_replicas)
        clone = copy.deepcopy(self)
        clone._lane, clone._replicas = lane_id, canonical_replicas
        return clone

    def _check_can_clone(self, lane_id: int, canonical_replicas: int) -> None:
        if self._lane is not None:
            raise RuntimeError(
                f"this source is already bound to lane {self._lane} of {self._replicas}; clone the template instead"
            )
        check_lane(lane_id, canonical_replicas)

    def _check_producing(self) -> None:
        if self._lane is None:
            raise RuntimeError("the template source never produces chunks; call clone_for_lane(lane_id, R) first")

    def _check_lane_header(self, state: Mapping[str, Any]) -> None:
        """Refuse a checkpoint taken on another lane or with another ``canonical_replicas``."""
        check_lane_header(state, self._lane, self._replicas)

    def chunk_size_hint(self) -> int | None:
        """The fixed chunk size, if the source has one."""
        return None

    @property
    def requires_token_priming(self) -> bool:
        return False

    def prime(self, **kwargs: Any) -> None:
        """Driver-side calibration before workers fork; nothing to do by default."""

    def supports_indexing(self) -> bool:
        return False

    def __bool__(self) -> bool:
        return True  # a source is never falsy, whether or not it has a length

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} is streaming-only; it has no length")

    def sample_id_at(self, index: int) -> SampleId:
        raise NotImplementedError(f"{type(self).__name__} is streaming-only; it has no random access")

    def sample_ids_at(self, indices: Any) -> np.ndarray:
        """The samples at ``indices`` as an ``(n, 3)`` int64 array (``sample_id_at`` for each, unless
        the source has a batched lookup)."""
        flat = np.asarray(indices, dtype=np.int64).reshape(-1)
        return np.array([self.sample_id_at(int(i)) for i in flat], dtype=np.int64).reshape(-1, 3)


def check_lane_header(state: Mapping[str, Any], lane: int | None, replicas: int | None) -> None:
    """Refuse a checkpoint unless it was taken on lane ``lane`` of ``replicas``."""
    saved = (state.get(KEY_LANE), state.get(KEY_REPLICAS))
    if tuple(map(type, saved)) != (type(lane), type(replicas)) or saved != (lane, replicas):
        raise ValueError(
            f"checkpoint belongs to lane {show(saved[0])} of {show(saved[1])}, but this source is lane {lane} "
            f"of {replicas}; load it into the clone of that lane"
        )

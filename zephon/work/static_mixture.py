"""StaticMixtureWorkSource: a fixed set of datasets mixed in fixed proportions.

A thin shell over the pure core: it holds ``(config, state)``, validates once at
construction, and each method calls one core function and swaps in the new state.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from zephon.core import checkpoint, coverage, index
from zephon.core.chunk import SampleId, WorkChunk
from zephon.core.config import SourceConfig
from zephon.core.schedule import SourceState, initial_state
from zephon.core.step import step
from zephon.core.tokens import token_shares, with_ratios
from zephon.io import Dataset
from zephon.limits import show
from zephon.work._priming import cached_ratio
from zephon.work import mixture_config
from zephon.work._resolve import check_liveness, resolve
from zephon.work.source import WorkSource


class StaticMixtureWorkSource(WorkSource):
    """Mix ``datasets`` by ``mixture`` weights into deterministic chunks of ``chunk_size`` pointers.

    Build the template once, then ``clone_for_lane(l, R)`` per lane; each clone's stream is a
    pure function of the arguments and the lane. Every argument is checked here: a bad one
    raises ``ValueError`` / ``TypeError`` naming it, before anything is built.

    Parameters
    ----------
    datasets : sequence of Dataset
        The datasets to mix, with unique names. A pointer's ``dataset_id`` is the dataset's
        position in this list.
    mixture : MixtureSpec or mapping of str to float
        One positive finite weight per dataset name (no more, no fewer). Weights are
        normalised, summed in the mapping's order.
    chunk_size : int, default 16384
        Pointers per chunk (fewer only where a redistributing dataset drains).
    seed : int, default 0
        The root of every random decision: shuffles, lane routing, read order.
    shuffle_shards : bool, default True
        Visit each dataset's shards in a fresh random order on every pass.
    shuffle_within_shard : bool, default False
        Read the rows of each shard in a random order.
    shuffle_block_size : int, "auto", "global" or None, default None
        Also shuffle each dataset's sequence in blocks of this many samples, across shards.
        ``"auto"``: eight times the largest shard of any dataset; ``"global"``: the whole
        dataset (a true global shuffle); ``None``: no block shuffle. Capped at each
        dataset's size.
    exhausted_policy : {"stop", "repeat", "redistribute"}, mapping or None, default None
        What happens when a dataset cannot supply its quota: ``"stop"`` ends the stream,
        ``"repeat"`` starts its next pass, ``"redistribute"`` lets it drain and shares its
        weight among the others. A mapping sets it per dataset. ``None``: ``"repeat"`` when
        ``stop_after_passes`` is in force, otherwise ``"stop"``.
    reshuffle_on_repeat : bool or mapping of str to bool, default True
        Shuffle each pass of a repeating dataset anew; ``False`` repeats pass 0's order.
    max_repeats : int, mapping or None, default None
        Passes a repeating dataset may make after its first; the stream ends when one would
        need more. ``None``: unbounded. Cannot be combined with ``stop_after_passes``.
    stop_after_passes : int, None or "auto", default "auto"
        End the stream once every dataset has completed this many passes (datasets that get
        there sooner repeat to keep the mixture). ``None``: no such limit. ``"auto"``: ``1``,
        unless ``exhausted_policy`` or ``max_repeats`` is given, then ``None``.
    lane_assignment : {"permute", "modulo"}, default "permute"
        How global chunks are routed to lanes: a seeded permutation of the lanes per block
        of ``R`` chunks, or chunk ``g`` to lane ``g % R``.
    allocation : "accumulator", "fixed" or Allocator, default "accumulator"
        How a chunk's pointers are shared among datasets: carried fractional shares (exact
        in the limit), the legacy fixed quotas, or your own allocator object.
    token_estimation : TokenEstimation or None, default None
        Make the weights shares of *tokens*, with each dataset's tokens per byte measured by
        :meth:`prime` or pinned. ``None``: weights are shares of samples.
    pass_tail : {"carry", "drop"} or mapping name -> str, default "carry"
        What a repeating dataset does when its pass has fewer samples left than its quota of a
        chunk. ``"carry"``: the chunk takes them all, then the rest of its quota from the start
        of the next pass, so its stream is its passes back to back and every pass the stream
        moves past is read completely, exactly once. ``"drop"``: the tail is skipped and the
        next pass begins (zephon 0.2.0's streams). Quotas, the number of chunks,
        ``target_mixture``, ``source_exhausted`` and the end of the stream are the same in both.
        A mapping sets it per dataset (omitted datasets take ``"carry"``). ``coverage()``
        reports what each dataset has read and skipped.
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        mixture: Any,
        chunk_size: int = 16384,
        seed: int = 0,
        shuffle_shards: bool = True,
        shuffle_within_shard: bool = False,
        shuffle_block_size: int | str | None = None,
        exhausted_policy: str | Mapping[str, str] | None = None,
        reshuffle_on_repeat: bool | Mapping[str, bool] = True,
        max_repeats: int | Mapping[str, int | None] | None = None,
        stop_after_passes: int | str | None = "auto",
        lane_assignment: str = "permute",
        allocation: Any = "accumulator",
        token_estimation: Any = None,
        pass_tail: str | Mapping[str, str] = "carry",
    ):
        self._config = resolve(
            datasets, mixture, chunk_size=chunk_size, seed=seed, shuffle_shards=shuffle_shards,
            shuffle_within_shard=shuffle_within_shard, shuffle_block_size=shuffle_block_size,
            exhausted_policy=exhausted_policy, reshuffle_on_repeat=reshuffle_on_repeat,
            max_repeats=max_repeats, stop_after_passes=stop_after_passes,
            lane_assignment=lane_assignment, allocation=allocation, token_estimation=token_estimation,
            pass_tail=pass_tail,
        )
        self._estimation = token_estimation
        self._block_size = shuffle_block_size  # as given: "auto" stays "auto" in to_config()
        self._datasets = tuple(datasets)
        self._state = initial_state(self._config)
        self._index: index.StreamIndex | None = None  # built on first random access

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | os.PathLike[str], *, tokenizer: Any = None,
                    measure: Callable[[Any], int] | None = None) -> StaticMixtureWorkSource:
        """Build the source a mixture config describes (see :mod:`zephon.work.mixture_config`).

        Parameters
        ----------
        config : mapping, str or os.PathLike
            The config as a dict (as :meth:`to_config` returns it), or the path of a
            ``.toml`` or ``.json`` file holding one; a file's relative dataset paths are
            taken from its folder.
        tokenizer : callable or object with ``encode``, default None
            The tokenizer of a ``token_estimation`` table that measures ratios.
        measure : callable, default None
            A ``record -> token count`` function that replaces ``tokenizer``.
        """
        if isinstance(config, (str, os.PathLike)):
            config = mixture_config.read_config_file(config)
        return cls(**mixture_config.source_arguments(config, tokenizer=tokenizer, measure=measure))

    def to_config(self) -> dict[str, Any]:
        """Every setting of this source as plain data: ``from_config(s.to_config())`` builds the same source.

        Datasets appear by path (path datasets) or by their shard table (count-only ones);
        settings as resolved per dataset. A primed token-mode source writes its measured
        ratios, so rebuilding it measures nothing. Raises ``ValueError`` for what a file
        cannot hold: in-memory records or a custom allocator. The lane binding of a clone
        is not part of it.
        """
        return mixture_config.config_of(self._config, self._datasets, self._block_size, self._estimation)

    @property
    def config(self) -> SourceConfig:
        """The resolved configuration (frozen; includes the lane binding of a clone)."""
        return self._config

    @property
    def state(self) -> SourceState:
        """Where the source stands (frozen; a few numbers per dataset)."""
        return self._state

    def next_chunk(self) -> WorkChunk | None:
        self._check_producing()
        chunk, self._state = step(self._state, self._config)
        return chunk

    def component_ids(self) -> dict[str, int]:
        return {d.name: i for i, d in enumerate(self._config.datasets)}

    @property
    def datasets_by_id(self) -> dict[int, Dataset]:
        return dict(enumerate(self._datasets))

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> StaticMixtureWorkSource:
        """A clone bound to one lane; it shares the datasets and shard tables with the template."""
        self._check_can_clone(lane_id, canonical_replicas)
        clone = object.__new__(type(self))
        clone._datasets, clone._estimation, clone._block_size = self._datasets, self._estimation, self._block_size
        clone._config = dataclasses.replace(self._config, lane=lane_id, canonical_replicas=canonical_replicas)
        clone._state = self._state
        clone._index = None
        clone._lane, clone._replicas = lane_id, canonical_replicas
        return clone

    def state_dict(self) -> dict[str, Any]:
        return checkpoint.state_to_json(self._state, self._config)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint; a token-mode one brings its ratios (nothing is measured again)."""
        checkpoint.check_header(state, self._config)
        self._check_lane_header(state)
        ratios = checkpoint.ratios_from_json(state, self._config)
        config = self._with_ratios(ratios) if ratios else self._config
        self._state = checkpoint.state_from_json(state, config)
        self._config, self._index = config, None

    @property
    def requires_token_priming(self) -> bool:
        """True for a token-aware source until every dataset has its tokens-per-byte ratio."""
        return not self._config.primed

    def prime(self, *, progress: bool | None = None, **_: Any) -> None:
        """Measure the missing tokens-per-byte ratios (on the driver, before workers fork).

        Idempotent; a no-op in sample mode, once primed, or after a token-mode restore.
        """
        if self._config.primed:
            return
        self._config = self._with_ratios({
            d.name: cached_ratio(self._datasets[i], i, self._estimation, self._config.seed, progress)
            for i, d in enumerate(self._config.datasets) if d.token_ratio is None
        })
        self._index = None

    def _with_ratios(self, ratios: dict[str, tuple[float, str]]) -> SourceConfig:
        """The config with these token ratios, checked for liveness."""
        config = with_ratios(self._config, ratios)
        check_liveness(config.datasets, config.chunk_size, config.allocator, token_shares(config.datasets))
        return config

    def chunk_size_hint(self) -> int:
        return self._config.chunk_size

    def supports_indexing(self) -> bool:
        """True for finite streams of the built-in allocators: ``len`` and ``sample_id_at`` work."""
        return index.supports_indexing(self._config)

    def __len__(self) -> int:
        """Samples in the stream from its start: the lane's for a clone, all for the template.

        Sample mode reads it off the random-access index; token mode plans every chunk.
        """
        if self._config.token_mode:
            return index.remaining_samples(initial_state(self._config), self._config)
        return self._stream_index().length

    def sample_id_at(self, i: int) -> SampleId:
        """The ``i``-th sample of the stream in default read order (``IndexError`` outside it)."""
        stream = self._stream_index()
        if type(i) is not int or not 0 <= i < stream.length:  # the fast path costs two checks
            i = self._check_index(i)
        return index.sample_at(stream, self._config, i)

    def sample_ids_at(self, indices: Any) -> np.ndarray:
        """The samples at ``indices`` as an ``(n, 3)`` int64 array (one call for many lookups)."""
        positions = np.asarray(indices)
        if positions.ndim != 1 or (positions.size and positions.dtype.kind not in "iu"):
            raise TypeError(f"indices must be a 1-D sequence of ints, got {show(indices)}")
        length = len(self)
        if positions.size and (positions.min() < 0 or positions.max() >= length):
            bad = positions[(positions < 0) | (positions >= length)][0]
            raise IndexError(f"sample index {bad} is out of range [0, {length})")
        return index.samples_at(self._stream_index(), self._config, positions.astype(np.int64, copy=False))

    def remaining_samples(self) -> int:
        """Samples still to come from the current state (after a restore too)."""
        return index.remaining_samples(self._state, self._config)

    def _stream_index(self) -> index.StreamIndex:
        if self._index is None:
            self._index = index.build_index(self._config)
        return self._index

    def _check_index(self, i: Any) -> int:
        if type(i) is bool or not isinstance(i, (int, np.integer)):
            raise TypeError(f"sample index must be an int, got {show(i)}")
        length = self._stream_index().length
        if not 0 <= i < length:
            raise IndexError(f"sample index {show(i)} is out of range [0, {length})")
        return int(i)

    def coverage(self) -> dict[str, dict[str, int]]:
        """Per dataset name, from the state alone in O(datasets): ``passes_completed``,
        ``position`` in the current pass, ``pass_length`` and ``never_read``, the samples of
        its passes so far that were skipped (0 under ``pass_tail="carry"``, the dropped tails
        under ``"drop"``). A lane's figures count every lane's chunks before its position."""
        return coverage.coverage(self._state, self._config)

    def continues_after_exhaustion(self) -> frozenset[str]:
        """Names of the datasets that may drain while the others go on (``exhausted_policy='redistribute'``)."""
        return frozenset(d.name for d in self._config.datasets if d.policy == "redistribute")

    def __repr__(self) -> str:
        lane = "template" if self._lane is None else f"lane {self._lane} of {self._replicas}"
        return f"StaticMixtureWorkSource({list(self._config.names)}, {lane}, chunk {self._state.chunk_index})"

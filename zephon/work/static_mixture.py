"""StaticMixtureWorkSource: a fixed set of datasets mixed in fixed proportions.

A thin shell over the pure core (``zephon.work._mixture``): it holds ``(config, state)``,
validates once at construction, and each method calls one core function and swaps in the
new state.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence, cast

from zephon.core import checkpoint, counting, coverage, index
from zephon.core.config import SourceConfig
from zephon.core.schedule import (
    SourceState, check_drawn, initial_state, state_of_token, state_token, token_chunk_index,
)
from zephon.core.step import step, stream_end
from zephon.core.tokens import token_shares, with_ratios
from zephon.io import Dataset
from zephon.work import mixture_config
from zephon.work._mixture import MixtureShell, check_history
from zephon.work._resolve import check_liveness, resolve
from zephon.work.source import check_lane_header


# The keys of a checkpoint, beside its lane and state, that a restore takes settings from: lanes
# of one template and lane count restored from checkpoints that agree on them make checkpoints
# that differ only in lane and state.
RESTORED_SETTINGS = (checkpoint.KEY_ORDERS, checkpoint.KEY_RATIOS, checkpoint.KEY_MIGRATIONS)


class StaticMixtureWorkSource(MixtureShell):
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
        next pass begins (the earlier rule's streams, kept exactly). Both give the same quotas
        and ``target_mixture`` on every chunk both produce; they differ where the stream ends.
        ``"carry"`` ends by what was read, so under ``stop_after_passes`` or ``max_repeats`` its
        stream can hold more chunks than ``"drop"``'s (never fewer), and ``source_exhausted``
        can name a capped dataset at a later chunk.
        A mapping sets it per dataset (omitted datasets take ``"carry"``). ``coverage()``
        reports what each dataset has read and skipped.
    """

    _core_step = staticmethod(step)
    _core_initial = staticmethod(initial_state)
    _core_remaining = staticmethod(index.remaining_samples)
    _core_index = staticmethod(index.build_index)
    _core_sample = staticmethod(index.sample_at)
    _core_samples = staticmethod(index.samples_at)
    _core_indexable = staticmethod(index.supports_indexing)
    _core_coverage = staticmethod(coverage.coverage)
    _core_end = staticmethod(stream_end)
    _core_to_json = staticmethod(checkpoint.state_to_json)
    _core_token = staticmethod(state_token)
    _core_of_token = staticmethod(state_of_token)
    _core_token_chunk = staticmethod(token_chunk_index)

    @staticmethod
    def _core_bind(config: SourceConfig, lane: int, replicas: int) -> SourceConfig:
        return config.for_lane(lane, replicas)

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
        config = resolve(
            datasets, mixture, chunk_size=chunk_size, seed=seed, shuffle_shards=shuffle_shards,
            shuffle_within_shard=shuffle_within_shard, shuffle_block_size=shuffle_block_size,
            exhausted_policy=exhausted_policy, reshuffle_on_repeat=reshuffle_on_repeat,
            max_repeats=max_repeats, stop_after_passes=stop_after_passes,
            lane_assignment=lane_assignment, allocation=allocation, token_estimation=token_estimation,
            pass_tail=pass_tail,
        )
        self._setup(config, datasets, token_estimation)
        self._block_size = shuffle_block_size  # as given: "auto" stays "auto" in to_config()

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | os.PathLike[str], *, tokenizer: Any = None,
                    measure: Callable[[Any], float] | None = None) -> StaticMixtureWorkSource:
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
        is not part of it, nor are the sample orders a migration kept for continuing
        datasets: those travel in the migrated checkpoint, and loading it into the rebuilt
        source restores them.
        """
        return mixture_config.config_of(self._config, self._datasets, self._block_size, self._estimation)

    def state_dict(self) -> checkpoint.StaticMixtureStateDict:
        """The checkpoint: plain JSON, tagged, versioned and sealed with a digest (see
        :class:`~zephon.work.StaticMixtureStateDict` for its keys); about a kilobyte for a few
        datasets, whatever the position."""
        return cast(checkpoint.StaticMixtureStateDict, self._checkpoint(self._state))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint; a token-mode one brings its ratios (nothing is measured again).

        A state made by ``zephon.work.migrate`` carries the run's migration history, kept here,
        and the sample order of each dataset that continues an older one (its seed, position and
        shuffles then), which the restored source keeps.
        """
        checkpoint.check_header(state, self._config)
        self._restore(state, checked=False)

    def restore_checked(self, state: Mapping[str, Any]) -> None:
        """``load_state_dict`` of a checkpoint already checked for this source's settings: its
        form, size, seal and settings are not checked again (its lane and positions are). A
        subclass that restores its own way (overrides ``load_state_dict``) is restored by it."""
        if type(self).load_state_dict is not StaticMixtureWorkSource.load_state_dict:
            self.load_state_dict(state)
        else:
            self._restore(state, checked=True)

    def _restore(self, state: Mapping[str, Any], checked: bool) -> None:
        """Restore ``state``: the settings are this source's with ``state``'s ``RESTORED_SETTINGS``."""
        self._check_lane_header(state)
        history = check_history(state.get(checkpoint.KEY_MIGRATIONS, []))
        config = checkpoint.with_orders(self._config, state.get(checkpoint.KEY_ORDERS))
        ratios = checkpoint.ratios_from_json(state, config)
        config = self._core_with_ratios(ratios, config) if ratios else config
        self._state = _restored(state, config, migrated=bool(history), checked=checked)
        self._config, self._index, self._history = config, None, history

    def remaining_by_lane(self, states: Mapping[int, Mapping[str, Any]], replicas: int, *,
                          checked: bool = False) -> dict[int, int]:
        """Samples each lane (of ``replicas``) still yields from its checkpoint ``states[lane]``:
        what ``clone_for_lane(lane, replicas)`` loaded with it returns from ``remaining_samples()``,
        for many lanes in one walk of the global schedule (``zephon.core.counting``). Call it on
        the template.

        Parameters
        ----------
        states : Mapping[int, Mapping[str, Any]]
            Lane -> that lane's ``state_dict()``.
        replicas : int
            The lanes' ``canonical_replicas``.
        checked : bool, default False
            The states were checked for this source's settings already, as ``restore_checked``
            takes them: their form, size, seal and settings are not checked again (their lanes
            and positions are). By default they are checked as ``load_state_dict`` checks them.
        """
        if self.lane_id is not None:
            raise RuntimeError("remaining_by_lane counts lanes of the template source; call it on the source you built")
        core, alone = {}, {}
        for lane, state in states.items():
            if self._config.token_mode or checkpoint.KEY_ORDERS in state:  # lanes of their own schedule
                clone = self.clone_for_lane(lane, replicas)
                restore = clone.restore_checked if checked else clone.load_state_dict
                restore(state)
                alone[lane] = clone.remaining_samples()
                continue
            if not checked:
                checkpoint.check_header(state, self._config)
            check_lane_header(state, lane, replicas)
            core[lane] = _restored(state, self._config, migrated=checkpoint.KEY_MIGRATIONS in state, checked=checked)
        counts = counting.remaining_by_lane(self._config, core, lambda lane: self._core_bind(self._config, lane, replicas),
                                            replicas)
        return {**counts, **alone}

    def _core_with_ratios(self, ratios: dict[str, tuple[float, str]], config: SourceConfig | None = None
                          ) -> SourceConfig:
        """The config (this source's by default) with these token ratios, checked for liveness."""
        config = with_ratios(config or self._config, ratios)
        check_liveness(config.datasets, config.chunk_size, config.allocator, token_shares(config.datasets))
        return config


def _restored(state: Mapping[str, Any], config: SourceConfig, migrated: bool, checked: bool = False) -> SourceState:
    """The checked state of a checkpoint (``checked``: its settings were, so only its positions
    are); one of a stream never migrated must agree with what its cursors read (a migrated one
    drew them under another mixture)."""
    restored = checkpoint.state_from_json(state, config, checked)
    if not (migrated or restored.requeue or checkpoint.KEY_ORDERS in state):
        check_drawn(restored, config, initial_state(config))
    return restored

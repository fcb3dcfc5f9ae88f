"""StaticMixtureWorkSource: a fixed set of datasets mixed in fixed proportions.

A thin shell over the pure core (``zephon.work._mixture``): it holds ``(config, state)``,
validates once at construction, and each method calls one core function and swaps in the
new state.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from zephon.core import checkpoint, coverage, index
from zephon.core.config import SourceConfig
from zephon.core.schedule import initial_state
from zephon.core.step import step
from zephon.core.tokens import token_shares, with_ratios
from zephon.io import Dataset
from zephon.work._mixture import MixtureShell, check_history
from zephon.work._resolve import UNSET, check_liveness, resolve


class StaticMixtureWorkSource(MixtureShell):
    """Mix ``datasets`` by ``mixture`` weights into deterministic chunks of ``chunk_size`` pointers.

    See SPEC §1 for every argument. Build the template once, then ``clone_for_lane(l, R)`` per
    lane; each clone's stream is a pure function of the arguments and the lane.

    Parameters
    ----------
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

    _core_step = staticmethod(step)
    _core_initial = staticmethod(initial_state)
    _core_remaining = staticmethod(index.remaining_samples)
    _core_index = staticmethod(index.build_index)
    _core_sample = staticmethod(index.sample_at)
    _core_samples = staticmethod(index.samples_at)
    _core_indexable = staticmethod(index.supports_indexing)
    _core_coverage = staticmethod(coverage.coverage)

    @staticmethod
    def _core_bind(config: SourceConfig, lane: int, replicas: int) -> SourceConfig:
        return dataclasses.replace(config, lane=lane, canonical_replicas=replicas)

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
        reshuffle_on_repeat: bool | Mapping[str, bool] = UNSET,
        max_repeats: int | Mapping[str, int | None] | None = None,
        stop_after_passes: int | None = UNSET,
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

    def state_dict(self) -> dict[str, Any]:
        return self._with_history(checkpoint.state_to_json(self._state, self._config))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint; a token-mode one brings its ratios (nothing is measured again).

        A state made by ``zephon.work.migrate`` carries the run's migration history, kept here,
        and the sample order of each dataset that continues an older one (its seed, position and
        shuffles then), which the restored source keeps.
        """
        checkpoint.check_header(state, self._config)
        self._check_lane_header(state)
        history = check_history(state.get(checkpoint.KEY_MIGRATIONS, []))
        config = checkpoint.with_orders(self._config, state.get(checkpoint.KEY_ORDERS))
        ratios = checkpoint.ratios_from_json(state, config)
        config = self._core_with_ratios(ratios, config) if ratios else config
        self._state = checkpoint.state_from_json(state, config)
        self._config, self._index, self._history = config, None, history

    def _core_with_ratios(self, ratios: dict[str, tuple[float, str]], config: SourceConfig | None = None
                          ) -> SourceConfig:
        """The config (this source's by default) with these token ratios, checked for liveness."""
        config = with_ratios(config or self._config, ratios)
        check_liveness(config.datasets, config.chunk_size, config.allocator, token_shares(config.datasets))
        return config

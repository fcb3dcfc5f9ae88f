"""Property-testing kit for zephon sources and pipelines (needs the ``zephon-mixtures[testing]`` extra: hypothesis).

| use | for |
|---|---|
| :func:`sources`, :func:`phased_sources`, :func:`reachable_states`, :func:`work_chunks`, :func:`loader_topologies` | hypothesis strategies: built sources (static or phased), states they reach, chunks, job topologies |
| :func:`datasets`, :func:`mixtures`, :func:`source_configs`, :func:`phased_source_configs`, :func:`mixture_read_configs`, :func:`cut_points` | strategies for the parts |
| :func:`assert_replay_equivalent` | restoring any checkpoint replays the rest exactly |
| :func:`assert_lanes_partition` | lanes are disjoint and merge into the single-lane stream |
| :func:`assert_elastic_resume_equivalent` | a job stopped on one topology resumes on another, every lane exact |
| :func:`assert_mixture_prefix_bound` | every prefix keeps each component within a bound of its target |
| :func:`assert_passes_complete` | every completed pass holds each sample once |
| :func:`assert_parallel_reads`, :func:`batch_digest` | a model-parallel job's replicas: peers read the same batches, replicas disjoint ones |
| :func:`assert_same_stream_in_fresh_process` | the same stream in a new interpreter (hash seed, cwd, threads) |
| :func:`stream_digest` | a stable digest of a stream, to pin in CI |
| :func:`collect` | a source's chunks as a list |

``st.from_type`` draws :class:`~zephon.Dataset`, :class:`~zephon.StaticMixtureWorkSource`,
:class:`~zephon.work.PhasedMixtureWorkSource`,
:class:`~zephon.WorkChunk`, :class:`~zephon.work.MixtureReadConfig` and
:class:`~zephon.work.MixtureSpec` once zephon is installed (a ``hypothesis`` entry point).
The pytest plugin adds the ``zephon_golden`` fixture and ``--zephon-update-golden``.
Every assertion takes a zero-argument factory returning a fresh source or pipeline; its
failure says where the streams part: lane, chunk, position and both pointers.
"""
try:
    import hypothesis as _hypothesis  # noqa: F401  (the optional dependency of the strategies)
except ModuleNotFoundError as missing:
    if missing.name != "hypothesis":
        raise
    raise ImportError("zephon.testing needs hypothesis, which is not installed: pip install 'zephon-mixtures[testing]'") \
        from missing

from zephon.testing._assertions import (assert_lanes_partition, assert_mixture_prefix_bound, assert_passes_complete,
                                        assert_replay_equivalent)
from zephon.testing._elastic import assert_elastic_resume_equivalent
from zephon.testing._parallel import assert_parallel_reads, batch_digest
from zephon.testing._process import assert_same_stream_in_fresh_process
from zephon.testing._strategies import (cut_points, datasets, loader_topologies, mixture_read_configs, mixtures,
                                        phased_source_configs, phased_sources, reachable_states, source_configs,
                                        sources, work_chunks)
from zephon.testing._streams import collect, stream_digest

__all__ = [
    "assert_elastic_resume_equivalent", "assert_lanes_partition", "assert_mixture_prefix_bound",
    "assert_parallel_reads", "assert_passes_complete", "assert_replay_equivalent",
    "assert_same_stream_in_fresh_process", "batch_digest", "collect",
    "cut_points", "datasets", "loader_topologies", "mixture_read_configs", "mixtures", "phased_source_configs",
    "phased_sources", "reachable_states",
    "source_configs", "sources", "stream_digest", "work_chunks",
]
assert sorted(__all__) == sorted(n for n in dir() if n[0] not in "_@" and n != "annotations"), __all__  # @: pytest

"""zephon curriculum benchmark: phases against the static source, and migration of a wide run.

``python bench/curriculum.py`` (``--quick`` for a smoke run). The workload is the core
benchmark's datasets and chunk size; the curriculum anneals at 90 % of the chunks of a finite
run (``stop_after_passes``) to a mixture that doubles ``c``. Ratios are medians of per-repeat
ratios, both sides measured back to back in the same repeat; targets are informational and
the script always exits 0.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
from _common import Row, median_ratio, paired, table
from core import CHUNK_SIZE, SEED, SHARDS, WEIGHTS

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core import phases
from zephon.core.schedule import plan_next_reference
from zephon.limits import MAX_PASSES
from zephon.runtime import make_state
from zephon.runtime._state import dataset_fingerprints
from zephon.torch import migrate_checkpoint
from zephon.work import Phase, PhasedMixtureWorkSource

ANNEAL = {"a": 0.3, "b": 0.3, "c": 0.4}
LONG = MAX_PASSES  # passes of a run that does not end inside the benchmark


def datasets() -> list[Dataset]:
    return [Dataset.from_counts(name, np.full(shards, rows, dtype=np.int64)) for name, (shards, rows) in SHARDS.items()]


def curriculum(passes: int, until: int) -> PhasedMixtureWorkSource:
    return PhasedMixtureWorkSource(datasets(), [Phase(WEIGHTS, until_chunk=until), Phase(ANNEAL)],
                                   chunk_size=CHUNK_SIZE, seed=SEED, stop_after_passes=passes)


def static(passes: int) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(datasets(), WEIGHTS, chunk_size=CHUNK_SIZE, seed=SEED, stop_after_passes=passes)


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def resolution_rows(repeats: int, chunks: int, reference_chunks: int) -> list[Row]:
    """Phase starts: the kernel walk over ``chunks``, and its speed against the Python walk."""
    def starts(until: int) -> float:
        source = curriculum(LONG, until)  # construction is not timed
        return timed(source.phase_starts)

    kernel = [starts(chunks) for _ in range(repeats)]

    def python_walk() -> float:
        config = curriculum(LONG, reference_chunks).config
        template = dataclasses.replace(config.phases[0], lane=None, canonical_replicas=None)
        start = phases.Start(0, 0, 0, phases.initial_state(config.base))
        return reference_chunks / timed(lambda: _python_resolve(config, template, start))

    def kernel_walk() -> float:
        return reference_chunks / starts(reference_chunks)

    fast, slow = paired(repeats, kernel_walk, python_walk)
    return [
        Row(f"phase starts over {chunks:,} chunks", statistics.median(kernel), "s", "<1 s", None,
            statistics.median(kernel) < 1.0, kernel),
        Row("phase starts: kernel / Python walk (chunks/s)", statistics.median(fast), "1/s", ">=20x",
            median_ratio(fast, slow), median_ratio(fast, slow) >= 20, fast),
    ]


def _python_resolve(config, phase, start) -> None:
    """The Python walk of ``phases._resolve_next`` (what runs without the kernel: the reference planner)."""
    g, state = start.chunk_index, start.state
    while g < config.bounds[0][1]:
        planned = plan_next_reference(state, phase)
        g, state = planned.chunk_index + 1, planned.state


def stream_rows(repeats: int, chunks: int) -> list[Row]:
    """next_chunk of a phased lane against the static lane, in steady state (phase 0)."""
    def run(source):
        lane = source.clone_for_lane(0, 4)
        lane.next_chunk()  # layouts and phase starts are built once per lane: not timed
        return lambda: chunks * CHUNK_SIZE / timed(lambda: [lane.next_chunk() for _ in range(chunks)])

    phased_lane, static_lane = run(curriculum(LONG, 10**5)), run(static(LONG))
    # which of the two runs first alternates (paired): the second of a pair runs faster on a busy machine
    phased, plain = paired(repeats, phased_lane, static_lane)
    return [Row("phased next_chunk / static (ptr/s)", statistics.median(phased), "ptr/s", ">=0.9x",
                median_ratio(phased, plain), median_ratio(phased, plain) >= 0.9, phased)]


def lookup_rows(repeats: int, passes: int, batch: int) -> list[Row]:
    """Batched random access on a phased lane (annealing at 90 % of the chunks) against the static lane."""
    until = int(0.9 * len(static(passes)) / CHUNK_SIZE)
    phased_lane = curriculum(passes, until).clone_for_lane(1, 4)
    static_lane = static(passes).clone_for_lane(1, 4)
    many = np.random.default_rng(0).integers(0, min(len(phased_lane), len(static_lane)), batch)
    phased, plain = paired(repeats, lambda: batch / timed(lambda: phased_lane.sample_ids_at(many)),
                           lambda: batch / timed(lambda: static_lane.sample_ids_at(many)))
    return [Row(f"phased sample_ids_at / static, batches of {batch:,}", statistics.median(phased), "1/s",
                ">=0.5x", median_ratio(phased, plain), median_ratio(phased, plain) >= 0.5, phased)]


def migration_rows(repeats: int, replicas: int) -> list[Row]:
    """migrate_checkpoint of a run of ``replicas`` lanes, each a few chunks apart."""
    template = static(LONG)
    entries = {}
    for lane in range(replicas):
        clone = template.clone_for_lane(lane, replicas)
        for _ in range(3 + lane % 5):
            clone.next_chunk()
        entries[lane] = (clone.state_dict(), CHUNK_SIZE // 3, 0)
    checkpoint = make_state(replicas, entries, dataset_fingerprints(template.datasets_by_id), {})
    new = StaticMixtureWorkSource(datasets(), ANNEAL, chunk_size=CHUNK_SIZE, seed=SEED, exhausted_policy="repeat")
    samples = [timed(lambda: migrate_checkpoint(checkpoint, new, requeue=True)) for _ in range(repeats)]
    return [Row(f"migrate_checkpoint, {replicas} lanes, requeue", statistics.median(samples), "s", "<1 s", None,
                statistics.median(samples) < 1.0, samples)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    quick = parser.parse_args().quick
    repeats = 3 if quick else 7
    print(f"zephon curriculum benchmark ({'quick' if quick else 'full'}): {repeats} repeats, medians")
    rows = (resolution_rows(repeats, 10**5 if quick else 9 * 10**5, 2000 if quick else 10000)
            + stream_rows(repeats, 20 if quick else 100)
            + lookup_rows(repeats, 20 if quick else 100, 100_000 if quick else 1_000_000)
            + migration_rows(repeats, 16 if quick else 64))
    print(table(rows))


if __name__ == "__main__":
    main()

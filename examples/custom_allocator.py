"""Plug your own allocator into StaticMixtureWorkSource.

An allocator decides how many pointers each dataset contributes to a chunk. It is a plain
object with a ``name``, an ``init(num_datasets)`` that returns a JSON-able state, and a pure
``allocate(state, weights, chunk_size) -> (quotas, state')``. ``weights`` are normalised
over the active datasets and exactly 0.0 for inactive ones, which must get a quota of 0;
quotas must sum to ``chunk_size``.

This one keeps integer counts of what each dataset has drawn so far and gives each chunk
to whoever is furthest behind its share: the mixture is exact after every chunk, to within
one sample per dataset, with no floating-point state.
"""
import json
import math

from zephon import Dataset, StaticMixtureWorkSource


class CatchUpAllocator:
    name = "catch-up"  # written into every checkpoint's fingerprint

    def init(self, num_datasets):
        return {"drawn": [0] * num_datasets}

    def allocate(self, state, weights, chunk_size):
        drawn = state["drawn"]
        total = sum(drawn) + chunk_size
        behind = [max(0.0, w * total - d) if w > 0 else 0.0 for w, d in zip(weights, drawn)]
        scale = chunk_size / sum(behind)
        wanted = [b * scale for b in behind]
        quotas = [math.floor(x) for x in wanted]
        by_remainder = sorted(range(len(quotas)), key=lambda c: (-(wanted[c] - quotas[c]), c))
        for c in by_remainder[:chunk_size - sum(quotas)]:
            quotas[c] += 1
        return tuple(quotas), {"drawn": [d + q for d, q in zip(drawn, quotas)]}


datasets = [Dataset.from_counts("web", [1_000] * 50), Dataset.from_counts("code", [700] * 30)]
mixture = {"web": 0.7, "code": 0.3}
source = StaticMixtureWorkSource(datasets, mixture, chunk_size=333, seed=1, allocation=CatchUpAllocator(),
                                 exhausted_policy="repeat")

lane = source.clone_for_lane(0, 1)
counts = {"web": 0, "code": 0}
for _ in range(100):
    for name, count in lane.next_chunk().counts.items():
        counts[name] += count
total = sum(counts.values())
print("shares after 100 chunks:", {name: round(n / total, 5) for name, n in counts.items()}, "target:", mixture)

saved = json.dumps(lane.state_dict())  # the allocator's state travels in the checkpoint
expected = [lane.next_chunk() for _ in range(5)]
resumed = source.clone_for_lane(0, 1)
resumed.load_state_dict(json.loads(saved))
assert [resumed.next_chunk() for _ in range(5)] == expected
print("resumed from a checkpoint: the next 5 chunks are identical")

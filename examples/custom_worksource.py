"""Write your own WorkSource: a curriculum that reads its datasets one after another.

The built-in StaticMixtureWorkSource mixes datasets in fixed proportions; this source reads
"warmup" completely, then "main", in storage order, in chunks of ``chunk_size`` pointers. It
implements the five required members; ``clone_for_lane`` keeps the base class's default (a
deep copy). Chunk ``g`` of the global stream belongs to lane ``g % R``.

The checks at the end are the ones to run on any source: ``zephon.testing`` (the
``zephon-mixtures[testing]`` extra) replays every checkpoint and checks that the lanes partition the
stream.
"""
from zephon import Dataset, Pipeline, WorkChunk, WorkSource
from zephon.testing import assert_lanes_partition, assert_replay_equivalent


class SequentialWorkSource(WorkSource):
    def __init__(self, datasets, chunk_size):
        self._datasets = list(datasets)
        self._chunk_size = chunk_size
        self._next = 0  # the next global chunk this lane may own
        self._total = sum(d.total() for d in datasets)

    def component_ids(self):
        return {d.name: i for i, d in enumerate(self._datasets)}

    @property
    def datasets_by_id(self):
        return dict(enumerate(self._datasets))

    def next_chunk(self):
        if self.lane_id is None:
            raise RuntimeError("the template never produces chunks: call clone_for_lane(lane_id, R) first")
        g = self._next + (self.lane_id - self._next) % self.canonical_replicas  # the lane's next chunk
        start = g * self._chunk_size
        if start >= self._total:
            return None
        self._next = g + 1
        return WorkChunk(self._pointers(start, min(start + self._chunk_size, self._total)), seed=g)

    def _pointers(self, start, stop):
        """Samples [start, stop) of the datasets laid end to end, grouped by dataset."""
        components, offset = {}, 0
        for dataset_id, dataset in enumerate(self._datasets):
            pointers = []
            for shard_id, count in zip(dataset.ids().tolist(), dataset.counts().tolist()):
                low, high = max(start, offset), min(stop, offset + count)
                pointers += [(dataset_id, shard_id, row - offset) for row in range(low, high)]
                offset += count
            if pointers:
                components[dataset.name] = pointers
        return components

    def state_dict(self):
        return {"lane": self.lane_id, "canonical_replicas": self.canonical_replicas, "next": self._next}

    def load_state_dict(self, state):
        if (state["lane"], state["canonical_replicas"]) != (self.lane_id, self.canonical_replicas):
            raise ValueError(f"this checkpoint belongs to lane {state['lane']} of {state['canonical_replicas']}")
        self._next = state["next"]


datasets = [Dataset.from_counts("warmup", [40, 25]), Dataset.from_counts("main", [100] * 3)]
template = SequentialWorkSource(datasets, chunk_size=32)

lane = template.clone_for_lane(0, 1)
for chunk in iter(lane.next_chunk, None):
    print(chunk.counts, end=" ")
print()

assert_replay_equivalent(lambda: SequentialWorkSource(datasets, 32).clone_for_lane(1, 3), cuts=range(6))
assert_lanes_partition(lambda: SequentialWorkSource(datasets, 32), replicas=3)
print("checkpoints replay exactly; 3 lanes partition the stream")

items = list(Pipeline(template))  # count-only datasets: each item is its pointer and component
print(f"{len(items)} items, first {items[0]}, last {items[-1]}")

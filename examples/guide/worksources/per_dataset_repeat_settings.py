"""Per-dataset repeat settings: one dataset stops the run, one repeats at most three times,
one repeats its first pass's order forever.

The source stops as soon as any dataset cannot supply its allocation within its limits:
here "books" runs out first, since it may not repeat at all.
"""
from zephon import Dataset, StaticMixtureWorkSource

datasets = [
    Dataset.from_counts("books", [1_000] * 8),
    Dataset.from_counts("news", [500] * 4),
    Dataset.from_counts("forum", [250] * 4),
]
source = StaticMixtureWorkSource(
    datasets,
    {"books": 0.6, "news": 0.3, "forum": 0.1},
    chunk_size=50,
    seed=3,
    shuffle_within_shard=True,
    exhausted_policy={"books": "stop", "news": "repeat", "forum": "repeat"},
    max_repeats={"news": 3},  # news: its first pass plus at most three more
    reshuffle_on_repeat={"forum": False},  # forum re-reads its first pass's order
)

lane = source.clone_for_lane(lane_id=0, canonical_replicas=1)
chunks = list(iter(lane.next_chunk, None))
print(f"{len(chunks)} chunks, {sum(len(c) for c in chunks):,} samples")
for dataset, cursor in zip(datasets, lane.state.cursors):
    print(f"{dataset.name}: in pass {cursor.epoch}, {cursor.position:,} of {dataset.total():,} samples read")

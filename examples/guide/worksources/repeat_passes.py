"""Keep the mixture until every dataset has completed two passes.

"news" is four times smaller than "books" at the same weight, so it repeats (reshuffled on
every pass) while "books" finishes its second pass; then the source stops.
"""
from zephon import Dataset, StaticMixtureWorkSource

datasets = [
    Dataset.from_counts("books", [1_000] * 8),  # 8 shards of 1,000 samples
    Dataset.from_counts("news", [500] * 4),  # 4 shards of 500 samples
]
source = StaticMixtureWorkSource(
    datasets,
    {"books": 0.5, "news": 0.5},
    chunk_size=40,
    seed=3,
    shuffle_within_shard=True,
    stop_after_passes=2,  # every dataset completes at least two passes
)

lane = source.clone_for_lane(lane_id=0, canonical_replicas=1)
drawn = {"books": 0, "news": 0}
for chunk in iter(lane.next_chunk, None):
    for name, count in chunk.counts.items():
        drawn[name] += count

for dataset in datasets:
    passes = drawn[dataset.name] / dataset.total()
    print(f"{dataset.name}: {drawn[dataset.name]:,} samples drawn = {passes:g} passes")

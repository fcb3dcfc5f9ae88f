"""The seed's table, one row at a time: what you supply, and where the stream ends.

Every row runs the same two datasets to the end of its stream (the "repeat" row, which never
ends, is read for 200 chunks) and prints what each dataset read: passes completed and the
samples of the pass in progress, as ``coverage()`` reports them.
"""
from zephon import Dataset, StaticMixtureWorkSource

datasets = [
    Dataset.from_counts("big", [1_000] * 4),  # 4,000 samples
    Dataset.from_counts("small", [97] * 3),  # 291 samples
]
ROWS = {
    "nothing": {},  # repeat, stop_after_passes=1: once every dataset has completed a pass
    "exhausted_policy='repeat'": {"exhausted_policy": "repeat"},  # never ends by itself
    "exhausted_policy='stop'": {"exhausted_policy": "stop"},  # when any dataset cannot supply its quota
    "stop_after_passes=3": {"stop_after_passes": 3},  # once every dataset has completed 3 passes
    "max_repeats=2": {"exhausted_policy": "repeat", "max_repeats": 2},  # when one would start a 4th pass
}

for row, settings in ROWS.items():
    source = StaticMixtureWorkSource(datasets, {"big": 0.7, "small": 0.3}, chunk_size=100, **settings)
    lane = source.clone_for_lane(lane_id=0, canonical_replicas=1)
    chunks, chunk = 0, None
    while chunks < 200 and (chunk := lane.next_chunk()) is not None:
        chunks += 1
    ended = "ended" if chunk is None else "still going"
    read = ", ".join(f"{name} {c['passes_completed']} passes + {c['position']}"
                     for name, c in lane.coverage().items())
    print(f"{row}: {ended} after {chunks} chunks; {read}")

"""A user's training data pipeline: two in-memory corpora mixed 3:1, with a per-record map.

Everything a test needs is a module-level function, so that the fresh-process check can
send it to a new interpreter by reference.
"""
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

WORDS = "the a data model token mixture shard lane chunk seed pass epoch".split()


def corpus(name: str, shards: int, rows: int, width: int) -> Dataset:
    """Shards of made-up documents; document ``j`` of shard ``s`` is a fixed function of both."""
    return Dataset.from_records(name, [
        [{"text": " ".join(WORDS[(s * 7 + j * 3 + k) % len(WORDS)] for k in range(width + j % 5))}
         for j in range(rows)]
        for s in range(shards)
    ])


def build_source() -> StaticMixtureWorkSource:
    """The mixture: 75% prose, 25% code, in chunks of 16, each dataset read once."""
    return StaticMixtureWorkSource(
        [corpus("prose", shards=4, rows=400, width=12), corpus("code", shards=3, rows=200, width=6)],
        {"prose": 0.75, "code": 0.25}, chunk_size=16, seed=2024, shuffle_within_shard=True,
        exhausted_policy="stop",
    )


def add_features(item: dict) -> dict:
    """The map step: what the trainer consumes (a stateless function of the record)."""
    words = item["text"].split()
    return {**item, "words": len(words), "first": words[0]}


def build_pipeline() -> Pipeline:
    return Pipeline(build_source()).map(add_features)

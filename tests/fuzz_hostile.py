"""Hypothesis fuzzers for hostile input, run as a script in a subprocess by test_fuzz.py (a crash
there fails the test instead of killing pytest).

``python tests/fuzz_hostile.py`` runs both fuzzers and prints one JSON line of case counts;
``ZEPHON_HYPOTHESIS_PROFILE=deep`` runs ten times as many (4,000 each), random instead of derandomized.

* **constructor**: random, often hostile, arguments to ``Dataset.from_counts`` and
  ``StaticMixtureWorkSource``; each is refused with ``ValueError``/``TypeError`` (message under
  1,000 characters) or builds a source whose first chunks, checkpoint round trip and (for
  short streams) length work.
* **state**: a lane's checkpoint with one random edit (a value replaced, a key added or
  removed, a number nudged, keys reordered); it is refused with ``ValueError`` and the lane is
  unchanged, or it continues exactly like the original. Edits made with the digest
  recomputed (``sealed``) must be refused or load and run without a crash.
* **file**: a checkpoint file with bytes flipped, cut, inserted or appended; ``load_checkpoint``
  refuses it with ``ValueError`` or returns exactly the saved state.
* **index**: odd random-access indices (huge, negative, floats, bools, numpy scalars); each
  gets ``IndexError``/``TypeError`` or the sample ``sample_ids_at`` gives for it.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter

import numpy as np

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon import Dataset, StaticMixtureWorkSource
from zephon.core.checkpoint import sealed
from zephon.core.index import least_chunks
from zephon.runtime import load_checkpoint, make_state, save_checkpoint

DEEP = os.environ.get("ZEPHON_HYPOTHESIS_PROFILE") == "deep"
EXAMPLES = 4000 if DEEP else 400
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not DEEP, database=None,
                    suppress_health_check=list(HealthCheck))
COUNTS: Counter = Counter()

HUGE_INTS = st.sampled_from([2**31, 2**48, 2**48 + 1, 2**52, 2**62, 2**63 - 1, 2**63, 2**64, 2**70, -2**63, 10**400])
INTS = st.one_of(st.integers(-3, 40), HUGE_INTS)
ODD = st.one_of(st.booleans(), st.none(), st.floats(allow_nan=True), st.text(max_size=3),
                st.lists(st.integers(0, 3), max_size=2), st.just(b"x"))
WEIGHTS = st.one_of(st.floats(min_value=1e-300, max_value=1e308), st.integers(1, 100), HUGE_INTS,
                    st.sampled_from([0, -1, float("nan"), float("inf"), 1e-12, 5e-324, True]))


def _message_ok(error: Exception) -> None:
    assert len(str(error)) < 1000, f"error message of {len(str(error))} characters: {str(error)[:200]}"


def _mostly(draw, valid, hostile):
    """A value from ``valid``, or one time in sixteen from ``hostile``."""
    return draw(hostile) if draw(st.integers(0, 15)) == 0 else draw(valid)


@st.composite
def arguments(draw):
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4, unique=True))
    count = st.one_of(HUGE_INTS, st.integers(-2, -1))
    counts = {n: draw(st.lists(st.builds(lambda ok, bad, pick: bad if pick == 0 else ok, st.integers(0, 60), count,
                                         st.integers(0, 39)), min_size=1, max_size=4)) for n in names}
    mixture = {n: _mostly(draw, st.integers(1, 9), WEIGHTS) for n in names}
    kwargs = {}
    for key, (valid, hostile) in {
        "chunk_size": (st.integers(1, 40), st.one_of(INTS, ODD)),
        "seed": (st.integers(), st.one_of(HUGE_INTS, ODD)),
        "shuffle_shards": (st.booleans(), ODD),
        "shuffle_within_shard": (st.booleans(), ODD),
        "shuffle_block_size": (st.one_of(st.none(), st.integers(1, 50), st.sampled_from(["auto", "global"])),
                               st.one_of(INTS, ODD, st.just("x"))),
        "exhausted_policy": (st.sampled_from(["stop", "repeat", "redistribute"]),
                             st.one_of(ODD, st.fixed_dictionaries({names[0]: st.sampled_from(["repeat", "stop", 3])}))),
        "max_repeats": (st.one_of(st.none(), st.integers(0, 3)), st.one_of(INTS, ODD)),
        "stop_after_passes": (st.one_of(st.none(), st.integers(1, 3)), st.one_of(INTS, ODD)),
        "lane_assignment": (st.sampled_from(["permute", "modulo"]), ODD),
        "allocation": (st.sampled_from(["accumulator", "fixed"]), ODD),
    }.items():
        if draw(st.integers(0, 2)) == 0:
            kwargs[key] = _mostly(draw, valid, hostile)
    replicas = _mostly(draw, st.integers(1, 4), INTS)
    lane = _mostly(draw, st.integers(0, replicas - 1 if type(replicas) is int and 1 <= replicas <= 4 else 3), INTS)
    return counts, mixture, kwargs, lane, replicas


def _build(counts, mixture, kwargs):
    datasets = [Dataset.from_counts(name, shard_counts) for name, shard_counts in counts.items()]
    return StaticMixtureWorkSource(datasets, mixture, **kwargs)


@SETTINGS
@given(arguments())
def fuzz_constructor(args):
    counts, mixture, kwargs, lane_id, replicas = args
    try:
        template = _build(counts, mixture, kwargs)
        lane = template.clone_for_lane(lane_id, replicas)
    except (ValueError, TypeError) as error:
        _message_ok(error)
        COUNTS["constructor refused"] += 1
        if os.environ.get("FUZZ_DEBUG"):
            print(str(error)[:60], file=sys.stderr)
        return
    COUNTS["constructor built"] += 1
    if lane.chunk_size_hint() > 4096:
        return
    try:
        for _ in range(3):
            lane.next_chunk()
    except ValueError as error:  # the first chunk cannot be produced (SPEC §4): named, on every lane
        _message_ok(error)
        return
    state = json.loads(json.dumps(lane.state_dict()))
    twin = template.clone_for_lane(lane_id, replicas)
    twin.load_state_dict(state)
    assert twin.next_chunk() == lane.next_chunk()
    if lane.supports_indexing() and least_chunks(lane.config)[0] < 5000:
        assert len(lane) >= 0
        COUNTS["constructor indexed"] += 1


CONFIGS = [
    {"exhausted_policy": "repeat"},
    {"exhausted_policy": {"web": "redistribute", "code": "repeat"}},
    {"stop_after_passes": 2, "shuffle_block_size": "auto", "shuffle_within_shard": True},
    {"allocation": "fixed", "exhausted_policy": "repeat", "lane_assignment": "modulo"},
]


def _lane(config: int, replicas: int):
    datasets = [Dataset.from_counts("web", [40, 0, 25, 31]), Dataset.from_counts("code", [17, 9]),
                Dataset.from_counts("math", [12, 12, 3])]
    source = StaticMixtureWorkSource(datasets, {"web": 5, "code": 3, "math": 2}, chunk_size=7, seed=4,
                                     **CONFIGS[config])
    return source.clone_for_lane(replicas - 1, replicas)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-3, 3), HUGE_INTS,
                                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                           max_leaves=6)


def _nudged(value, draw):
    if type(value) is int:
        return draw(st.sampled_from([value + 1, value - 1, float(value), value == 1, -value, value * 2**40]))
    if type(value) is float:
        return draw(st.sampled_from([value + 1e-12, -value, int(value), value * 2, float("nan")]))
    if type(value) is bool:
        return int(value)
    return draw(JSON_VALUES)


@st.composite
def edits(draw):
    config, replicas, steps = draw(st.integers(0, len(CONFIGS) - 1)), draw(st.integers(1, 3)), draw(st.integers(0, 9))
    kind = draw(st.sampled_from(["replace", "nudge", "delete", "add", "reorder"]))
    return config, replicas, steps, kind, draw(st.randoms(use_true_random=False)), draw(st.data())


def _edit(state, kind, rng, data):
    """One random edit of ``state`` in place; returns whether it may leave the state's meaning intact."""
    paths = [p for p in _paths(state) if p]
    path = paths[rng.randrange(len(paths))]
    parent = state
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if kind == "reorder":
        target = parent[last] if isinstance(parent[last], dict) else parent
        if isinstance(target, dict):
            items = list(target.items())
            rng.shuffle(items)
            target.clear()
            target.update(items)
        return True
    if kind == "delete" and isinstance(parent, dict):
        del parent[last]
    elif kind == "add":
        holder = parent if isinstance(parent, dict) else state
        holder["extra" + str(rng.randrange(3))] = data.draw(JSON_VALUES)
    elif kind == "nudge":
        parent[last] = _nudged(parent[last], data.draw)
    else:
        parent[last] = data.draw(JSON_VALUES)
    return False


def _continuation(lane, chunks=6):
    return [lane.next_chunk() for _ in range(chunks)]


@SETTINGS
@given(edits())
def fuzz_state(case):
    config, replicas, steps, kind, rng, data = case
    original = _lane(config, replicas)
    for _ in range(steps):
        original.next_chunk()
    state = json.loads(json.dumps(original.state_dict()))
    _edit(state, kind, rng, data)
    for edited, strict in ((state, True), (sealed(state) if isinstance(state, dict) else state, False)):
        fresh = _lane(config, replicas)
        before = fresh.state
        try:
            fresh.load_state_dict(json.loads(json.dumps(edited)))
        except ValueError as error:
            _message_ok(error)
            assert fresh.state == before, "a refused state changed the source"
            COUNTS["state refused" if strict else "resealed refused"] += 1
            continue
        if strict:
            reference = _lane(config, replicas)
            reference.load_state_dict(original.state_dict())
            assert _continuation(fresh) == _continuation(reference), f"accepted edit ({kind}) changed the stream"
            COUNTS["state accepted, same stream"] += 1
        else:
            try:
                _continuation(fresh, 3)
            except ValueError as error:
                _message_ok(error)
            COUNTS["resealed accepted"] += 1


def _loader_state() -> dict:
    source = StaticMixtureWorkSource([Dataset.from_counts("a", [9, 4, 12]), Dataset.from_counts("b", [5, 5])],
                                     {"a": 2, "b": 1}, chunk_size=5, exhausted_policy="repeat")
    entries = {lane: (source.clone_for_lane(lane, 3).state_dict(), lane, 0) for lane in range(3)}
    return make_state(3, entries, [{"id": 0, "name": "a", "fingerprint": None},
                                   {"id": 1, "name": "b", "fingerprint": None}], {"world_size": 1})


LOADER_STATE = _loader_state()


@SETTINGS
@given(st.sampled_from(["flip", "cut", "insert", "append"]), st.integers(0, 2**20), st.binary(min_size=1, max_size=8))
def fuzz_file(kind, where, junk):
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "ckpt")
        save_checkpoint(path, LOADER_STATE)
        with open(path, "rb") as f:
            data = f.read()
        at = where % (len(data) + 1)
        if kind == "flip" and at < len(data):
            data = data[:at] + bytes([data[at] ^ junk[0]]) + data[at + 1:]
        elif kind == "cut":
            data = data[:at]
        elif kind == "insert":
            data = data[:at] + junk + data[at:]
        else:
            data += junk
        with open(path, "wb") as f:
            f.write(data)
        try:
            loaded = load_checkpoint(path)
        except ValueError as error:
            _message_ok(error)
            COUNTS["file refused"] += 1
            return
        assert loaded == LOADER_STATE, f"a damaged file ({kind} at {at}) loaded as another state"
        COUNTS["file intact"] += 1


INDEX_LANE = StaticMixtureWorkSource([Dataset.from_counts("a", [30, 12]), Dataset.from_counts("b", [25])],
                                     {"a": 3, "b": 2}, chunk_size=6).clone_for_lane(1, 2)
ODD_INDICES = st.one_of(st.integers(-2**70, 2**70), st.integers(-3, 60), st.floats(), st.booleans(), st.none(),
                        st.integers(-2**63, 2**63 - 1).map(np.int64), st.integers(0, 2**64 - 1).map(np.uint64),
                        st.integers(0, 60).map(np.int32), st.text(max_size=2), st.just(10**5000))


@SETTINGS
@given(ODD_INDICES)
def fuzz_index(i):
    try:
        sample = INDEX_LANE.sample_id_at(i)
    except (IndexError, TypeError) as error:
        _message_ok(error)
        COUNTS["index refused"] += 1
        return
    assert tuple(INDEX_LANE.sample_ids_at([int(i)])[0].tolist()) == tuple(sample)
    COUNTS["index answered"] += 1


def main() -> None:
    fuzz_constructor()
    fuzz_state()
    fuzz_file()
    fuzz_index()
    print(json.dumps(dict(COUNTS)))


if __name__ == "__main__":
    sys.exit(main())

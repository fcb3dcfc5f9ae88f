"""zephon.torch.DataLoader in one process: order, batches, exact and elastic resume (issue #5).

Ranks are simulated with explicit ``rank`` / ``world_size``; real multi-process runs are in
``test_torch_distributed.py``. DataLoader workers are real (``num_workers=2``).
"""
import json
import logging
import math
import threading

import numpy as np
import pytest
import torch
from helpers import lane_streams

import zephon.runtime._book
import zephon.torch as zt
import zephon.torch._iterator as zt_iterator
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.core.checkpoint import sealed
from zephon.runtime import make_state, parse_state, rank_lanes, worker_lanes
from zephon.work import Phase, PhasedMixtureWorkSource

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning",
                                        "ignore:'set_vital' is deprecated:UserWarning")


def make_source(seed=3, chunk_size=16, policy="stop", **kwargs):
    datasets = [Dataset.from_counts("web", [60] * 6), Dataset.from_counts("code", [45] * 4),
                Dataset.from_counts("math", [30] * 2)]
    return StaticMixtureWorkSource(datasets, {"web": 0.5, "code": 0.3, "math": 0.2}, chunk_size=chunk_size,
                                   seed=seed, exhausted_policy=policy, **kwargs)


def sample_ids(unit):
    """The pointers of a batch or an item, as a list of tuples."""
    ids = unit["_sample_id"]
    return list(map(tuple, ids.tolist())) if isinstance(ids, torch.Tensor) else [ids]


def flatten(units):
    return [p for unit in units for p in sample_ids(unit)]


def reader_batches(streams, lanes, size, drop_last):
    """A reader's batches: each of its lanes' streams cut into batches of ``size``, the lanes
    taken in turn batch by batch (a lane that runs out leaves the turn)."""
    queues = []
    for lane in lanes:
        cuts = [streams[lane][a:a + size] for a in range(0, len(streams[lane]), size)]
        queues.append([c for c in cuts if not (drop_last and len(c) < size)])
    out = []
    while any(queues):
        out += [q.pop(0) for q in queues if q]
    return out


def expected_units(source, replicas, rank, world, workers, batch, mapping="contiguous", drop_last=False):
    """What the loader must yield: each reader's batches (``reader_batches``), readers in turn."""
    lanes, streams = rank_lanes(replicas, rank, world, mapping), lane_streams(source, replicas)
    queues = [reader_batches(streams, worker_lanes(lanes, w, max(1, workers), mapping), batch or 1, drop_last)
              for w in range(max(1, workers))]
    out = []
    while any(queues):
        out += [q.pop(0) for q in queues if q]
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch", [None, 7])
def test_single_lane_loader_yields_the_global_stream(workers, batch):
    pipeline = Pipeline(make_source())
    loader = zt.DataLoader(pipeline, batch_size=batch, num_workers=workers, canonical_replicas=1)
    units = list(loader)
    assert flatten(units) == [item["_sample_id"] for item in pipeline]
    if batch:
        assert all(set(u) == {"_sample_id", "_component"} and u["_sample_id"].dtype == torch.int64 for u in units)
        assert [u["_sample_id"].shape[0] for u in units[:-1]] == [batch] * (len(units) - 1)
    else:
        assert units[0] == next(iter(pipeline))
    assert loader.batch_size == batch and loader.canonical_replicas == 1


@pytest.mark.parametrize("workers,replicas,mapping", [(0, 3, "contiguous"), (2, 5, "contiguous"),
                                                      (2, 4, "interleaved"), (3, 7, "interleaved")])
def test_lanes_readers_and_round_robin_order(workers, replicas, mapping):
    source = make_source()
    loader = zt.DataLoader(Pipeline(source), batch_size=5, num_workers=workers, canonical_replicas=replicas,
                           mapping=mapping, rank=1, world_size=2, even_batches=False)
    units = [sample_ids(u) for u in loader]
    assert units == expected_units(source, replicas, 1, 2, workers, 5, mapping)
    mine = rank_lanes(replicas, 1, 2, mapping)
    assert loader.lanes() == mine
    reference = lane_streams(source, replicas)
    assert sorted(flatten_ids(units)) == sorted(p for lane in mine for p in reference[lane])


def flatten_ids(units):
    return [p for unit in units for p in unit]


def test_components_are_named_per_sample():
    source = make_source()
    pipeline = Pipeline(source)
    names = {item["_sample_id"]: item["_component"] for item in pipeline}
    for batch in zt.DataLoader(pipeline, batch_size=9, num_workers=2, canonical_replicas=2):
        assert batch["_component"] == [names[p] for p in sample_ids(batch)]


def test_drop_last_drops_each_lanes_last_partial_batch_and_counts_it():
    source = make_source()
    loader = zt.DataLoader(Pipeline(source), batch_size=6, num_workers=2, canonical_replicas=3, drop_last=True)
    units = [sample_ids(u) for u in loader]
    assert units == expected_units(source, 3, 0, 1, 2, 6, drop_last=True)
    assert all(len(u) == 6 for u in units) and loader.drop_last
    assert loader.stats()["drop_last"] == sum(len(s) % 6 for s in lane_streams(source, 3).values())


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch", [None, 6])
def test_resume_on_the_same_topology_is_exact_batch_for_batch(workers, batch):
    def make():
        return zt.DataLoader(Pipeline(make_source()), batch_size=batch, num_workers=workers, canonical_replicas=3)

    full = [sample_ids(u) for u in make()]
    for cut in [0, 1, 5, 12, len(full) - 1, len(full)]:
        loader = make()
        it = iter(loader)
        head = [sample_ids(next(it)) for _ in range(cut)]
        state = json.loads(json.dumps(loader.state_dict()))
        fresh = make()
        fresh.load_state_dict(state)
        assert head + [sample_ids(u) for u in fresh] == full, cut


def _as_version_3(state):
    """A loader state in the form version 3 wrote: each phased lane's inner state keeps its seal."""
    parsed = parse_state(state)
    entries = {lane: parsed.entries[lane] for lane in parsed.entries}
    old = make_state(parsed.canonical_replicas, entries, parsed.datasets, parsed.topology, run=parsed.run,
                     sealed_by_source=True)
    lanes = {k: v for k, v in old["lanes"].items() if k != "nested"}
    return sealed({**{k: v for k, v in old.items() if k not in ("digest", "in_epoch")}, "version": 3, "lanes": lanes})


@pytest.mark.parametrize("cut", [0, 5, 23, 60])
def test_a_phased_loader_resumes_exactly_from_its_state_and_from_version_3s(cut):
    """Every lane's state of a phased source is written field by field once the lanes have moved
    on, its inner seal left out, and checked column by column on load; the form version 3 wrote
    (the inner seals kept, checked lane by lane) resumes the same."""
    def make():
        source = PhasedMixtureWorkSource(
            [Dataset.from_counts("web", [60] * 6), Dataset.from_counts("code", [45] * 4)],
            [Phase({"web": 0.7, "code": 0.3}, until_chunk=9), Phase({"web": 0.2, "code": 0.8})],
            chunk_size=8, seed=5, exhausted_policy="repeat", stop_after_passes=None, max_repeats=2)
        return zt.DataLoader(Pipeline(source), batch_size=3, canonical_replicas=4)

    full = [sample_ids(u) for u in make()]
    loader = make()
    it = iter(loader)
    head = [sample_ids(next(it)) for _ in range(cut)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["lanes"]["nested"] == ["inner"]
    for saved in (state, _as_version_3(state)):
        fresh = make()
        fresh.load_state_dict(saved)
        assert head + [sample_ids(u) for u in fresh] == full


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact_around_the_views_the_trainer_makes_at_a_time(workers):
    """A bundle's batch views are made VIEWS at a time: cutting (and stepping back ``lag``
    batches) on either side of one such block, or of two, resumes exactly, and every batch
    is its own samples."""
    views = zt_iterator.VIEWS

    def make():
        return zt.DataLoader(Pipeline(make_source()), batch_size=1, num_workers=workers, canonical_replicas=1)

    full = [sample_ids(u) for u in make()]
    assert len(full) > 2 * views + 2 and all(len(u) == 1 for u in full)
    for cut, lag in [(views - 1, 0), (views, 0), (views + 1, 1), (views + 2, 2), (2 * views, 1), (2 * views + 1, 0)]:
        loader = make()
        it = iter(loader)
        head = [sample_ids(next(it)) for _ in range(cut)]
        state = json.loads(json.dumps(loader.state_dict(lag=lag)))
        fresh = make()
        fresh.load_state_dict(state)
        assert head[:cut - lag] + [sample_ids(u) for u in fresh] == full, (cut, lag)


def test_state_is_exact_whatever_was_prefetched_and_mid_chunk():
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=5, num_workers=2, canonical_replicas=4,
                           prefetch_factor=4)
    it = iter(loader)
    for _ in range(3):
        next(it)
    consumed = {lane: entry[1] for lane, entry in parse_state(loader.state_dict()).entries.items()}
    # 3 batches of 5, one lane each: readers 0, 1, 0 -> reader 0 gave a batch of lane 0, then of lane 1;
    # reader 1 (lanes 2, 3) one of lane 2
    assert consumed == {0: 5, 1: 5, 2: 5, 3: 0}


def test_break_and_iterate_again_continues_and_persistent_workers_do_too():
    for kwargs in ({"num_workers": 0}, {"num_workers": 2, "persistent_workers": True}):
        def make():
            return zt.DataLoader(Pipeline(make_source()), batch_size=4, canonical_replicas=2, **kwargs)

        full = [sample_ids(u) for u in make()]
        loader, got = make(), []
        for _ in range(3):
            for k, unit in enumerate(loader):
                got.append(sample_ids(unit))
                if k == 4:
                    break
        got += [sample_ids(u) for u in loader]
        assert got == full
        assert list(loader) == []  # the stream has ended


def elastic_run(first, second, batches, replicas=4):
    """Run ``first`` topology for ``batches`` batches per rank, merge the states, resume with ``second``.

    A topology is ``(world_size, workers, mapping)``. Returns everything yielded, in order."""
    source = make_source(seed=11)
    world, workers, mapping = first
    seen, states = [], []
    for rank in range(world):
        loader = zt.DataLoader(Pipeline(source), batch_size=5, num_workers=workers, canonical_replicas=replicas,
                               mapping=mapping, rank=rank, world_size=world)
        it = iter(loader)
        for _ in range(batches):
            seen += sample_ids(next(it))
        states.append(json.loads(json.dumps(loader.state_dict())))
    merged = zt.merge_states(states)
    world, workers, mapping = second
    for rank in range(world):
        loader = zt.DataLoader(Pipeline(make_source(seed=11)), batch_size=3, num_workers=workers,
                               mapping=mapping, rank=rank, world_size=world, even_batches=False)
        loader.load_state_dict(merged)
        assert loader.canonical_replicas == replicas  # taken from the checkpoint
        seen += flatten(loader)
    return source, seen, merged


@pytest.mark.parametrize("second", [(1, 3, "contiguous"), (4, 1, "interleaved"), (3, 0, "interleaved")])
def test_elastic_resume_continues_every_lane_exactly(second):
    source, seen, merged = elastic_run((2, 2, "contiguous"), second, batches=5)
    assert any(0 < entry[1] < 16 for entry in parse_state(merged).entries.values()), "the checkpoint is mid-chunk"
    reference = lane_streams(source, 4)
    owner = {p: lane for lane, pointers in reference.items() for p in pointers}
    assert sorted(seen) == sorted(owner)  # nothing missing, nothing repeated
    per_lane = {lane: [p for p in seen if owner[p] == lane] for lane in reference}
    assert per_lane == reference


def test_state_size_depends_only_on_lanes():
    loader = zt.DataLoader(Pipeline(make_source(policy="repeat")), batch_size=16, canonical_replicas=8)
    it = iter(loader)
    sizes = []
    for k in range(600):
        next(it)
        if k % 100 == 99:
            sizes.append(len(json.dumps(loader.state_dict())))
    # no chunk contents, no history: only the digits of a few numbers per lane vary (and its digest)
    # (per dataset: epoch, position and tails)
    assert max(sizes) - min(sizes) < 8 * 80 and max(sizes) < 8 * 490


def test_load_state_dict_refuses_mismatches_before_changing_anything():
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=4, canonical_replicas=4, rank=0, world_size=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    before = loader.state_dict()
    with pytest.raises(ValueError, match="canonical_replicas=4.*canonical_replicas=2"):
        zt.DataLoader(Pipeline(make_source()), canonical_replicas=2).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        zt.DataLoader(Pipeline(make_source(seed=4)), rank=0, world_size=2).load_state_dict(state)
    other = [Dataset.from_counts("web", [60] * 6), Dataset.from_counts("code", [45] * 4)]
    with pytest.raises(ValueError, match="datasets"):
        zt.DataLoader(Pipeline(StaticMixtureWorkSource(other, {"web": 1, "code": 1}, chunk_size=16)),
                      rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"lacks lanes \[2, 3\]"):
        zt.DataLoader(Pipeline(make_source()), rank=1, world_size=2).load_state_dict(state)
    corrupted = json.loads(json.dumps(state))
    corrupted["lanes"]["consumed"] = [17] * corrupted["lanes"]["count"]
    with pytest.raises(ValueError, match="digest does not match"):
        loader.load_state_dict(corrupted)
    with pytest.raises(ValueError, match="consumed=17 samples of a chunk of at most 16"):
        loader.load_state_dict(sealed(corrupted))  # well formed, but no chunk holds 17
    with pytest.raises(ValueError, match="kind"):
        loader.load_state_dict({"kind": "torch"})
    assert loader.state_dict() == before


def test_dataset_fingerprints_are_checked(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"x": list(range(20))}), tmp_path / "d" / "0.parquet")

    def make():
        dataset = Dataset.from_path("d", tmp_path / "d", cache_dir=tmp_path / "c")
        return zt.DataLoader(Pipeline(StaticMixtureWorkSource([dataset], {"d": 1}, chunk_size=4)), batch_size=2)

    loader = make()
    next(iter(loader))
    state = loader.state_dict()
    assert state["datasets"][0]["fingerprint"]
    pq.write_table(pa.table({"x": [-v for v in range(20)]}), tmp_path / "d" / "0.parquet")
    with pytest.raises(ValueError, match="content fingerprint"):
        make().load_state_dict(state)


def test_records_batches_and_custom_collate():
    shards = [[{"id": 10 * s + o, "w": float(o)} for o in range(n)] for s, n in enumerate([30, 25, 40])]
    source = StaticMixtureWorkSource([Dataset.from_records("r", shards), Dataset.from_counts("n", [50])],
                                     {"r": 2, "n": 1}, chunk_size=9, seed=1, exhausted_policy="stop")
    pipeline = Pipeline(source).map(lambda item: {"twice": 2 * item.get("id", -1), **item})
    with pytest.raises(ValueError, match="different fields"):
        list(zt.DataLoader(Pipeline(source), batch_size=8))
    pipeline = pipeline.map(lambda item: {k: v for k, v in item.items() if k in ("twice", "_sample_id", "_component")})
    items = list(pipeline)
    batches = list(zt.DataLoader(pipeline, batch_size=8, num_workers=2, canonical_replicas=1))
    assert flatten(batches) == [i["_sample_id"] for i in items]
    assert torch.equal(torch.cat([b["twice"] for b in batches]), torch.tensor([i["twice"] for i in items]))
    lists = list(zt.DataLoader(pipeline, batch_size=8, collate_fn=list, canonical_replicas=1))
    assert [i for b in lists for i in b] == items


@pytest.mark.parametrize("workers", [0, 2])
def test_parquet_columnar_batches_equal_collated_items(tmp_path, workers):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "p").mkdir()
    (tmp_path / "q").mkdir()
    for s in range(3):
        pq.write_table(pa.table({"id": pa.array(range(100 * s, 100 * s + 40), pa.int32()),
                                 "score": [0.5 * i for i in range(40)], "ok": [i % 2 == 0 for i in range(40)],
                                 "text": [f"t{s}.{i}" for i in range(40)],
                                 "note": pa.array(["" if i % 5 else f"n{i}" for i in range(40)], pa.large_string())}),
                       tmp_path / "p" / f"{s}.parquet", row_group_size=16)
        pq.write_table(pa.table({"id": pa.array(range(1000 + 100 * s, 1000 + 100 * s + 30), pa.int32()),
                                 "ok": [i % 3 == 0 for i in range(30)], "text": [f"ü{s}·{i}" * (i % 4) for i in range(30)],
                                 "note": pa.array([f"m{i}" for i in range(30)], pa.large_string())}),
                       tmp_path / "q" / f"{s}.parquet", row_group_size=7)
    datasets = [Dataset.from_path(name, tmp_path / name, cache_dir=tmp_path / "c") for name in "pq"]
    for weights, columns in (({"p": 1}, None), ({"p": 2, "q": 1}, ["id", "ok", "text", "note"]),
                             ({"q": 1}, ["note", "text"])):
        pipeline = Pipeline(StaticMixtureWorkSource([d for d in datasets if d.name in weights], weights, chunk_size=12,
                                                    shuffle_within_shard=True), columns=columns)
        assert pipeline.columnar
        columnar = list(zt.DataLoader(pipeline, batch_size=10, num_workers=workers, canonical_replicas=2))
        items = list(zt.DataLoader(pipeline, batch_size=10, num_workers=workers, canonical_replicas=2,
                                   collate_fn=zt.collate))
        assert len(columnar) == len(items) > 8
        for a, b in zip(columnar, items):
            assert list(a) == list(b) == [*(columns or ["id", "score", "ok", "text", "note"]), "_sample_id",
                                          "_component"]
            for key in a:
                if isinstance(a[key], torch.Tensor):
                    assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
                else:
                    assert a[key] == b[key] and type(a[key]) is type(b[key]) is list, key


def test_a_program_that_exits_mid_iteration_prints_nothing_of_the_background_fetch(tmp_path):
    """With num_workers=0 a thread fetches the next bundle; exiting with the loop unfinished
    must not print a traceback from stopping it."""
    import subprocess
    import sys
    import textwrap

    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(4000)]}), tmp_path / "d" / "0.parquet")
    script = textwrap.dedent(f"""
        import zephon.torch as zt
        from zephon import Dataset, Pipeline, StaticMixtureWorkSource
        dataset = Dataset.from_path("d", {str(tmp_path / "d")!r}, cache_dir={str(tmp_path / "c")!r})
        pipeline = Pipeline(StaticMixtureWorkSource([dataset], {{"d": 1}}, chunk_size=512), columns=["text"])
        it = iter(zt.DataLoader(pipeline, batch_size=8, num_workers=0))
        import zephon.torch._bundles as held  # noqa: F401 - to the end: its globals may go before the generator
        print(len(next(it)["text"]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "8", done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


@pytest.mark.parametrize("failing_take", [1, 2, 3])
def test_a_bundle_that_cannot_be_taken_fails_after_the_bundles_before_it(tmp_path, monkeypatch, failing_take):
    """With num_workers=0 the next bundle is taken and fetched ahead; when taking it fails,
    every batch of the bundles taken before it still reaches the loop, then the error does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import zephon.torch._bundles as bundles_module

    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(20000)]}), tmp_path / "d" / "0.parquet")
    dataset = Dataset.from_path("d", tmp_path / "d", cache_dir=tmp_path / "c")
    pipeline = Pipeline(StaticMixtureWorkSource([dataset], {"d": 1}, chunk_size=512), columns=["text"])
    uninterrupted = [batch["text"] for batch in zt.DataLoader(pipeline, batch_size=8, num_workers=0)]
    taken, batches = bundles_module._taken, []

    def failing(mux, plan, worker):
        if len(batches) == failing_take:
            raise RuntimeError("taking a bundle failed")
        bundle = taken(mux, plan, worker)
        batches.append(len(bundle[0].bounds) - 1)
        return bundle

    monkeypatch.setattr(bundles_module, "_taken", failing)
    received = []
    with pytest.raises(RuntimeError, match="taking a bundle failed"):
        for batch in zt.DataLoader(pipeline, batch_size=8, num_workers=0):
            received.append(batch["text"])
    assert len(received) == sum(batches) > 0
    assert received == uninterrupted[:len(received)]


def test_the_main_process_fetches_two_bundles_at_once(tmp_path, monkeypatch):
    """With num_workers=0 the first two fetches must overlap (each waits here for the other) and
    the batches are those of fetches that do not wait."""
    import itertools
    import threading

    import pyarrow as pa
    import pyarrow.parquet as pq

    import zephon.torch._bundles as bundles_module

    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(20000)]}), tmp_path / "d" / "0.parquet")
    dataset = Dataset.from_path("d", tmp_path / "d", cache_dir=tmp_path / "c")
    pipeline = Pipeline(StaticMixtureWorkSource([dataset], {"d": 1}, chunk_size=512), columns=["text"])
    alone = [batch["text"] for batch in zt.DataLoader(pipeline, batch_size=8, num_workers=0)]
    fetch, calls, together = bundles_module._fetch_columns, itertools.count(), threading.Barrier(2, timeout=30)

    def meeting(*args):
        if next(calls) < 2:
            together.wait()  # BrokenBarrierError if the second fetch only starts once the first ends
        return fetch(*args)

    monkeypatch.setattr(bundles_module, "_fetch_columns", meeting)
    assert [batch["text"] for batch in zt.DataLoader(pipeline, batch_size=8, num_workers=0)] == alone


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_loader_has_the_length_of_the_epoch_it_resumes_into(workers, caplog, monkeypatch):
    """Lightning and transformers count the batches of their epoch and end it at ``len()``: a
    loader restored mid-epoch is as long as the whole epoch (what it delivered before the
    state, at any lag, plus what is left); the iteration after that one starts a new epoch."""
    def make():
        return zt.DataLoader(Pipeline(make_source()), batch_size=7, num_workers=workers, canonical_replicas=3)

    loader = make()
    total = len(loader)
    it = iter(loader)
    for _ in range(5):
        next(it)
    for lag in (0, 2):
        resumed = make()
        resumed.load_state_dict(loader.state_dict(lag=lag))
        assert len(resumed) == total and resumed.remaining() == total - 5 + lag
        again = make()
        again.load_state_dict(resumed.state_dict())  # a state saved before iterating keeps the count
        assert len(again) == total
        assert len(list(resumed)) == total - 5 + lag and len(resumed) == total
        after_end = make()
        after_end.load_state_dict(resumed.state_dict())
        assert len(after_end) == total and len(list(after_end)) == 0 and len(after_end) == total  # its end
        assert len(list(after_end)) == 0 and len(after_end) == 0  # a new epoch
    state = loader.state_dict()
    old = sealed({**{k: v for k, v in state.items() if k not in ("digest", "in_epoch")}, "version": 4})
    resumed = make()
    monkeypatch.setattr(zephon.runtime._book, "_logged", set())  # said once per process
    with caplog.at_level(logging.WARNING, logger="zephon"):
        resumed.load_state_dict(old)
    assert len(resumed) == total - 5  # a version 4 state does not say how far into its epoch it was
    assert "predates the count of batches delivered in its epoch" in caplog.text


def test_len_is_the_iterations_total_and_remaining_what_is_still_to_come():
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=7, num_workers=2, canonical_replicas=3)
    total = len(loader)
    it = iter(loader)
    next(it)
    next(it)
    assert len(loader) == total and loader.remaining() == total - 2
    assert len(list(it)) == total - 2
    assert len(loader) == total and loader.remaining() == 0  # a scheduler or progress bar still reads the total
    state = loader.state_dict()
    assert len(list(loader)) == 0 and len(loader) == 0  # a new iteration after the end has nothing
    loader.load_state_dict(state)
    assert len(loader) == total and loader.remaining() == 0  # the state's epoch, which had ended
    with pytest.raises(TypeError):
        len(zt.DataLoader(Pipeline(make_source(policy="repeat")), batch_size=7))
    lanes = lane_streams(make_source(), 3)
    assert total == math.ceil(len(lanes[0] + lanes[1]) / 7) + math.ceil(len(lanes[2]) / 7)


def test_idle_workers_are_logged_once(caplog):
    with caplog.at_level(logging.WARNING, logger="zephon"):
        loader = zt.DataLoader(Pipeline(make_source()), batch_size=50, num_workers=3, canonical_replicas=2)
        assert flatten(loader) and flatten(loader) == []
    assert sum("stay idle" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("front, most", [("DataLoader", 17), ("StreamDataset", 19)])  # (each is said once a process)
def test_a_reader_of_many_lanes_says_what_its_chunks_in_flight_hold(caplog, monkeypatch, front, most):
    """Each lane holds a chunk in flight: past the bound (lowered here), a reader says how much."""
    monkeypatch.setattr(zephon.runtime._book, "IN_FLIGHT_WARNING", most * 7 * 32)
    source = make_source(chunk_size=7, policy="repeat")
    for lanes, warned in [(most - 1, False), (most, True)]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="zephon"):
            pipeline = Pipeline(source)
            if front == "DataLoader":
                iter(zt.DataLoader(pipeline, batch_size=4, canonical_replicas=lanes))
            else:
                iter(pipeline.to_torch_dataset(canonical_replicas=lanes))
        said = [r.message for r in caplog.records if "in flight" in r.message]
        assert said == ([f"zephon: a reader of rank 0 reads {lanes} lanes, each with a chunk of 7 pointers in flight: "
                         "about 0.0 GiB; more readers (DataLoader workers or ranks) or a smaller chunk_size hold less"]
                        if warned else [])


def test_loader_refuses_torch_side_ordering_and_bad_arguments():
    pipeline = Pipeline(make_source())
    with pytest.raises(ValueError, match="shuffle"):
        zt.DataLoader(pipeline, shuffle=True)
    with pytest.raises(ValueError, match="sampler"):
        zt.DataLoader(pipeline, sampler=[0, 1])
    with pytest.raises(ValueError, match="batch_size"):
        zt.DataLoader(pipeline, batch_size=0)
    with pytest.raises(ValueError, match="mapping"):
        zt.DataLoader(pipeline, mapping="zigzag")
    with pytest.raises(ValueError, match="rank=2 and world_size=2"):
        zt.DataLoader(pipeline, rank=2, world_size=2)
    with pytest.raises(TypeError, match="Pipeline"):
        zt.DataLoader([1, 2, 3])
    assert isinstance(zt.DataLoader(make_source()), torch.utils.data.DataLoader)  # a WorkSource works too


def test_topology_detection(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert zt.detect_topology() == zt.Topology(0, 1, 0, "single process")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert zt.detect_topology() == zt.Topology(3, 4, 1, "environment")
    assert zt.detect_topology(rank=0) == zt.Topology(0, 4, 1, "explicit")
    loader = zt.DataLoader(Pipeline(make_source()))
    assert loader.canonical_replicas == 32 and loader.lanes() == list(range(24, 32))  # 8 lanes per first reader
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        zt.detect_topology()


def test_a_launcher_without_rank_gives_the_rank_by_node_or_an_error(monkeypatch):
    """Lightning's own DDP launcher sets WORLD_SIZE, NODE_RANK and LOCAL_RANK but no RANK: the
    rank is LOCAL_RANK on node 0, NODE_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK where the processes
    per node are known, and never a guess (every rank would be rank 0 and read its lanes)."""
    for name in ("RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("NODE_RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert zt.detect_topology() == zt.Topology(1, 2, 1, "environment")
    assert zt.DataLoader(Pipeline(make_source()), canonical_replicas=4).lanes() == [2, 3]
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("NODE_RANK", "1")
    with pytest.raises(ValueError, match="WORLD_SIZE=4 but RANK is not set.*NODE_RANK='1'.*pass rank="):
        zt.detect_topology()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert zt.detect_topology() == zt.Topology(3, 4, 1, "environment")
    monkeypatch.delenv("NODE_RANK")
    monkeypatch.setenv("GROUP_RANK", "1")  # torchrun's name for the node's rank
    assert zt.detect_topology() == zt.Topology(3, 4, 1, "environment")
    monkeypatch.delenv("GROUP_RANK")
    with pytest.raises(ValueError, match="RANK is not set"):
        zt.detect_topology()
    assert zt.detect_topology(rank=2, world_size=4).rank == 2  # an explicit rank needs none of them
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert zt.detect_topology() == zt.Topology(0, 1, 1, "environment")


def test_all_gather_state_without_a_process_group_merges_locally():
    loader = zt.DataLoader(Pipeline(make_source()), canonical_replicas=2)
    assert zt.all_gather_state(loader.state_dict()) == zt.merge_states([loader.state_dict()])


def test_checkpoint_files_check_against_a_loader(tmp_path):
    loader = zt.DataLoader(Pipeline(make_source()), batch_size=3, canonical_replicas=2)
    it = iter(loader)
    next(it)
    zt.save_checkpoint(tmp_path / "c", loader.state_dict())
    state = zt.load_checkpoint(tmp_path / "c", expect=zt.DataLoader(Pipeline(make_source())))
    assert state == loader.state_dict()
    with pytest.raises(ValueError, match="seed"):
        zt.load_checkpoint(tmp_path / "c", expect=zt.DataLoader(Pipeline(make_source(seed=9))))


def _tag(item):
    return dict(item, tagged=True)


@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")
def test_spawned_workers_read_the_same_stream_and_need_a_picklable_pipeline():
    forked = zt.DataLoader(Pipeline(make_source()).map(_tag), batch_size=4, num_workers=1)
    spawned = zt.DataLoader(Pipeline(make_source()).map(_tag), batch_size=4, num_workers=1,
                            multiprocessing_context="spawn")
    assert [sample_ids(b) for b in spawned] == [sample_ids(b) for b in forked]
    pointers = [zt.DataLoader(Pipeline(make_source()), batch_size=4, num_workers=2, canonical_replicas=2,
                              multiprocessing_context=context)
                for context in ("spawn", "fork")]  # pointers through the pipe, and through shared-memory slots
    assert [sample_ids(b) for b in pointers[0]] == [sample_ids(b) for b in pointers[1]] == \
        [sample_ids(b) for b in zt.DataLoader(Pipeline(make_source()), batch_size=4, canonical_replicas=2)]
    unpicklable = threading.Lock()  # lambdas travel by value; a lock cannot travel at all
    loader = zt.DataLoader(Pipeline(make_source()).map(lambda item: unpicklable and item), batch_size=4,
                           num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(TypeError, match="cannot be pickled.*'fork'"):
        next(iter(loader))


def test_bundles_pin_their_tensors(monkeypatch):
    from zephon.torch._bundles import Bundle

    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: pinned.append(self.shape) or self)
    bundle = Bundle(0, 0, [], [], False)
    bundle.pointers = torch.zeros((4, 3), dtype=torch.int64)
    assert bundle.pin_memory() is bundle and pinned == [(4, 3)]
    bundle.pointers, bundle.units = None, [{"x": torch.ones(2), "_component": ["a", "b"]}]
    bundle.pin_memory()
    assert pinned[-1] == (2,) and bundle.units[0]["_component"] == ["a", "b"]
    from zephon.torch._collate import Strings

    text = Strings(np.array([0, 2, 5]), np.frombuffer(b"hiyou", dtype=np.uint8))
    bundle.units, bundle.shipped, bundle.lazy = [{"x": torch.ones(3), "text": text}], True, True
    assert bundle.land().units[0]["text"] is text  # a lazy bundle's units are landed one by one, as handed out
    bundle.pin_memory()  # a pinned one, whole
    assert pinned[-1] == (3,) and bundle.units[0]["text"] == ["hi", "you"] and not bundle.shipped


def test_collectives_use_the_cuda_device_under_nccl(monkeypatch):
    from zephon.torch import _dist

    monkeypatch.setattr(_dist.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _dist.collective_device(None) == torch.device("cuda", 3)
    monkeypatch.setattr(_dist.dist, "get_backend", lambda group=None: "gloo")
    assert _dist.collective_device(None) == torch.device("cpu")


def test_pinning_walks_dicts_lists_tuples_and_namedtuples_and_leaves_the_rest(monkeypatch):
    from collections import namedtuple

    from zephon.torch._bundles import _pin

    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: pinned.append(tuple(self.shape)) or self)
    Pair = namedtuple("Pair", "ids mask")
    batch = {"x": torch.ones(2), "pair": Pair(torch.ones(3), [torch.ones(4), "tag"]), "t": (torch.ones(5), 7),
             "_component": ["a", "b"]}
    out = _pin(batch)
    assert sorted(pinned) == [(2,), (3,), (4,), (5,)]
    assert type(out["pair"]) is Pair and out["pair"].mask[1] == "tag" and out["t"][1] == 7
    assert out["_component"] == ["a", "b"]
    from collections import UserDict

    encoding = UserDict({"input_ids": torch.ones(6)})  # a mapping of its own type, as tokenizers return
    pinned_encoding = _pin(encoding)
    assert type(pinned_encoding) is UserDict and pinned[-1] == (6,)


@pytest.mark.parametrize("row_bytes", [1.0, 150.0, 4000.0])
def test_columnar_bundles_are_sized_by_rows_and_bytes_and_larger_in_the_main_process(row_bytes):
    from zephon.torch._bundles import COLUMNAR_BUNDLE, COLUMNAR_BYTES, HERE_COLUMNAR, Plan

    source = StaticMixtureWorkSource([Dataset.from_counts("a", [10**6])], {"a": 1.0}, chunk_size=1024)
    plan = Plan(Pipeline(source), 1, {0: [0]}, {}, 256, False, None, None)
    sizes = []
    for _ in range(2):  # as a worker's reader, then as the main process's
        plan.fit_bundles(row_bytes)
        sizes.append(plan.bundle_size)
        plan.read_here()
    by_bytes = COLUMNAR_BYTES // row_bytes
    assert sizes == [min(COLUMNAR_BUNDLE, by_bytes) // 256 * 256, min(HERE_COLUMNAR, by_bytes) // 256 * 256]
    assert all(size % 256 == 0 and size >= 256 for size in sizes)


@pytest.mark.parametrize("chunk_size, batch_size", [(1, 1), (4, 256), (3, 10), (16384, 256)])
def test_a_bundle_holds_at_most_so_many_chunks_in_whole_batches(chunk_size, batch_size):
    """A source of small chunks makes its first bundle in milliseconds, on every path."""
    from zephon.torch._bundles import BUNDLE_CHUNKS, HERE_BUNDLE, POINTER_BUNDLE, Plan

    source = StaticMixtureWorkSource([Dataset.from_counts("a", [10**6])], {"a": 1.0}, chunk_size=chunk_size)
    plan = Plan(Pipeline(source), 1, {0: [0]}, {}, batch_size, False, None, None)
    sizes = [plan.bundle_size]
    plan.read_here()
    sizes.append(plan.bundle_size)
    plan.fit_bundles(1.0)
    sizes.append(plan.bundle_size)
    most = max(batch_size, BUNDLE_CHUNKS * chunk_size // batch_size * batch_size)
    assert sizes[:2] == [min(POINTER_BUNDLE // batch_size * batch_size, most), min(HERE_BUNDLE, most)]
    assert sizes[2] <= most and all(size % batch_size == 0 for size in sizes)

"""The shared-memory slots that carry pointer bundles and packed batches from DataLoader workers:
what goes in comes out, a slot stays leased while any view of it lives (a worker never
overwrites one), and a worker that finds no free slot is told at once (it sends through the
pipe instead)."""
from __future__ import annotations

import gc
import multiprocessing
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

pytest.importorskip("torch")

from zephon.runtime import write  # noqa: E402
from zephon.torch import _bundles, _packed, _slots  # noqa: E402
from zephon.torch._slots import Slots, stow, take, unstow  # noqa: E402

CAPACITY = 64
COUNT = 3


def _put(slots: Slots, worker: int, pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[int, int, int] | None:
    """What a worker does with a bundle: claim a slot, write the pieces, carry the slot's number."""
    slot = slots.claim(worker)
    return None if slot is None else slots.carried(slot, write(slots.views(worker, slot), 0, pieces))


def _pieces(data: st.DataObject, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    pointers = data.draw(hnp.arrays(np.int64, (n, 3)))
    components = data.draw(hnp.arrays(np.int64, n, elements=st.integers(0, 2**31 - 1)))
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    return [(pointers[a:b], components[a:b]) for a, b in zip([0, *cuts], [*cuts, n])]


@given(ops=st.lists(st.one_of(st.integers(0, CAPACITY), st.tuples(st.just("drop"), st.integers(0, 9))), max_size=30),
       worker=st.integers(0, 1), data=st.data())
def test_leased_slots_keep_their_bundles_and_a_full_worker_is_told_at_once(ops, worker, data):
    slots = Slots.for_pointers(2, CAPACITY, COUNT, multiprocessing.get_context("fork"))
    live: list[tuple[object, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for op in ops:
        if isinstance(op, tuple):
            if live:
                live.pop(op[1] % len(live))
                gc.collect()
        else:
            pieces = _pieces(data, op)
            carried = _put(slots, worker, pieces)
            if len(live) == COUNT:
                assert carried is None  # every slot is leased: no wait, no overwrite
                continue
            assert carried is not None and carried[2] == op
            pointers, components = take(worker, carried)
            expected_pointers = np.concatenate([p for p, _ in pieces]) if pieces else np.zeros((0, 3), np.int64)
            expected_components = np.concatenate([c for _, c in pieces]) if pieces else np.zeros(0, np.int64)
            live.append((carried, pointers, components, expected_pointers, expected_components))
        for _, pointers, components, expected_pointers, expected_components in live:
            assert pointers.numpy().tolist() == expected_pointers.tolist()
            assert components.tolist() == expected_components.tolist()
    assert len({carried[1] for carried, *_ in live}) == len(live)  # live leases hold distinct slots


def test_a_slot_is_freed_when_its_last_view_is_gone():
    import torch

    slots = Slots.for_pointers(1, 8, 1, multiprocessing.get_context("fork"))
    pieces = [(np.arange(24, dtype=np.int64).reshape(8, 3), np.arange(8, dtype=np.int64))]
    pointers, components = take(0, _put(slots, 0, pieces))
    batches = torch.split(pointers, [4, 4])
    del pointers
    assert _put(slots, 0, pieces) is None
    del batches
    assert _put(slots, 0, pieces) is None  # the component ids still view the slot
    del components
    assert _put(slots, 0, pieces) is not None


def _pointer_batches(workers):
    import zephon.torch as zt
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    source = StaticMixtureWorkSource([Dataset.from_counts("a", [50] * 4)], {"a": 1.0}, chunk_size=16, seed=2)
    return [b["_sample_id"].tolist() for b in zt.DataLoader(Pipeline(source), batch_size=8, num_workers=workers,
                                                                   canonical_replicas=2)]


def test_a_loop_that_keeps_every_batch_gets_the_same_batches(monkeypatch):
    import zephon.torch as zt
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    monkeypatch.setattr(_bundles, "SLOT_BUNDLE", 16)  # many bundles: the slots run out, the pipe takes over
    source = StaticMixtureWorkSource([Dataset.from_counts("a", [50] * 4)], {"a": 1.0}, chunk_size=16, seed=2)
    kept = [b["_sample_id"] for b in zt.DataLoader(Pipeline(source), batch_size=8, num_workers=2, canonical_replicas=2)]
    assert [b.tolist() for b in kept] == _pointer_batches(0)


@pytest.mark.parametrize("drop_last", [False, True])
def test_slots_filled_a_part_at_a_time_give_the_batches_of_whole_bundles(monkeypatch, drop_last):
    import zephon.torch as zt
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    def run(workers):
        source = StaticMixtureWorkSource([Dataset.from_counts("a", [53, 41]), Dataset.from_counts("b", [37])],
                                         {"a": 0.7, "b": 0.3}, chunk_size=11, seed=5)  # short turns mid-stream
        loader = zt.DataLoader(Pipeline(source), batch_size=6, num_workers=workers, canonical_replicas=4,
                               drop_last=drop_last)
        batches = [(b["_sample_id"].tolist(), b["_component"]) for b in loader]
        return batches, loader.stats(), loader.state_dict()

    whole = run(2)  # each reader's lanes fit in one part and one slot
    monkeypatch.setattr(_bundles, "POINTER_BUNDLE", 8)  # parts of one batch, slots of six
    monkeypatch.setattr(_bundles, "SLOT_BUNDLE", 40)
    assert run(2) == whole


def _forked_trainer(out):
    out.put(_pointer_batches(2))


def test_a_trainer_forked_after_torch_ran_its_threads_still_starts_its_workers():
    import torch

    torch.set_num_threads(2)
    torch.zeros(1 << 22).add_(1).sum()  # OpenMP threads now exist in this process, not in its forks
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    trainer = context.Process(target=_forked_trainer, args=(out,))
    trainer.start()
    try:
        batches = out.get(timeout=120)  # a hang (OpenMP after fork) ends here as queue.Empty
        trainer.join(10)
    finally:
        if trainer.is_alive():
            trainer.kill()
    assert trainer.exitcode == 0 and batches == _pointer_batches(0)


_DTYPES = st.sampled_from(["int64", "int32", "uint8", "float32"])


@given(shapes=st.lists(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 300), _DTYPES), max_size=4), max_size=4),
       width=st.integers(0, 1 << 16), data=st.data())
def test_stowed_units_come_back_equal_and_hold_their_slot_until_the_last_is_gone(shapes, width, data):
    import torch

    slots = Slots(1, width, 1, multiprocessing.get_context("fork"))
    units = [{f"k{i}": torch.from_numpy(data.draw(hnp.arrays(dtype, shape))) for i, (*shape, dtype) in enumerate(unit)}
             for unit in shapes]
    expected = [{k: v.clone() for k, v in unit.items()} for unit in units]
    carried = stow(slots, 0, units)
    stowed = [(u, k) for u, unit in enumerate(units) for k, v in unit.items() if not isinstance(v, torch.Tensor)]
    assert all(expected[u][k].nbytes >= _slots.STOW_BYTES for u, k in stowed)
    assert (carried is None) == (not stowed)
    if carried is None:
        assert slots.claim(0) is not None  # an unused slot is freed at once
        return
    landed = unstow(0, carried, pickle.loads(pickle.dumps(units)))  # the units cross a pipe
    assert [{k: _raw(v) for k, v in unit.items()} for unit in landed] == \
        [{k: _raw(v) for k, v in unit.items()} for unit in expected]
    views = [landed[u][k] for u, k in stowed]
    del landed, units
    gc.collect()
    assert slots.claim(0) is None  # the views still lease the slot
    del views
    gc.collect()
    assert slots.claim(0) is not None


@given(texts=st.lists(st.lists(st.text(max_size=30), max_size=20), max_size=4), width=st.integers(0, 1 << 14),
       tensors=st.booleans())
def test_stowed_strings_come_back_equal_and_hold_their_slot_until_they_are_gone(texts, width, tensors):
    """A columnar batch's strings travel in a slot when they fit (offsets and bytes both), its
    tensors only with ``tensors``; what does not fit stays in the unit."""
    import torch

    from zephon.torch._collate import Strings

    def column(values):
        encoded = [v.encode() for v in values]
        return Strings(np.cumsum([0] + [len(e) for e in encoded], dtype=np.int64),
                       np.frombuffer(b"".join(encoded), dtype=np.uint8))

    slots = Slots(1, width, 1, multiprocessing.get_context("fork"))
    units = [{"text": column(values), "ids": torch.arange(600)} for values in texts]
    carried = stow(slots, 0, units, tensors=tensors)
    strings_stowed = [type(unit["text"]) is not Strings for unit in units]
    if texts:  # the first unit's strings go first: they are stowed when they fit
        first = column(texts[0])
        assert strings_stowed[0] == (-(-first.offsets.nbytes // 64) * 64 + first.data.nbytes <= width)
    tensors_stowed = [type(unit["ids"]) is not torch.Tensor for unit in units]
    assert tensors or not any(tensors_stowed)
    assert (carried is None) == (not any(strings_stowed) and not any(tensors_stowed))
    if carried is None:
        assert slots.claim(0) is not None  # an unused slot is freed at once
        return
    landed = unstow(0, carried, pickle.loads(pickle.dumps(units)))  # the units cross a pipe
    assert [unit["text"].values() for unit in landed] == texts
    assert all(torch.equal(unit["ids"], torch.arange(600)) for unit in landed)
    del units
    gc.collect()
    assert slots.claim(0) is None  # the landed units still lease the slot
    del landed
    gc.collect()
    assert slots.claim(0) is not None


def _raw(tensor):
    """A tensor's dtype, shape and bytes (NaNs compare equal)."""
    return str(tensor.dtype), tuple(tensor.shape), tensor.numpy().tobytes()


def _packed_batches(workers: int, keep: bool) -> list[dict[str, list]]:
    import zephon.torch as zt
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    rng = np.random.default_rng(0)
    records = [[{"text": "w " * int(rng.integers(1, 400))} for _ in range(30)] for _ in range(4)]
    source = StaticMixtureWorkSource([Dataset.from_records("a", records), Dataset.from_records("b", records[:2])],
                                     {"a": 0.7, "b": 0.3}, chunk_size=8, seed=3)
    pipeline = Pipeline(source).tokenize(lambda text: [1 + len(w) for w in text.split()], eos_id=0).pack(256, pad_id=0)
    loader = zt.DataLoader(pipeline, batch_size=4, num_workers=workers, canonical_replicas=4)
    batches = []
    for batch in loader:
        batches.append(batch if keep else {k: v.tolist() for k, v in batch.items() if k.endswith("_ids")})
        if not keep:
            batch["input_ids"].fill_(-1)  # a training step may write into its batch
    return [{k: v.tolist() for k, v in b.items() if k.endswith("_ids")} for b in batches] if keep else batches


@pytest.mark.parametrize("keep", [False, True])
def test_packed_batches_through_slots_equal_those_through_the_pipe(monkeypatch, keep):
    with monkeypatch.context() as patch:
        patch.setattr(_bundles.Plan, "share_memory", lambda *args: None)  # no slots: every bundle takes the pipe
        piped = _packed_batches(2, keep=False)
    monkeypatch.setattr(_packed, "TOKENS_PER_BUNDLE", 1024)  # a batch a bundle: keeping them all leases every slot
    assert _packed_batches(2, keep) == piped
    assert _packed_batches(1, keep) == _packed_batches(0, keep=False)

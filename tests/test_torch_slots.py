"""The shared-memory slots that carry pointer bundles from DataLoader workers: what goes in comes
out, a worker never overwrites a slot the trainer has not copied, and closing frees a waiting worker."""
from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

pytest.importorskip("torch")

from zephon.torch import _slots  # noqa: E402
from zephon.torch._slots import SLOTS, Slots, take  # noqa: E402

CAPACITY = 64


@pytest.fixture(scope="module")
def slots():
    return Slots(2, CAPACITY, multiprocessing.get_context("fork"))


@given(n=st.integers(0, CAPACITY), worker=st.integers(0, 1), data=st.data())
def test_a_bundle_comes_out_of_its_slot_as_it_went_in(slots, n, worker, data):
    pointers = data.draw(hnp.arrays(np.int64, (n, 3)))
    components = data.draw(hnp.arrays(np.int32, n))
    carried = slots.put(worker, pointers, components)
    assert carried is not None and carried[2] == n
    got_pointers, got_components = take(worker, carried)
    assert got_pointers.numpy().tolist() == pointers.tolist()
    assert got_components.tolist() == components.tolist()
    got_pointers[...] = 0  # the trainer's copy: changing it leaves the slot alone
    assert slots._views(worker, carried[1], n)[0].tolist() == pointers.tolist()


def test_a_worker_waits_for_a_free_slot_and_stops_waiting_once_closed(monkeypatch):
    monkeypatch.setattr(_slots, "WAIT", 0.01)
    slots = Slots(1, 4, multiprocessing.get_context("fork"))
    full = [slots.put(0, np.full((4, 3), k), np.full(4, k, dtype=np.int32)) for k in range(SLOTS)]
    assert [c[1] for c in full] == list(range(SLOTS))
    written: list = []
    writer = threading.Thread(target=lambda: written.append(slots.put(0, np.full((4, 3), 9), np.zeros(4, np.int32))))
    writer.start()
    writer.join(0.2)
    assert writer.is_alive() and not written  # every slot holds a bundle the trainer has not copied
    pointers, _ = take(0, full[0])
    writer.join(5)
    assert pointers.unique().tolist() == [0]  # copied before the waiting worker wrote into its slot
    assert written and written[0][1] == full[0][1]
    waiting: list = []
    blocked = threading.Thread(target=lambda: waiting.append(slots.put(0, np.zeros((1, 3)), np.zeros(1, np.int32))))
    blocked.start()
    slots.close()
    blocked.join(5)
    assert waiting == [None]


def _pointer_batches(workers):
    import zephon.torch as zt
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    source = StaticMixtureWorkSource([Dataset.from_counts("a", [50] * 4)], {"a": 1.0}, chunk_size=16, seed=2)
    return [b["_sample_id"].tolist() for b in zt.DataLoader(Pipeline(source), batch_size=8, num_workers=workers,
                                                                   canonical_replicas=2)]


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

"""Checkpoint directories: every rank saves its own lanes, a step counts once every lane is there.

Ranks are loaders built with ``rank=`` / ``world_size=`` in one process (the directory needs no
collective, so nothing else is needed); the multi-process runs with a rank killed mid-save are
in test_distributed_checkpoints.py.
"""
import dataclasses
import logging
import os
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ranks import die_halfway_through_the_next_write
from s3_server import s3_client

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.io import Store
from zephon.io._store import LISTING_ATTEMPTS
from zephon.runtime import merge_states, parse_state


def make_source(seed=3):
    datasets = [Dataset.from_counts("web", [60] * 6), Dataset.from_counts("code", [45] * 4)]
    return StaticMixtureWorkSource(datasets, {"web": 0.6, "code": 0.4}, chunk_size=16, seed=seed,
                                   exhausted_policy="stop")


def ranks(world, replicas, seed=3):
    """One loader per rank of a ``world``-rank job, each with a running iterator."""
    loaders = [zt.DataLoader(Pipeline(make_source(seed)), batch_size=4, canonical_replicas=replicas, rank=r,
                             world_size=world) for r in range(world)]
    return loaders, [iter(loader) for loader in loaders]


def step_all(iterators):
    for it in iterators:
        next(it)


def test_a_step_is_complete_once_every_rank_saved_and_loads_on_another_topology(tmp_path):
    loaders, its = ranks(2, 6)
    step_all(its)
    assert zt.save_checkpoint_dir(tmp_path, loaders[0], step=1) is False
    assert zt.complete_steps(tmp_path) == []
    assert zt.save_checkpoint_dir(tmp_path, loaders[1], step=1) is True
    assert zt.complete_steps(tmp_path) == [1]
    state = zt.load_checkpoint_dir(tmp_path)
    assert state == merge_states([loader.state_dict() for loader in loaders])
    assert sorted(parse_state(state).entries) == list(range(6))
    for rank in range(3):
        loader = zt.DataLoader(Pipeline(make_source()), batch_size=4, rank=rank, world_size=3)
        loader.load_state_dict(state)
        assert loader.canonical_replicas == 6


@settings(max_examples=15)
@given(world=st.integers(1, 3), extra=st.integers(0, 4), keep=st.one_of(st.none(), st.integers(1, 3)),
       saves=st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=5))
def test_the_newest_step_every_rank_saved_is_loaded_and_old_steps_go_by_keep(tmp_path_factory, world, extra, keep,
                                                                             saves):
    directory = tmp_path_factory.mktemp("dir")
    loaders, its = ranks(world, world + extra)
    states, done = {}, []
    for step, who in enumerate(saves, start=1):
        step_all(its)
        saved = [rank for rank in range(world) if who[rank]]
        for rank in saved:
            zt.save_checkpoint_dir(directory, loaders[rank], step=step, keep=keep)
        if len(saved) == world:
            states[step] = merge_states([loader.state_dict() for loader in loaders])
            done.append(step)
    expected = done if keep is None else done[-keep:]
    assert zt.complete_steps(directory) == expected
    if not done:
        with pytest.raises(FileNotFoundError, match="no complete step"):
            zt.load_checkpoint_dir(directory)
        return
    assert zt.load_checkpoint_dir(directory) == states[done[-1]]
    for step in expected:
        assert zt.load_checkpoint_dir(directory, step) == states[step]
    left = [int(name[5:17]) for name in os.listdir(directory)]
    assert [s for s in left if s < done[-1] and s not in expected] == [], "old and incomplete steps are removed"


def complete_then_partial(directory, world, replicas, savers, steps=(1, 2)):
    """Step ``steps[0]`` saved by every rank, then step ``steps[1]`` by the ranks ``savers`` only."""
    loaders, its = ranks(world, replicas)
    step_all(its)
    for loader in loaders:
        zt.save_checkpoint_dir(directory, loader, step=steps[0])
    step_all(its)
    for rank in savers:
        zt.save_checkpoint_dir(directory, loaders[rank], step=steps[1])
    return loaders


def test_an_incomplete_step_is_never_loaded_and_is_described(tmp_path, caplog):
    complete_then_partial(tmp_path, 3, 7, [1], steps=(10, 20))
    with caplog.at_level(logging.WARNING, logger="zephon"):
        state = zt.load_checkpoint_dir(tmp_path)
    assert state == zt.load_checkpoint_dir(tmp_path, 10)
    assert "step 20" in caplog.text and "ranks 0, 2 of 3 did not save" in caplog.text
    with pytest.raises(ValueError, match=r"step 20 .* incomplete: ranks 0, 2 of 3 did not save; lanes 0-2, 5-6 "
                                         r"of 7 are missing; it is never loaded"):
        zt.load_checkpoint_dir(tmp_path, 20)
    with pytest.raises(FileNotFoundError, match="has no step 15"):
        zt.load_checkpoint_dir(tmp_path, 15)


def test_a_step_whose_marker_was_not_written_is_finalized_by_name(tmp_path, caplog):
    loaders, its = ranks(2, 4)
    step_all(its)
    for loader in loaders:
        zt.save_checkpoint_dir(tmp_path, loader, step=5)
    (folder,) = os.listdir(tmp_path)
    os.remove(tmp_path / folder / "complete.ckpt")  # the rank that marks it died after its own file
    with pytest.raises(ValueError, match=r"every rank's file is there but the marker is not.*"
                                         r"finalize_checkpoint_dir\(directory, step=5\)"):
        zt.load_checkpoint_dir(tmp_path, 5)
    assert zt.finalize_checkpoint_dir(tmp_path, 5) is True
    assert zt.load_checkpoint_dir(tmp_path) == merge_states([loader.state_dict() for loader in loaders])


def test_two_runs_in_one_directory_are_refused_not_merged(tmp_path):
    mine, its = ranks(2, 4, seed=3)
    other, others = ranks(2, 4, seed=4)  # another seed: another run
    step_all(its + others)
    zt.save_checkpoint_dir(tmp_path, mine[0], step=1)
    with pytest.raises(ValueError, match="holds checkpoints of another run .* give this one its own directory"):
        zt.save_checkpoint_dir(tmp_path, other[0], step=1)
    zt.save_checkpoint_dir(tmp_path / "b", other[0], step=1)
    (folder,) = os.listdir(tmp_path / "b")
    os.rename(tmp_path / "b" / folder, tmp_path / folder)  # two jobs that raced into one directory
    with pytest.raises(ValueError, match="holds checkpoints of 2 runs .* never merged"):
        zt.load_checkpoint_dir(tmp_path)


def test_a_checkpoint_of_another_run_is_refused_by_the_loader(tmp_path):
    loaders, its = ranks(1, 4, seed=3)
    step_all(its)
    zt.save_checkpoint_dir(tmp_path, loaders[0], step=1)
    other = zt.DataLoader(Pipeline(make_source(seed=4)), batch_size=4)
    with pytest.raises(ValueError, match="does not restore|another run"):
        zt.load_checkpoint_dir(tmp_path, expect=other)


def test_saving_a_complete_step_again_needs_the_same_positions(tmp_path):
    loaders, its = ranks(1, 3)
    step_all(its)
    zt.save_checkpoint_dir(tmp_path, loaders[0], step=1)
    assert zt.save_checkpoint_dir(tmp_path, loaders[0], step=1) is True  # a retried save of the same step
    step_all(its)
    with pytest.raises(ValueError, match="already complete.*each save needs a new step number"):
        zt.save_checkpoint_dir(tmp_path, loaders[0], step=1)


def test_a_damaged_file_is_refused_by_name(tmp_path):
    loaders, its = ranks(1, 3)
    step_all(its)
    zt.save_checkpoint_dir(tmp_path, loaders[0], step=1)
    (folder,) = os.listdir(tmp_path)
    marker = tmp_path / folder / "complete.ckpt"
    data = bytearray(marker.read_bytes())
    data[-3] ^= 1
    marker.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"complete\.ckpt.*fails its sha256 checksum"):
        zt.load_checkpoint_dir(tmp_path)


@pytest.mark.parametrize("bad,match", [
    (dict(step=-1), "step=-1 must be an int >= 0"), (dict(step=True), "step=True"),
    (dict(step=1, keep=0), "keep=0 must be an int >= 1"),
])
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, bad, match):
    loaders, _ = ranks(1, 3)
    with pytest.raises(ValueError, match=match):
        zt.save_checkpoint_dir(tmp_path / "d", loaders[0], **bad)
    assert not (tmp_path / "d").exists()


def test_a_merged_state_is_not_a_rank_state(tmp_path):
    loaders, _ = ranks(2, 4)
    merged = merge_states([loader.state_dict() for loader in loaders])
    with pytest.raises(ValueError, match=r"saves one rank's state.*ranks \[0, 1\].*save_checkpoint"):
        zt.save_checkpoint_dir(tmp_path, merged, step=1)


def test_a_rank_killed_while_writing_leaves_the_step_incomplete(tmp_path):
    loaders = complete_then_partial(tmp_path, 2, 4, [0])
    pid = os.fork()
    if pid == 0:  # rank 1, killed halfway through writing its file of step 2
        die_halfway_through_the_next_write()
        zt.save_checkpoint_dir(tmp_path, loaders[1], step=2)
        os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert zt.complete_steps(tmp_path) == [1]
    assert zt.load_checkpoint_dir(tmp_path) == zt.load_checkpoint_dir(tmp_path, 1)


def test_an_object_store_holds_a_checkpoint_directory(endpoint, tmp_path):
    s3_client(endpoint).create_dir("ckpts")
    uri = "s3://ckpts/run1"
    loaders, its = ranks(2, 4)
    for step in (1, 2, 3):
        step_all(its)
        for loader in loaders:
            zt.save_checkpoint_dir(uri, loader, step=step, keep=2)
    step_all(its)
    zt.save_checkpoint_dir(uri, loaders[1], step=4)
    assert zt.complete_steps(uri) == [2, 3]
    assert zt.load_checkpoint_dir(uri) == zt.load_checkpoint_dir(uri, 3)
    with pytest.raises(ValueError, match="step 4 of s3://ckpts/run1 is incomplete: ranks 0 of 2"):
        zt.load_checkpoint_dir(uri, 4)
    store = Store(uri)
    assert len(store.listing()[0]) == 3  # steps 2, 3 and the incomplete 4
    explicit = zt.load_checkpoint_dir("ckpts/run1", filesystem=s3_client(endpoint))
    assert explicit == zt.load_checkpoint_dir(uri)


def test_a_state_of_another_run_fingerprint_is_refused(tmp_path):
    from zephon.runtime import make_state

    loaders, _ = ranks(1, 3)
    parsed = parse_state(loaders[0].state_dict())
    forged = make_state(parsed.canonical_replicas, parsed.entries, parsed.datasets, parsed.topology, run="0" * 32)
    with pytest.raises(ValueError, match=r"another run \(run 0{32}"):
        loaders[0].load_state_dict(forged)


def resumed_ranks(directory, world, step=None, batch_size=4):
    """The ranks of a job resumed from ``directory`` (its newest complete step, or ``step``)."""
    state = zt.load_checkpoint_dir(directory, step)
    loaders = [zt.DataLoader(Pipeline(make_source()), batch_size=batch_size, rank=r, world_size=world)
               for r in range(world)]
    for loader in loaders:
        loader.load_state_dict(state)
    return loaders, [iter(loader) for loader in loaders]


@pytest.mark.parametrize("rolled_back", [True, False])
def test_a_run_that_did_not_resume_from_the_newest_step_needs_its_own_directory(tmp_path, rolled_back):
    loaders, its = ranks(2, 4)
    for step in (10, 20, 30):
        step_all(its)
        for loader in loaders:
            zt.save_checkpoint_dir(tmp_path, loader, step=step)
    loaders, its = resumed_ranks(tmp_path, 2, step=10) if rolled_back else ranks(2, 4)
    step_all(its)
    with pytest.raises(ValueError, match=r"holds complete steps \[20, 30\] after step 15.*directory of its own"):
        zt.save_checkpoint_dir(tmp_path, loaders[0], step=15)
    assert zt.complete_steps(tmp_path) == [10, 20, 30] and len(os.listdir(tmp_path)) == 3


@pytest.mark.parametrize("dead_attempt", ["fresh", "other batch size"])
def test_a_step_half_saved_by_a_dead_attempt_is_completed_only_by_the_next_attempts_files(tmp_path, dead_attempt,
                                                                                         caplog):
    loaders, its = ranks(2, 4)
    step_all(its)
    for loader in loaders:
        zt.save_checkpoint_dir(tmp_path, loader, step=10)
    if dead_attempt == "other batch size":
        loaders, its = resumed_ranks(tmp_path, 2, batch_size=3)
    step_all(its)
    step_all(its)  # the dead attempt stands elsewhere at step 20 than the next one will
    zt.save_checkpoint_dir(tmp_path, loaders[0], step=20)  # ... and dies before rank 1 saves step 20
    loaders, its = resumed_ranks(tmp_path, 2)
    step_all(its)
    with caplog.at_level(logging.WARNING, logger="zephon"):
        assert zt.save_checkpoint_dir(tmp_path, loaders[1], step=20) is False, "not with the dead attempt's rank 0"
    assert "has a file of every rank, but of 2 attempts" in caplog.text
    assert zt.save_checkpoint_dir(tmp_path, loaders[0], step=20) is True
    assert zt.load_checkpoint_dir(tmp_path) == merge_states([loader.state_dict() for loader in loaders])


def test_ranks_that_each_reload_their_own_state_still_complete_their_steps(tmp_path):
    loaders = [zt.DataLoader(Pipeline(make_source()), batch_size=4, canonical_replicas=1, rank=r, world_size=2,
                             even_batches=False) for r in range(2)]  # rank 0 holds the only lane, rank 1 none
    its = [iter(loader) for loader in loaders]
    for step in (1, 2):
        next(its[0])
        for loader in loaders:
            loader.load_state_dict(loader.state_dict())  # as an epoch rollover does
        assert [zt.save_checkpoint_dir(tmp_path, loader, step=step) for loader in loaders] == [False, True]
        its = [iter(loader) for loader in loaders]


def test_torn_and_stray_files_of_an_incomplete_step_are_described_not_fatal(tmp_path, caplog):
    loaders = complete_then_partial(tmp_path, 2, 4, [0])
    folder = tmp_path / sorted(os.listdir(tmp_path))[-1]
    (rank0,) = os.listdir(folder)
    (folder / rank0).write_bytes(b"zephon-checkpoint 1 torn")
    (folder / rank0.replace("rank-00000", "rank-00007")).write_bytes(b"no such rank")
    (folder / rank0.replace("00002", f"{2**40:05d}")).write_bytes(b"no such world")
    with caplog.at_level(logging.WARNING, logger="zephon"):
        assert zt.load_checkpoint_dir(tmp_path) == zt.load_checkpoint_dir(tmp_path, 1)
        assert zt.save_checkpoint_dir(tmp_path, loaders[1], step=2) is False
    assert "their files do not merge" in caplog.text and "do not merge" in caplog.text.split("skipped")[-1]
    assert zt.complete_steps(tmp_path) == [1]


def test_a_filesystem_without_whole_uploads_gets_a_moved_temporary_file(tmp_path):
    import pyarrow.fs as pafs

    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    assert fs.type_name == "subtree"
    loaders, its = ranks(2, 4)
    step_all(its)
    for loader in loaders:
        zt.save_checkpoint_dir("ckpt", loader, step=1, filesystem=fs)
    (folder,) = os.listdir(tmp_path / "ckpt")
    names = sorted(os.listdir(tmp_path / "ckpt" / folder))
    assert names[0] == "complete.ckpt" and [n[:19] for n in names[1:]] == ["rank-00000-of-00002", "rank-00001-of-00002"]
    assert not any(n.endswith(".tmp") for n in names)
    assert zt.load_checkpoint_dir("ckpt", filesystem=fs) == merge_states([loader.state_dict() for loader in loaders])


@pytest.mark.parametrize("races", [1, LISTING_ATTEMPTS - 1, LISTING_ATTEMPTS])
def test_a_listing_that_races_with_another_ranks_rename_is_read_again(tmp_path, races):
    store = Store(str(tmp_path))
    store.write("step/rank-0.ckpt", b"x")
    real, calls = store.location.fs, []

    class Racing:
        def get_file_info(self, selector):  # the first listings meet a file renamed away mid-read
            calls.append(selector)
            if len(calls) <= races:
                raise FileNotFoundError(f"Cannot list directory '{selector.base_dir}'")
            return real.get_file_info(selector)

    store.location = dataclasses.replace(store.location, fs=Racing())
    if races < LISTING_ATTEMPTS:
        assert store.listing("step") == ([], ["rank-0.ckpt"])
    else:
        with pytest.raises(OSError, match=f"kept changing while it was read, {LISTING_ATTEMPTS} times"):
            store.listing("step")

"""The DataLoader as a Stateful of torch.distributed.checkpoint, in one process (DCP loads
without a process group then): which lanes a rank asks for, wrappers, several loaders. The
runs on real ranks are in test_distributed_checkpoints.py."""
import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.runtime import parse_state

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def make_source():
    datasets = [Dataset.from_counts("web", [40] * 3), Dataset.from_counts("code", [30] * 2)]
    return StaticMixtureWorkSource(datasets, {"web": 0.6, "code": 0.4}, chunk_size=8, seed=5)


def loader(replicas=None, rank=0, world_size=1):
    return zt.DataLoader(Pipeline(make_source()), batch_size=4, canonical_replicas=replicas, rank=rank,
                         world_size=world_size, even_batches=False)


def positions(data):
    return parse_state(data.state_dict()).entries


def advanced(replicas, batches=3):
    saved = loader(replicas)
    it = iter(saved)
    for _ in range(batches):
        next(it)
    return saved


def test_a_rank_that_reads_no_lane_still_takes_the_checkpoints_lane_count(tmp_path):
    dcp.save({"data": advanced(2)}, checkpoint_id=str(tmp_path))
    idle = loader(rank=2, world_size=3)  # 2 lanes: rank 2 of 3 reads none
    dcp.load({"data": idle}, checkpoint_id=str(tmp_path))
    assert idle.canonical_replicas == 2
    assert list(idle) == []


class App(Stateful):
    """A user's Stateful holding the loader next to other state (torchtitan's pattern)."""

    def __init__(self, data):
        self.data, self.steps = data, 0

    def state_dict(self):
        return {"data": self.data.state_dict(), "steps": self.steps}

    def load_state_dict(self, state):
        self.data.load_state_dict(state["data"])
        self.steps = state["steps"]


def test_a_loader_inside_a_stateful_wrapper_saves_its_lanes_and_resumes_exactly(tmp_path):
    saved = advanced(4)
    dcp.save({"app": App(saved)}, checkpoint_id=str(tmp_path))
    resumed = App(loader())
    dcp.load({"app": resumed}, checkpoint_id=str(tmp_path))
    assert positions(resumed.data) == positions(saved)
    assert [b["_sample_id"].tolist() for b in resumed.data] == [b["_sample_id"].tolist() for b in saved]


def test_a_stateful_that_reaches_the_loader_through_a_helper_still_saves_its_lanes(tmp_path):
    class Collecting(App):
        def state_dict(self):
            return self._collect()

        def _collect(self):
            return {"data": self.data.state_dict(), "steps": self.steps}

    saved = advanced(4)
    dcp.save({"app": Collecting(saved)}, checkpoint_id=str(tmp_path))
    assert all(key.startswith("app.data.zephon_lanes.") or key == "app.steps"
               for key in dcp.FileSystemReader(str(tmp_path)).read_metadata().state_dict_metadata)
    resumed = Collecting(loader())
    dcp.load({"app": resumed}, checkpoint_id=str(tmp_path))
    assert positions(resumed.data) == positions(saved)
    assert list(saved.state_dict()) != ["zephon_lanes"], "outside DCP the loader's own state"


def test_two_loaders_of_different_lane_counts_load_under_their_keys(tmp_path):
    train, val = advanced(4), advanced(6, batches=1)
    dcp.save({"train": train, "val": val}, checkpoint_id=str(tmp_path))
    fresh_train, fresh_val = loader(), loader()
    dcp.load({"train": fresh_train, "val": fresh_val}, checkpoint_id=str(tmp_path))
    assert (fresh_train.canonical_replicas, fresh_val.canonical_replicas) == (4, 6)
    assert positions(fresh_train) == positions(train) and positions(fresh_val) == positions(val)


def test_loaders_of_fixed_lane_counts_load_inside_one_wrapper(tmp_path):
    class Both(Stateful):
        def __init__(self, train, val):
            self.train, self.val = train, val

        def state_dict(self):
            return {"train": self.train.state_dict(), "val": self.val.state_dict()}

        def load_state_dict(self, state):
            self.train.load_state_dict(state["train"])
            self.val.load_state_dict(state["val"])

    saved = Both(advanced(4), advanced(6, batches=1))
    dcp.save({"both": saved}, checkpoint_id=str(tmp_path))
    fresh = Both(loader(replicas=4), loader(replicas=6))
    dcp.load({"both": fresh}, checkpoint_id=str(tmp_path))
    assert positions(fresh.train) == positions(saved.train) and positions(fresh.val) == positions(saved.val)


def test_a_loader_of_another_lane_count_is_refused_before_dcp_reads(tmp_path):
    dcp.save({"data": advanced(4)}, checkpoint_id=str(tmp_path))
    other = loader(replicas=8)
    with pytest.raises(ValueError, match="holds 4 lanes .* canonical_replicas=8.*pass canonical_replicas=4"):
        dcp.load({"data": other}, checkpoint_id=str(tmp_path))

"""zephon.lightning inside a real Lightning run (CPU; DDP on gloo): killed after step 11,
resumed from step 8's checkpoint, the steps train on the uninterrupted run's batches, on one
device and on two, and a run killed on two devices resumes on one without repeating a sample."""
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_inspect

pytest.importorskip("lightning")
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_lightning.py"


def train(folder, *extra, check=True):
    done = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(folder), *extra], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def seen(folder, rank):
    """Step -> sample ids, the last record of a step winning (a resumed run trains it again)."""
    steps = {}
    for line in (Path(folder) / f"seen.{rank}").read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = [tuple(p) for p in record["ids"]]
    return steps


@pytest.mark.parametrize("devices", [1, 2])
def test_a_killed_run_resumes_on_the_batch_after_its_checkpoint(tmp_path, devices):
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    train(whole, "--devices", str(devices))
    assert train(crashed, "--devices", str(devices), "--crash-at", "11", check=False).returncode != 0
    inspected = run_inspect(crashed / "step=8.ckpt")
    assert inspected[0].startswith("read: Lightning checkpoint") and "lanes held 4" in inspected[2]
    assert run_inspect(crashed)[0].endswith("step=8.ckpt (the newest of 2 .ckpt files)")
    assert max(seen(crashed, 0)) == 11
    train(crashed, "--devices", str(devices), "--resume")
    for rank in range(devices):
        assert seen(crashed, rank) == seen(whole, rank)


def test_a_run_killed_on_two_devices_resumes_on_one(tmp_path):
    crashed = tmp_path / "crashed"
    train(crashed, "--devices", "2", "--crash-at", "11", check=False)
    before = [p for rank in range(2) for step, ids in seen(crashed, rank).items() if step <= 8 for p in ids]
    elastic = tmp_path / "elastic"
    shutil.copytree(crashed, elastic)
    (elastic / "seen.0").unlink()
    train(elastic, "--devices", "1", "--resume", "--steps", "28")
    after = [p for step, ids in seen(elastic, 0).items() for p in ids]
    assert len(after) == 20 * 4  # steps 9 .. 28 on one device
    assert len(set(before + after)) == len(before) + len(after)  # nothing read twice


def test_a_tensor_parallel_group_trains_on_one_stream_and_resumes_on_data_parallel_ranks(tmp_path):
    """ModelParallelStrategy with one replica of two tensor-parallel ranks: both train on the
    batches one device would; killed at step 11, it resumes from step 8 under DDP on two
    data-parallel ranks, reading nothing twice."""
    single, parallel = tmp_path / "single", tmp_path / "parallel"
    train(single, "--devices", "1", "--steps", "12")
    assert train(parallel, "--devices", "2", "--tensor-parallel", "2", "--crash-at", "11", check=False).returncode
    assert seen(parallel, 0) == seen(parallel, 1) == {k: v for k, v in seen(single, 0).items() if k <= 11}
    before = [p for step, ids in seen(parallel, 0).items() if step <= 8 for p in ids]
    for rank in range(2):
        (parallel / f"seen.{rank}").unlink()
    train(parallel, "--devices", "2", "--resume", "--steps", "16")
    after = [p for rank in range(2) for ids in seen(parallel, rank).values() for p in ids]
    assert len(after) == 2 * 8 * 4  # steps 9 .. 16 on two ranks
    assert len(set(before + after)) == len(before) + len(after)  # nothing read twice


def test_a_bare_loader_in_lightning_says_what_to_use(tmp_path):
    script = tmp_path / "bare.py"
    script.write_text(
        "import lightning.pytorch as pl, torch\n"
        "import zephon.torch as zt\n"
        "from zephon import Dataset, Pipeline, StaticMixtureWorkSource\n"
        "class M(pl.LightningModule):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.layer = torch.nn.Linear(3, 1)\n"
        "    def training_step(self, batch, i):\n"
        "        return self.layer(batch['_sample_id'].float()).mean()\n"
        "    def configure_optimizers(self):\n"
        "        return torch.optim.SGD(self.parameters(), lr=0.0)\n"
        "    def train_dataloader(self):\n"
        "        source = StaticMixtureWorkSource([Dataset.from_counts('a', [40] * 2)], {'a': 1.0}, chunk_size=8,\n"
        "                                         exhausted_policy='repeat')\n"
        "        return zt.DataLoader(Pipeline(source), batch_size=4, canonical_replicas=2)\n"  # endless: no length
        f"pl.Trainer(max_steps=4, accelerator='cpu', logger=False, enable_progress_bar=False, "
        f"default_root_dir={str(tmp_path)!r}).fit(M())\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("use zephon.lightning.DataModule") == 1


def test_a_stream_that_ends_before_max_steps_ends_the_run(tmp_path):
    """max_steps=1000 over a stream of 100 batches: the run stops when the stream does."""
    done = train(tmp_path / "short", "--steps", "1000")
    assert sorted(seen(tmp_path / "short", 0)) == list(range(1, 101))
    assert "the training stream has ended" in done.stderr


DDP_SCRIPT = '''
import json, sys
import lightning.pytorch as pl, torch
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.lightning import DataModule

class M(pl.LightningModule):
    def __init__(self):
        super().__init__(); self.layer = torch.nn.Linear(3, 1)
    def training_step(self, batch, i):
        with open(f"{sys.argv[1]}/seen.{self.global_rank}", "a") as f:
            f.write(json.dumps(batch["_sample_id"].tolist()) + "\\n")
        return self.layer(batch["_sample_id"].float()).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

source = StaticMixtureWorkSource([Dataset.from_counts("web", [30] * 3), Dataset.from_counts("code", [20] * 3)],
                                 {"web": 0.6, "code": 0.4}, chunk_size=8, seed=3)
data = DataModule(Pipeline(source), batch_size=4, canonical_replicas=4)
data.train_dataloader()  # before fit: Lightning has not started its processes yet
steps = data.remaining(world_size=2)
trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                     enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                     default_root_dir=sys.argv[1])
trainer.fit(M(), datamodule=data)
with open(f"{sys.argv[1]}/end.{trainer.global_rank}", "w") as f:
    json.dump({"steps": steps, "lanes": data.loader.lanes(), "global_step": trainer.global_step}, f)
'''


def test_ddp_from_lightnings_launcher_reads_each_ranks_lanes_even_when_built_before_fit(tmp_path):
    """Lightning's DDP launcher sets no RANK, and a loader built before fit sees one process:
    fit builds it again per rank, each rank reads its own lanes, and remaining(world_size=2)
    before fit is every rank's step count."""
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    ends = [json.loads((tmp_path / f"end.{rank}").read_text()) for rank in range(2)]
    assert [end["lanes"] for end in ends] == [[0, 1], [2, 3]]
    seen = [[tuple(p) for line in (tmp_path / f"seen.{rank}").read_text().splitlines() for p in json.loads(line)]
            for rank in range(2)]
    assert not set(seen[0]) & set(seen[1])
    assert ends[0]["steps"] == ends[1]["steps"] == ends[0]["global_step"] == len(seen[0]) // 4 == len(seen[1]) // 4


BARE_DDP_SCRIPT = '''
import json, sys
import lightning.pytorch as pl, torch
from lightning.pytorch.callbacks import ModelCheckpoint
import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

folder, resume = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None

class M(pl.LightningModule):
    def __init__(self):
        super().__init__(); self.layer = torch.nn.Linear(3, 1)
    def train_dataloader(self):
        source = StaticMixtureWorkSource([Dataset.from_counts("web", [30] * 3)], {"web": 1.0}, chunk_size=8)
        return zt.DataLoader(Pipeline(source), batch_size=4, canonical_replicas=4)
    def training_step(self, batch, i):
        with open(f"{folder}/{'resumed' if resume else 'whole'}.{self.global_rank}", "a") as f:
            f.write(json.dumps(batch["_sample_id"].tolist()) + "\\n")
        return self.layer(batch["_sample_id"].float()).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

saves = [] if resume else [ModelCheckpoint(dirpath=folder, every_n_train_steps=4, save_top_k=-1, filename="{step}")]
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", logger=False, callbacks=saves,
                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=folder)
trainer.fit(M(), ckpt_path=resume)
'''


def test_a_bare_loader_under_ddp_resumes_every_rank(tmp_path):
    """Lightning keeps rank 0's copy of a loader's state: the bare loader gives it every rank's
    lanes (gathered), so each rank resumes on the batch after its checkpoint."""
    script = tmp_path / "bare_ddp.py"
    script.write_text(BARE_DDP_SCRIPT)
    for extra in ([], [str(tmp_path / "step=4.ckpt")]):
        done = subprocess.run([sys.executable, str(script), str(tmp_path), *extra], capture_output=True, text=True,
                              timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        whole, resumed = ((tmp_path / f"{run}.{rank}").read_text().splitlines() for run in ("whole", "resumed"))
        assert len(whole) > 4 and resumed == whole[4:]


def test_the_models_own_batch_hook_runs_and_the_steps_are_still_counted(tmp_path):
    """The data module counts steps with a callback: a model's on_before_batch_transfer is
    not replaced by a data module hook, and the saved state is that of the last step's batch."""
    import lightning.pytorch as pl
    import torch

    import zephon.torch as zt
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon.lightning import DataModule

    def pipeline():
        return Pipeline(StaticMixtureWorkSource([Dataset.from_counts("a", [40] * 2)], {"a": 1.0}, chunk_size=8))

    class Hooked(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            return {**batch, "x": batch["_sample_id"].float()}

        def training_step(self, batch, batch_idx):
            return self.layer(batch["x"]).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    data = DataModule(pipeline(), batch_size=4, canonical_replicas=2)
    pl.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
               enable_checkpointing=False, default_root_dir=tmp_path).fit(Hooked(), datamodule=data)
    reference = zt.DataLoader(pipeline(), batch_size=4, canonical_replicas=2)
    it = iter(reference)
    for _ in range(3):
        next(it)
    saved = zt.merge_states([next(iter(data.state_dict().values()))])
    assert saved["lanes"] == reference.state_dict()["lanes"]


def test_remaining_before_fit_counts_for_the_ranks_asked(caplog):
    import zephon.torch as zt
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon.lightning import DataModule

    source = StaticMixtureWorkSource([Dataset.from_counts("a", [40] * 2)], {"a": 1.0}, chunk_size=8)
    data = DataModule(Pipeline(source), batch_size=4, canonical_replicas=4)
    assert data.remaining(world_size=1) == 20
    second = zt.DataLoader(Pipeline(source), batch_size=4, canonical_replicas=4, rank=1, world_size=2)
    assert data.remaining(world_size=2) == second.remaining() < 20  # with even_batches, every rank's count
    assert data.loader is None  # counting builds no loader of the data module's
    with caplog.at_level(logging.WARNING, logger="zephon"):
        assert data.remaining() == 20
    assert "world_size=<devices x nodes>" in caplog.text
    with pytest.raises(ValueError, match="world_size=0"):
        data.remaining(world_size=0)


def test_a_bare_finite_loader_resumed_mid_epoch_trains_the_rest_of_the_epoch(tmp_path):
    """Lightning counts the batches of its epoch and ends it at len(loader): a loader resumed
    mid-epoch is as long as the whole epoch, so max_epochs=1 trains every batch left."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    import zephon.torch as zt
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    class Bare(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer, self.seen = torch.nn.Linear(3, 1), []

        def train_dataloader(self):
            source = StaticMixtureWorkSource([Dataset.from_counts("a", [30] * 2)], {"a": 1.0}, chunk_size=8)
            return zt.DataLoader(Pipeline(source), batch_size=4, canonical_replicas=2)

        def training_step(self, batch, batch_idx):
            self.seen.append(batch["_sample_id"].tolist())
            return self.layer(batch["_sample_id"].float()).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    def fit(ckpt=None):
        model = Bare()
        callbacks = [] if ckpt else [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5, save_top_k=-1,
                                                     filename="{step}")]
        pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                   enable_model_summary=False, callbacks=callbacks, default_root_dir=tmp_path).fit(model, ckpt_path=ckpt)
        return model.seen

    whole = fit()
    assert len(whole) == 16  # the lanes' last batches are short
    assert fit(tmp_path / "step=5.ckpt") == whole[5:]
    assert fit(tmp_path / "step=10.ckpt") == whole[10:]

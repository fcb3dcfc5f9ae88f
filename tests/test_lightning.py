"""zephon.lightning inside a real Lightning run (CPU; DDP on gloo): killed after step 11,
resumed from step 8's checkpoint, the steps train on the uninterrupted run's batches, on one
device and on two, and a run killed on two devices resumes on one without repeating a sample."""
import json
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

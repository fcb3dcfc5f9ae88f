"""``zephon inspect`` on every kind of checkpoint a run leaves (a file, a checkpoint directory
and its step folders, DCP, the frameworks' folders: those are run in test_lightning.py and
test_hf.py), and on paths that hold none: exit 2 with one line on stderr, never a traceback."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.cli import main
from zephon.runtime import merge_states
from zephon.runtime._checkpoint import HF_STATE_FILE

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def loaders(world=2, replicas=4):
    datasets = [Dataset.from_counts("web", [40] * 3), Dataset.from_counts("code", [30] * 2)]
    source = StaticMixtureWorkSource(datasets, {"web": 0.6, "code": 0.4}, chunk_size=8, seed=5)
    out = [zt.DataLoader(Pipeline(source), batch_size=4, canonical_replicas=replicas, rank=r, world_size=world,
                         even_batches=False) for r in range(world)]
    for it in [iter(loader) for loader in out]:
        next(it), next(it)
    return out


def summary(capsys, path):
    """What inspect prints for ``path`` after its "read:" line."""
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("read: ")
    return out[1:]


def test_every_kind_of_checkpoint_of_one_state_gives_its_summary(tmp_path, capsys):
    ranks = loaders()
    merged = merge_states([loader.state_dict() for loader in ranks])
    zt.save_checkpoint(tmp_path / "one.ckpt", merged)
    expected = summary(capsys, tmp_path / "one.ckpt")
    assert expected[0].startswith("loader state:") and "lanes held 4" in expected[1]
    (tmp_path / "state.json").write_text(json.dumps(merged))
    for loader in ranks:
        zt.save_checkpoint_dir(tmp_path / "dir", loader, step=7)
    (step,) = os.listdir(tmp_path / "dir")
    hf = tmp_path / "hf" / "checkpoint-12"
    hf.mkdir(parents=True)
    shutil.copy(tmp_path / "one.ckpt", hf / HF_STATE_FILE)
    dcp.save({"data": ranks[0], "other": ranks[1]}, checkpoint_id=str(tmp_path / "dcp"))
    for path in ("state.json", "dir", f"dir/{step}", f"dir/{step}/complete.ckpt", "hf", "hf/checkpoint-12"):
        assert summary(capsys, tmp_path / path) == expected, path
    assert main(["inspect", str(tmp_path / "dcp")]) == 0
    out = capsys.readouterr().out
    assert "DCP checkpoint" in out and "entry 'data'" in out and "entry 'other'" in out


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _odd_paths(tmp_path):
    good = tmp_path / "good.ckpt"
    zt.save_checkpoint(good, loaders(1, 2)[0].state_dict())
    text = good.read_bytes()
    _write(tmp_path / "empty", b"")
    _write(tmp_path / "random", os.urandom(500))
    _write(tmp_path / "zip", b"PK\x03\x04" + os.urandom(100))
    _write(tmp_path / "list.json", b"[1, 2]")
    _write(tmp_path / "deep.json", b"[" * 100000)
    _write(tmp_path / "kind.json", b'{"kind": "other"}')
    _write(tmp_path / "torn.ckpt", text[:len(text) // 2])
    _write(tmp_path / "flipped.ckpt", text[:-10] + bytes(b ^ 1 for b in text[-10:]))
    (tmp_path / "empty-dir").mkdir()
    _write(tmp_path / "dcp" / ".metadata", b"not a pickle")
    (tmp_path / "dir" / "step-000000000003.0123456789abcdef").mkdir(parents=True)
    _write(tmp_path / "hf" / "checkpoint-3" / HF_STATE_FILE, b"garbage")
    _write(tmp_path / "ckpts" / "last.ckpt", b"PK\x03\x04")
    _write(tmp_path / "source.json", b'{"kind": "zephon.StaticMixtureWorkSource", "state": 5}')
    _write(tmp_path / "phases.json", b'{"kind": "zephon.PhasedMixtureWorkSource", "phases": [5]}')
    torch.save({"DataModule": {"zephon_loader": None}}, tmp_path / "unbuilt.ckpt")
    torch.save({"state_dict": {"w": torch.ones(2)}}, tmp_path / "model.ckpt")
    with open(tmp_path / "huge", "wb") as f:
        f.truncate(2**29)  # sparse: refused by its size, never read
    _write(tmp_path / "named" / "step-000100.ckpt", b"not a checkpoint")  # Lightning's file, not a step folder
    dcp.save({"data": loaders(1, 2)[0]}, checkpoint_id=str(tmp_path / "torn-dcp"))
    (data,) = [p for p in (tmp_path / "torn-dcp").iterdir() if p.suffix == ".distcp"]
    data.write_bytes(data.read_bytes()[:100])
    return ["missing", "empty", "random", "zip", "list.json", "deep.json", "kind.json", "torn.ckpt", "flipped.ckpt",
            "empty-dir", "dcp", "dir", "hf", "ckpts", "/dev/null", "source.json", "phases.json", "unbuilt.ckpt",
            "model.ckpt", "huge", "named", "torn-dcp"]


def test_a_path_that_holds_no_checkpoint_exits_2_with_one_line(tmp_path):
    for name in _odd_paths(tmp_path):
        done = subprocess.run([sys.executable, "-m", "zephon", "inspect", str(tmp_path / name)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and done.stdout == "", (name, done.stdout, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("zephon inspect: "), (name, done.stderr)


def test_a_dcp_folder_is_inspected_without_torch_warnings(tmp_path):
    dcp.save({"data": loaders(1, 2)[0]}, checkpoint_id=str(tmp_path / "dcp"))
    done = subprocess.run([sys.executable, "-m", "zephon", "inspect", str(tmp_path / "dcp")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith(f"read: DCP checkpoint {tmp_path / 'dcp'}, entry 'data'")

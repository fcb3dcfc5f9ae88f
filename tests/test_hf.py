"""zephon.hf.Trainer inside a real transformers.Trainer run (CPU; torchrun with gloo for two
processes): killed after step 7, resumed from checkpoint-4, the steps train on the uninterrupted
run's sequences, and every process reads its own lanes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_hf.py"


def train(out, processes, *extra, check=True):
    launch = [sys.executable] if processes == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                      "--nproc-per-node", str(processes)]
    done = subprocess.run([*launch, str(SCRIPT), "--out", str(out), *extra], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def seen(out, rank):
    steps = {}
    for line in (Path(out) / f"seen.{rank}").read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = record["sequences"]
    return steps


@pytest.mark.parametrize("processes", [1, 2])
def test_a_killed_trainer_resumes_on_the_batch_after_its_checkpoint(tmp_path, processes):
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    train(whole, processes)
    assert train(crashed, processes, "--crash-at", "7", check=False).returncode != 0
    assert (crashed / "checkpoint-4" / "zephon_loader.ckpt").exists()
    train(crashed, processes, "--resume")
    runs = [seen(whole, rank) for rank in range(processes)]
    assert all(sorted(run) == list(range(1, 13)) for run in runs)
    assert [seen(crashed, rank) for rank in range(processes)] == runs
    if processes == 2:  # each process read its own lanes: no sequence in common
        pieces = [{tuple(p) for s in run.values() for seq in s for p in seq} for run in runs]
        assert not pieces[0] & pieces[1]

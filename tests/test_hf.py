"""zephon.hf.Trainer inside a real transformers.Trainer run (CPU; torchrun with gloo for two
processes): killed after step 7, resumed from checkpoint-4, the steps train on the uninterrupted
run's sequences, and every process reads its own lanes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_inspect

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
    inspected = run_inspect(crashed)
    assert "newest of 1 transformers checkpoints" in inspected[0] and "checkpoint-4" in inspected[0]
    assert run_inspect(crashed / "checkpoint-4")[1:] == inspected[1:]
    train(crashed, processes, "--resume")
    runs = [seen(whole, rank) for rank in range(processes)]
    assert all(sorted(run) == list(range(1, 13)) for run in runs)
    assert [seen(crashed, rank) for rank in range(processes)] == runs
    if processes == 2:  # each process read its own lanes: no sequence in common
        pieces = [{tuple(p) for s in run.values() for seq in s for p in seq} for run in runs]
        assert not pieces[0] & pieces[1]


def test_max_steps_defaults_to_the_loaders_optimizer_steps(tmp_path):
    """With gradient accumulation, the default max_steps counts updates, not batches: the run
    takes every batch once and its learning-rate schedule ends at 0."""
    sys.path.insert(0, str(SCRIPT.parent))
    import train_hf
    import zephon.torch as zt
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon.hf import Trainer

    source = StaticMixtureWorkSource([Dataset.from_records("web", [[{"text": "xx x xxx " * 3}] * 30] * 2)],
                                     {"web": 1.0}, chunk_size=8)
    loader = zt.DataLoader(Pipeline(source).tokenize(train_hf.word_lengths, eos_id=0).pack(16, pad_id=0),
                           batch_size=2, canonical_replicas=2, collate_fn=train_hf.lm_batch)
    batches = loader.remaining()
    args = TrainingArguments(output_dir=str(tmp_path), gradient_accumulation_steps=4, use_cpu=True, report_to=[],
                             save_strategy="no", disable_tqdm=True, lr_scheduler_type="linear")
    model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=16, n_embd=8, n_layer=1, n_head=2))
    trainer = Trainer(model=model, args=args, train_loader=loader)
    trainer.train()
    assert trainer.state.global_step == -(-batches // 4) == args.max_steps
    assert loader.remaining() == 0 and trainer.lr_scheduler.get_last_lr()[0] == 0


def test_a_tensor_parallel_group_trains_on_the_stream_of_one_process_and_resumes(tmp_path):
    """A (dp=1, tp=2) mesh under torchrun: both ranks train on the batches one process reads,
    and a run killed after step 7 resumes from checkpoint-4 on them."""
    single, crashed = tmp_path / "single", tmp_path / "crashed"
    train(single, 1)
    assert train(crashed, 2, "--tensor-parallel", "2", "--crash-at", "7", check=False).returncode != 0
    train(crashed, 2, "--tensor-parallel", "2", "--resume")
    assert seen(crashed, 0) == seen(crashed, 1) == seen(single, 0)

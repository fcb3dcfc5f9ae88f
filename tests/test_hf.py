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


def _tiny_run(out, *, endless=False, save_steps=10, max_steps=-1, accumulation=1):
    """A zephon.hf.Trainer over a linear model of the sample ids (what the steps see is the point)."""
    import torch
    from transformers import TrainingArguments
    import zephon.torch as zt
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon.hf import Trainer

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def forward(self, sample=None):
            return {"loss": self.layer(sample).pow(2).mean()}

    def collate(items):
        batch = zt.collate(items)
        batch["sample"] = batch["_sample_id"].float()
        return batch

    kw = dict(exhausted_policy="repeat", stop_after_passes=None) if endless else {}
    source = StaticMixtureWorkSource([Dataset.from_counts("web", [30] * 3)], {"web": 1.0}, chunk_size=8, **kw)
    loader = zt.DataLoader(Pipeline(source), batch_size=4, canonical_replicas=4, collate_fn=collate,
                           even_batches=not endless)
    args = TrainingArguments(output_dir=str(out), use_cpu=True, report_to=[], disable_tqdm=True, save_steps=save_steps,
                             max_steps=max_steps, num_train_epochs=3, gradient_accumulation_steps=accumulation)
    return Trainer(model=Linear(), args=args, train_loader=loader)


def test_the_epoch_after_a_resume_counts_the_batches_before_the_checkpoint(tmp_path):
    whole = _tiny_run(tmp_path / "whole")
    whole.train()
    assert whole.state.global_step == 24 and whole.state.epoch == 1.0  # 24 batches: one epoch
    resumed = _tiny_run(tmp_path / "whole")
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-10"))
    assert resumed.state.global_step == 24 and resumed.state.epoch == 1.0
    assert [h["epoch"] for h in resumed.state.log_history] == [h["epoch"] for h in whole.state.log_history]


def test_a_resume_with_gradient_accumulation_makes_the_uninterrupted_runs_updates(tmp_path):
    """24 batches in updates of 5: the epoch's last update has 4. Resumed after 2 updates (10
    batches), Trainer counts the epoch's batches on from there, so that last update is made."""
    import torch

    whole = _tiny_run(tmp_path / "whole", save_steps=2, accumulation=5)
    whole.train()
    assert whole.state.global_step == 5 and whole.state.epoch == 1.0
    resumed = _tiny_run(tmp_path / "whole", save_steps=2, accumulation=5)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    assert resumed.state.global_step == 5 and resumed.state.epoch == 1.0
    assert resumed.train_loader.remaining() == 0
    for mine, theirs in zip(resumed.model.parameters(), whole.model.parameters()):
        assert torch.equal(mine, theirs)


def test_a_resume_on_another_number_of_ranks_says_what_max_steps_is(tmp_path, caplog):
    """The run's max_steps is kept across resumes (its learning-rate schedule's); on another
    number of data-parallel ranks the data left may not fit it, and a warning says both."""
    whole = _tiny_run(tmp_path / "run")
    whole.train()
    run_file = tmp_path / "run" / "checkpoint-10" / "zephon_run.json"
    assert json.loads(run_file.read_text()) == {"max_steps": 24, "data_parallel": 1}

    def resume(max_steps=-1):
        caplog.clear()
        with caplog.at_level("WARNING", logger="zephon"):
            _tiny_run(tmp_path / "run", max_steps=max_steps).train(resume_from_checkpoint=str(run_file.parent))
        return [r.getMessage() for r in caplog.records if "data-parallel ranks" in r.getMessage()]
    assert resume() == []
    run_file.write_text(json.dumps({"max_steps": 24, "data_parallel": 2}))  # as if saved on two ranks
    said = resume()
    assert len(said) == 1 and "saved on 2 data-parallel ranks and resumes on 1: max_steps is 24 (the run's" in said[0]
    assert "(14 left); the loader has 14 batches left on this process, in updates of 1" in said[0]
    said = resume(max_steps=20)
    assert len(said) == 1 and "max_steps is 20 (set for this run) (10 left)" in said[0]


def test_misuse_says_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="cannot count.*set max_steps"):
        _tiny_run(tmp_path / "endless", endless=True).train()
    foreign = tmp_path / "foreign" / "checkpoint-2"
    foreign.mkdir(parents=True)
    (foreign / "trainer_state.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="has no zephon_loader.ckpt or zephon_run.json: it was not saved by "
                                                "zephon.hf.Trainer.*start without resume_from_checkpoint"):
        _tiny_run(tmp_path / "foreign").train(resume_from_checkpoint=True)

"""Train a tiny GPT-2 with transformers.Trainer on a zephon DataLoader: checkpoints resume exactly.

    python examples/train_hf.py --out /tmp/hf --crash-at 7          # killed after step 7
    python examples/train_hf.py --out /tmp/hf --resume              # from checkpoint-4
    torchrun --nproc-per-node 2 examples/train_hf.py --out /tmp/hf2 # two processes (gloo)
    torchrun --nproc-per-node 2 examples/train_hf.py --out /tmp/hf3 --tensor-parallel 2  # one replica, 2 ranks

The model is built from a config (nothing downloaded). Three small in-memory corpora are
tokenized (by word length, a stand-in tokenizer) and packed into sequences of 16 tokens; every
process reads its own lanes, and each ``checkpoint-*`` directory holds the loader's state of the
batch the step trained on, so ``train(resume_from_checkpoint=...)`` trains on the next one.
Every step appends the sequences it trained on to ``--out/seen.<rank>``. With
``--tensor-parallel N`` the loader takes a ``(dp, tp)`` device mesh: the N ranks of a
tensor-parallel group train on the same batches (the tiny model itself is not split).
"""
import argparse
import gc
import json
import os
import signal

import numpy as np
import torch
from torch.distributed.device_mesh import init_device_mesh
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.hf import Trainer


def corpus(name: str, words: tuple[int, int], seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    shards = [[{"text": " ".join("x" * rng.integers(1, 9) for _ in range(rng.integers(*words)))} for _ in range(40)]
              for _ in range(4)]
    return Dataset.from_records(name, shards)


def word_lengths(text: str) -> list[int]:
    return [len(word) for word in text.split()]


def lm_batch(items):
    """zephon's batch of packed sequences, with the labels GPT-2 learns (not across padding)."""
    batch = zt.collate(items)
    batch["labels"] = batch["input_ids"].masked_fill(batch["segment_ids"] == 0, -100)
    return batch


class LoggingTrainer(Trainer):
    """Records what each step trains on and, with ``crash_at``, dies there (SIGKILL)."""

    def __init__(self, *args, seen: str, crash_at: int | None, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen, self.crash_at = seen, crash_at

    def training_step(self, model, inputs, num_items_in_batch=None):
        with open(f"{self.seen}.{self.args.process_index}", "a") as f:
            f.write(json.dumps({"step": self.state.global_step + 1, "sequences": inputs["_documents"]}) + "\n")
        if self.state.global_step + 1 == self.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().training_step(model, inputs, num_items_in_batch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="hf-run")
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    parser.add_argument("--tensor-parallel", type=int, default=None,
                        help="ranks per tensor-parallel group: the loader reads per data-parallel rank of the mesh")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    source = StaticMixtureWorkSource([corpus("web", (3, 20), 0), corpus("code", (10, 30), 1),
                                      corpus("books", (30, 60), 2)], {"web": 0.6, "code": 0.3, "books": 0.1},
                                     chunk_size=16, seed=5)
    pipeline = Pipeline(source).tokenize(word_lengths, eos_id=0).pack(16, pad_id=0)
    training = TrainingArguments(output_dir=args.out, max_steps=12, save_steps=4, logging_steps=4,
                                 learning_rate=1e-3, use_cpu=True, report_to=[],
                                 ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
                                 save_safetensors=False, disable_tqdm=True)
    layout = {}
    if args.tensor_parallel:  # the process group exists once the arguments know their device
        tp = args.tensor_parallel
        layout["device_mesh"] = init_device_mesh(training.device.type, (training.world_size // tp, tp),
                                                 mesh_dim_names=("dp", "tp"))
    loader = zt.DataLoader(pipeline, batch_size=4, canonical_replicas=4, collate_fn=lm_batch, **layout)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    trainer = LoggingTrainer(model=model, args=training, train_loader=loader,
                             seen=os.path.join(args.out, "seen"), crash_at=args.crash_at)
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    if torch.distributed.is_initialized():
        del trainer, model  # DDP's reducer holds the process group: if it let go last, at exit, torch could abort
        gc.collect()
        torch.distributed.barrier()  # every rank leaves together
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

"""Train a tiny model with PyTorch Lightning on a zephon DataModule: checkpoints resume exactly.

    python examples/train_lightning.py --dir /tmp/lit --crash-at 11   # killed after step 11
    python examples/train_lightning.py --dir /tmp/lit --resume         # from step 8's checkpoint
    python examples/train_lightning.py --dir /tmp/lit2 --devices 2     # DDP on CPU (gloo)
    python examples/train_lightning.py --dir /tmp/lit3 --devices 2 --tensor-parallel 2  # one replica of 2 ranks

Lightning saves a checkpoint every 4 steps (``ModelCheckpoint``); the data module's state in it
is the loader's state as of the batch the step trained on, so ``trainer.fit(...,
ckpt_path=...)`` continues with the next batch, on any number of devices. Every step appends
the sample ids it trained on to ``--dir/seen.<rank>``. With ``--tensor-parallel N`` the run
uses ``ModelParallelStrategy``: the data module reads per data-parallel rank of its mesh, so the
N ranks of a tensor-parallel group train on the same batches (the tiny model itself is not
split).
"""
import argparse
import json
import os
import signal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.lightning import DataModule


class Tiny(pl.LightningModule):
    """A linear model on the sample ids (the point is which samples each step sees)."""

    def __init__(self, seen: str, crash_at: int | None):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.seen, self.crash_at = seen, crash_at

    def training_step(self, batch, batch_idx):
        ids = batch["_sample_id"]
        with open(f"{self.seen}.{self.global_rank}", "a") as f:
            f.write(json.dumps({"step": self.global_step + 1, "ids": ids.tolist()}) + "\n")
        if self.global_step + 1 == self.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)  # as a failure would
        return self.layer(ids.float()).pow(2).mean()

    def configure_model(self):
        """Where a model would be split over ``self.device_mesh["tensor_parallel"]``; this one stays whole."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-6)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="lightning-run")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--tensor-parallel", type=int, default=None, help="ranks per tensor-parallel group")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --dir")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)

    source = StaticMixtureWorkSource([Dataset.from_counts("web", [50] * 4), Dataset.from_counts("code", [30] * 4)],
                                     {"web": 0.7, "code": 0.3}, chunk_size=8, seed=3)
    data = DataModule(Pipeline(source), batch_size=4, canonical_replicas=4)
    checkpoints = ModelCheckpoint(dirpath=args.dir, every_n_train_steps=4, save_top_k=-1, filename="{step}")
    strategy = "ddp" if args.devices > 1 else "auto"
    if args.tensor_parallel:
        strategy = ModelParallelStrategy(data_parallel_size=args.devices // args.tensor_parallel,
                                         tensor_parallel_size=args.tensor_parallel, save_distributed_checkpoint=False)
    trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", devices=args.devices, strategy=strategy,
                         callbacks=[checkpoints], logger=False, enable_progress_bar=False, enable_model_summary=False)
    newest = None
    if args.resume:
        steps = [int(name[len("step="):-len(".ckpt")]) for name in os.listdir(args.dir) if name.endswith(".ckpt")]
        newest = os.path.join(args.dir, f"step={max(steps)}.ckpt")
    trainer.fit(Tiny(os.path.join(args.dir, "seen"), args.crash_at), datamodule=data, ckpt_path=newest)


if __name__ == "__main__":
    main()

"""Train a tiny model through zephon.torch.DataLoader, with checkpoints and resume.

    python examples/train_tiny.py --steps 60 --checkpoint-dir /tmp/tiny
    torchrun --nproc-per-node 2 examples/train_tiny.py --steps 60 --checkpoint-dir /tmp/tiny

Two in-memory datasets of (x, y) records, mixed 3:1, train a linear model. Every
``--save-every`` steps the run checkpoints the model and the loader; run the script again with
the same ``--checkpoint-dir`` and it continues where it stopped, also on another number of
processes (the data checkpoint records lanes, not ranks). ``--stop-at N`` ends the run after
step N, as a crash would. ``--checkpoint`` chooses how:

* ``file``: the ranks gather the loader's state (a collective) and rank 0 writes one file;
* ``dir``: every rank saves its own lanes into a checkpoint directory (no collective); a step
  counts once every rank's file is there;
* ``dcp``: model, optimizer and loader go through ``torch.distributed.checkpoint``, one
  folder per step (DCP writes the folder's ``.metadata`` last: a folder with it is complete).
"""
import argparse
import gc
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

FEATURES = 4


def make_records(seed, shards, rows, noise):
    """Shards of records {"x": 4 floats, "y": float} from one linear function, plus noise."""
    rng = np.random.default_rng(seed)
    w = np.array([1.0, -2.0, 0.5, 3.0])
    out = []
    for _ in range(shards):
        x = rng.normal(size=(rows, FEATURES))
        y = x @ w + noise * rng.normal(size=rows)
        out.append([{"x": xi.tolist(), "y": float(yi)} for xi, yi in zip(x, y)])
    return out


def to_tensors(item):
    """A map step: the record's fields as float32 tensors (``_sample_id`` and ``_component`` are kept)."""
    return {**item, "x": torch.tensor(item["x"], dtype=torch.float32),
            "y": torch.tensor(item["y"], dtype=torch.float32)}


def resume_file(directory, loader, net, optimizer):
    data_path = os.path.join(directory, "data.ckpt")
    if not os.path.exists(data_path):
        return 0
    loader.load_state_dict(zt.load_checkpoint(data_path))  # any number of ranks and workers
    saved = torch.load(os.path.join(directory, "model.pt"))
    net.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return saved["step"]


def save_file(directory, loader, net, optimizer, step):
    state = zt.all_gather_state(loader.state_dict())  # a collective: every rank calls it
    if rank_of() == 0:
        os.makedirs(directory, exist_ok=True)
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                   os.path.join(directory, "model.pt"))
        zt.save_checkpoint(os.path.join(directory, "data.ckpt"), state)  # written last: the checkpoint is complete


def resume_dir(directory, loader, net, optimizer):
    steps = zt.complete_steps(os.path.join(directory, "data"))
    if not steps:
        return 0
    loader.load_state_dict(zt.load_checkpoint_dir(os.path.join(directory, "data"), steps[-1]))
    saved = torch.load(os.path.join(directory, f"model-{steps[-1]}.pt"))
    net.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return steps[-1]


def save_dir(directory, loader, net, optimizer, step):
    if rank_of() == 0:  # the model first: a step whose data is complete has its model
        os.makedirs(directory, exist_ok=True)
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict()},
                   os.path.join(directory, f"model-{step}.pt"))
    zt.save_checkpoint_dir(os.path.join(directory, "data"), loader, step=step)  # every rank, no collective


def dcp_state(loader, net, optimizer, step):
    model, optim = get_state_dict(net, optimizer)
    return {"model": model, "optimizer": optim, "data": loader, "step": torch.tensor(step)}


def resume_dcp(directory, loader, net, optimizer):
    done = [name for name in os.listdir(directory) if os.path.exists(os.path.join(directory, name, ".metadata"))] \
        if os.path.isdir(directory) else []
    if not done:
        return 0
    state = dcp_state(loader, net, optimizer, 0)
    dcp.load(state, checkpoint_id=os.path.join(directory, max(done)))  # the loader is a Stateful
    set_state_dict(net, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return int(state["step"])


def save_dcp(directory, loader, net, optimizer, step):
    dcp.save(dcp_state(loader, net, optimizer, step), checkpoint_id=os.path.join(directory, f"step-{step:08d}"))


CHECKPOINTS = {"file": (resume_file, save_file), "dir": (resume_dir, save_dir), "dcp": (resume_dcp, save_dcp)}


def rank_of():
    return dist.get_rank() if dist.is_initialized() else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--stop-at", type=int, default=None, help="end after this step, as a crash would")
    parser.add_argument("--checkpoint-dir", default="tiny-checkpoints")
    parser.add_argument("--checkpoint", choices=sorted(CHECKPOINTS), default="file")
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()

    if "WORLD_SIZE" in os.environ:  # launched by torchrun: one process per rank
        dist.init_process_group("gloo")
    torch.manual_seed(0)

    source = StaticMixtureWorkSource(
        [Dataset.from_records("clean", make_records(0, 8, 64, 0.01)),
         Dataset.from_records("noisy", make_records(1, 4, 64, 0.3))],
        {"clean": 0.75, "noisy": 0.25}, chunk_size=64, seed=7, shuffle_within_shard=True,
        exhausted_policy="repeat",  # an endless stream: the loop decides when to stop
    )
    loader = zt.DataLoader(Pipeline(source).map(to_tensors), batch_size=16, num_workers=args.workers,
                           canonical_replicas=4)
    net = torch.nn.Linear(FEATURES, 1)
    model = torch.nn.parallel.DistributedDataParallel(net) if dist.is_initialized() else net
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)

    resume, save = CHECKPOINTS[args.checkpoint]
    step = resume(args.checkpoint_dir, loader, net, optimizer)
    if step and rank_of() == 0:
        print(f"resumed at step {step}")

    for batch in loader:
        if step >= args.steps:
            break
        loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % args.save_every == 0:
            save(args.checkpoint_dir, loader, net, optimizer, step)
            if rank_of() == 0:
                print(f"step {step}: loss {loss.item():.4f} (checkpoint saved)")
        if step == args.stop_at:
            break

    if dist.is_initialized():
        del model  # DDP's reducer holds the process group: if it let go last, at exit, torch could deadlock
        gc.collect()
        dist.barrier()  # every rank leaves together: none tears its connections down under a peer still working
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

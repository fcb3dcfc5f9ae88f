"""Data parallelism inside a model-parallel job: zephon reads per data-parallel rank of a DeviceMesh.

    torchrun --nproc-per-node 4 examples/train_parallel.py --mesh dp=2,tp=2 --out /tmp/par
    torchrun --nproc-per-node 8 examples/train_parallel.py --mesh pp=2,dp=2,tp=2 --out /tmp/par --crash-at 6
    torchrun --nproc-per-node 4 examples/train_parallel.py --mesh dp=4,tp=1 --out /tmp/par4 \
        --resume /tmp/par/ckpt                                          # another layout, same data

The mesh is built as torchtitan builds it (``init_device_mesh`` with named dimensions); the
loader takes it with ``dp_dims=("dp",)``. The ranks of a tensor-parallel group check, at every
step, that they hold the same batch (as a real tensor-parallel layer needs), and the
data-parallel ranks all-reduce a stand-in gradient over their group. Every rank appends the
sample ids it trains on to ``--out/seen.<rank>``; every ``--save-every`` steps the loader's
state goes to the checkpoint directory ``--out/ckpt`` (a file per data-parallel rank, written
by the replica's first rank). ``--crash-at N`` kills every process after step N, as a failure
would; ``--resume DIR`` continues from that directory's newest complete step.
"""
import argparse
import gc
import hashlib
import json
import os
import signal

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource


def pipeline():
    source = StaticMixtureWorkSource([Dataset.from_counts("web", [60] * 8), Dataset.from_counts("code", [40] * 6)],
                                     {"web": 0.7, "code": 0.3}, chunk_size=8, seed=11)
    return Pipeline(source)


def same_in_group(batch, group):
    """Whether every rank of ``group`` holds this batch (its sample ids' digest, gathered)."""
    digest = hashlib.sha256(batch["_sample_id"].numpy().tobytes()).digest()
    mine = torch.frombuffer(bytearray(digest), dtype=torch.uint8)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    return all(torch.equal(g, mine) for g in gathered)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="dp=2,tp=2", help="dimension=size pairs, outermost first")
    parser.add_argument("--out", default="parallel-run")
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--resume", default=None, help="a checkpoint directory to continue from")
    args = parser.parse_args()
    names, sizes = zip(*((name, int(size)) for name, size in (pair.split("=") for pair in args.mesh.split(","))))

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", sizes, mesh_dim_names=names)
    loader = zt.DataLoader(pipeline(), batch_size=8, canonical_replicas=16, device_mesh=mesh, dp_dims=("dp",))
    if args.resume:
        loader.load_state_dict(zt.load_checkpoint_dir(args.resume))
    rank = dist.get_rank()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"seen.{rank}"), "w") as seen:
        for step, batch in enumerate(loader, 1):
            if "tp" in names and not same_in_group(batch, mesh["tp"].get_group()):
                raise RuntimeError(f"rank {rank}: the tensor-parallel group holds different batches at step {step}")
            dist.all_reduce(torch.ones(1), group=mesh["dp"].get_group())  # the gradient all-reduce, standing in
            seen.write(json.dumps(batch["_sample_id"].tolist()) + "\n")
            seen.flush()
            if step % args.save_every == 0:
                zt.save_checkpoint_dir(os.path.join(args.out, "ckpt"), loader, step=step)
            if step == args.crash_at:
                dist.barrier()  # every rank has taken step N: the whole job fails there, not one rank a step early
                os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:
        print(f"{step} steps on data-parallel rank {loader.topology.rank} of {loader.topology.world_size}")
    del loader, mesh
    gc.collect()
    dist.barrier()  # every rank leaves together
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Pretrain a tiny GPT on packed token sequences, with checkpoints, a crash and an elastic resume.

    python examples/pretrain_llm.py --out /tmp/llm
    torchrun --nproc-per-node 2 examples/pretrain_llm.py --out /tmp/llm --crash-at 12
    torchrun --nproc-per-node 3 examples/pretrain_llm.py --out /tmp/llm

Three generated corpora (web, code, books: short, medium and long documents) are written as
JSONL files under ``--out``, a byte-pair tokenizer is trained on them (``tokenizers``,
nothing downloaded), and the token-aware mixture 0.6 / 0.3 / 0.1 is tokenized, packed into
sequences of ``--seq-len`` tokens and held to its token shares by ``ensure_mixture("strict")``.
The model attends only within each document of a sequence (``segment_ids``).

Every ``--save-every`` steps, and at the end, rank 0 writes the model and the loader's global
state; run the script again with the same ``--out`` and it continues from there, on any
number of processes. ``--crash-at N`` kills every process after step N (SIGKILL), as a failure would.
Each rank logs what it trained on to ``--out/seen.<rank>.jsonl`` (step, then the pieces of
every sequence: pointer, component and token span).
"""
import argparse
import gc
import json
import os
import signal
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.work import TokenEstimation

CORPORA = {"web": (100, 4, 30), "code": (50, 20, 90), "books": (20, 60, 200)}  # docs per shard, words per doc
WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ro", "su", "ti") for b in ("n", "s", "t", "la", "ro", "")]


def write_corpora(root: Path) -> dict[str, Path]:
    """Four JSONL shards per corpus of generated text (the same on every run)."""
    rng = np.random.default_rng(0)
    paths = {}
    for name, (docs, low, high) in CORPORA.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for shard in range(4):
            lines = [json.dumps({"text": " ".join(rng.choice(WORDS, rng.integers(low, high)))}) for _ in range(docs)]
            (folder / f"{shard}.jsonl").write_text("\n".join(lines) + "\n")
        paths[name] = folder
    return paths


def train_tokenizer(paths: dict[str, Path], target: Path):
    """A byte-pair tokenizer trained on the corpora, saved once and reloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if not target.exists():
        tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["[PAD]", "[EOS]", "[UNK]"], show_progress=False)
        texts = (json.loads(line)["text"] for p in paths.values() for f in sorted(p.glob("*.jsonl"))
                 for line in f.read_text().splitlines())
        tokenizer.train_from_iterator(texts, trainer)
        tokenizer.save(str(target))
    return Tokenizer.from_file(str(target))


class TinyGPT(nn.Module):
    """Token and position embeddings, two causal transformer layers masked per document, a head."""

    def __init__(self, vocab: int, seq_len: int, width: int = 32):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(seq_len, width)
        layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.layers = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor, segments: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        same_document = segments[:, :, None] == segments[:, None, :]
        blocked = ~(causal & same_document)  # True: may not attend
        blocked = blocked.repeat_interleave(2, dim=0)  # one mask per head
        return self.head(self.layers(self.tokens(ids) + self.positions(positions), mask=blocked))


def make_loader(args, paths, tokenizer, even_batches: bool = True) -> zt.DataLoader:
    source = StaticMixtureWorkSource(
        [Dataset.from_path(name, path) for name, path in paths.items()], {"web": 0.6, "code": 0.3, "books": 0.1},
        chunk_size=32, seed=11, token_estimation=TokenEstimation(primer="measure", tokenizer=tokenizer))
    source.prime(progress=False)
    eos, pad = tokenizer.token_to_id("[EOS]"), tokenizer.token_to_id("[PAD]")
    pipeline = (Pipeline(source).tokenize(tokenizer, eos_id=eos).pack(args.seq_len, pad_id=pad)
                .ensure_mixture("strict"))
    # even_batches (the default): every rank takes the same number of steps, counted up front by
    # packing each lane's remaining documents; the surplus stays unread in the checkpoint
    return zt.DataLoader(pipeline, batch_size=args.batch_size, num_workers=args.workers, canonical_replicas=6,
                         even_batches=even_batches)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="llm-run")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--save-every", type=int, default=8)
    parser.add_argument("--crash-at", type=int, default=None, help="SIGKILL every process after this step")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()

    if "WORLD_SIZE" in os.environ:  # launched by torchrun: one process per rank
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    out = Path(args.out)
    if rank == 0:
        paths = write_corpora(out / "data")
        train_tokenizer(paths, out / "tokenizer.json")
    if dist.is_initialized():
        dist.barrier()
    paths = {name: out / "data" / name for name in CORPORA}
    tokenizer = train_tokenizer(paths, out / "tokenizer.json")
    torch.manual_seed(0)
    model = TinyGPT(tokenizer.get_vocab_size(), args.seq_len)
    loader = make_loader(args, paths, tokenizer)
    step = 0
    if (out / "model.pt").exists():
        saved = torch.load(out / "model.pt")
        model.load_state_dict(saved["model"])
        step = saved["step"]
        loader.load_state_dict(zt.load_checkpoint(out / "data.ckpt"))
        print(f"rank {rank}: resumed at step {step}", flush=True)
    ddp = nn.parallel.DistributedDataParallel(model) if dist.is_initialized() else model
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    pad = tokenizer.token_to_id("[PAD]")
    with open(out / f"seen.{rank}.jsonl", "a") as log:
        for batch in loader:
            step += 1
            ids = batch["input_ids"]
            logits = ddp(ids, batch["segment_ids"], batch["position_ids"])
            targets = ids[:, 1:].masked_fill(batch["segment_ids"][:, 1:] != batch["segment_ids"][:, :-1], pad)
            loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), ignore_index=pad)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            log.write(json.dumps({"step": step, "sequences": batch["_documents"]}) + "\n")
            log.flush()
            if step % args.save_every == 0:
                save(out, model, step, loader)
            if step == args.crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
    save(out, model, step, loader)  # the end: what even_batches held back stays in the data checkpoint
    print(f"rank {rank}: finished after step {step}, loss {loss.item():.3f}; tokens "
          f"{loader.stats()['tokens']['received']}", flush=True)
    if dist.is_initialized():
        del ddp  # DDP's reducer holds the process group: if it let go last, at exit, torch could deadlock
        gc.collect()
        dist.destroy_process_group()


def save(out: Path, model: nn.Module, step: int, loader: zt.DataLoader) -> None:
    """The model (rank 0) and the loader's global state: every rank's lanes, gathered."""
    state = zt.all_gather_state(loader.state_dict()) if dist.is_initialized() else loader.state_dict()
    if not dist.is_initialized() or dist.get_rank() == 0:
        zt.save_checkpoint(out / "data.ckpt", state)
        torch.save({"model": model.state_dict(), "step": step}, out / "model.tmp")
        os.replace(out / "model.tmp", out / "model.pt")


if __name__ == "__main__":
    main()

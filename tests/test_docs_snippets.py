"""Every Python snippet of the README and the docs runs as written.

A page's snippets run in order, in one namespace, in a fresh directory holding the data they
name (``data/web``, ``data/code``, ``data/wiki``; ``s3://bucket/books`` on the test S3 server).
What a page's text treats as the reader's own (their ``source``, ``pipeline``, ``model``,
``train_step``, tokenizer, ``MySource``) is given by ``GIVEN[page]``, small and real; imports
are the snippets' own, and nothing of a snippet is changed.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from helpers import write_jsonl
from s3_server import s3_client

from zephon import Dataset, Pipeline, StaticMixtureWorkSource

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "error:.*No checkpoint will be loaded")  # a resume that starts over


def snippets(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


def texts(name: str, shards: int, rows: int) -> list[list[str]]:
    rng = np.random.default_rng(len(name))
    words = np.array(["data", "mixture", "lane", "token", name, "shard", "chunk", "resume"])
    return [[" ".join(rng.choice(words, 3 + k % 9)) for k in range(rows)] for _ in range(shards)]


def write_data(directory: Path, endpoint: str) -> None:
    """The files the snippets read, under ``directory`` and in the S3 bucket ``bucket``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = directory / "data"
    data.mkdir()
    write_jsonl(data / "web", texts("web", 12, 1000))  # a chunk of 16,384 draws up to 11,469 of web
    write_jsonl(data / "code", texts("code", 6, 1000))
    (data / "wiki").mkdir()
    pq.write_table(pa.table({"text": texts("wiki", 1, 200)[0]}), data / "wiki" / "part-0.parquet")
    s3 = s3_client(endpoint)
    s3.create_dir("bucket")  # one server per module: the bucket may be there already
    for shard, docs in enumerate(texts("books", 2, 100)):
        with s3.open_output_stream(f"bucket/books/part-{shard}.parquet") as out:
            pq.write_table(pa.table({"text": docs}), out)


def text_source(chunk_size: int = 64, **kwargs: Any) -> StaticMixtureWorkSource:
    datasets = [Dataset.from_path("web", "data/web"), Dataset.from_path("code", "data/code")]
    return StaticMixtureWorkSource(datasets, {"web": 0.7, "code": 0.3}, chunk_size=chunk_size, seed=1, **kwargs)


def small_text_source(**kwargs: Any) -> StaticMixtureWorkSource:
    datasets = [Dataset.from_records(name, [[{"text": t} for t in shard] for shard in texts(name, 2, 60)])
                for name in ("web", "code")]
    return StaticMixtureWorkSource(datasets, {"web": 0.7, "code": 0.3}, chunk_size=16, seed=1, **kwargs)


def count_datasets(rows: int = 400) -> list[Dataset]:
    return [Dataset.from_counts(name, [rows] * shards) for name, shards in (("web", 6), ("code", 4), ("books", 4))]


def train_step(batch: Any) -> None:
    assert len(batch["_sample_id"]) > 0


def tokenize(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "n_words": len(record["text"].split())}


def bpe():
    """A small BPE tokenizer trained on generated text (nothing is downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=80, special_tokens=["[UNK]", "[EOS]"], show_progress=False)
    tokenizer.train_from_iterator((doc for shard in texts("train", 4, 200) for doc in shard), trainer)
    return tokenizer


def given_checkpoints() -> dict[str, Any]:
    import torch

    import zephon.torch as zt

    template = StaticMixtureWorkSource(count_datasets(), {"web": 2, "code": 1, "books": 1}, chunk_size=16)
    lane = template.clone_for_lane(0, 4)
    lane.next_chunk()
    model = torch.nn.Linear(3, 1)
    loader = zt.DataLoader(Pipeline(template), batch_size=4)
    return {"template": template, "lane": lane, "loader": loader, "train_step": train_step, "model": model,
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}


def given_curriculum() -> dict[str, Any]:
    import zephon.torch as zt

    datasets = count_datasets(rows=4000)  # a chunk of 16,384 draws up to 12,288 of web
    old = Pipeline(StaticMixtureWorkSource(datasets[:2], {"web": 3, "code": 1}, chunk_size=16, seed=0))
    loaders = [zt.DataLoader(old, batch_size=4, rank=r, world_size=2, canonical_replicas=4) for r in range(2)]
    for loader in loaders:
        next(iter(loader))
    new = StaticMixtureWorkSource(datasets, {"web": 1, "code": 1, "books": 2}, chunk_size=16, seed=0)
    return {"datasets": datasets, "all_ranks_states": [loader.state_dict() for loader in loaders],
            "new_pipeline": Pipeline(new)}


def given_datasets() -> dict[str, Any]:
    return {"source": text_source()}


def given_hf() -> dict[str, Any]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    def lm_batch(items):
        ids = torch.stack([torch.as_tensor(item["input_ids"]) for item in items])
        return {"input_ids": ids, "labels": ids.clone()}

    pipeline = Pipeline(small_text_source()).tokenize(bpe(), eos_id=1).pack(16, pad_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=80, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    return {"pipeline": pipeline, "lm_batch": lm_batch, "model": model}


def given_lightning() -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch["_sample_id"].float()).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-9)

    source = StaticMixtureWorkSource(count_datasets(), {"web": 2, "code": 1, "books": 1}, chunk_size=16,
                                     exhausted_policy="repeat")
    return {"model": Model(), "pipeline": Pipeline(source)}


def given_pretraining() -> dict[str, Any]:
    from zephon.work import TokenEstimation

    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe(), eos_token="[EOS]")
    source = small_text_source(token_estimation=TokenEstimation(tokenizer=tokenizer))
    source.prime()
    return {"source": source, "tokenizer": tokenizer}


def given_random_access() -> dict[str, Any]:
    datasets = [Dataset.from_counts("web", [1_000_000] * 150), Dataset.from_counts("code", [500_000] * 100)]
    template = StaticMixtureWorkSource(datasets, {"web": 0.7, "code": 0.3}, chunk_size=16384, seed=7)
    return {"lane": template.clone_for_lane(0, 1), "indices": np.arange(0, 10_000_000, 100_000)}


def given_testing() -> dict[str, Any]:
    def MySource(*_: Any) -> StaticMixtureWorkSource:  # the reader's own source, whatever it takes
        return StaticMixtureWorkSource(count_datasets(), {"web": 2, "code": 1, "books": 1}, chunk_size=8)

    return {"MySource": MySource}


def given_tokens() -> dict[str, Any]:
    return {"datasets": [Dataset.from_path("web", "data/web"), Dataset.from_path("code", "data/code")],
            "my_tokenizer": bpe()}


def given_torch() -> dict[str, Any]:
    return {"source": text_source(), "tokenize": tokenize, "train_step": train_step}


def given_readme() -> dict[str, Any]:
    return {"tokenize": tokenize, "train_step": train_step}


GIVEN: dict[str, Callable[[], dict[str, Any]]] = {
    "checkpoints.md": given_checkpoints, "curriculum.md": given_curriculum, "datasets.md": given_datasets,
    "hf.md": given_hf, "lightning.md": given_lightning, "pretraining.md": given_pretraining,
    "random-access.md": given_random_access, "testing.md": given_testing, "tokens.md": given_tokens,
    "torch.md": given_torch, "README.md": given_readme,
}


@pytest.mark.parametrize("page", [p for p in PAGES if snippets(p)], ids=lambda p: p.name)
def test_the_snippets_of_a_page_run_as_written(page, tmp_path, monkeypatch, endpoint):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    write_data(tmp_path, endpoint)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    namespace = GIVEN.get(page.name, dict)()
    for number, block in enumerate(snippets(page)):
        exec(compile(block, f"{page.name} snippet {number}", "exec"), namespace)  # noqa: S102  (the page's code)

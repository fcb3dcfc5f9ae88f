"""Token files in token mode: exact costs with no tokenizer and no priming, strict token mixtures
packed straight from the files (no tokenize step), and exact resumes."""
import numpy as np
import pytest

import zephon.torch as zt
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.core import cache
from zephon.core.config import COST_UNITS
from zephon.work import TokenEstimation

from helpers import write_datatrove, write_megatron

SHARES = {"web": 0.6, "code": 0.3, "books": 0.1}
LENGTHS = {"web": (2, 40), "code": (20, 120), "books": (100, 400)}


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def corpus(tmp_path):
    """Three datasets of two files each: web and books as Megatron pairs, code as datatrove files."""
    rng = np.random.default_rng(5)
    out = {}
    for name, (low, high) in LENGTHS.items():
        for i in range(2):
            docs = [rng.integers(1, 30000, rng.integers(low, high)).tolist() for _ in range(150)]
            out.setdefault(name, []).append(docs)
            if name == "code":
                write_datatrove(tmp_path / f"{name}_{i}.ds", docs)
            else:
                write_megatron(tmp_path / f"{name}_{i}", docs, split=2)
    datasets = [Dataset.from_megatron("web", tmp_path / "web_*"), Dataset.from_token_files("code", tmp_path / "code_*.ds"),
                Dataset.from_megatron("books", tmp_path / "books_*")]
    return datasets, out


def source(datasets, **kwargs):
    return StaticMixtureWorkSource(datasets, SHARES, chunk_size=32, seed=9, exhausted_policy="repeat",
                                   token_estimation=TokenEstimation(), **kwargs)


def test_token_mode_prices_each_shard_at_its_exact_tokens_per_document(corpus):
    datasets, docs = corpus
    config = source(datasets).config
    for plan, dataset in zip(config.datasets, datasets):
        assert (plan.ratio_origin, plan.token_ratio) == ("exact", 0.5)
        exact = [sum(map(len, shard)) / len(shard) for shard in docs[plan.name]]
        assert np.allclose(cache.costs(plan) / COST_UNITS, exact, atol=1 / COST_UNITS)
        assert dataset.tokens().tolist() == [sum(map(len, shard)) for shard in docs[plan.name]]


def test_a_primer_may_not_contradict_the_files(corpus):
    datasets, _ = corpus
    with pytest.raises(ValueError, match="pins 'web' at 0.3 tokens per byte, but its token files hold exactly 0.5"):
        StaticMixtureWorkSource(datasets, SHARES, token_estimation=TokenEstimation(primer={"web": 0.3}))
    assert source(datasets).config == StaticMixtureWorkSource(
        datasets, SHARES, chunk_size=32, seed=9, exhausted_policy="repeat",
        token_estimation=TokenEstimation(primer={"web": 0.5})).config


def run(p, cut=None, state=None, **kwargs):
    loader = zt.DataLoader(p, batch_size=4, canonical_replicas=2, even_batches=False, **kwargs)
    if state is not None:
        loader.load_state_dict(state)
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == (cut or 60):
            break
    return batches, loader.state_dict()


def test_strict_mixture_packs_the_files_without_a_tokenize_step(corpus):
    """Every prefix of the packed stream holds each dataset's tokens within two sequences per lane
    of its target share."""
    datasets, docs = corpus
    seq_len = 64
    p = Pipeline(source(datasets)).pack(seq_len, pad_id=0).ensure_mixture("strict")
    batches, _ = run(p)
    placed = dict.fromkeys(SHARES, 0)
    for batch in batches:
        for row in range(len(batch["input_ids"])):
            for name, counts in batch["_tokens"].items():
                placed[name] += int(counts[row])
            total = sum(placed.values())
            assert all(abs(placed[n] - SHARES[n] * total) <= 2 * 2 * seq_len for n in SHARES), (placed, total)
    assert total == 60 * 4 * seq_len
    by_name = {name: [d for shard in shards for d in shard] for name, shards in docs.items()}
    for batch in batches[:5]:  # the packed tokens are the files' tokens
        for row, pieces in zip(batch["input_ids"].tolist(), batch["_documents"]):
            position = 0
            for _, shard, offset, name, start, end in pieces:
                assert row[position:position + end - start] == by_name[name][shard * 150 + offset][start:end]
                position += end - start


def test_a_token_file_run_resumes_exactly(corpus):
    datasets, _ = corpus
    p = Pipeline(source(datasets)).pack(48, pad_id=0).ensure_mixture("strict")
    whole, _ = run(p, num_workers=1)
    first, state = run(p, cut=17, num_workers=1)
    rest, _ = run(p, cut=60 - 17, state=state, num_workers=1)
    assert [b["input_ids"].tolist() for b in first + rest] == [b["input_ids"].tolist() for b in whole]

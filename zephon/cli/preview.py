"""``zephon preview CONFIG``: what a mixture config will do, in numbers and (``--plot``) pictures.

Builds the template source the config describes and plans its whole stream on numbers (no
pointers, no records read; a token-aware mixture first measures its tokens per byte with
``--tokenizer`` unless its ratios are pinned): the resolved settings, the passes each dataset makes, the
stream's length, the chunks each lane gets, and how far a chunk, and a batch of ``--batch-size``
samples (consecutive samples of one lane, as ``zephon.torch.DataLoader`` cuts them), stray from
the mixture. ``--plot DIR`` writes PNG figures (needs the
``zephon-mixtures[plot]`` extra, matplotlib): see :mod:`zephon.cli._plots`.
"""
from __future__ import annotations

import argparse
import os
from types import ModuleType
from typing import TYPE_CHECKING, Sequence

import numpy as np

from zephon.cli._plan import StreamPlan, lane_owners, plan_stream, target_shares
from zephon.core import SourceConfig
from zephon.core.index import StreamIndex, build_index, is_finite, round_robin
from zephon.limits import MAX_REPLICAS
from zephon.work import StaticMixtureWorkSource

if TYPE_CHECKING:
    from tokenizers import Tokenizer

NAME = "preview"
HELP = "show what a mixture config (.toml / .json) will do, without reading data; --plot draws it"
MAX_CHUNKS = 200_000  # global chunks planned at most (a longer stream is shown up to here)
BATCH_SAMPLES = 1 << 20  # samples of lane 0 cut into batches for the composition figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The preview's options."""
    parser.add_argument("config", help="a mixture config file (.toml or .json)")
    parser.add_argument("--lanes", type=int, default=8, help="canonical replicas to route chunks to (default 8)")
    parser.add_argument("--plot", metavar="DIR", help="write PNG figures into DIR (needs zephon-mixtures[plot])")
    parser.add_argument("--max-chunks", type=int, default=MAX_CHUNKS,
                        help=f"plan at most this many global chunks (default {MAX_CHUNKS:,})")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="batch size of the per-batch composition figures (default 256)")
    parser.add_argument("--tokenizer", metavar="FILE",
                        help="a Hugging Face tokenizer.json, for a token-aware mixture whose ratios are measured")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: on a terminal, when slow)")


def run(args: argparse.Namespace) -> int:
    """Print the preview (and write the figures); returns the exit status."""
    if args.lanes < 1 or args.max_chunks < 1 or args.batch_size < 1:
        raise ValueError(f"--lanes, --max-chunks and --batch-size must be >= 1, got {args.lanes}, {args.max_chunks} "
                         f"and {args.batch_size}")
    if args.lanes > MAX_REPLICAS:
        raise ValueError(f"--lanes {args.lanes} is more than the {MAX_REPLICAS} lanes a source may have "
                         "(zephon.limits.MAX_REPLICAS); pass the canonical_replicas of the job")
    plots = _plotting() if args.plot else None  # fail before the work if matplotlib is missing
    tokenizer = _tokenizer(args.tokenizer) if args.tokenizer else None
    source = _source(args.config, tokenizer)
    source.prime(progress=args.progress)
    config = source.config
    whole = _whole_stream(source)
    plan = plan_stream(config, args.max_chunks, whole.chunks if whole else None, args.progress)
    owners = lane_owners(config, plan.chunks, args.lanes)
    print(_settings(args.config, config, args.lanes))
    print(_datasets_table(config, plan))
    print(_stream_summary(config, plan, owners, args.lanes, whole))
    print(_composition(config, plan, owners, args.batch_size))
    if plots is not None:
        for path in plots.write_all(args.plot, source, plan, args.lanes, args.progress):
            print(f"wrote {path}")
    return 0


def _plotting() -> ModuleType:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'zephon-mixtures[plot]'") from None
    from zephon.cli import _plots

    return _plots


def _source(path: str, tokenizer: Tokenizer | None) -> StaticMixtureWorkSource:
    """The template source of the config file; a token mixture that must measure its ratios
    but got no ``--tokenizer`` is told about the option (the library's message names only its
    own arguments)."""
    try:
        return StaticMixtureWorkSource.from_config(path, tokenizer=tokenizer)
    except ValueError as error:
        if tokenizer is None and "neither tokenizer nor measure" in str(error):  # zephon.work._resolve's message
            raise ValueError(f"{error} (here: pass --tokenizer FILE, a Hugging Face tokenizer.json)") from None
        raise


def _whole_stream(source: StaticMixtureWorkSource) -> StreamIndex | None:
    """The whole stream's exact length in chunks and samples when the source can count it
    (finite, sample mode: an arithmetic walk, no pointers), else None."""
    if not source.supports_indexing():
        return None
    return build_index(source.config)  # the template's: the whole stream


def _tokenizer(path: str) -> Tokenizer:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ImportError("--tokenizer needs the tokenizers package: pip install tokenizers") from None
    return Tokenizer.from_file(path)


def _settings(path: str, config: SourceConfig, lanes: int) -> str:
    mode = "tokens" if config.token_mode else "samples"
    return (f"{os.path.basename(path)}: chunk_size={config.chunk_size:,}, seed={config.seed}, weights in {mode}, "
            f"allocation={config.allocator.name}\n"
            f"  shuffle_shards={config.shuffle_shards}, shuffle_within_shard={config.shuffle_within_shard}, "
            f"stop_after_passes={config.stop_after_passes}\n"
            f"  lanes: {lanes} ({config.lane_assignment})\n")


def _datasets_table(config: SourceConfig, plan: StreamPlan) -> str:
    targets = target_shares(config)
    realised = plan.quotas.sum(axis=0) / max(plan.samples, 1)
    rows = [("dataset", "weight", "shards", "samples", "block", "policy", "max_repeats", "reshuffle", "tail",
             "passes", "share", "target")]
    for c, d in enumerate(config.datasets):
        passes = plan.passes[-1, c] if plan.chunks else 0.0
        rows.append((d.name, f"{d.weight:g}", f"{len(d.shard_counts):,}", f"{d.total:,}",
                     f"{d.block_size:,}" if d.block_size > 1 else "-", d.policy,
                     "-" if d.max_repeats is None else str(d.max_repeats), "yes" if d.reshuffle_on_repeat else "no",
                     d.pass_tail, f"{passes:.3f}", f"{realised[c]:.5f}", f"{targets[c]:.5f}"))
    return _table(rows)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if k == 0 else cell.rjust(w) for k, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    return "\n".join(lines) + "\n"


def _composition(config: SourceConfig, plan: StreamPlan, owners: np.ndarray, batch_size: int) -> str:
    """Per dataset, how far lane 0's chunks and its batches of ``batch_size`` stray from the
    mixture: max and mean of ``|count - share x size|`` (share: the dataset's share of the lane)."""
    quotas = plan.quotas[owners == 0] if plan.chunks else plan.quotas
    quotas = quotas[:max(1, np.searchsorted(np.cumsum(quotas.sum(axis=1)), BATCH_SAMPLES) + 1)]
    if not quotas.sum():
        return "composition: lane 0 has no samples"
    shares = quotas.sum(axis=0) / quotas.sum()
    sizes = quotas.sum(axis=1, keepdims=True)
    per_chunk = np.abs(quotas - shares * sizes)
    order = np.concatenate([round_robin(tuple(q))[0] for q in quotas.tolist()])
    full = len(order) // batch_size
    rows = [("dataset", "share", "chunk max", "chunk mean", "batch max", "batch mean")]
    if full:
        counts = np.bincount(np.repeat(np.arange(full), batch_size) * len(shares) + order[:full * batch_size],
                             minlength=full * len(shares)).reshape(full, len(shares))
        per_batch = np.abs(counts - shares * batch_size)
    for c, d in enumerate(config.datasets):
        batch = (f"{per_batch[:, c].max():.2f}", f"{per_batch[:, c].mean():.2f}") if full else ("-", "-")
        rows.append((d.name, f"{shares[c]:.5f}", f"{per_chunk[:, c].max():.2f}", f"{per_chunk[:, c].mean():.2f}",
                     *batch))
    head = (f"composition of lane 0 ({len(quotas):,} chunks of ~{config.chunk_size:,}, {full:,} batches of "
            f"{batch_size:,}): |count - share x size| per dataset")
    return head + "\n" + _table(rows)


def _stream_summary(config: SourceConfig, plan: StreamPlan, owners: np.ndarray, lanes: int,
                    whole: StreamIndex | None) -> str:
    """The stream's length and how it ends, and the chunks and samples each lane gets (of the
    chunks planned, which the first line says when they are not the whole stream)."""
    per_lane = np.bincount(owners, minlength=lanes)
    samples = np.bincount(owners, weights=plan.quotas.sum(axis=1), minlength=lanes) if plan.chunks else per_lane
    of = "" if plan.complete else ", of the chunks shown"
    return (f"{_stream_head(config, plan, whole)}\n"
            f"lanes: {per_lane.min():,}–{per_lane.max():,} chunks each, "
            f"{int(samples.min()):,}–{int(samples.max()):,} samples each{of}")


def _stream_head(config: SourceConfig, plan: StreamPlan, whole: StreamIndex | None) -> str:
    """The stream's length and why it ends; for a plan cut at ``--max-chunks``, how much is shown
    and, when ``whole`` counts it, how long the stream really is (endless only when no dataset ends it)."""
    if plan.complete:
        return f"stream: {plan.chunks:,} chunks, {plan.samples:,} samples; {_why_it_ends(config, plan.ended_by)}"
    if whole is not None:
        return (f"stream: {whole.chunks:,} chunks, {whole.length:,} samples; only the first {plan.chunks:,} "
                f"({plan.samples:,} samples) are shown (--max-chunks)")
    if is_finite(config):
        return (f"stream: finite, longer than the {plan.chunks:,} chunks ({plan.samples:,} samples) shown "
                "(--max-chunks)")
    return f"stream: endless; the first {plan.chunks:,} chunks ({plan.samples:,} samples) are shown"


def _why_it_ends(config: SourceConfig, ended_by: str | None) -> str:
    """Why a stream planned to its end ends (``ended_by``: the dataset that ended it, if one did)."""
    passes = config.stop_after_passes
    if passes is not None:
        return f"ends once every dataset has completed {passes} pass{'es' if passes > 1 else ''}"
    if ended_by:
        return f"ends when {ended_by!r} cannot supply its quota"
    return "ends when every dataset has drained"

"""The figures of ``zephon preview --plot DIR`` (matplotlib, the ``zephon-mixtures[plot]`` extra).

| file | shows |
|---|---|
| ``mixture.png`` | realised vs target share of each dataset over the stream (log scale), and per lane in percentage points |
| ``passes.png`` | each dataset's pass progress over the stream, ``stop_after_passes`` and the end marked |
| ``coverage.png`` | the share of each lane's chunks that hold each dataset: the configured routing and the other |
| ``shuffle.png`` | how far originally adjacent samples end up apart, per shuffle level, vs a global shuffle |

Figures are drawn on ``matplotlib.figure.Figure`` objects (no pyplot, no global state).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from zephon.cli._plan import StreamPlan, lane_owners, target_shares
from zephon.io import Dataset
from zephon.io.progress import Progress
from zephon.work import StaticMixtureWorkSource

POINTS = 2000  # points per curve at most
SHUFFLE_SAMPLES = 200_000  # samples of the dataset prefix the shuffle figure permutes


def write_all(directory: str, source: StaticMixtureWorkSource, plan: StreamPlan, lanes: int,
              progress: bool | None = None) -> list[str]:
    """Draw every figure into ``directory`` (created if needed); returns the files written."""
    os.makedirs(directory, exist_ok=True)
    targets = target_shares(source.config)
    figures = {
        "mixture.png": mixture_figure(plan, targets, lane_owners(source.config, plan.chunks, lanes), lanes),
        "passes.png": passes_figure(plan, source.config.stop_after_passes),
        "coverage.png": coverage_figure(source, plan, lanes),
        "shuffle.png": shuffle_figure(source, progress),
    }
    paths = []
    for name, figure in figures.items():
        path = os.path.join(directory, name)
        figure.savefig(path, dpi=110)
        paths.append(path)
    return paths


def _thin(n: int) -> np.ndarray:
    """At most ``POINTS`` indices spread over ``range(n)``, the last included."""
    return np.unique(np.linspace(0, max(n - 1, 0), min(n, POINTS)).astype(np.int64))


def _cumulative_shares(quotas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.cumsum(quotas, axis=0)
    totals = counts.sum(axis=1)
    return totals, counts / np.maximum(totals, 1)[:, None]


def mixture_figure(plan: StreamPlan, targets: np.ndarray, owners: np.ndarray, lanes: int) -> Figure:
    """Realised share of each dataset over the whole stream against its target (dashed), on a
    log scale so that a 0.0002 share shows beside a 0.7 one; and within each lane, how far the
    share strays from its target in percentage points (absolute, so a tiny share does not swamp
    the others)."""
    figure = Figure(figsize=(12, 4.5), layout="constrained")
    whole, per_lane = figure.subplots(1, 2, sharey=False)
    colors = [f"C{c % 10}" for c in range(len(plan.names))]
    totals, shares = _cumulative_shares(plan.quotas)
    keep = _thin(plan.chunks)
    for c, name in enumerate(plan.names):
        whole.plot(totals[keep], shares[keep, c], color=colors[c], label=f"{name} (target {targets[c]:.4g})")
        whole.axhline(targets[c], color=colors[c], linestyle="--", linewidth=0.8)
    for lane in range(lanes):
        mine = plan.quotas[owners == lane]
        if not len(mine):
            continue
        lane_totals, lane_shares = _cumulative_shares(mine)
        keep = _thin(len(mine))
        for c in range(len(plan.names)):
            per_lane.plot(lane_totals[keep], 100 * (lane_shares[keep, c] - targets[c]), color=colors[c],
                          linewidth=0.6, alpha=0.6)
    per_lane.axhline(0.0, color="black", linewidth=0.6)
    whole.set(title="Whole stream: realised share (target dashed)", xlabel="samples", ylabel="share",
              yscale="log")
    per_lane.set(title=f"Within each of {lanes} lanes", xlabel="samples of the lane",
                 ylabel="realised − target share, percentage points")
    whole.legend(loc="best", fontsize="small")
    return figure


def passes_figure(plan: StreamPlan, stop_after_passes: int | None) -> Figure:
    """Each dataset's passes completed over the stream (each curve its own line style, so one
    that lies on another still shows), with ``stop_after_passes`` and the stream's end marked."""
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    axes = figure.subplots()
    totals = np.cumsum(plan.quotas.sum(axis=1))
    keep = _thin(plan.chunks)
    styles = ("-", "--", ":", "-.")
    for c, name in enumerate(plan.names):
        axes.plot(totals[keep], plan.passes[keep, c], label=name, linestyle=styles[c % len(styles)],
                  linewidth=1.8 - 0.3 * (c % 4))
    if stop_after_passes is not None:
        axes.axhline(stop_after_passes, color="gray", linestyle="--", linewidth=0.8,
                     label=f"stop_after_passes={stop_after_passes}")
    if plan.complete and len(totals):
        end = f"end of the stream ({plan.ended_by} ran out)" if plan.ended_by else "end of the stream"
        axes.axvline(totals[-1], color="black", linewidth=0.8, label=end)
    axes.set(title="Pass progress of each dataset" + ("" if plan.complete else " (first chunks only)"),
             xlabel="samples of the stream", ylabel="passes completed")
    axes.legend(loc="best", fontsize="small")
    return figure


def coverage_figure(source: StaticMixtureWorkSource, plan: StreamPlan, lanes: int) -> Figure:
    figure = Figure(figsize=(12, 1.5 + 0.5 * len(plan.names)), layout="constrained")
    held = plan.quotas > 0
    configured = source.config.lane_assignment
    for axes, routing in zip(figure.subplots(1, 2), ("permute", "modulo")):
        owners = lane_owners(source.config, plan.chunks, lanes, routing)
        per_lane = np.maximum(np.bincount(owners, minlength=lanes), 1)
        share = np.stack([np.bincount(owners, weights=held[:, c], minlength=lanes) / per_lane
                          for c in range(len(plan.names))])
        image = axes.imshow(share, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0)
        mark = " — this source's" if routing == configured else " — the alternative"
        axes.set(title=f"lane_assignment={routing!r}{mark}", xlabel="lane", yticks=range(len(plan.names)),
                 yticklabels=plan.names)
        if lanes <= 16:
            for (c, lane), value in np.ndenumerate(share):
                axes.text(lane, c, f"{value:.2f}", ha="center", va="center", fontsize=7,
                          color="white" if value < 0.5 else "black")
    figure.colorbar(image, ax=figure.axes, label="share of the lane's chunks holding the dataset")
    return figure


def _prefix(dataset: Dataset) -> Dataset:
    """The dataset's first shards, at most ``SHUFFLE_SAMPLES`` samples (a larger first shard is cut)."""
    counts = dataset.counts()
    k = max(1, int(np.searchsorted(np.cumsum(counts), SHUFFLE_SAMPLES, side="right")))
    kept = [int(n) for n in counts[:k]]
    kept[0] = min(kept[0], SHUFFLE_SAMPLES)
    return Dataset.from_counts(dataset.name, kept)


def shuffle_levels(source: StaticMixtureWorkSource, c: int) -> dict[str, dict[str, Any]]:
    """The shuffle settings compared in the figure, weakest first."""
    config = source.config
    block = config.datasets[c].block_size
    if block <= 1:
        block = 8 * max(int(d.shard_counts.max(initial=0)) for d in config.datasets)
    return {
        "none": dict(shuffle_shards=False),
        "shards": dict(shuffle_shards=True),
        "shards + rows": dict(shuffle_shards=True, shuffle_within_shard=True),
        f"shards + rows + blocks of {block:,}": dict(shuffle_shards=True, shuffle_within_shard=True,
                                                    shuffle_block_size=block),
        "global": dict(shuffle_shards=True, shuffle_within_shard=True, shuffle_block_size="global"),
    }


def adjacent_gaps(dataset: Dataset, seed: int, settings: dict[str, Any]) -> np.ndarray:
    """For each pair of originally adjacent samples (same shard), how far apart one pass reads them."""
    single = StaticMixtureWorkSource([dataset], {dataset.name: 1.0}, chunk_size=min(65536, dataset.total()),
                                     seed=seed, exhausted_policy="redistribute", **settings)
    lane = single.clone_for_lane(0, 1)
    starts = np.concatenate([[0], np.cumsum(dataset.counts())[:-1]])
    order = np.concatenate([chunk.read_order()[0] for chunk in iter(lane.next_chunk, None)])
    position = np.empty(dataset.total(), dtype=np.int64)
    position[starts[order[:, 1]] + order[:, 2]] = np.arange(len(order))
    same_shard = np.ones(dataset.total(), dtype=bool)
    same_shard[np.cumsum(dataset.counts()) - 1] = False
    first = np.flatnonzero(same_shard[:-1])
    gaps: np.ndarray = np.abs(position[first + 1] - position[first])
    return gaps


def shuffle_figure(source: StaticMixtureWorkSource, progress: bool | None = None) -> Figure:
    c = int(np.argmax([d.total for d in source.config.datasets]))
    dataset = _prefix(source.datasets_by_id[c])
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    axes = figure.subplots()
    levels = shuffle_levels(source, c)
    bar = Progress(len(levels), "shuffle levels", progress)
    for label, settings in levels.items():
        gaps = np.sort(adjacent_gaps(dataset, source.config.seed, settings))
        keep = _thin(len(gaps))
        axes.step(np.maximum(gaps[keep], 1), (keep + 1) / len(gaps), where="post",
                  label=f"{label} (median {int(np.median(gaps)):,})",
                  linestyle=":" if label == "global" else "-")
        bar.advance()
    bar.close()
    axes.set_xscale("log")
    axes.set(title=f"Shuffle quality: {dataset.name!r}, first {dataset.shard_count():,} shards "
                   f"({dataset.total():,} samples)",
             xlabel="distance in read order between samples adjacent in storage", ylabel="fraction of pairs (CDF)")
    axes.legend(loc="best", fontsize="small")
    return figure

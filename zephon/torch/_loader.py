"""zephon.torch.DataLoader: a torch DataLoader over a Pipeline with exact, elastic checkpoints.

How it works
------------
The loader hands torch an internal ``IterableDataset`` and no batching of its own
(``batch_size=None``). Each reader (a worker, or the main process with ``num_workers=0``)
sends its lanes' batches in bundles (``zephon.torch._bundles``); the main process yields them
round robin over the readers and knows, after every batch, each reader's position
(``zephon.torch._iterator``): so ``state_dict()`` is exact for what the training loop has
received, whatever was prefetched.

With ``even_batches`` (the default) the main process stops every rank after the same number
of batches, counted up front from random access (``zephon.runtime.count_ranks``); ``stats()``
counts what the loop received (``zephon.runtime.LoaderStats``). Workers die with their
trainer and a dead worker is reported by name (``zephon.torch._workers``).
"""
from __future__ import annotations

import functools
import json
import logging
import sys
from typing import Any, Callable, Mapping, Sequence, cast

import numpy as np
import torch
import torch.utils.data as tud

from zephon.limits import MAX_LAG
from zephon.runtime import (
    Entry, Even, LaneBook, LoaderStateDict, LoaderStats, LoaderStatsDict, Pipeline, RankCount, count_packed, count_rank,
    count_ranks, countable, even_target, log_once, maybe_finite, paused_gc, rank_lanes, say_in_flight,
)
from zephon.torch._bundles import Bundle, Plan, Readers, widen_pipe
from zephon.torch._dcp import dcp_caller, dcp_state_dict, from_dcp, is_dcp_form
from zephon.torch._dist import all_gather_state, collective_device
from zephon.torch._iterator import LoaderIterator
from zephon.torch._slots import SPARE
from zephon.torch._relay import BROADCAST, COMPUTE, Relay, replicas_of
from zephon.torch._topology import Topology, detect_topology, dp_dim_names
from zephon.torch._workers import watch_workers
from zephon.work import WorkSource

log = logging.getLogger("zephon")


def _identity(bundle: Any) -> Any:
    return bundle


class DataLoader(tud.DataLoader[Bundle]):
    """A torch ``DataLoader`` over a :class:`zephon.Pipeline`, with exact and elastic checkpoints.

    Parameters
    ----------
    pipeline : Pipeline or WorkSource
        What to read (a work source is wrapped in ``Pipeline(source)``).
    batch_size : int or None, default None
        ``None`` yields items (dicts), else batches made by ``collate_fn`` (default:
        :func:`zephon.torch.collate`: ``_sample_id`` a ``(B, 3)`` int64 tensor, ``_component``
        a list of names, other fields by torch's ``default_collate``). Each reader makes its
        own batches, as torch does for an ``IterableDataset``: a batch is ``batch_size``
        consecutive samples of one of its lanes, in the lane's read order, so it carries the
        mixture (each component within 2 samples of its share of the batch), and the reader
        takes its lanes in turn, batch by batch. A lane's last batch may be shorter;
        ``drop_last`` drops those (counted in ``stats()["drop_last"]``). Batches come round
        robin over the workers. With a ``filter`` step a batch holds the items of
        ``batch_size`` consecutive samples that pass it (an empty batch, ``_sample_id`` of
        shape ``(0, 3)``, when none does).
    num_workers : int, default 0
        DataLoader worker processes. On Linux they start by fork unless
        ``multiprocessing_context`` says otherwise (a spawned worker needs a picklable
        pipeline). Workers die with the trainer, and a worker that dies during the run
        raises :class:`zephon.torch.WorkerDiedError` naming it, its pid and its lanes.
    even_batches : bool, default True
        Every rank yields the same number of batches (items), so a step with a collective
        (DDP's all-reduce) never waits for a rank that has ended. Needs a finite source that
        counts its remaining samples (random access); the counts are made up front, without
        reading, and ``len(loader)`` is that number. The longer ranks' surplus is **held
        back**: not yielded in this run, left unread in the checkpoint (a resume on another
        topology counts it again). It is counted in ``stats()["even_batches"]`` and logged
        once. All ranks must use the same ``batch_size`` and ``drop_last``; more ranks than
        ``canonical_replicas`` is a ``ValueError`` (a rank without lanes would stop them all).
        Counting walks each lane's schedule once, on numbers (about 0.3 ms per lane for a
        stream of 6,000 chunks over 1,024 lanes), at the first ``len()`` or ``iter()`` and
        after each ``load_state_dict``; a rank that loaded only its own lanes' state takes
        the smallest count by an all-reduce (a collective: call it on every rank).
        An unbounded source needs nothing (every rank is endless). ``False``: each rank
        reads its lanes to their end.
    canonical_replicas : int or None, default None
        The number of lanes, fixed for the whole run. Default: a loaded checkpoint's value,
        else ``8 x world_size x max(1, num_workers)`` at the first start, so the job can grow
        to 8 times as many readers (ranks x workers) with a lane for each; any number of
        readers gets lane counts within one of each other. Cost: each lane keeps one chunk
        in flight in its reader (``chunk_size x 32`` bytes of pointers per lane, plus its
        records when they are read).
    mapping : str, default "contiguous"
        How lanes map to ranks and a rank's lanes to its workers: ``"contiguous"`` or
        ``"interleaved"``.
    rank, world_size : int or None, default None
        Override the detected topology (see :func:`zephon.torch.detect_topology`): this
        process's reader rank and the number of readers.
    device_mesh : torch.distributed.DeviceMesh or None, default None
        A job with tensor, pipeline or context parallelism: the readers are the mesh's
        data-parallel ranks (``dp_dims``). The ranks of one data-parallel replica read the
        same lanes and receive identical batches (see ``replicate``); ``len``, ``even_batches``,
        ``stats()`` and checkpoints count data-parallel ranks, and only a replica's first rank
        writes checkpoint files.
    dp_dims : str or tuple of str, default ("dp",)
        The mesh's data-parallel dimensions, taken row-major when several (e.g.
        ``("dp_replicate", "dp_shard")`` for HSDP).
    dp_group : ProcessGroup or None, default None
        Instead of a mesh: this rank's data-parallel process group (e.g. Megatron's
        ``get_data_parallel_group()``); the group holding global rank 0 writes.
    dp_rank, dp_size : int or None, default None
        Instead of a mesh or group: the data-parallel rank and size (every rank of a replica
        then writes its checkpoint files, the same bytes).
    replicate : str, default "compute"
        How the ranks of a replica (``device_mesh``) get their batches: ``"compute"``, each
        reads its lanes itself; ``"broadcast"``, the replica's first rank reads (with its
        ``num_workers``) and sends each bundle of batches to the others, for pipelines whose
        reading costs more than sending. Broadcast makes the replicas' process groups when the
        loader is built (a collective: build it on every rank).
    cache_bytes : int or None, default 1 GiB (``2**30``)
        Each reader keeps, per dataset read from files, the decoded shards its lanes read:
        its fetch cache holds the dataset's ``cache_shards`` (default 1) *per lane* it reads,
        within this many decoded bytes per dataset (and the dataset's own ``cache_bytes``, if
        smaller). ``None``: no byte bound beyond the dataset's. Memory per reader is at most
        ``datasets x cache_bytes``. With workers, the Parquet row groups they decode are
        shared through a store in ``/dev/shm`` of at most ``cache_bytes`` bytes too (and half
        the space free there; ``stats()["shared_decoding"]`` counts what it saved).
    **dataloader_kwargs
        Any other torch DataLoader argument, except ``sampler``, ``batch_sampler`` and
        ``shuffle``: the order is the source's.

    ``state_dict()`` is exact after every batch the loop received; ``load_state_dict``
    accepts it, or the merged global state of any topology with the same
    ``canonical_replicas``. Each ``iter(loader)`` continues where the loop stopped (the
    stream is one long epoch; its length is the source's business). ``stats()`` tells what
    was delivered and where the datasets stand; events (a new pass, a drained dataset, the
    end) are logged once per rank on the ``zephon`` logger at INFO, the resolved
    configuration at DEBUG when iteration starts.
    """

    def __init__(self, pipeline: Pipeline | WorkSource, *, batch_size: int | None = None, num_workers: int = 0,
                 even_batches: bool = True, canonical_replicas: int | None = None, mapping: str = "contiguous",
                 rank: int | None = None, world_size: int | None = None, cache_bytes: int | None = 2**30,
                 device_mesh: Any = None, dp_dims: str | Sequence[str] = ("dp",), dp_group: Any = None,
                 dp_rank: int | None = None, dp_size: int | None = None, replicate: str = COMPUTE,
                 **dataloader_kwargs: Any):
        if isinstance(pipeline, WorkSource):
            pipeline = Pipeline(pipeline)
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"DataLoader needs a zephon.Pipeline (or a WorkSource), got {type(pipeline).__name__}")
        if batch_size is not None and (type(batch_size) is not int or batch_size < 1):
            raise ValueError(f"batch_size={batch_size!r} must be None (items) or an int >= 1")
        if type(even_batches) is not bool:
            raise ValueError(f"even_batches={even_batches!r} must be True or False")
        if cache_bytes is not None and (type(cache_bytes) is not int or cache_bytes < 1):
            raise ValueError(f"cache_bytes={cache_bytes!r} must be an int >= 1 (decoded bytes per reader and dataset) "
                             "or None (only the datasets' own bounds)")
        if batch_size is None and any(kind == "filter" for kind, _ in pipeline.steps):
            raise ValueError("a pipeline with a filter step needs a batch_size (batches are cut before filtering, so "
                             "their number is known); pass batch_size=1 for single items")
        for name in ("sampler", "batch_sampler"):
            if dataloader_kwargs.pop(name, None) is not None:
                raise ValueError(f"{name} cannot be used with a zephon DataLoader: the sample order is the source's "
                                 "(set shuffling on the source)")
        if dataloader_kwargs.pop("shuffle", None):
            raise ValueError("shuffle=True cannot be used with a zephon DataLoader: the sample order is the "
                             "source's (set shuffle_shards / shuffle_within_shard / shuffle_block_size on it)")
        if num_workers > 0 and sys.platform.startswith("linux"):
            # workers inherit the pipeline by fork, as torch does by default on Linux before Python 3.14
            dataloader_kwargs.setdefault("multiprocessing_context", "fork")
        drop_last = dataloader_kwargs.pop("drop_last", False)
        collate_fn = dataloader_kwargs.pop("collate_fn", None)
        if replicate not in (COMPUTE, BROADCAST):
            raise ValueError(f"replicate={replicate!r} must be {COMPUTE!r} (each rank of a replica reads) or "
                             f"{BROADCAST!r} (its first rank reads and sends)")
        if replicate == BROADCAST and device_mesh is None:
            raise ValueError("replicate='broadcast' needs device_mesh= (the mesh names each replica's ranks)")
        topology = detect_topology(rank, world_size, device_mesh=device_mesh, dp_dims=dp_dims, dp_group=dp_group,
                                   dp_rank=dp_rank, dp_size=dp_size)
        self._zephon_relay = (Relay(replicas_of(device_mesh, dp_dim_names(dp_dims)))
                              if replicate == BROADCAST and topology.peers > 1 else None)
        self._zephon_book = LaneBook(pipeline, canonical_replicas=canonical_replicas, mapping=mapping,
                                     rank=topology.rank, world_size=topology.world_size,
                                     readers=max(1, num_workers) if type(num_workers) is int else 1)
        self._zephon_topology = topology
        self._zephon_batch = (batch_size, bool(drop_last), collate_fn)
        self._zephon_cache_bytes = cache_bytes
        self._zephon_live: LoaderIterator | None = None
        self._zephon_before = 0  # units of the epoch delivered before the live iteration started
        self._zephon_loaded = 0  # units of the epoch a loaded state had delivered: the next iteration's start
        self._zephon_even_batches = even_batches
        self._zephon_even: Even | None = None
        self._zephon_stats = LoaderStats(pipeline.source, list(pipeline.component_names(np.arange(pipeline.kinds))),
                                         topology.rank)
        packing = pipeline.packing
        if packing is not None:
            mixture = packing.mixture
            self._zephon_stats.pack(None if mixture is None else mixture.shares,
                                    0.0 if mixture is None else mixture.tolerance)
        super().__init__(Readers(), batch_size=None, num_workers=num_workers, collate_fn=_identity,
                         **dataloader_kwargs)

    # torch keeps batch_size / drop_last as attributes; report the zephon ones (batching is ours)
    @property
    def batch_size(self) -> int | None:
        return self._zephon_batch[0]

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        pass  # torch's own (None: no torch-side batching)

    @property
    def drop_last(self) -> bool:
        return self._zephon_batch[1]

    @drop_last.setter
    def drop_last(self, value: Any) -> None:
        pass

    @property
    def pipeline(self) -> Pipeline:
        return self._zephon_book.pipeline

    @property
    def topology(self) -> Topology:
        return self._zephon_topology

    @property
    def canonical_replicas(self) -> int:
        return self._zephon_book.canonical_replicas

    @property
    def even_batches(self) -> bool:
        return self._zephon_even_batches

    def lanes(self) -> list[int]:
        """The lanes this rank reads."""
        return self._zephon_book.rank_lanes()

    def _readers(self) -> int:
        return max(1, self.num_workers)

    def _settle(self) -> None:
        if self._zephon_live is not None:
            self._zephon_live.settle()
            self._zephon_live.close_pieces()
            self._zephon_book.update(self._zephon_live.entries(), self._zephon_live.operators())
            self._zephon_live = None

    def _entries(self) -> Mapping[int, Entry]:
        return self._zephon_live.entries() if self._zephon_live is not None else self._zephon_book.entries()

    def _operators(self) -> dict[int, Any]:
        return self._zephon_live.operators() if self._zephon_live is not None else self._zephon_book.operators()

    def _counter(self) -> Callable[[Mapping[int, Entry], Mapping[int, Any]], RankCount]:
        """Counts this rank's remaining batches from ledger entries and operator states (holds
        no reference to the loader)."""
        book = self._zephon_book
        batch_size, drop_last, _ = self._zephon_batch
        packing = book.pipeline.packing
        if packing is not None:
            return functools.partial(_count_packed, book.pipeline, packing, book.canonical_replicas,
                                     batch_size=batch_size, drop_last=drop_last)
        return functools.partial(_count_samples, book.pipeline.source, book.canonical_replicas, rank=book.rank,
                                 world_size=book.world_size, mapping=book.mapping,
                                 batch_size=batch_size, drop_last=drop_last)

    def _even(self) -> Even | None:
        """The equal-steps budget: set once from the positions (all ranks' when known, else an
        all-reduce over torch.distributed), then counted down as batches are yielded."""
        if self._zephon_even is not None or not self._zephon_even_batches:
            return self._zephon_even
        book = self._zephon_book
        template = book.pipeline.source
        if not self._countable():  # an unbounded stream needs nothing: every rank is endless
            if maybe_finite(template):
                log_once(f"zephon: even_batches: {type(template).__name__} cannot count its remaining samples (no "
                         "random access), so ranks may end at different steps; wrap the loop in "
                         "torch.distributed.algorithms.Join or make the source indexable")
            return None
        if book.world_size > book.canonical_replicas:
            raise ValueError(f"even_batches: {book.world_size} ranks share canonical_replicas={book.canonical_replicas} "
                             "lanes, so a rank owns no lane and every rank would stop at once, the rest of the data "
                             "unread; run on at most that many ranks, move the checkpoint to more lanes "
                             "(zephon.torch.migrate_checkpoint(..., canonical_replicas=N)), or pass even_batches=False")
        every = range(book.canonical_replicas)
        if book.pipeline.packing is not None:
            target = self._packed_target()
        elif book.known(every):
            batch_size, drop_last, _ = self._zephon_batch
            counts = count_ranks(template, book.canonical_replicas, book.entries(every), book.world_size,
                                 book.mapping, batch_size, drop_last, checked=True)
            target = even_target(counts)
        else:
            target = _all_reduce_min(self._counter()(self._entries(), {}).units, book)
        self._zephon_even = Even(target)
        return self._zephon_even

    def _even_after_fork(self, base: Any) -> Even | None:
        """:meth:`_even`, once the workers of ``base`` have started: its all-reduce finishes on
        gloo's threads, and a fork while one of them makes its Python thread state can leave the
        new worker stuck inside the fork for good (CPython up to 3.11.7, gh-112275: the child
        waits on the lock of the thread-state list that the other thread held); so workers fork
        first. Should it fail, the workers are shut down before the error is raised."""
        try:
            return self._even()
        except BaseException:
            shutdown = getattr(base, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            raise

    def _countable(self) -> bool:
        """Whether the remaining batches can be counted: by random access, or (packed) by packing
        the rest of a stream known to end."""
        template = self._zephon_book.pipeline.source
        if self._zephon_book.pipeline.packing is not None:
            return getattr(template, "config", None) is not None and maybe_finite(template)
        return countable(template)

    def _packed_target(self) -> int:
        """The equal-steps budget of a packed pipeline: this rank's count, the smallest over the
        ranks by an all-reduce, or (without torch.distributed, every lane's position known)
        every rank's count made here."""
        import torch.distributed as dist

        book, count = self._zephon_book, self._counter()
        every = range(book.canonical_replicas)
        if book.world_size == 1 or (dist.is_available() and dist.is_initialized()) or not book.known(every):
            own = count(self._entries(), self._operators()).units
            return own if book.world_size == 1 else _all_reduce_min(own, book)
        operators = book.operators(list(every))
        ranks = [rank_lanes(book.canonical_replicas, rank, book.world_size, book.mapping)
                 for rank in range(book.world_size)]
        return min(count(book.entries(lanes), {lane: operators[lane] for lane in lanes}).units for lanes in ranks)

    def _log_config(self, plan: Plan, even: Even | None) -> None:
        if not log.isEnabledFor(logging.DEBUG):
            return
        book = self._zephon_book
        config = {"rank": book.rank, "world_size": book.world_size, "canonical_replicas": book.canonical_replicas,
                  "mapping": book.mapping, "readers": self._readers(),
                  "lanes": {w: lanes for w, lanes in plan.lanes.items()}, "batch_size": plan.batch_size,
                  "drop_last": plan.drop_last, "even_batches": None if even is None else even.left,
                  "steps": [f"{kind}({getattr(fn, '__qualname__', fn)})" for kind, fn in book.pipeline.steps],
                  "source": source_settings(book.pipeline.source)}
        log.debug("zephon: resolved configuration %s", json.dumps(config, default=str))

    def __iter__(self) -> LoaderIterator:  # type: ignore[override]  # zephon's iterator wraps torch's
        self._settle()
        book = self._zephon_book
        readers = self._readers()
        lanes = {w: book.worker_lanes(w, readers) for w in range(readers)}
        idle = [w for w, owned in lanes.items() if not owned]
        if idle and len(idle) < readers:
            log_once(f"zephon: rank {book.rank} reads {len(book.rank_lanes())} lanes with {readers} DataLoader "
                     f"workers; workers {idle} have no lane and stay idle")
        say_in_flight(book.pipeline.source, max(map(len, lanes.values())), book.rank)
        batch_size, drop_last, collate_fn = self._zephon_batch
        plan = Plan(book.pipeline, book.canonical_replicas, lanes, book.entries(), batch_size, drop_last, collate_fn,
                    self._zephon_cache_bytes, book.operators())
        context = self.multiprocessing_context or torch.multiprocessing.get_context()
        relay = self._zephon_relay
        if self.num_workers > 0 and context.get_start_method() == "fork" and (relay is None or relay.reads):
            assert self.prefetch_factor is not None  # torch sets it whenever there are workers
            plan.share_memory(readers, self.prefetch_factor + SPARE, context)
        if self.num_workers > 0 and (relay is None or relay.reads):
            plan.share_pieces(readers)
        readers_dataset = self.dataset
        assert isinstance(readers_dataset, Readers)
        readers_dataset.plan = plan
        if self.persistent_workers and self._iterator is not None:
            self._iterator._shutdown_workers()  # type: ignore[attr-defined]  # workers must start anew
            self._iterator = None
        base = super().__iter__() if relay is None or relay.reads else None  # the others receive: no readers
        even = self._even_after_fork(base)
        self._log_config(plan, even)
        live = LoaderIterator(base, plan, self._zephon_stats, even, self._counter(), relay)
        self._zephon_before, self._zephon_loaded = self._zephon_loaded, 0  # a later iter() starts a new epoch
        if self.num_workers > 0 and base is not None:
            widen_pipe(base)
            watch_workers(live)
        self._zephon_live = live
        return live

    def __len__(self) -> int:
        """The batches (or items) of the current iteration, its epoch, as torch users expect:
        what a learning-rate schedule or a progress bar reads before iterating, unchanged while
        it runs and after it ends (a new ``iter()`` after the end has 0). A loader resumed by
        ``load_state_dict`` has the length of the epoch it resumes into: the batches delivered
        of it before the checkpoint plus what is left, as a training framework that counts the
        batches of its epoch (Lightning, transformers) expects. :meth:`remaining` is what is
        still to come. With ``even_batches``, the same number on every rank; it needs a finite
        source that can count what is left, else ``TypeError``."""
        return self.remaining() + self._in_epoch(0)

    def _in_epoch(self, lag: int) -> int:
        """The units of the current epoch delivered, as of ``lag`` units before the last one."""
        live = self._zephon_live
        return self._zephon_loaded if live is None else self._zephon_before + live.yielded - lag

    def remaining(self) -> int:
        """Batches (or items) still to come from the loader's position (with ``even_batches``,
        the same on every rank); ``TypeError`` where the source cannot count them."""
        template = self._zephon_book.pipeline.source
        if not self._countable():
            raise TypeError(f"{type(template).__name__} cannot count its remaining samples (an unbounded stream or "
                            "no random access), so this DataLoader has no length")
        even = self._even()
        if even is not None:
            return even.left
        return self._counter()(self._entries(), self._operators()).units

    def stats(self) -> LoaderStatsDict:
        """What this rank delivered and where its datasets stand (plain JSON; see
        :class:`zephon.runtime.LoaderStatsDict`).

        ``batches``; ``samples`` per component; ``filtered`` (items filter steps dropped);
        ``datasets``: per dataset what the loop received of it, as the source's ``coverage()``
        figures (``passes_completed``, ``position`` and ``unread_in_pass`` of the pass in
        progress, ``pass_length``, ``never_read``: skipped pass tails), counting the received
        part of each lane's chunk in flight and every global chunk before the cut of this
        rank's lanes, and its ``policy``; ``redistributed`` (datasets that ran dry
        and whose share went to the others) and ``exhausted`` (what ended the stream);
        ``ended``; ``even_batches``: ``steps`` (this run's equal step count from where it was
        set), ``given``, ``held_back_batches`` and ``held_back_samples`` (None without it);
        ``tokens`` (packed pipelines, else None): ``received`` (real tokens per component),
        ``padding``, ``dropped`` (tokens of the sequences open at a lane's end that
        ``pack(final="drop")`` dropped), ``target`` (``ensure_mixture``'s shares) and ``late``
        (strict mode's forced picks).
        For a packed pipeline ``samples`` counts the documents whose first token the loop
        received, and ``drop_last`` counts sequences. ``shared_decoding`` (None until workers
        shared a store of decoded Parquet row groups): the row groups they ``decoded``, those
        a worker read from another's decoding (``shared``), those decoded but kept by one
        worker (``unshared``: the store in ``/dev/shm`` was full or unwritable) and the times a
        worker ``waited`` for another's decoding, summed over the iterations.
        """
        even, live = self._zephon_even, self._zephon_live
        if live is not None:
            live.settle()
        packing = self.pipeline.packing
        operators = None if packing is None else self._operators()
        late = None
        if packing is not None and packing.strict and operators is not None:
            late = self._zephon_stats.late(operators.values())
        return self._zephon_stats.as_json(self.canonical_replicas, self._entries(),
                                          None if even is None else even.as_json(), late,
                                          None if live is None else live.piece_counts(), operators)

    def state_dict(self, lag: int = 0) -> LoaderStateDict:
        """Where this rank's lanes stand after the last batch received (JSON; size ∝ lanes).

        ``lag`` (default 0): the state as of ``lag`` batches before the last one yielded, for
        a training framework that fetches batches ahead of the step it trains (Lightning and
        accelerate fetch one ahead: the step trained on batch n while the loader has yielded
        n + 1). At most ``zephon.limits.MAX_LAG`` (4) batches of the running iteration;
        ``ValueError`` beyond what it yielded.

        Called by ``torch.distributed.checkpoint`` (``save``, ``async_save``, ``load``), it
        returns one entry per lane instead (``{"zephon_lanes": {lane: JSON}}``): DCP keeps each
        key once, and only a lane's own rank holds its key, so a checkpoint saved on N ranks
        loads on M. Called by Lightning, it is the global state (every rank's lanes, gathered:
        Lightning calls it on every rank and keeps rank 0's)."""
        caller = dcp_caller()
        if caller is not None:
            return cast(LoaderStateDict, dcp_state_dict(self._zephon_book, lambda: self._state(lag), caller, self))
        if not sys._getframe(1).f_globals.get("__name__", "").startswith(("lightning.", "pytorch_lightning.")):
            return self._state(lag)
        if not self._countable():  # Lightning fetches ahead of its step when a loader has no length
            log_once("zephon: Lightning saves this DataLoader's state in its checkpoints, but it fetches a batch "
                     "ahead of the step it trains (the loader has no length), so that state is one batch past the "
                     "step and a resume would skip a batch: use zephon.lightning.DataModule(pipeline, ...) instead")
        state = self._state(lag)
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        return all_gather_state(state) if distributed and torch.distributed.get_world_size() > 1 else state

    def _state(self, lag: int) -> LoaderStateDict:
        if type(lag) is not int or not 0 <= lag <= MAX_LAG:
            raise ValueError(f"state_dict(lag={lag!r}) must be an int in 0 .. {MAX_LAG} (batches before the last one "
                             "yielded)")
        live, book = self._zephon_live, self._zephon_book
        if live is None and lag:
            raise ValueError(f"state_dict(lag={lag}): no iteration is running, so there are no batches to step "
                             "back over; lag=0 is the state after the last batch received")
        with paused_gc():
            if live is None:
                return book.state(book.saved_entries(), num_workers=self.num_workers, operators=self._operators(),
                                  batch_size=self.batch_size, in_epoch=self._in_epoch(0))
            entries, operators = live.entries(lag), live.operators(lag)  # these check lag
            return book.state(entries, num_workers=self.num_workers, operators=operators,
                              batch_size=self.batch_size, in_epoch=self._in_epoch(lag))

    def check_state_dict(self, state: Any) -> None:
        """Raise ``ValueError`` unless ``state`` restores into this loader (nothing changes)."""
        self._zephon_book.check(state)

    def load_state_dict(self, state: Any) -> None:
        """Resume from ``state``: this rank's state, or a merged global state of any earlier
        topology with the same ``canonical_replicas``. Checks everything before changing anything.
        An iterator already running keeps going but no longer moves the loader's position.
        With ``even_batches`` the step count is counted again from the loaded positions.
        Also takes what ``torch.distributed.checkpoint.load`` loaded for this loader. The next
        iteration continues the state's epoch: ``len()`` counts the batches it had delivered (0,
        logged once, for a state of loader state version 4 or earlier, which does not record them)."""
        if is_dcp_form(state):
            state = from_dcp(state)
        parsed = self._zephon_book.load(state)
        if parsed.in_epoch is None:
            log_once("zephon: the loaded state predates the count of batches delivered in its epoch (loader state "
                     "version 4 or earlier): len(loader) counts the resumed epoch from the checkpoint")
        self._zephon_loaded, self._zephon_before = parsed.in_epoch or 0, 0
        if self._zephon_live is not None:
            self._zephon_live.settle()
            self._zephon_live.close_pieces()
        self._zephon_live = None
        self._zephon_even = None
        self._zephon_stats.ended = False


def _count_samples(template: Any, replicas: int, entries: Mapping[int, Entry], operators: Mapping[int, Any], *,
                   rank: int, world_size: int, mapping: str, batch_size: int | None, drop_last: bool) -> RankCount:
    return count_rank(template, replicas, entries, rank, world_size, mapping, batch_size, drop_last, checked=True)


def _count_packed(pipeline: Pipeline, packing: Any, replicas: int, entries: Mapping[int, Entry],
                  operators: Mapping[int, Any], *, batch_size: int | None, drop_last: bool) -> RankCount:
    log.info("zephon: even_batches on a packed pipeline: counting the sequences of %d lanes by reading and "
             "tokenizing their remaining documents", len(entries))
    return count_packed(pipeline, packing, replicas, entries, operators, batch_size, drop_last)


def _all_reduce_min(value: int, book: LaneBook) -> int:
    """The smallest ``value`` over the ranks (a collective); needs torch.distributed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"even_batches=True needs every rank's position to count the steps, but rank {book.rank} "
                         "holds only its own lanes' (a per-rank state was loaded): load the global state "
                         "(zephon.torch.all_gather_state / merge_states of every rank's state), initialise "
                         "torch.distributed first, or pass even_batches=False")
    tensor = torch.tensor([value], dtype=torch.int64, device=collective_device(None))
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def source_settings(source: Any) -> dict[str, Any]:
    """The resolved settings of a mixture source that shape its stream (for the DEBUG log)."""
    config = getattr(source, "config", None)
    if config is None:
        return {"source": repr(source)}
    return {"chunk_size": config.chunk_size, "seed": config.seed, "stop_after_passes": config.stop_after_passes,
            "datasets": {d.name: {"weight": d.weight, "policy": d.policy, "max_repeats": d.max_repeats,
                                  "block_size": d.block_size, "samples_per_pass": int(d.total)}
                         for d in config.datasets}}

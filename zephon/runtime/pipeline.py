"""Pipeline: a work source, the records its pointers name, and per-record map steps.

| use | for |
|---|---|
| ``Pipeline(source)`` | items of the source's stream: record fields + ``_sample_id`` + ``_component`` |
| ``.map(fn)`` | a stateless per-record step (returns a new pipeline) |
| ``.filter(predicate)`` | drop the items ``predicate`` rejects (they count as consumed) |
| ``.tokenize(tokenizer)`` | ``input_ids`` and ``num_tokens`` from a text field (a stateless step) |
| ``.pack(seq_len)`` | each lane's documents as fixed-length token sequences (the last step) |
| ``.ensure_mixture(mode)`` | the token mixture of the packed sequences, reported or enforced |
| ``iter(pipeline)`` | the whole stream in one process (lane 0 of 1: global chunk order) |
| ``.to_torch_dataset()`` | a torch ``IterableDataset`` (lanes on ranks and workers, checkpointable) |
| ``.to_indexable_torch_dataset()`` | a map-style torch ``Dataset`` via random access |
| ``zephon.torch.DataLoader(pipeline, ...)`` | the checkpointable, elastic torch DataLoader |

An item is a dict: the record's fields (a record that is not a mapping comes as
``{"record": value}``), then ``"_sample_id"`` — the ``(dataset_id, shard_id, offset)`` tuple —
and ``"_component"`` — the component's name. Count-only datasets have no records, so their
items hold just those two keys. Records are read with :func:`zephon.io.fetch`, batched per
shard. This module never imports torch.
"""
from __future__ import annotations

import logging
import numbers
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from zephon._ext.labels import BatchNames
from zephon.io import Readahead, fetch, fetch_rows, take_records
from zephon.io.catalog import uncombined
from zephon.ops import MixtureConfig, PackConfig, Packing, mixture, pack, tokenize
from zephon.runtime._packed import initial_operator, packed_items
from zephon.runtime._stream import DROPPED, ItemStream, component_table, initial_entries
from zephon.work import WorkSource, by_value

KEY_SAMPLE_ID, KEY_COMPONENT, KEY_RECORD = "_sample_id", "_component", "record"
PREFETCH_BYTES = 256 << 20  # readahead bound per reader when data is not on a local disk
PREFETCH_THREADS = 8
MAP, FILTER, TOKENIZE = "map", "filter", "tokenize"
LOG = logging.getLogger("zephon")


def _map_all(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """``fn`` over the items (dropped ones stay dropped), each result keeping the item's
    ``_sample_id`` / ``_component``. Plain dicts that carry the item's own keys over (the usual
    map) skip every other check: the ``Mapping`` ABC checks and comparing the keys cost more
    than the rest."""
    out = []
    for item in items:
        if item is DROPPED:
            out.append(item)
            continue
        new = fn(item)
        if not (type(new) is dict and type(item) is dict and new.get(KEY_SAMPLE_ID) is item.get(KEY_SAMPLE_ID)
                and new.get(KEY_COMPONENT) is item.get(KEY_COMPONENT)):
            new = _kept_keys(fn, item, new)
        out.append(new)
    return out


def _tokenize_all(config: tokenize.TokenizeConfig, items: list[Any], own: bool) -> list[Any]:
    """The items tokenized in one batch (dropped ones stay dropped); ``own``: they are dicts
    this pipeline made, which take the ids in place."""
    kept = [k for k, item in enumerate(items) if item is not DROPPED]
    chosen = [items[k] for k in kept]
    if own:
        tokenize.tokenize_own(config, chosen)
    else:
        chosen = tokenize.tokenize_items(config, chosen)
    out = list(items)
    for k, item in zip(kept, chosen):
        out[k] = item
    return out


def _source_weights(source: WorkSource) -> dict[str, float]:
    """A mixture source's weights by component (its datasets' names)."""
    datasets = getattr(getattr(source, "config", None), "datasets", None)
    if datasets is None:
        raise ValueError(f"ensure_mixture: {type(source).__name__} has no mixture weights to target; pass "
                         "weights={component: share, ...}")
    return {d.name: float(d.weight) for d in datasets}


def _kept_keys(fn: Callable[[Any], Any], item: Any, out: Any) -> Any:
    """``fn``'s result ``out`` for ``item``, with the item's ``_sample_id`` / ``_component`` kept
    on a mapping (added where missing; a change is an error)."""
    if not isinstance(item, Mapping) or not isinstance(out, Mapping) or KEY_SAMPLE_ID not in item:
        return out
    for key in (KEY_SAMPLE_ID, KEY_COMPONENT):
        if key not in out:
            if not isinstance(out, dict):
                raise TypeError(f"map step {_name(fn)} returned a {type(out).__name__} without {key!r}; return a "
                                "dict (zephon adds the key) or keep the item's key")
            out[key] = item[key]
        elif out[key] != item[key]:
            raise ValueError(f"map step {_name(fn)} changed {key!r} from {item[key]!r} to {out[key]!r}; map steps "
                             f"must keep {KEY_SAMPLE_ID!r} and {KEY_COMPONENT!r} (checkpoints and stats use them): "
                             "put derived values under another key")
    return out


def _all_paths(datasets: Any) -> bool:
    """Whether every dataset is a path dataset (its reads give new dicts, nothing shared to copy)."""
    return bool(datasets) and all(getattr(d, "catalog", None) is not None for d in datasets)


def _same_columns(datasets: Any, columns: tuple[str, ...] | None) -> bool:
    """Whether batches can be read as Arrow columns: every dataset is a path dataset whose
    records a table holds (not token files), and every shard has the same (selected) columns,
    of types that combine into one without changing a value (``zephon.io.fetch_table``).
    Otherwise items are collated (which names mixed fields clearly); a reason other than token
    files is logged."""
    datasets = list(datasets)
    if not _all_paths(datasets):
        return False
    readers = [getattr(d, "reader", None) for d in datasets]
    if not all(r is not None and (r.columnar or r.tabular) for r in readers):
        return False
    schemas = [tuple((n, t) for n, t in c.schemas[k] if columns is None or n in columns)
               for c in (d.catalog for d in datasets) for k in np.unique(c.schema_of[c.schema_of >= 0]).tolist()]
    problem = uncombined(schemas)
    if problem is not None:
        LOG.info("zephon: batches are collated from records, not read as columns: %s (%s)", problem,
                 ", ".join(d.name for d in datasets))
    return problem is None


def _one_arrow_schema(datasets: Any) -> bool:
    """Whether every shard of every dataset is read as Arrow tables (Parquet, Arrow) and has the
    very same columns, in the same order and of the same types: then their records can be
    gathered from many shards at once and come out as a read per shard makes them."""
    schemas: set[Any] = set()
    for dataset in datasets:
        catalog, reader = getattr(dataset, "catalog", None), getattr(dataset, "reader", None)
        if catalog is None or reader is None or not reader.columnar or (catalog.schema_of < 0).any():
            return False
        schemas.update(catalog.schemas[k] for k in np.unique(catalog.schema_of).tolist())
    return len(schemas) == 1


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", repr(fn))


class Pipeline:
    """Items of ``work_source``'s stream: records fetched from its datasets, then ``map`` steps.

    Parameters
    ----------
    work_source : WorkSource
        The template source you built (each lane is cloned from it).
    columns : sequence of str or None, default None
        Read only those columns of path datasets (``None``: all).
    prefetch_bytes : int or None, default None
        Readahead: every reader (the main process or each DataLoader worker) loads the pieces
        (row groups, record batches, spans of JSONL lines) of its lanes' chunks in flight and
        next chunks in the background, holding at most this many bytes not yet read. ``None``:
        :data:`PREFETCH_BYTES` when a dataset is not on a local disk (object storage, a remote
        or explicit filesystem), else off; ``0``: off.
    prefetch_threads : int, default 8
        Background threads of the readahead (one request each at a time).
    """

    def __init__(self, work_source: WorkSource, *, columns: Sequence[str] | None = None,
                 prefetch_bytes: int | None = None, prefetch_threads: int = PREFETCH_THREADS):
        if not isinstance(work_source, WorkSource):
            raise TypeError(f"Pipeline needs a WorkSource (e.g. StaticMixtureWorkSource), got "
                            f"{type(work_source).__name__}")
        if work_source.lane_id is not None:
            raise ValueError(f"Pipeline needs the template source, not the clone of lane {work_source.lane_id}; "
                             "pass the source you built (zephon clones it per lane)")
        if columns is not None and (isinstance(columns, str) or not all(isinstance(c, str) for c in columns)):
            raise TypeError(f"columns={columns!r} must be a list of column names, e.g. ['text']")
        for parameter, value, low in (("prefetch_bytes", prefetch_bytes, 0), ("prefetch_threads", prefetch_threads, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low):
                raise ValueError(f"{parameter}={value!r} must be an int >= {low}"
                                 + (" or None (automatic)" if parameter == "prefetch_bytes" else ""))
        self._source = work_source
        self._steps: tuple[tuple[str, Any], ...] = ()
        self._columns = None if columns is None else tuple(columns)
        self._vocabulary = component_table(work_source.component_ids())
        names = np.empty(max(self._vocabulary.values(), default=-1) + 1, dtype=object)
        for name, i in self._vocabulary.items():
            names[i] = name
        self._names = names
        self._name_tuple: tuple[str | None, ...] = tuple(names.tolist())  # unused ids have None
        datasets = dict(work_source.datasets_by_id)
        self._datasets = datasets
        readable = np.zeros(max(datasets, default=-1) + 1, dtype=bool)
        for dataset_id, dataset in datasets.items():
            readable[dataset_id] = dataset.has_records
        self._readable = readable
        self._any_records = bool(readable.any())
        self._all_paths = _all_paths(list(datasets.values()))
        self._columnar = _same_columns(datasets.values(), self._columns)
        self._gathers = _one_arrow_schema(datasets.values())  # see _records
        if prefetch_bytes is None:
            remote = any((reader := getattr(d, "reader", None)) is not None and not reader.shards.location.is_local
                         for d in datasets.values())
            prefetch_bytes = PREFETCH_BYTES if remote else 0
        self._prefetch = (int(prefetch_bytes), int(prefetch_threads))
        self._packing: Packing | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Map and filter steps and tokenizers are pickled by value (cloudpickle): lambdas reach
        spawned DataLoader workers."""
        state = dict(self.__dict__)
        state["_steps"] = tuple((kind, replace(fn, tokenizer=by_value(fn.tokenizer)) if kind == TOKENIZE else by_value(fn))
                                for kind, fn in self._steps)
        return state

    # -- composition ------------------------------------------------------------------------

    def map(self, fn: Callable[[Any], Any]) -> Pipeline:
        """A new pipeline that applies ``fn`` to every item (after the earlier steps).

        ``fn`` must be stateless: an item's result may only depend on the item, since items are
        produced by several workers and replayed on resume. When ``fn`` returns a dict without
        ``_sample_id`` / ``_component``, the item's are added to it; a result that changes them
        raises ``ValueError`` (checkpoints, stats and batches rely on them).
        """
        return self._with_step(MAP, fn)

    def filter(self, predicate: Callable[[Any], Any]) -> Pipeline:
        """A new pipeline without the items for which ``predicate(item)`` is false.

        A dropped item still counts as consumed: checkpoints stay exact and a resume never
        sees it again. The loader counts drops in ``stats()["filtered"]``. Batches are cut
        from the stream before filtering, so a batch holds at most ``batch_size`` items (and
        the number of batches does not depend on the predicate). ``predicate`` must be
        stateless, like a map step.
        """
        return self._with_step(FILTER, predicate)

    def tokenize(self, tokenizer: Any, field: str = "text", add_eos: bool = True, *,
                 eos_id: int | None = None) -> Pipeline:
        """A new pipeline whose items also hold ``input_ids`` (an int64 array) and ``num_tokens``.

        ``tokenizer``: a callable ``str -> ids`` or an object with ``encode`` (a Hugging Face
        ``tokenizers.Tokenizer``, whose ``encode_batch`` then tokenizes a block of items at
        once, or a ``transformers`` tokenizer). ``field`` (default ``"text"``): the item's text.
        ``add_eos`` (default True): append ``eos_id`` to every document; ``eos_id`` (default
        None): the tokenizer's ``eos_token_id`` (a tokenizer without one needs it given).
        Deterministic: the same text always gives the same ids.
        """
        return self._with_step(TOKENIZE, tokenize.config(tokenizer, field, add_eos, eos_id))

    def pack(self, seq_len: int, strategy: str = pack.CONCAT, pad_id: int | None = None, bos_id: int | None = None,
             eos_id: int | None = None, *, final: str | None = None, pool: int = pack.POOL) -> Pipeline:
        """A new pipeline of packed sequences: each lane's documents (items with ``input_ids``,
        e.g. from :meth:`tokenize`) become sequences of ``seq_len`` tokens.

        ``strategy``: ``"concat"`` (default) concatenates documents and cuts every ``seq_len``
        tokens (a document may span sequences); ``"best_fit"`` keeps documents shorter than
        ``seq_len`` whole (longer ones are cut into ``seq_len`` pieces), placing each into the
        fullest of at most ``pool`` (default 8) open sequences it fits, padded with ``pad_id``.
        ``bos_id`` / ``eos_id`` (default None): put before / after every document.
        ``final``: at the lane's end, the sequences still open (one with ``"concat"``, up to
        ``pool`` with ``"best_fit"``) are ``"pad"``-ded or ``"drop"``-ped (counted in
        ``stats()["tokens"]["dropped"]``); default ``"pad"`` when there is a ``pad_id``.

        An item is a sequence: ``input_ids``, ``segment_ids`` (1, 2, … per document piece, 0
        on padding) and ``position_ids`` (from 0 in each piece), each ``(seq_len,)`` int64, for
        document-masked attention; ``_documents``, per piece ``(dataset, shard, offset,
        component, start, end)`` (its pointer and token span); ``_tokens``, real tokens per
        component. Packing runs per lane, so checkpoints stay exact and elastic: they hold the
        packer's documents as pointers and token offsets, re-read and re-tokenized on restore.
        ``pack`` is the last step (but ``ensure_mixture``).
        """
        if self._packing is not None:
            raise ValueError("pack() was already called on this pipeline; a pipeline packs once")
        new = self._copy(self._steps)
        new._packing = self._packing_of(pack.config(seq_len, strategy, pad_id, bos_id, eos_id, final, pool), None)
        return new

    def ensure_mixture(self, mode: str = mixture.REPORT, tolerance: float = 0.01, *,
                       weights: Mapping[str, float] | None = None, queue: int = mixture.QUEUE) -> Pipeline:
        """A new pipeline that measures (``mode="report"``, default) or enforces
        (``mode="strict"``) the token mixture of the packed sequences, after :meth:`pack`.

        ``weights``: the target token shares by component (default: the source's mixture
        weights). ``"report"`` counts the real tokens per component of what the loader delivers
        (``stats()["tokens"]``) and logs when a share is off its target by more than
        ``tolerance`` (relative, default 0.01). ``"strict"`` (with ``pack(strategy="concat")``)
        fills each sequence from the component furthest behind its target share of the lane's
        tokens so far, so every prefix of a lane holds each component within about one sequence
        of its target. It waits for a component while fewer than ``queue`` (default 256)
        documents are queued; past that it takes the queued component furthest behind (the
        pieces placed so are counted, per component waited for, in ``stats()["tokens"]["late"]``,
        and said once per component). The queued documents are part of the checkpoint, as
        positions in the lane.
        """
        if self._packing is None:
            raise ValueError("ensure_mixture() measures packed sequences: call .pack(seq_len) first")
        if self._packing.mixture is not None:
            raise ValueError("ensure_mixture() was already called on this pipeline; call it once, with the mode you want")
        shares = weights if weights is not None else _source_weights(self._source)
        checked = mixture.config(mode, shares, self._vocabulary, tolerance, queue)
        if checked.mode == mixture.STRICT:
            mixture.init(checked, self._packing.pack)  # refuses a packer it cannot drive
            unweighted = sorted(name for name, i in self._vocabulary.items() if checked.shares[i] == 0)
            if unweighted:
                raise ValueError(f"ensure_mixture(mode='strict'): components {unweighted} have no target share, but "
                                 "the source delivers them; give every component a weight")
        new = self._copy(self._steps)
        new._packing = self._packing_of(self._packing.pack, checked)
        return new

    def _packing_of(self, packing: PackConfig, mixing: MixtureConfig | None) -> Packing:
        tokenizers = [config for kind, config in self._steps if kind == TOKENIZE]
        return Packing.of(packing, mixing, tokenizers)

    def _with_step(self, kind: str, fn: Any) -> Pipeline:
        if kind != TOKENIZE and not callable(fn):
            raise TypeError(f"{kind}(fn): fn must be callable, got {fn!r}")
        if self._packing is not None:
            raise ValueError(f"{kind}() after pack(): steps on documents come before pack; to change packed "
                             "sequences, pass a collate_fn to the DataLoader")
        return self._copy(self._steps + ((kind, fn),))

    def _copy(self, steps: tuple[tuple[str, Any], ...]) -> Pipeline:
        new = object.__new__(Pipeline)
        for slot in ("_source", "_columns", "_vocabulary", "_names", "_datasets", "_readable", "_any_records",
                     "_all_paths", "_columnar", "_gathers", "_prefetch", "_packing", "_name_tuple"):
            setattr(new, slot, getattr(self, slot))
        new._steps = steps
        return new

    # -- what it is -------------------------------------------------------------------------

    @property
    def source(self) -> WorkSource:
        return self._source

    @property
    def maps(self) -> tuple[Callable[[Any], Any], ...]:
        """The map functions, in order."""
        return tuple(fn for kind, fn in self._steps if kind == MAP)

    @property
    def steps(self) -> tuple[tuple[str, Any], ...]:
        """The ``("map" | "filter", fn)`` and ``("tokenize", TokenizeConfig)`` steps, in order."""
        return self._steps

    @property
    def packing(self) -> Packing | None:
        """The packing stage (``pack``, and ``ensure_mixture``), or None."""
        return self._packing

    @property
    def columns(self) -> tuple[str, ...] | None:
        return self._columns

    @property
    def datasets_by_id(self) -> Mapping[int, Any]:
        return self._datasets

    @property
    def vocabulary(self) -> dict[str, int]:
        """The source's ``component_ids()``: component name -> id."""
        return self._vocabulary

    @property
    def kinds(self) -> int:
        """The number of component ids, ``0 .. kinds - 1`` (some may be unused)."""
        return len(self._names)

    def component_names(self, ids: np.ndarray) -> list[str]:
        """Names of component ``ids`` (one per sample)."""
        names: list[str] = self._names[ids].tolist()
        return names

    def batch_names(self, ids: np.ndarray, bounds: Sequence[int]) -> BatchNames:
        """Per batch, the names of its samples' component ids, each list made when indexed:
        batch ``k`` holds ``ids[bounds[k]:bounds[k + 1]]``."""
        return BatchNames(self._name_tuple, ids, bounds)

    @property
    def is_indexable(self) -> bool:
        """Whether items can be read by position (``to_indexable_torch_dataset``): a finite
        source with random access (map steps are per record, so they never prevent it)."""
        return self._packing is None and bool(self._source.supports_indexing())

    @property
    def pointer_only(self) -> bool:
        """No records and no steps: an item is just its pointer and component."""
        return not self._any_records and not self._steps and self._packing is None

    @property
    def columnar(self) -> bool:
        """Every dataset is a path dataset of records a table holds, every shard has columns that
        combine into one table, and there are no steps: batches can be read as columns."""
        return self._columnar and not self._steps and self._packing is None

    @property
    def prefetch_bytes(self) -> int:
        """The readahead's bound in bytes (0: no readahead)."""
        return self._prefetch[0]

    def readahead(self) -> Readahead | None:
        """A new readahead for one reader's stream (None when off or nothing is read from storage)."""
        budget, threads = self._prefetch
        if not budget or not self._any_records:
            return None
        return Readahead(self._datasets, budget, threads, self._columns)

    # -- items ------------------------------------------------------------------------------

    def materialize(self, pointers: np.ndarray, components: np.ndarray) -> list[Any]:
        """The items of ``pointers`` (``(n, 3)`` int64) with component ids ``components``, in order,
        less those a filter step dropped."""
        return [item for item in self.materialize_marked(pointers, components) if item is not DROPPED]

    def materialize_marked(self, pointers: np.ndarray, components: np.ndarray) -> list[Any]:
        """One entry per pointer: its item, or :data:`DROPPED` where a filter step rejected it."""
        return self._steps_over(self._items(pointers, components))

    def _items(self, pointers: np.ndarray, components: np.ndarray) -> list[Any]:
        """The pointers' items before any step: each a dict of its record's fields (if it has
        a record), its ``_sample_id`` and its ``_component``."""
        ids = pointers.tolist()
        names = self._names[components].tolist()
        if not self._any_records:
            return [{KEY_SAMPLE_ID: tuple(p), KEY_COMPONENT: c} for p, c in zip(ids, names)]
        readable = self._readable[pointers[:, 0]]
        rows = np.flatnonzero(readable)
        fresh = self._all_paths  # files give a new dict per record: nothing shared to copy
        if fresh and len(rows) == len(ids):  # every item is its record, its keys set in place
            items: list[Any] = self._records(pointers)
            for item, p, c in zip(items, ids, names):
                item[KEY_SAMPLE_ID] = tuple(p)
                item[KEY_COMPONENT] = c
            return items
        records = iter(self._records(pointers[rows]) if len(rows) else ())
        items = []
        for p, c, r in zip(ids, names, readable.tolist()):
            if r:
                record = next(records)
                if fresh:
                    item = record
                else:
                    item = dict(record) if type(record) is dict or isinstance(record, Mapping) else {KEY_RECORD: record}
            else:
                item = {}
            item[KEY_SAMPLE_ID] = tuple(p)
            item[KEY_COMPONENT] = c
            items.append(item)
        return items

    def _steps_over(self, items: list[Any]) -> list[Any]:
        """The map, tokenize and filter steps over a reader's new items, in order."""
        own = True  # the items are dicts made here (a map step may return objects it keeps)
        for kind, fn in self._steps:
            if kind == MAP:
                items, own = _map_all(fn, items), False
            elif kind == TOKENIZE:
                items = _tokenize_all(fn, items, own)
            else:
                items = [item if item is DROPPED or fn(item) else DROPPED for item in items]
        return items

    def _records(self, pointers: np.ndarray) -> list[Any]:
        """The records at ``pointers``: when every shard is an Arrow table of one schema
        (:func:`_one_arrow_schema`), gathered at once and made dicts column by column
        (``fetch_rows``, then ``take_records``), which costs far less a record than a read per
        shard (``fetch``)."""
        if self._gathers:
            return take_records(*fetch_rows(self._datasets, pointers, self._columns))
        return fetch(self._datasets, pointers, self._columns)

    def items_at(self, pointers: np.ndarray) -> list[Any]:
        """Items of ``pointers`` whose component is their dataset's name (random access)."""
        pointers = np.asarray(pointers, dtype=np.int64).reshape(-1, 3)
        components = self._dataset_components()[pointers[:, 0]]
        return self.materialize(pointers, components)

    def _dataset_components(self) -> np.ndarray:
        table = np.full(max(self._datasets, default=-1) + 1, -1, dtype=np.int64)
        for dataset_id, dataset in self._datasets.items():
            component = self._vocabulary.get(dataset.name)
            if component is None:
                raise TypeError(f"dataset {dataset.name!r} is not a component of the source "
                                f"({sorted(self._vocabulary)}), so random access cannot name its component")
            table[dataset_id] = component
        return table

    def __iter__(self) -> Iterator[Any]:
        """Every item of the stream in one process: lane 0 of 1, i.e. global chunk order (packed:
        the sequences of that one lane)."""
        entries = initial_entries(self._source, [0], 1)
        if self._packing is not None:
            operators = {0: initial_operator(self._packing)}
            return packed_items(self, self._packing, [0], 1, entries, operators, self._name_tuple)
        return ItemStream(self, [0], 1, entries)

    # -- torch front ends (import torch) ------------------------------------------------------
    # The one upward reference of the runtime: the seed names these methods on Pipeline, while
    # zephon.torch is built on this package. Importing inside the method keeps the module graph
    # acyclic and torch optional.

    def to_torch_dataset(self, *, canonical_replicas: int | None = None, mapping: str = "contiguous",
                         rank: int | None = None, world_size: int | None = None, **layout: Any) -> Any:
        """A torch ``IterableDataset`` of the items: see :class:`zephon.torch.StreamDataset`
        (``layout``: its ``device_mesh``, ``dp_dims``, ``dp_group``, ``dp_rank``, ``dp_size``).
        A packed pipeline is read with :class:`zephon.torch.DataLoader` (``TypeError`` here)."""
        from zephon.torch import StreamDataset

        return StreamDataset(self, canonical_replicas=canonical_replicas, mapping=mapping, rank=rank,
                             world_size=world_size, **layout)

    def to_indexable_torch_dataset(self, *, lane: int | None = None, canonical_replicas: int | None = None) -> Any:
        """A map-style torch ``Dataset`` of the items: see :class:`zephon.torch.IndexedDataset`.

        Raises ``TypeError`` when the pipeline is not indexable (see :attr:`is_indexable`).
        """
        from zephon.torch import IndexedDataset

        return IndexedDataset(self, lane=lane, canonical_replicas=canonical_replicas)

    def __repr__(self) -> str:
        steps = ", ".join(f"{kind}({_name(fn)})" for kind, fn in self._steps)
        return f"Pipeline({self._source!r}{', steps=[' + steps + ']' if steps else ''})"


def batch_names_reference(names: Sequence[Any], ids: np.ndarray, bounds: Sequence[int]) -> list[list[Any]]:
    """What the labels kernel's ``BatchNames`` holds (pure): per batch the names of its ids."""
    return [[names[i] for i in ids[a:b].tolist()] for a, b in zip(bounds, bounds[1:])]

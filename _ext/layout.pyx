# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Pass layout kernel: where each position of one pass of a dataset lives (shard id and row).

Defined by the shard lookup and within-shard stages of
zephon/core/cursor.py::pointer_reference (the block mosaic before them is cursor.pyx's). It
stands apart from the loops that write pointers because a layout is built once per pass and
kept (zephon/core/cursor.py::epoch_layout, a random-access ``Lookup``), then read by all of
them: cursor.pyx's, and lookup.pyx's through cursor.pyx's ``_take_at``.

``ShardTable`` is one dataset's shard table with its key prefixes, built once per config;
``ShardTable.layout(e)`` is the ``PassLayout`` of the pass with key epoch ``e``, whose C
hand-off ``Pass`` (layout.pxd) the loops read:

* **uniform** shards (every shard has ``u > 0`` rows except at most one, the *odd* shard,
  with any count ``t``): O(1) — order position ``k`` holds shard index ``perm(order, k)``,
  the odd shard sits at ``k* = perm⁻¹(order, odd)``, the shard of ``q`` is arithmetic
  around ``k*``, and a shard's within key is ``derive(within_key, shard_id)`` when needed.
  Before a large batched lookup the pass may *materialise* (``PassLayout._prepare``): build
  its shard ids and within keys in pass order, which never changes the output;
* **general** shards: the O(#shards) tables (ids in pass order, cumulative counts, within
  keys), built here in one pass, searched by binary search.

The lookups on a ``Pass`` (``_locate``: a batch of positions to their shard ids and rows)
are inline in layout.pxd, so that the loops of cursor.pyx compile them in.
"""
import numpy as np
from libc.stdint cimport int64_t, uint64_t
from zephon._ext._keys cimport derive
from zephon._ext.perm cimport perm_apply_many, perm_invert, perm_make

cdef enum:
    # A uniform pass builds its O(#shards) tables for a batched lookup (block mosaic or
    # take_at) of at least #shards / MATERIALISE_RATIO positions: a table entry costs about
    # as much as the per-position shard permutation and key derivation it saves.
    MATERIALISE_RATIO = 4


# -- layouts ------------------------------------------------------------------------------


cdef void _fill_tables(const Pass* P, const int64_t[::1] counts, int64_t[::1] ordered_ids,
                       int64_t[::1] cum_end, uint64_t[::1] within_keys) noexcept nogil:
    """Shard ids, cumulative counts (if ``cum_end`` is not empty) and within keys (if
    ``within_keys`` is not empty) in pass order."""
    cdef Py_ssize_t k, s
    cdef int64_t cum = 0
    for k in range(P.shards):
        ordered_ids[k] = k
    if P.shuffle and P.shards:
        perm_apply_many(&P.order, <uint64_t*>&ordered_ids[0], P.shards)
    for k in range(P.shards):
        s = ordered_ids[k]
        ordered_ids[k] = P.shard_ids[s]
        if cum_end.shape[0]:
            cum += counts[s]
            cum_end[k] = cum
        if within_keys.shape[0]:
            within_keys[k] = derive(P.within_key, <uint64_t>ordered_ids[k])


cdef class PassLayout:
    """One pass of one dataset as the pointer kernels read it; build with ``ShardTable.layout``."""

    def __init__(self):
        raise TypeError("PassLayout is built by ShardTable.layout(epoch)")

    @property
    def uniform(self):
        """True when the shard lookup is arithmetic (no cumulative counts)."""
        return bool(self.p.uniform)

    @property
    def materialised(self):
        """True when the pass holds its shard ids (and within keys) in pass order."""
        return self.p.ordered_ids != NULL

    def materialise(self):
        """Build a uniform pass's shard ids and within keys in pass order now (idempotent).

        The kernel does this itself before a large batched lookup; the output never changes.
        """
        if self.p.uniform and self.p.ordered_ids == NULL:
            self._build(False)

    cdef void _build(self, bint cumulative):
        """Fill the pass-order tables (O(#shards), with the GIL) and point p at them."""
        cdef Py_ssize_t shards = self.p.shards
        ordered_ids = np.empty(shards, dtype=np.int64)
        cum_end = np.empty(shards if cumulative else 0, dtype=np.int64)
        within_keys = np.empty(shards if self.p.within else 0, dtype=np.uint64)
        cdef int64_t[::1] ids_view = ordered_ids, cum_view = cum_end
        cdef uint64_t[::1] keys_view = within_keys
        _fill_tables(&self.p, self.table.counts, ids_view, cum_view, keys_view)
        self.tables = (ordered_ids, cum_end, within_keys)
        if shards:
            self.p.ordered_ids = &ids_view[0]
            self.p.cum_end = &cum_view[0] if cumulative else NULL
            self.p.within_keys = &keys_view[0] if self.p.within else NULL

    cdef void _prepare(self, Py_ssize_t count):
        """Materialise a uniform pass's tables before a batched lookup of ``count`` positions
        when that is cheaper than deriving each shard's id and key per position."""
        if self.p.uniform and self.p.ordered_ids == NULL and count * MATERIALISE_RATIO >= self.p.shards:
            self._build(False)

    def __reduce__(self):
        return (_layout_of, (self.table, self.epoch))


def _layout_of(ShardTable table, uint64_t epoch):
    return table.layout(epoch)


cdef class ShardTable:
    """One dataset's shard table and key prefixes, from which each pass's layout is built.

    ``u > 0`` marks uniform shards: every shard has ``u`` rows except shard index ``odd``
    (``-1``: none), which has ``t``. ``u = 0``: general shards. A level key is
    ``derive(prefix, epoch)`` (zephon/core/keys.py::purpose_key); the caller checked all of it.
    """

    def __init__(self, shard_ids, counts, int64_t u, int64_t odd, int64_t t, bint shuffle, bint within,
                 uint64_t order_prefix, uint64_t within_prefix, uint64_t block_prefix, int64_t block_size):
        self.shard_ids = shard_ids
        self.counts = counts
        if not (self.shard_ids.shape[0] == self.counts.shape[0] and u >= 0 and -1 <= odd < self.counts.shape[0]):
            raise ValueError(f"ShardTable: {self.shard_ids.shape[0]} shard ids, {self.counts.shape[0]} counts, "
                             f"u={u}, odd={odd}; pass one count per shard id, u >= 0 and -1 <= odd < #shards")
        self.arrays = (shard_ids, counts)
        self.u, self.odd, self.t = u, odd, t
        self.shuffle, self.within = shuffle, within
        self.order_prefix, self.within_prefix, self.block_prefix = order_prefix, within_prefix, block_prefix
        self.block_size = block_size
        self.total = 0
        cdef Py_ssize_t s
        for s in range(self.counts.shape[0]):
            self.total += self.counts[s]

    @property
    def uniform(self):
        return self.u > 0

    def __reduce__(self):
        return (ShardTable, (self.arrays[0], self.arrays[1], self.u, self.odd, self.t, self.shuffle, self.within,
                             self.order_prefix, self.within_prefix, self.block_prefix, self.block_size))

    def layout(self, uint64_t epoch):
        """The ``PassLayout`` of the pass whose keys use ``epoch``: O(1) if uniform, else O(#shards)."""
        cdef PassLayout layout = PassLayout.__new__(PassLayout)
        cdef Pass* P = &layout.p
        cdef Py_ssize_t shards = self.shard_ids.shape[0]
        layout.table, layout.epoch, layout.tables = self, epoch, None
        P.total, P.block_size, P.shards = self.total, self.block_size, shards
        P.block_key = derive(self.block_prefix, epoch)
        P.within, P.shuffle = self.within, self.shuffle
        P.within_key = derive(self.within_prefix, epoch)
        P.order = perm_make(derive(self.order_prefix, epoch), <uint64_t>shards)
        P.shard_ids = &self.shard_ids[0] if shards else NULL
        P.ordered_ids = P.cum_end = NULL
        P.within_keys = NULL
        P.uniform = self.u > 0
        P.u, P.t, P.kstar = self.u, 0, shards
        if P.uniform:
            if self.odd >= 0:
                P.t = self.t
                P.kstar = <int64_t>perm_invert(&P.order, <uint64_t>self.odd) if self.shuffle else self.odd
            return layout
        layout._build(True)
        return layout

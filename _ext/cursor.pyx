# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cursor kernel: write one dataset's pointers for a range, or any list, of pass positions.

Defined by zephon/core/cursor.py::pointer_reference. A position ``p`` goes through the block
mosaic (if any), then the shard lookup, then the within-shard permutation (if any).
Positions go through each stage a batch at a time, so the permutations of a batch's
elements run side by side (the batched network of feistel.h).

``ShardTable`` is one dataset's shard table with its key prefixes, built once per config;
``ShardTable.layout(e)`` is the ``PassLayout`` of the pass with key epoch ``e``:

* **uniform** shards (every shard has ``u > 0`` rows except at most one, the *odd* shard,
  with any count ``t``): O(1) — order position ``k`` holds shard index ``perm(order, k)``,
  the odd shard sits at ``k* = perm⁻¹(order, odd)``, the shard of ``q`` is arithmetic
  around ``k*``, and a shard's within key is ``derive(within_key, shard_id)`` when needed;
* **general** shards: the O(#shards) tables (ids in pass order, cumulative counts, within
  keys), built here in one pass, searched by binary search.
"""
import numpy as np
from libc.stdint cimport int64_t, uint64_t
from zephon._ext._keys cimport derive
from zephon._ext.perm cimport (
    PERM_BATCH, Perm, perm_apply, perm_apply_each, perm_apply_many, perm_invert, perm_make,
)

cdef enum:
    # A uniform pass builds its O(#shards) tables for a batched lookup (block mosaic or
    # take_at) of at least #shards / MATERIALISE_RATIO positions: a table entry costs about
    # as much as the per-position shard permutation and key derivation it saves.
    MATERIALISE_RATIO = 4


# cursor.pxd declares ``Pass`` (a PassLayout's C hand-off), the fields of ``ShardTable`` and
# ``PassLayout``, and ``_take_at``, for kernels that write pointers themselves (lookup.pyx).


# -- shard lookup -------------------------------------------------------------------------


cdef inline Py_ssize_t _shard_of(const int64_t* cum_end, int64_t q, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    """First k in [lo, hi) with cum_end[k] > q."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if cum_end[mid] > q:
            hi = mid
        else:
            lo = mid + 1
    return lo


cdef inline void _shards_of(const int64_t* cum_end, const int64_t* q, Py_ssize_t* shard, Py_ssize_t m,
                            Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    """shard[j] = first k in [lo, hi) with cum_end[k] > q[j], for j < m, given one exists.

    A binary search without branches: every q takes the same steps (the halvings of hi - lo),
    each a conditional add, and the m searches advance side by side, so the CPU overlaps their
    loads and nothing is mispredicted.
    """
    cdef Py_ssize_t length = hi - lo, half, j
    for j in range(m):
        shard[j] = lo
    while length > 1:
        half = length >> 1
        for j in range(m):
            shard[j] += half & -<Py_ssize_t>(cum_end[shard[j] + half - 1] <= q[j])
        length -= half


cdef inline Py_ssize_t _uniform_shard_of(const Pass* P, int64_t q) noexcept nogil:
    """The order position of the non-empty shard holding pass position q (uniform shards)."""
    cdef int64_t head = P.kstar * P.u  # rows before the odd shard
    if q < head:
        return q // P.u
    if q < head + P.t:
        return P.kstar
    return P.kstar + 1 + (q - head - P.t) // P.u


cdef inline Py_ssize_t _find(const Pass* P, int64_t q) noexcept nogil:
    if P.uniform:
        return _uniform_shard_of(P, q)
    return _shard_of(P.cum_end, q, 0, P.shards)


cdef inline int64_t _start(const Pass* P, Py_ssize_t k) noexcept nogil:
    """First pass position of the shard at order position k."""
    if P.uniform:
        return k * P.u if k <= P.kstar else (k - 1) * P.u + P.t
    return P.cum_end[k - 1] if k > 0 else 0


cdef inline int64_t _rows(const Pass* P, Py_ssize_t k, int64_t start) noexcept nogil:
    """Rows of the shard at order position k, which starts at start."""
    if P.uniform:
        return P.t if k == P.kstar else P.u
    return P.cum_end[k] - start


cdef inline int64_t _id(const Pass* P, Py_ssize_t k) noexcept nogil:
    """Shard id at order position k."""
    if P.ordered_ids != NULL:
        return P.ordered_ids[k]
    return P.shard_ids[perm_apply(&P.order, <uint64_t>k) if P.shuffle else k]


cdef inline uint64_t _within_key(const Pass* P, Py_ssize_t k, int64_t shard_id) noexcept nogil:
    if P.within_keys != NULL:
        return P.within_keys[k]
    return derive(P.within_key, <uint64_t>shard_id)


cdef void _locate(const Pass* P, const int64_t* q, Py_ssize_t m, Py_ssize_t lo, Py_ssize_t hi,
                  int64_t* ids, uint64_t* rows) noexcept nogil:
    """ids[j], rows[j] = shard id and offset of pass position q[j] (after the mosaic), j < m.

    For general shards the search is limited to order positions [lo, hi), which must hold
    every q[j]; uniform shards ignore lo and hi.
    """
    cdef Py_ssize_t shard[PERM_BATCH]
    cdef uint64_t index[PERM_BATCH]
    cdef uint64_t keys[PERM_BATCH]
    cdef uint64_t ns[PERM_BATCH]
    cdef Py_ssize_t j, k
    cdef int64_t start
    if P.uniform:
        for j in range(m):
            k = _uniform_shard_of(P, q[j])
            start = _start(P, k)
            rows[j] = <uint64_t>(q[j] - start)
            ns[j] = <uint64_t>_rows(P, k, start)
            index[j] = <uint64_t>k
        if P.ordered_ids != NULL:  # materialised
            for j in range(m):
                ids[j] = P.ordered_ids[index[j]]
                if P.within:
                    keys[j] = P.within_keys[index[j]]
        else:
            if P.shuffle:
                perm_apply_many(&P.order, index, m)
            for j in range(m):
                ids[j] = P.shard_ids[index[j]]
            if P.within:
                for j in range(m):
                    keys[j] = derive(P.within_key, <uint64_t>ids[j])
    else:
        _shards_of(P.cum_end, q, shard, m, lo, hi)
        for j in range(m):
            k = shard[j]
            start = P.cum_end[k - 1] if k > 0 else 0
            rows[j] = <uint64_t>(q[j] - start)
            ids[j] = P.ordered_ids[k]
            if P.within:
                keys[j] = P.within_keys[k]
                ns[j] = <uint64_t>(P.cum_end[k] - start)
    if P.within:
        perm_apply_each(rows, keys, ns, m)


# -- the loops ----------------------------------------------------------------------------


cdef void _take_runs(int64_t[:, ::1] out, Py_ssize_t row, int64_t dataset_id, const Pass* P,
                     int64_t position, int64_t count) noexcept nogil:
    """No block mosaic: positions are consecutive, so walk shard by shard."""
    cdef int64_t p = position, end = position + count, start, stop, shard_id
    cdef Py_ssize_t k = _find(P, p), j, m
    cdef uint64_t rows[PERM_BATCH]
    cdef Perm shard_perm
    while p < end:
        start = _start(P, k)
        stop = start + _rows(P, k, start)
        if stop > end:
            stop = end
        if p < stop:
            shard_id = _id(P, k)
            if P.within:
                shard_perm = perm_make(_within_key(P, k, shard_id), <uint64_t>_rows(P, k, start))
            while p < stop:
                m = stop - p if stop - p < PERM_BATCH else PERM_BATCH
                for j in range(m):
                    rows[j] = <uint64_t>(p - start + j)
                if P.within:
                    perm_apply_many(&shard_perm, rows, m)
                for j in range(m):
                    out[row + j, 0] = dataset_id
                    out[row + j, 1] = shard_id
                    out[row + j, 2] = <int64_t>rows[j]
                row += m
                p += m
        k += 1


cdef void _take_blocks(int64_t[:, ::1] out, Py_ssize_t row, int64_t dataset_id, const Pass* P,
                       int64_t position, int64_t count) noexcept nogil:
    """Block mosaic: permute positions inside each block, then look each one up."""
    cdef int64_t p = position, end = position + count, block, block_start, block_len, block_stop
    cdef int64_t q[PERM_BATCH]
    cdef int64_t ids[PERM_BATCH]
    cdef uint64_t x[PERM_BATCH]
    cdef Py_ssize_t lo = 0, hi = 0, j, m
    cdef Perm block_perm
    while p < end:
        block = p // P.block_size
        block_start = block * P.block_size
        block_len = P.block_size if P.total - block_start > P.block_size else P.total - block_start
        block_stop = block_start + block_len if block_start + block_len < end else end
        block_perm = perm_make(derive(P.block_key, <uint64_t>block), <uint64_t>block_len)
        if not P.uniform:  # the shards this block spans
            lo = _shard_of(P.cum_end, block_start, 0, P.shards)
            hi = _shard_of(P.cum_end, block_start + block_len - 1, lo, P.shards) + 1
        while p < block_stop:
            m = block_stop - p if block_stop - p < PERM_BATCH else PERM_BATCH
            for j in range(m):
                x[j] = <uint64_t>(p - block_start + j)
            perm_apply_many(&block_perm, x, m)
            for j in range(m):
                q[j] = block_start + <int64_t>x[j]
            _locate(P, q, m, lo, hi, ids, x)
            for j in range(m):
                out[row + j, 0] = dataset_id
                out[row + j, 1] = ids[j]
                out[row + j, 2] = <int64_t>x[j]
            row += m
            p += m


cdef void _take_at(int64_t* out, const int64_t* rows, int64_t dataset_id, const Pass* P,
                   const int64_t* positions, Py_ssize_t n) noexcept nogil:
    """Positions in any order: each batch goes through its own blocks' permutations.

    The pointer of ``positions[j]`` (j < n) goes to row ``rows[j]`` of ``out`` (rows of 3
    int64), or row j when ``rows`` is NULL.
    """
    cdef Py_ssize_t done = 0, j, m
    cdef int64_t p, block, block_start
    cdef int64_t* row
    cdef int64_t q[PERM_BATCH]
    cdef int64_t ids[PERM_BATCH]
    cdef int64_t starts[PERM_BATCH]
    cdef uint64_t x[PERM_BATCH]
    cdef uint64_t keys[PERM_BATCH]
    cdef uint64_t lens[PERM_BATCH]
    while done < n:
        m = n - done if n - done < PERM_BATCH else PERM_BATCH
        if P.block_size > 1:
            for j in range(m):
                p = positions[done + j]
                block = p // P.block_size
                block_start = block * P.block_size
                starts[j] = block_start
                x[j] = <uint64_t>(p - block_start)
                keys[j] = derive(P.block_key, <uint64_t>block)
                lens[j] = <uint64_t>(P.block_size if P.total - block_start > P.block_size else P.total - block_start)
            perm_apply_each(x, keys, lens, m)
            for j in range(m):
                q[j] = starts[j] + <int64_t>x[j]
        else:
            for j in range(m):
                q[j] = positions[done + j]
        _locate(P, q, m, 0, P.shards, ids, x)
        for j in range(m):
            row = out + 3 * (rows[done + j] if rows != NULL else done + j)
            row[0] = dataset_id
            row[1] = ids[j]
            row[2] = <int64_t>x[j]
        done += m


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
    """One pass of one dataset as the kernel reads it; build with ``ShardTable.layout``."""

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
    """One dataset's shard table and key prefixes as the cursor kernel needs them.

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


# -- doors --------------------------------------------------------------------------------


def take(int64_t[:, ::1] out, Py_ssize_t row, int64_t dataset_id, PassLayout layout, int64_t position,
         int64_t count):
    """Write pointers for pass positions [position, position+count) into out[row:row+count].

    The caller guarantees ``0 <= position``, ``position + count <= total`` and that ``out`` fits.
    """
    cdef const Pass* P = &layout.p
    if P.block_size > 1:
        layout._prepare(count)
    with nogil:
        if P.block_size > 1:
            _take_blocks(out, row, dataset_id, P, position, count)
        else:
            _take_runs(out, row, dataset_id, P, position, count)


def take_at(int64_t[:, ::1] out, int64_t dataset_id, PassLayout layout, const int64_t[::1] positions):
    """Write the pointer at pass position ``positions[j]`` into ``out[j]`` for every j.

    Positions may come in any order and repeat. Returns -1, or, writing nothing, the first j
    whose position lies outside ``[0, total)``. The caller guarantees
    ``out.shape[0] == len(positions)``.
    """
    cdef Py_ssize_t j
    cdef int64_t total = layout.p.total
    for j in range(positions.shape[0]):
        if not 0 <= positions[j] < total:
            return j
    layout._prepare(positions.shape[0])
    if positions.shape[0]:
        with nogil:
            _take_at(&out[0, 0], NULL, dataset_id, &layout.p, &positions[0], positions.shape[0])
    return -1


cdef Py_ssize_t _shard_runs(const Pass* P, int64_t position, int64_t count, int64_t* ends,
                            int64_t* ids) noexcept nogil:
    """Runs of equal shard id over pass positions [position, position+count): run r covers
    offsets [ends[r-1], ends[r]) (ends[-1] = 0) of shard ids[r]. Returns the number of runs;
    without a mosaic, ``ends`` NULL only counts them.

    Without a mosaic a run is a shard's stretch, O(runs); with one, positions are looked up a
    batch at a time (O(count)) with the within-shard shuffle off, which moves no shard id.
    """
    cdef int64_t p = position, end = position + count, start, stop, block, block_start, block_len
    cdef Py_ssize_t k, runs = 0, j, m
    cdef int64_t q[PERM_BATCH]
    cdef int64_t found[PERM_BATCH]
    cdef uint64_t x[PERM_BATCH]
    cdef Pass plain = P[0]
    cdef Perm block_perm
    plain.within = False
    if P.block_size <= 1:
        k = _find(P, p)
        while p < end:
            start = _start(P, k)
            stop = start + _rows(P, k, start)
            if p < stop:
                p = stop if stop < end else end
                if ends != NULL:
                    ids[runs], ends[runs] = _id(P, k), p - position
                runs += 1
            k += 1
        return runs
    while p < end:
        block = p // P.block_size
        block_start = block * P.block_size
        block_len = P.block_size if P.total - block_start > P.block_size else P.total - block_start
        block_perm = perm_make(derive(P.block_key, <uint64_t>block), <uint64_t>block_len)
        m = min(block_start + block_len - p, end - p, PERM_BATCH)
        for j in range(m):
            x[j] = <uint64_t>(p - block_start + j)
        perm_apply_many(&block_perm, x, m)
        for j in range(m):
            q[j] = block_start + <int64_t>x[j]
        _locate(&plain, q, m, 0, P.shards, found, x)
        for j in range(m):
            if runs == 0 or ids[runs - 1] != found[j]:
                ids[runs] = found[j]
                runs += 1
            ends[runs - 1] = p - position + j + 1
        p += m
    return runs


def shard_runs(PassLayout layout, int64_t position, int64_t count):
    """``(ends, ids)``: the shard ids of pass positions [position, position+count) as runs.

    Run r covers offsets ``[ends[r-1], ends[r])`` from ``position`` (``ends[-1]`` = 0) and
    reads shard ``ids[r]`` (adjacent runs differ). Token mode prices draws by shard, so it
    needs these, never the rows. The caller guarantees ``0 <= position`` and
    ``position + count <= total``.
    """
    cdef const Pass* P = &layout.p
    cdef Py_ssize_t runs = count
    if count > 0 and P.block_size > 1:
        layout._prepare(count)
    elif count > 0:
        runs = _shard_runs(P, position, count, NULL, NULL)
    ends = np.empty(runs, dtype=np.int64)
    ids = np.empty(runs, dtype=np.int64)
    cdef int64_t[::1] ends_view = ends, ids_view = ids
    if count > 0:
        with nogil:
            runs = _shard_runs(P, position, count, &ends_view[0], &ids_view[0])
    return ends[:runs], ids[:runs]

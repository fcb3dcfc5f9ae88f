# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Random-access kernel: the samples at any indices of a lane's stream, in one call.

Defined by zephon/core/index.py::sample_at_reference. A ``Lookup`` holds one lane's snapshot
index (zephon/core/index.py) and answers a batch in three steps, without the GIL but to build
a new shape or fetch a pass layout:

1. **Bucket** — each target gets the key ``snapshot · every + chunk guess``: the snapshot
   interval holding it and its chunk inside the interval if every chunk were full (a lower
   bound). Chunks are almost always full, so that is ``target // chunk_size`` up to the
   first short chunk of the lane, and after it the guess ``target // (every · chunk_size)``
   corrected by a galloping search along the snapshots' sample counts. The batch kernel
   (``batch.walk_sort``, a radix sort) orders the targets by key: by snapshot and, within
   it, by stream position up to a chunk.
2. **Walk** — each non-empty interval is walked once from its snapshot with the scheduling
   kernel, only as far as its last target; each target's chunk gives its dataset and rank
   through the chunk's weighted round robin, a table per distinct quota vector kept in a
   ``shapes.ShapeCache`` on the Lookup (``max_shapes`` shapes, ``shape_budget`` bytes). The
   pass position is the chunk's start in that dataset plus the rank, brought into its pass
   (``schedule._in_pass``: a "carry" draw may run on into the next one), once per target. Consecutive targets of a dataset in one pass make a run
   (``batch.runs_count``).
3. **Pointers** — targets are grouped by dataset, stably (``batch.walk_group``), so each
   dataset's runs come one after the other (the walk goes forward chunk by chunk; targets
   sharing a guessed chunk next to a short one may alternate passes, which only makes more
   runs); every run goes through the cursor kernel (``cursor._take_at``) in one batch, which
   scatters its pointers to the targets' rows. The layout of a pass comes from the
   ``layout_of`` callable only when a dataset's pass changes; the last one per dataset is
   kept. A run builds its pass's tables in pass order (``PassLayout._prepare``) only if it
   has at least as many targets as the pass has shards: unlike a pass read in order, random
   targets seldom come back to the same pass.

The index, the schedule and the shapes are read under a lock, so one Lookup may serve
several threads (one at a time).
"""
import threading

cimport cython

import numpy as np
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc
from zephon._ext.batch cimport (LOW, MAX_TARGETS, Run, Runs, Walk, runs_close, runs_count, runs_open,
                                runs_start, runs_trim, walk_group, walk_open, walk_sort)
from zephon._ext.cursor cimport PassLayout, _take_at
from zephon._ext.schedule cimport PLANNED, Schedule, Scheduler, _in_pass, _walk
from zephon._ext.shapes cimport Draw, ShapeCache, shapes_close, shapes_draws, shapes_open

cdef enum:
    ENDED = 1  # the walk status when the stream ends before a target (snapshots of another config)

cdef int64_t MAX_CHUNK = <int64_t>1 << 31  # must match zephon/core/readorder.py (ranks and offsets fit 32 bits)


@cython.final
@cython.no_gc_clear  # __dealloc__ closes the schedule through self.scheduler
cdef class Lookup:
    """One lane's random access: ``samples_at(targets, out)`` (see the module docstring).

    Built once per stream index from the config's ``Scheduler``, the snapshot arrays
    (``ints`` rows ``[g, samples before, epochs..., positions..., tails...]``, ``acc`` accumulators),
    the snapshot spacing ``every``, the stream ``length``, ``chunk_size``, ``reshuffle``
    (per dataset, 1 if its passes have their own keys) and ``layout_of(dataset, key_epoch)``,
    which returns the cursor ``PassLayout`` of that pass.
    """

    cdef Scheduler scheduler
    cdef const int64_t[:, ::1] ints
    cdef const double[:, ::1] acc
    cdef const int64_t[::1] reshuffle
    cdef int64_t every, length, chunk_size, lane, replicas
    cdef double per_chunk  # 1 / chunk_size
    cdef int routing
    cdef uint64_t lane_key
    cdef Py_ssize_t n, snapshots
    cdef int64_t full_chunks  # chunks of the lane before the first snapshot interval with a short chunk
    cdef object layout_of, lock
    cdef list layouts  # the current PassLayout of each dataset, or None
    cdef int64_t* layout_epochs  # its key epoch, -1: none
    cdef double* state_acc  # n accumulators, then n active weights
    cdef int64_t* state  # n epochs, n positions, n tails
    cdef int64_t* plans  # every chunks of n quotas, n start epochs, n start positions (the schedule's)
    cdef int64_t* starts  # every + 1 chunk starts (samples before)
    cdef Schedule sched  # the scheduling kernel's scratch, opened once
    cdef bint opened
    cdef Runs runs  # the runs of the current call
    cdef ShapeCache shapes
    # (C fields start zeroed: NULL pointers, opened False, until __init__ sets them)

    def __init__(self, Scheduler scheduler not None, const int64_t[:, ::1] ints, const double[:, ::1] acc,
                 int64_t every, int64_t length, int64_t chunk_size, const int64_t[::1] reshuffle, object layout_of,
                 Py_ssize_t max_shapes=64, Py_ssize_t shape_budget=32 << 20):
        cdef Py_ssize_t c, n = reshuffle.shape[0]
        if self.opened:
            raise TypeError("Lookup: already initialised; build a new one")
        if not (ints.shape[0] >= 1 and ints.shape[1] == 2 + 3 * n and acc.shape[0] == ints.shape[0]
                and acc.shape[1] == n and scheduler.tables.totals.shape[0] == n and every >= 1 and max_shapes >= 1
                and shape_budget >= 0):
            raise ValueError(f"Lookup: snapshots ({ints.shape[0]}, {ints.shape[1]}) and ({acc.shape[0]}, "
                             f"{acc.shape[1]}) for {n} datasets and a {scheduler.tables.totals.shape[0]}-dataset "
                             f"scheduler, every={every}, max_shapes={max_shapes}, shape_budget={shape_budget}; "
                             f"pass the arrays of a StreamIndex built for the scheduler's config")
        if not 1 <= chunk_size <= MAX_CHUNK:
            raise ValueError(f"Lookup: chunk_size={chunk_size}; random access needs 1 <= chunk_size <= {MAX_CHUNK}")
        self.scheduler, self.ints, self.acc, self.reshuffle, self.layout_of = scheduler, ints, acc, reshuffle, layout_of
        self.every, self.length, self.chunk_size, self.n, self.snapshots = every, length, chunk_size, n, ints.shape[0]
        self.per_chunk = 1.0 / <double>chunk_size
        self.lane, self.replicas, self.routing = scheduler.lane, scheduler.replicas, scheduler.routing
        self.lane_key = scheduler.lane_key
        self.lock, self.layouts = threading.Lock(), [None] * n
        self.layout_epochs = <int64_t*>malloc((4 * n + 1) * sizeof(int64_t))  # and state
        self.state_acc = <double*>malloc((2 * n + 1) * sizeof(double))
        self.plans = <int64_t*>malloc((3 * n * every + every + 1) * sizeof(int64_t))  # and starts
        if self.layout_epochs == NULL or self.state_acc == NULL or self.plans == NULL:
            raise MemoryError("Lookup: no memory for the walk's state")
        self.state = self.layout_epochs + n
        self.starts = self.plans + 3 * n * every
        for c in range(n):
            self.layout_epochs[c] = -1
        self.full_chunks = self._full_chunks()
        runs_open(&self.runs, n)
        shapes_open(&self.shapes, n, max_shapes, shape_budget)
        scheduler._open(&self.sched, self.state_acc + n)
        self.opened = True

    def __dealloc__(self):
        shapes_close(&self.shapes)
        runs_close(&self.runs)
        free(self.layout_epochs)
        free(self.state_acc)
        free(self.plans)
        if self.opened:
            self.scheduler._close(&self.sched)

    def __reduce__(self):
        raise TypeError("a Lookup is a cache: rebuild it (StreamIndex drops it when pickled)")

    @property
    def shapes_cached(self):
        """How many chunk shapes (round-robin tables) the cache holds now."""
        return self.shapes.count

    def samples_at(self, const int64_t[::1] targets, int64_t[:, ::1] out):
        """Write the sample at stream index ``targets[j]`` into ``out[j]`` for every j.

        Targets may come in any order and repeat. Raises ``IndexError`` naming the first target
        outside ``[0, length)`` before writing anything.
        """
        cdef Py_ssize_t j, m = targets.shape[0], bad = -1
        if m >= MAX_TARGETS:
            raise ValueError(f"samples_at: {m} targets in one call; pass fewer than {MAX_TARGETS}")
        if out.shape[0] != m or out.shape[1] != 3:
            raise ValueError(f"samples_at: out has shape ({out.shape[0]}, {out.shape[1]}) for {m} targets; "
                             f"pass np.empty(({m}, 3), np.int64)")
        with nogil:
            for j in range(m):
                if not 0 <= targets[j] < self.length:
                    bad = j
                    break
        if bad >= 0:
            raise IndexError(f"samples_at: targets[{bad}] = {targets[bad]} is outside the stream [0, {self.length})")
        scratch = np.empty(4 * m, dtype=np.int64)  # numpy gives big arrays huge pages
        cdef int64_t[::1] scratch_view = scratch
        if m:
            with self.lock:
                self._samples_at(&targets[0], m, &out[0, 0], &scratch_view[0])

    def sample_at(self, int64_t target):
        """The sample at stream index ``target`` as a ``(dataset, shard, row)`` tuple: ``samples_at``
        for one target, without arrays."""
        cdef int64_t out[3]
        cdef int64_t scratch[4]
        if not 0 <= target < self.length:
            raise IndexError(f"sample_at: target {target} is outside the stream [0, {self.length})")
        with self.lock:
            self._samples_at(&target, 1, out, scratch)
        return out[0], out[1], out[2]

    cdef int _samples_at(self, const int64_t* targets, Py_ssize_t m, int64_t* out, int64_t* scratch) except -1:
        """The kernel behind both doors: bucket, walk, then pointers (the lock is held).

        ``scratch`` holds 4·m int64.
        """
        cdef Walk w
        walk_open(&w, scratch, m)
        try:
            with nogil:
                self._sort(targets, &w)
            if self._walk_intervals(&w) == ENDED:
                raise ValueError("samples_at: the stream ended before a target; the Lookup's snapshots "
                                 "belong to another config")
            self._pointers(&w, out)
        finally:
            runs_trim(&self.runs)
        return 0

    # -- 1. bucket ------------------------------------------------------------------------

    cdef int64_t _full_chunks(self):
        """Chunks of the lane before the first snapshot interval holding a short chunk: up to
        there, snapshot s sits at sample s · every · chunk_size and keys are arithmetic."""
        cdef Py_ssize_t s = 1
        while s < self.snapshots and self.ints[s, 1] == s * self.every * self.chunk_size:
            s += 1
        return self.snapshots * self.every if s == self.snapshots else (s - 1) * self.every

    cdef inline int64_t _key(self, int64_t target, uint64_t* offset) noexcept nogil:
        """Snapshot · every + the target's chunk there if every chunk were full (a lower bound);
        ``offset``: the target's distance from that chunk's start were it full (< chunk_size)."""
        cdef int64_t q = _divide(target, self.chunk_size, self.per_chunk), guess
        cdef Py_ssize_t s
        if q < self.full_chunks:
            offset[0] = <uint64_t>(target - q * self.chunk_size)
            return q
        s = self._snapshot(target)
        guess = (target - self.ints[s, 1]) // self.chunk_size
        guess = guess if guess < self.every else self.every - 1
        offset[0] = <uint64_t>(target - self.ints[s, 1] - guess * self.chunk_size)
        return s * self.every + guess

    cdef Py_ssize_t _snapshot(self, int64_t target) noexcept nogil:
        """The last snapshot whose samples-before (ints column 1) is <= target.

        Chunks are never longer than chunk_size, so the guess target // (every · chunk_size)
        is never past it; a galloping search goes forward from there (one comparison when
        the guess is right).
        """
        cdef Py_ssize_t mid, step = 1, lo = <Py_ssize_t>(target // (self.every * self.chunk_size)), hi
        lo = lo if lo < self.snapshots else self.snapshots - 1
        hi = lo + 1
        while hi < self.snapshots and self.ints[hi, 1] <= target:
            lo, step = hi, 2 * step
            hi = lo + step
        if hi > self.snapshots:
            hi = self.snapshots
        while hi - lo > 1:  # ints[lo, 1] <= target < ints[hi, 1] (or hi is the end)
            mid = (lo + hi) >> 1
            if self.ints[mid, 1] <= target:
                lo = mid
            else:
                hi = mid
        return lo

    cdef void _sort(self, const int64_t* targets, Walk* w) noexcept nogil:
        """Key every target (the item's low word: its offset from the guessed chunk), then put
        keys and items in walk order (by key)."""
        cdef Py_ssize_t j
        cdef int64_t top = 0
        cdef bint ordered = True
        cdef uint64_t offset = 0
        for j in range(w.m):
            w.keys[j] = self._key(targets[j], &offset)
            w.items[j] = (<uint64_t>j << 32) | offset
            ordered &= j == 0 or w.keys[j] >= w.keys[j - 1]
            if w.keys[j] > top:
                top = w.keys[j]
        walk_sort(w, top, ordered)

    # -- 2. walk --------------------------------------------------------------------------

    cdef Py_ssize_t _walk_intervals(self, Walk* w) except -1:
        """Walk every snapshot interval holding targets: fill w.positions, the datasets in
        w.items and the runs. Returns 0, or ENDED. Takes the GIL only to build a new shape."""
        cdef Py_ssize_t j = 0, status = 0
        runs_start(&self.runs)
        self.sched.retired = -1  # recompute the active weights at the first chunk
        with nogil:
            while j < w.m and status == 0:
                status = self._walk_interval(&self.sched, w, &j)
        return status

    cdef Py_ssize_t _walk_interval(self, Schedule* sched, Walk* w, Py_ssize_t* at) except -1 nogil:
        """The targets from walk position at[0] in one snapshot interval, chunk by chunk from
        its snapshot; moves at[0] past them. Returns 0, or ENDED."""
        cdef Py_ssize_t j = at[0], c, k, chunk = -1, chunks = 0, n = self.n, s = w.keys[j] // self.every
        cdef int64_t g = self.ints[s, 0], end = (s + 1) * self.every, target, epoch, position, guess
        cdef int64_t* plan
        cdef const Draw* draws = NULL
        cdef Draw draw
        for c in range(n):
            self.state[c], self.state[n + c] = self.ints[s, 2 + c], self.ints[s, 2 + n + c]
            self.state[2 * n + c] = self.ints[s, 2 + 2 * n + c]
            self.state_acc[c] = self.acc[s, c]
        self.starts[0] = self.ints[s, 1]
        while j < w.m and w.keys[j] < end:
            k = guess = w.keys[j] - s * self.every  # a lower bound of the target's chunk
            target = self.ints[s, 1] + guess * self.chunk_size + <int64_t>(w.items[j] & LOW)
            while chunks <= k or self.starts[chunks] <= target:  # walk up to the target's chunk
                if chunks == self.every or not self._next_chunk(sched, &g, chunks):
                    return ENDED
                chunks += 1
            while self.starts[k + 1] <= target:
                k += 1
            plan = self.plans + 3 * n * k
            if k != chunk:
                draws, chunk = shapes_draws(&self.shapes, plan), k
            draw = draws[target - self.starts[k]]
            c = draw.dataset
            epoch, position = plan[n + c], plan[2 * n + c] + draw.rank
            _in_pass(sched, c, &epoch, &position)  # a "carry" draw may run on into the next pass
            w.positions[j] = position
            w.items[j] = (w.items[j] & ~LOW) | <uint64_t>c
            runs_count(&self.runs, c, epoch if self.reshuffle[c] else 0)
            j += 1
        at[0] = j
        return 0

    cdef bint _next_chunk(self, Schedule* sched, int64_t* g, Py_ssize_t chunk) noexcept nogil:
        """Plan the lane's next chunk from global chunk g[0] into plans[chunk]; False at the end."""
        cdef Py_ssize_t c, n = self.n
        cdef int64_t* plan = self.plans + 3 * n * chunk
        cdef int64_t total = 0
        if _walk(sched, self.lane, self.replicas, self.routing, self.lane_key, g, self.state_acc, self.state,
                 self.state + n, self.state + 2 * n, plan, plan + n, plan + 2 * n) != PLANNED:
            return False
        g[0] += 1
        for c in range(n):
            total += plan[c]
        self.starts[chunk + 1] = self.starts[chunk] + total
        return True

    # -- 3. pointers ----------------------------------------------------------------------

    cdef int _pointers(self, Walk* w, int64_t* out) except -1:
        """Group the targets by dataset (stably), then write each run's pointers in one batch."""
        cdef Py_ssize_t r, c
        cdef Run run
        cdef PassLayout layout
        cdef int64_t* offsets = self.state  # per dataset: where its next run starts (the walk is done)
        with nogil:
            walk_group(w, offsets, self.n)
        for r in range(self.runs.count):
            run = self.runs.at[r]
            c = run.dataset
            if self.layout_epochs[c] != run.epoch:
                self.layouts[c] = self.layout_of(c, run.epoch)
                self.layout_epochs[c] = run.epoch
            layout = self.layouts[c]
            if run.count >= layout.p.shards:  # tables in pass order pay off within this run alone
                layout._prepare(run.count)
            with nogil:
                _take_at(out, w.rows + offsets[c], c, &layout.p, w.grouped + offsets[c], run.count)
            offsets[c] += run.count
        return 0


cdef inline int64_t _divide(int64_t t, int64_t d, double inverse) noexcept nogil:
    """t // d for t >= 0 and d >= 1 (``inverse`` = 1 / d): a float estimate, made exact."""
    cdef int64_t q = <int64_t>(<double>t * inverse)
    while q * d > t:
        q -= 1
    while (q + 1) * d <= t:
        q += 1
    return q

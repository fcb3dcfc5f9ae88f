# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Scheduling kernel: walk the global chunk schedule to a lane's next chunk, numbers only.

Defined by zephon/core/schedule.py (plan_chunk_reference, plan_next_reference) and the
allocators in zephon/core/alloc.py. Compiled with -ffp-contract=off so the accumulator's
double arithmetic matches Python bit for bit. schedule.pxd declares the ``Schedule`` struct,
``_walk`` and the ``Scheduler`` class for kernels that walk a lane themselves (lookup.pyx).
"""
from libc.math cimport floor, fmax, frexp, ldexp, modf
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport INT64_MAX, int64_t, uint64_t
from libc.stdlib cimport free, malloc, qsort

import numpy as np
from zephon._ext._keys cimport derive
from zephon._ext.perm cimport Perm, perm_apply, perm_invert, perm_make


cdef enum:
    SELECT_MAX = 8  # up to this many smallest are picked by selection; more, by sorting all


cdef int _by_key(const void* a, const void* b) noexcept nogil:
    cdef const Ranked* x = <const Ranked*>a
    cdef const Ranked* y = <const Ranked*>b
    if x.key != y.key:
        return -1 if x.key < y.key else 1
    return -1 if x.index < y.index else (1 if x.index > y.index else 0)


cdef void _rank(Schedule* s, Py_ssize_t count, Py_ssize_t want) noexcept nogil:
    """Move the ``want`` smallest of s.order[:count] by (s.keys[c], c) to the front, in order.

    A selection sort when few are needed (datasets are usually few, one or two ranks needed);
    a sort of all of them otherwise, so that many datasets cost count·log(count), not count·want.
    """
    cdef Py_ssize_t i, j, best, a, b
    if want > SELECT_MAX:
        for i in range(count):
            s.ranked[i].key, s.ranked[i].index = s.keys[s.order[i]], s.order[i]
        qsort(s.ranked, count, sizeof(Ranked), _by_key)
        for i in range(count):
            s.order[i] = s.ranked[i].index
        return
    for i in range(want if want < count else count):
        best = i
        for j in range(i + 1, count):
            a, b = s.order[j], s.order[best]
            if s.keys[a] < s.keys[b] or (s.keys[a] == s.keys[b] and a < b):
                best = j
        s.order[i], s.order[best] = s.order[best], s.order[i]


cdef Py_ssize_t _active_order(Schedule* s) noexcept nogil:
    cdef Py_ssize_t c, count = 0
    for c in range(s.n):
        if s.weights[c] > 0.0:
            s.order[count] = c
            count += 1
    return count


cdef void _accumulate(Schedule* s, double* acc, int64_t* quotas) noexcept nogil:
    """AccumulatorAllocator.allocate, in place."""
    cdef Py_ssize_t c, i, count
    cdef int64_t d = s.chunk_size
    for c in range(s.n):
        if s.weights[c] == 0.0 and acc[c] != 0.0:
            for i in range(s.n):
                acc[i] = 0.0
            break
    for c in range(s.n):
        quotas[c] = 0
        if s.weights[c] > 0.0:
            acc[c] = acc[c] + s.shares[c]
            quotas[c] = <int64_t>acc[c]
            acc[c] -= <double>quotas[c]
            d -= quotas[c]
    count = _active_order(s)
    if d > 0:
        for c in range(s.n):
            s.keys[c] = -acc[c]
        _rank(s, count, count if d > count else d)
        for i in range(d):
            c = s.order[i if i < count else i % count]
            quotas[c] += 1
            acc[c] -= 1.0
    elif d < 0:
        for c in range(s.n):
            s.keys[c] = acc[c]
        _rank(s, count, count)
        while d < 0:
            for i in range(count):
                c = s.order[i]
                if d < 0 and quotas[c] > 0:
                    quotas[c] -= 1
                    acc[c] += 1.0
                    d += 1


cdef void _fixed_quotas(Schedule* s) noexcept nogil:
    """FixedAllocator.allocate for the current weights, into s.fixed."""
    cdef Py_ssize_t c, i, count = _active_order(s)
    cdef int64_t left = s.chunk_size - count, extra
    cdef double whole
    for c in range(s.n):
        s.fixed[c] = 1 if s.weights[c] > 0.0 else 0
        s.keys[c] = -s.weights[c]
    _rank(s, count, count)
    for i in range(count):
        c = s.order[i]
        extra = <int64_t>floor(fmax(0.0, s.shares[c] - 1.0))
        if extra > left:
            extra = left
        s.fixed[c] += extra
        left -= extra
    for c in range(s.n):
        s.keys[c] = -modf(s.shares[c], &whole)
    count = _active_order(s)
    _rank(s, count, count)
    for i in range(left):
        s.fixed[s.order[i % count]] += 1


cdef inline void _allocate(Schedule* s, double* acc, int64_t* quotas) noexcept nogil:
    cdef Py_ssize_t c
    if s.allocator == ACCUMULATOR:
        _accumulate(s, acc, quotas)
    else:
        for c in range(s.n):
            quotas[c] = s.fixed[c]


cdef bint _passes_done(Schedule* s, int64_t* epochs, int64_t* positions, Py_ssize_t counting) noexcept nogil:
    cdef Py_ssize_t c
    cdef int64_t completed
    for c in range(s.n):
        completed = epochs[c] + (1 if c == counting or positions[c] >= s.totals[c] else 0)
        if completed < s.stop_after:
            return False
    return True


cdef bint _done_after(Schedule* s, const int64_t* epochs, const int64_t* positions,
                      const int64_t* drawn) noexcept nogil:
    """``_passes_done`` once each dataset has drawn ``drawn`` more samples on through its passes
    (as ``_advance`` moves them): a draw that ends a pass completes it."""
    cdef Py_ssize_t c
    cdef int64_t completed
    for c in range(s.n):
        if s.totals[c] > 0:
            completed = epochs[c] + (positions[c] + drawn[c]) // s.totals[c]
        else:
            completed = epochs[c] + 1
        if completed < s.stop_after:
            return False
    return True


cdef bint _update_weights(Schedule* s, int64_t* positions) noexcept nogil:
    """Normalise the weights over the active datasets; False if none is active.

    ``raw_weights`` are already normalised over all datasets (the first of the two stages); once some
    retired, they are divided by their sum over the active ones (the second stage).
    Redistributing datasets never come back once drained, so the active set changes exactly
    when their count changes, and the divisions run only then.
    """
    cdef Py_ssize_t c, k, retired = 0
    cdef double total = 0.0
    for c in range(s.n):
        if s.policies[c] == REDISTRIBUTE and positions[c] >= s.totals[c]:
            retired += 1
    if retired == s.retired:
        return retired < s.n
    s.retired = retired
    for c in range(s.n):
        s.weights[c] = 0.0 if (s.policies[c] == REDISTRIBUTE and positions[c] >= s.totals[c]) else 1.0
    for k in range(s.n):
        if s.weights[s.sum_order[k]] > 0.0:
            total += s.raw_weights[s.sum_order[k]]
    if total == 0.0:
        return False
    for c in range(s.n):
        if retired == 0:
            s.weights[c] = s.raw_weights[c]
        else:
            s.weights[c] = s.raw_weights[c] / total if s.weights[c] > 0.0 else 0.0
        s.shares[c] = s.weights[c] * <double>s.chunk_size
    if s.allocator == FIXED:
        _fixed_quotas(s)
    s.exact = -1  # the grids are found when a block is first skipped (_prepare_exact)
    return True


cdef Py_ssize_t _plan_chunk(Schedule* s, double* acc, int64_t* epochs, int64_t* positions, int64_t* tails,
                            int64_t* quotas) noexcept nogil:
    """plan_chunk_reference in place: PLANNED (positions not yet advanced) or the ending dataset."""
    cdef Py_ssize_t c
    cdef bint restart = True
    cdef int64_t remaining
    if not _update_weights(s, positions):
        return ALL_DONE
    for c in range(s.n):
        s.saved[c] = acc[c]
    while restart:
        restart = False
        for c in range(s.n):
            acc[c] = s.saved[c]
        _allocate(s, acc, quotas)
        for c in range(s.n):
            remaining = s.totals[c] - positions[c]
            if remaining >= quotas[c]:
                continue
            if s.policies[c] == STOP:
                return c
            if s.policies[c] == REDISTRIBUTE:
                quotas[c] = remaining
                continue
            if s.carry[c]:
                if not _can_carry(s, c, epochs[c], positions[c], quotas[c]):
                    return c
                continue
            if positions[c] == 0:  # a whole pass is too short: only a corrupted state gets here
                return c
            if s.max_repeats[c] >= 0 and epochs[c] >= s.max_repeats[c]:
                return c
            if s.stop_after > 0 and _passes_done(s, epochs, positions, c):
                return ALL_DONE  # every dataset is done, c counting its pass: none ends it
            tails[c] += s.totals[c] - positions[c]
            epochs[c] += 1
            positions[c] = 0
            restart = True
            break
    if s.stop_after > 0 and _passes_done(s, epochs, positions, -1):
        return ALL_DONE
    return PLANNED


cdef inline bint _can_carry(Schedule* s, Py_ssize_t c, int64_t epoch, int64_t position, int64_t quota) noexcept nogil:
    """can_carry: "carry" dataset c draws ``quota`` (> 0) on into its next passes within max_repeats."""
    cdef int64_t total = s.totals[c]
    if total == 0:
        return False
    if s.max_repeats[c] < 0:
        return True
    return epoch + (position + quota - 1) // total <= s.max_repeats[c]  # the pass it ends in


cdef inline void _advance(Schedule* s, int64_t* epochs, int64_t* positions, const int64_t* quotas) noexcept nogil:
    """advance in place: positions move by the quotas; a "carry" draw past its pass's end moves into
    the pass it ends in (a draw that ends a pass leaves the cursor at that pass's end)."""
    cdef Py_ssize_t c
    for c in range(s.n):
        positions[c] += quotas[c]
    _into_passes(s, epochs, positions)


cdef inline void _into_passes(Schedule* s, int64_t* epochs, int64_t* positions) noexcept nogil:
    """Each position past its pass's end moved into the pass it ends in: where draws that ran on
    through several passes, chunk by chunk as ``_advance`` moves them, leave it."""
    cdef Py_ssize_t c
    cdef int64_t passes
    for c in range(s.n):
        if positions[c] > s.totals[c]:
            passes = (positions[c] - 1) // s.totals[c]
            epochs[c] += passes
            positions[c] -= passes * s.totals[c]


cdef inline bint _carries(Schedule* s, Py_ssize_t c) noexcept nogil:
    """Dataset c repeats with "carry" tails: the end of one of its passes changes no quota and,
    within ``max_repeats`` (``_room``), ends nothing in the chunk, so quiet chunks run through it.
    (A pass count to stop after is checked where each chunk starts: ``_passes_done``, ``_done_after``.)"""
    return s.carry[c] and s.policies[c] == REPEAT and s.totals[c] > 0


cdef inline int64_t _room(Schedule* s, Py_ssize_t c, int64_t epoch, int64_t position) noexcept nogil:
    """How many samples dataset c can draw in quiet chunks from its cursor: to one short of its
    pass's end, or, one that ``_carries``, to the end of its last pass within ``max_repeats``
    (``_can_carry``; INT64_MAX without a limit). Negative: none."""
    if not s.carries[c]:
        return s.totals[c] - position - 1
    if s.max_repeats[c] < 0:
        return INT64_MAX
    if epoch > s.max_repeats[c]:
        return -1
    return (s.max_repeats[c] - epoch + 1) * s.totals[c] - position


cdef int64_t _slot_in_block(int64_t block, int64_t lane, int64_t replicas, uint64_t lane_key) noexcept nogil:
    """Where ``lane`` sits in block ``block`` of the permuted routing."""
    cdef Perm lanes = perm_make(derive(lane_key, <uint64_t>block), <uint64_t>replicas)
    return <int64_t>perm_invert(&lanes, <uint64_t>lane)


cdef int64_t _next_own(int64_t g, int64_t lane, int64_t replicas, int routing, uint64_t lane_key) noexcept nogil:
    """The first global chunk >= g that belongs to ``lane``: the inverse side of each routing
    of zephon/core/routing.py (``routing`` is its ``code``)."""
    cdef int64_t block = g // replicas, own
    if replicas == 1:  # every chunk is the lane's, whatever the routing
        return g
    if routing == ROUTE_MODULO:
        return g + (lane - g % replicas + replicas) % replicas
    while True:
        own = block * replicas + _slot_in_block(block, lane, replicas, lane_key)
        if own >= g:
            return own
        block += 1


cdef int64_t _skip_quiet(Schedule* s, double* acc, int64_t* epochs, int64_t* positions, int64_t* quotas,
                        int64_t count, int64_t steps, int64_t* work) noexcept nogil:
    """Skip up to ``count`` chunks in which no dataset draws past its ``_room``: none reaches the
    end of its pass but those whose draws carry on through it (``_carries``).

    Such chunks need only the allocator: the end-of-pass checks cannot fire. Long stretches go
    as blocks (``_skip_block``, O(datasets) each); at most ``steps`` chunks are stepped one by
    one. Each chunk stepped and each block adds one to ``work[0]``. Returns how many were
    skipped: fewer than ``count`` before a chunk that would draw a dataset past its room, or
    that would start with the passes to stop after all done; when ``steps`` run out; or when a
    block stops early (the caller then plans the next chunk in full, which is always right).
    ``quotas`` hold the last chunk's quotas if it was stepped.
    """
    cdef int64_t skipped = 0, block, stepped = 0
    cdef Py_ssize_t c
    while skipped < count:
        if s.stop_after > 0 and _passes_done(s, epochs, positions, -1):
            return skipped
        if count - skipped >= BLOCK_MIN:
            block = _skip_block(s, acc, epochs, positions, count - skipped)
            if block >= 0:
                work[0] += 1
                return skipped + block
        if stepped == steps:
            return skipped
        for c in range(s.n):
            s.saved[c] = acc[c]
        _allocate(s, acc, quotas)
        for c in range(s.n):
            if quotas[c] > 0 and quotas[c] > _room(s, c, epochs[c], positions[c]):
                for c in range(s.n):
                    acc[c] = s.saved[c]
                return skipped
        _advance(s, epochs, positions, quotas)
        skipped += 1
        stepped += 1
        work[0] += 1
    return skipped


cdef extern from *:
    """
    typedef __int128 zephon_int128;
    """
    ctypedef long long int128 "zephon_int128"  # C's 128-bit integer (gcc, clang): Cython sees a long long


cdef enum:
    BLOCK_MIN = 16  # fewer quiet chunks than this are stepped one by one (a block costs about as much)


cdef int64_t _grid_of(double x) noexcept nogil:
    """The smallest m >= 0 with x·2^m a whole number (x > 0), or -1 past 52."""
    cdef int e
    cdef int64_t whole = <int64_t>ldexp(frexp(x, &e), 53), m = 53 - e  # x = whole·2^-m, whole < 2^53
    while m > 0 and whole % 2 == 0:
        whole //= 2
        m -= 1
    return m if m <= 52 else -1


cdef void _prepare_exact(Schedule* s) noexcept nogil:
    """For the current weights: each active share's grid 2^-m and its units there, and whether
    the accumulator's arithmetic is exact on them (``s.exact``): every share >= 1 on a grid with
    m <= 52 and (share + 1)·2^m <= 2^53, so that ``acc + share`` is a double for any ``acc`` in
    [-1, 1) on the grid (where every chunk after the first leaves it; ``_on_grid`` checks the first)."""
    cdef Py_ssize_t c
    cdef int64_t m
    s.exact = 1
    for c in range(s.n):
        s.grid[c], s.units[c] = 0, 0
        if s.weights[c] == 0.0:
            continue
        m = _grid_of(s.shares[c]) if s.shares[c] >= 1.0 else -1
        if m < 0 or <int64_t>ldexp(s.shares[c], <int>m) + (<int64_t>1 << m) > (<int64_t>1 << 53):
            s.exact = 0
            return
        s.grid[c], s.units[c] = m, <int64_t>ldexp(s.shares[c], <int>m)


cdef bint _on_grid(Schedule* s, const double* acc) noexcept nogil:
    """The accumulators lie on their shares' grids, in [-1, 2], with ``acc + share`` a double,
    and no inactive one holds a remainder (the next chunk would zero them all)."""
    cdef Py_ssize_t c
    cdef double scaled
    for c in range(s.n):
        if s.weights[c] == 0.0:
            if acc[c] != 0.0:
                return False
            continue
        scaled = ldexp(acc[c], <int>s.grid[c])
        if not (-1.0 <= acc[c] <= 2.0) or scaled != floor(scaled) or \
                <int64_t>scaled + s.units[c] > (<int64_t>1 << 53):
            return False
    return True


cdef int64_t _regular_for(Schedule* s, const double* acc, int64_t count) noexcept nogil:
    """The most chunks (<= count) whose corrections are all regular (a deficit in 0..active
    datasets): while sum(acc) + t·(sum(shares) - chunk_size) stays in [-1, 1), on the finest grid."""
    cdef Py_ssize_t c
    cdef int64_t top = 0
    cdef int128 total = 0, drift, one, bound
    for c in range(s.n):
        if s.weights[c] > 0.0 and s.grid[c] > top:
            top = s.grid[c]
    one = (<int128>1) << top
    drift = -((<int128>s.chunk_size) << top)
    for c in range(s.n):
        if s.weights[c] > 0.0:
            total += (<int128><int64_t>ldexp(acc[c], <int>s.grid[c])) * ((<int128>1) << (top - s.grid[c]))
            drift += (<int128>s.units[c]) << (top - s.grid[c])
    if total + drift < -one or total + drift >= one:
        return 0
    if drift == 0:
        return count
    bound = (one - 1 - total) // drift if drift > 0 else (total + one) // (-drift)
    return <int64_t>bound if bound < count else count


cdef int _accumulate_ahead(Schedule* s, const double* acc, const int64_t* epochs, const int64_t* positions,
                           int64_t n) noexcept nogil:
    """AccumulatorAllocator.allocate_many: the cumulative quotas of ``n`` (>= 1) regular chunks into
    ``s.ahead`` and the accumulators after them into ``s.saved``. Returns 1 if no dataset draws
    past its ``_room`` in them, 2 if so but the passes to stop after are all done after them (a
    chunk after them would not start), 0 if one does, -1 if a correction is not regular."""
    cdef Py_ssize_t c, i, count = _active_order(s)
    cdef int64_t m
    cdef int128 x, deficit = (<int128>n) * s.chunk_size
    for c in range(s.n):
        s.ahead[c], s.saved[c] = 0, 0.0
        if s.weights[c] > 0.0:
            m = s.grid[c]
            x = <int128><int64_t>ldexp(acc[c], <int>m) + (<int128>n) * s.units[c]
            s.ahead[c] = <int64_t>(x >> m)
            s.saved[c] = ldexp(<double><int64_t>(x - ((<int128>s.ahead[c]) << m)), -<int>m)
            s.keys[c] = -s.saved[c]
            deficit -= s.ahead[c]
    if deficit < 0 or deficit > count:
        return -1
    _rank(s, count, <Py_ssize_t>deficit)
    for i in range(<Py_ssize_t>deficit):
        c = s.order[i]
        s.ahead[c] += 1
        s.saved[c] -= 1.0
    for c in range(s.n):
        if s.ahead[c] > 0 and s.ahead[c] > _room(s, c, epochs[c], positions[c]):
            return 0
    return 2 if s.stop_after > 0 and _done_after(s, epochs, positions, s.ahead) else 1


cdef void _quiet_bracket(Schedule* s, const double* acc, const int64_t* epochs, const int64_t* positions,
                         int64_t* below, int64_t* above) noexcept nogil:
    """Where the quiet chunks end, about: after ``n`` regular chunks a dataset has drawn
    ``floor(acc + n·share)`` or one more, so they are quiet for ``below`` chunks and not for
    ``above`` (each the least over the active datasets whose ``_room`` is bounded; a few chunks
    apart). Only estimates, in doubles: ``_skip_block`` checks them with ``_accumulate_ahead``."""
    cdef Py_ssize_t c
    cdef int64_t room
    cdef double share, left, low = -1.0, high = -1.0
    for c in range(s.n):
        room = _room(s, c, epochs[c], positions[c])
        if s.weights[c] > 0.0 and room < INT64_MAX:
            share = ldexp(<double>s.units[c], -<int>s.grid[c])
            left = <double>room + 1.0 - acc[c]
            if low < 0.0 or floor((left - 2.0) / share) < low:
                low = floor((left - 2.0) / share)
            if high < 0.0 or floor((left + 1.0) / share) + 2.0 < high:
                high = floor((left + 1.0) / share) + 2.0
    below[0] = <int64_t>low if low > 0.0 else 0
    above[0] = <int64_t>high if high > 0.0 else 0


cdef int64_t _fixed_done_at(Schedule* s, const int64_t* epochs, const int64_t* positions) noexcept nogil:
    """After how many chunks of the fixed quotas the passes to stop after are all done
    (``_done_after``), or -1 for never."""
    cdef Py_ssize_t c
    cdef int64_t need, at = 0
    for c in range(s.n):
        if epochs[c] >= s.stop_after:
            continue
        need = (s.stop_after - epochs[c]) * s.totals[c] - positions[c]  # samples to draw before c is done
        if s.totals[c] == 0 or need <= 0:
            if s.totals[c] == 0 and epochs[c] + 1 < s.stop_after:
                return -1
            continue
        if s.fixed[c] == 0:
            return -1
        if (need + s.fixed[c] - 1) // s.fixed[c] > at:
            at = (need + s.fixed[c] - 1) // s.fixed[c]
    return at


cdef int64_t _skip_fixed(Schedule* s, int64_t* epochs, int64_t* positions, int64_t count) noexcept nogil:
    """Skip up to ``count`` quiet chunks of the fixed allocator (the same quotas in each)."""
    cdef Py_ssize_t c
    cdef int64_t done, room
    for c in range(s.n):
        if s.fixed[c] > 0:
            room = _room(s, c, epochs[c], positions[c])
            if room < 0:
                return 0
            if room // s.fixed[c] < count:
                count = room // s.fixed[c]
    if s.stop_after > 0:
        done = _fixed_done_at(s, epochs, positions)
        if 0 <= done < count:
            count = done
    for c in range(s.n):
        positions[c] += count * s.fixed[c]
    _into_passes(s, epochs, positions)
    return count


cdef int64_t _skip_block(Schedule* s, double* acc, int64_t* epochs, int64_t* positions, int64_t count) noexcept nogil:
    """Skip up to ``count`` quiet chunks at once, in closed form: how many (fewer when the next is
    not quiet), or -1 where no closed form holds (the caller steps them one by one)."""
    cdef Py_ssize_t c
    cdef int64_t lo = 0, hi, mid
    cdef int64_t guesses[2]
    cdef int quiet, last, i = 0
    if s.allocator == FIXED:
        return _skip_fixed(s, epochs, positions, count)
    if s.exact < 0:
        _prepare_exact(s)
    if not s.exact or not _on_grid(s, acc):
        return -1
    count = _regular_for(s, acc, count)
    if count == 0:
        return -1
    quiet = _accumulate_ahead(s, acc, epochs, positions, count)
    if quiet < 0:
        return -1
    if quiet != 1:  # the quiet chunks end before ``count``, or the stream does: find where, from an estimate
        hi, last = count, quiet
        _quiet_bracket(s, acc, epochs, positions, &guesses[0], &guesses[1])
        while hi - lo > 1:  # bisect, first at the estimate's two ends (a few chunks apart)
            mid = guesses[i] if i < 2 else lo + (hi - lo) // 2
            i += 1
            if not lo < mid < hi:
                continue
            quiet = _accumulate_ahead(s, acc, epochs, positions, mid)
            if quiet < 0:
                return -1
            if quiet == 1:
                lo = mid
            else:
                hi, last = mid, quiet
        if last == 2:  # the chunk after the last quiet one is quiet too, but the stream ends after it
            lo = hi
        if lo == 0 or _accumulate_ahead(s, acc, epochs, positions, lo) < 1:
            return 0
        count = lo
    for c in range(s.n):
        if s.weights[c] > 0.0:  # an inactive accumulator stays as it is (0.0 or -0.0)
            positions[c] += s.ahead[c]
            acc[c] = s.saved[c]
    _into_passes(s, epochs, positions)
    return count


cdef enum:
    PAUSED = -3  # _walk_some passed its budget of work before the lane's own one


cdef void _draw_starts(Schedule* s, int64_t* start_epochs, int64_t* start_positions) noexcept nogil:
    """draw_start in place for every dataset: a repeating "carry" cursor at the end of its pass
    starts the next."""
    cdef Py_ssize_t c
    for c in range(s.n):
        if s.carry[c] and s.policies[c] == REPEAT and start_positions[c] >= s.totals[c] and s.totals[c] > 0:
            start_epochs[c] += 1
            start_positions[c] = 0


cdef Py_ssize_t _walk(Schedule* s, int64_t lane, int64_t replicas, int routing, uint64_t lane_key,
                      int64_t* g, double* acc, int64_t* epochs, int64_t* positions, int64_t* tails,
                      int64_t* quotas, int64_t* start_epochs, int64_t* start_positions) noexcept nogil:
    """Plan chunks from g[0] until the lane's own one; other lanes' chunks only move numbers."""
    return _walk_some(s, lane, replicas, routing, lane_key, g, acc, epochs, positions, tails, quotas,
                      start_epochs, start_positions, INT64_MAX)


cdef Py_ssize_t _walk_some(Schedule* s, int64_t lane, int64_t replicas, int routing, uint64_t lane_key,
                           int64_t* g, double* acc, int64_t* epochs, int64_t* positions, int64_t* tails,
                           int64_t* quotas, int64_t* start_epochs, int64_t* start_positions,
                           int64_t budget) noexcept nogil:
    """``_walk``, or ``PAUSED`` at a chunk boundary (the state arrays at global chunk g[0]) once
    ``budget`` units of work on other lanes' chunks are behind (a chunk stepped or planned, a
    block skipped: each O(datasets)), so that a caller can answer Ctrl-C.

    Quiet chunks (no dataset draws past its ``_room``) take the allocator-only path, the lane's
    own chunk included; the others take the full end-of-pass checks. The starts written are
    the schedule's cursors; ``_draw_starts`` turns them into where the draws begin (the index
    walk, which only counts samples, skips that).
    """
    cdef Py_ssize_t c, status
    cdef int64_t work = 0
    cdef int64_t own = _next_own(g[0], lane, replicas, routing, lane_key)
    while True:
        if work >= budget and g[0] < own:
            return PAUSED
        if not _update_weights(s, positions):
            return ALL_DONE
        if g[0] < own:
            g[0] += _skip_quiet(s, acc, epochs, positions, quotas, own - g[0], budget - work, &work)
        if g[0] == own:
            for c in range(s.n):
                start_epochs[c] = epochs[c]
                start_positions[c] = positions[c]
            if _skip_quiet(s, acc, epochs, positions, quotas, 1, 1, &work) == 1:
                return PLANNED
        status = _plan_chunk(s, acc, epochs, positions, tails, quotas)
        if status != PLANNED:
            return status
        for c in range(s.n):
            start_epochs[c] = epochs[c]
            start_positions[c] = positions[c]
        _advance(s, epochs, positions, quotas)
        if g[0] == own:
            return PLANNED
        g[0] += 1
        work += 1


cdef class ScheduleTables:
    """One config's scheduling tables (``Schedule``'s constant part), shared by the kernels of its
    lanes: each lane's ``Scheduler`` holds only its binding beside them."""

    def __init__(self, int allocator, const double[::1] raw_weights, const int64_t[::1] totals,
                 const int64_t[::1] policies, const int64_t[::1] max_repeats, const int64_t[::1] carry,
                 const int64_t[::1] sum_order, int64_t stop_after, int64_t chunk_size):
        self.allocator, self.raw_weights, self.totals, self.sum_order = allocator, raw_weights, totals, sum_order
        self.policies, self.max_repeats, self.carry, self.stop_after = policies, max_repeats, carry, stop_after
        self.chunk_size = chunk_size

    def __reduce__(self):
        """Pickle by the constructor's arguments (for spawned DataLoader workers)."""
        return ScheduleTables, (self.allocator, np.asarray(self.raw_weights), np.asarray(self.totals),
                                np.asarray(self.policies), np.asarray(self.max_repeats), np.asarray(self.carry),
                                np.asarray(self.sum_order), self.stop_after, self.chunk_size)


cdef class Scheduler:
    """One lane's scheduling kernel: its config's tables and the lane's binding; its methods walk a
    state in place.

    The state lives in the caller's arrays: ``acc`` (float64), ``epochs``, ``positions`` and
    ``tails`` (int64, the "drop" pass tails skipped so far), one entry per dataset.
    Scratch memory is per call, so one Scheduler may serve several threads walking different
    states. Its fields are declared in schedule.pxd.
    """

    def __init__(self, ScheduleTables tables not None, int64_t lane, int64_t replicas, int routing,
                 uint64_t lane_key):
        if routing != ROUTE_MODULO and routing != ROUTE_PERMUTE:
            raise ValueError(f"routing code {routing} is not a kernel routing (zephon/core/routing.py)")
        self.tables, self.lane, self.replicas, self.routing, self.lane_key = tables, lane, replicas, routing, lane_key

    def __reduce__(self):
        """Pickle by the constructor's arguments (for spawned DataLoader workers)."""
        return Scheduler, (self.tables, self.lane, self.replicas, self.routing, self.lane_key)

    cdef int _open(self, Schedule* s, double* weights) except -1:
        cdef ScheduleTables t = self.tables
        cdef Py_ssize_t c, n = t.totals.shape[0]
        s.n, s.allocator, s.stop_after, s.chunk_size = n, t.allocator, t.stop_after, t.chunk_size
        s.raw_weights, s.totals = &t.raw_weights[0], &t.totals[0]
        s.policies, s.max_repeats, s.sum_order = &t.policies[0], &t.max_repeats[0], &t.sum_order[0]
        s.carry = &t.carry[0]
        s.saved = <double*>malloc(3 * n * sizeof(double))
        s.order = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t))
        s.fixed = <int64_t*>malloc(5 * n * sizeof(int64_t))
        s.ranked = <Ranked*>malloc(n * sizeof(Ranked))
        if s.saved == NULL or s.order == NULL or s.fixed == NULL or s.ranked == NULL:
            self._close(s)
            raise MemoryError()
        s.shares, s.keys, s.weights, s.retired = s.saved + n, s.saved + 2 * n, weights, -1
        s.grid, s.units, s.ahead, s.carries = s.fixed + n, s.fixed + 2 * n, s.fixed + 3 * n, s.fixed + 4 * n
        for c in range(n):
            s.carries[c] = _carries(s, c)
        return 0

    cdef void _close(self, Schedule* s) noexcept:
        free(s.saved)
        free(s.order)
        free(s.fixed)
        free(s.ranked)

    cdef Py_ssize_t _step(self, Schedule* s, int64_t* g, double* acc, int64_t* epochs, int64_t* positions,
                          int64_t* tails, int64_t* out) noexcept nogil:
        """``_walk`` for this lane; ``out`` holds three rows of n (pointers, not memoryviews: this
        runs once per chunk of an index walk)."""
        return _walk(s, self.lane, self.replicas, self.routing, self.lane_key, g, acc, epochs, positions, tails,
                     out, out + s.n, out + 2 * s.n)

    def plan_next(self, int64_t chunk_index, double[::1] acc, int64_t[::1] epochs, int64_t[::1] positions,
                  int64_t[::1] tails, int64_t[:, ::1] out, double[::1] weights, int64_t budget=INT64_MAX):
        """Plan the lane's next chunk from global chunk ``chunk_index``.

        The state arrays move to the state after that chunk; ``out`` rows receive quotas, and
        the pass and position where each dataset's draw starts; ``weights`` the active weights. Returns
        ``(ended, g, dataset)``: the chunk's global index, or where the stream ends and which
        dataset ended it (-1: every dataset done / none active); after an end the state
        arrays hold no meaningful state. Other lanes' chunks are skipped without the GIL in
        stretches of ``budget`` units of work (each O(datasets)), with a check for signals
        (Ctrl-C) between them.
        """
        cdef Schedule s
        cdef Py_ssize_t status
        cdef int64_t g = chunk_index
        self._open(&s, &weights[0])
        try:
            while True:
                with nogil:
                    status = _walk_some(&s, self.lane, self.replicas, self.routing, self.lane_key, &g, &acc[0],
                                        &epochs[0], &positions[0], &tails[0], &out[0, 0], &out[1, 0], &out[2, 0],
                                        budget)
                    if status == PLANNED:
                        _draw_starts(&s, &out[1, 0], &out[2, 0])
                if status != PAUSED:
                    break
                PyErr_CheckSignals()
        finally:
            self._close(&s)
        if status == PLANNED:
            return False, g, -1
        return True, g, status

    def skip_quiet(self, double[::1] acc, int64_t[::1] epochs, int64_t[::1] positions, int64_t count):
        """Skip up to ``count`` quiet chunks from the state in the arrays (moved in place), as a
        lane skips other lanes' chunks. Returns ``(skipped, work)``: the chunks skipped, and the
        chunks stepped one by one plus the blocks skipped. For tests: a block is exactly
        ``AccumulatorAllocator.allocate_many`` (or the fixed quotas) over its chunks. ``count`` is
        at most 2^32 (a lane skips fewer than twice its lane count): datasets that carry on through
        their passes without a limit bound no skip."""
        cdef Schedule s
        cdef Py_ssize_t n = self.tables.totals.shape[0]
        cdef int64_t skipped = 0, work = 0
        cdef int64_t[::1] quotas = np.empty(n, dtype=np.int64)
        cdef double[::1] weights = np.empty(n, dtype=np.float64)
        if acc.shape[0] != n or epochs.shape[0] != n or positions.shape[0] != n:
            raise ValueError(f"skip_quiet: the state arrays need {n} entries, one per dataset")
        if not 0 <= count <= 2**32:
            raise ValueError(f"skip_quiet: count={count} must be in 0 .. 2**32")
        self._open(&s, &weights[0])
        with nogil:
            if _update_weights(&s, &positions[0]):
                skipped = _skip_quiet(&s, &acc[0], &epochs[0], &positions[0], &quotas[0], count, count, &work)
        self._close(&s)
        return skipped, work

    def index(self, int64_t chunk_index, double[::1] acc, int64_t[::1] epochs, int64_t[::1] positions,
              int64_t[::1] tails, int64_t own, int64_t samples, int64_t every, int64_t[:, ::1] snap_ints,
              double[:, ::1] snap_acc, int64_t budget):
        """Walk the lane's chunks to the end, recording the state before every ``every``-th one.

        ``own`` chunks of ``samples`` samples precede the given state. A snapshot row holds
        ``[g, samples_before, epochs..., positions..., tails...]`` and the accumulators. Stops when the
        snapshot arrays are full or after ``budget`` chunks of the lane (so that the caller
        can answer Ctrl-C between calls). Returns ``(filled, g, own, samples, ended)``; at an
        end, ``g`` is the global chunk that could not be produced.
        """
        cdef Schedule s
        cdef Py_ssize_t c, n = self.tables.totals.shape[0], filled = 0, status = PLANNED
        cdef int64_t g = chunk_index, stop = own + budget
        cdef int64_t[:, ::1] out = np.empty((3, n), dtype=np.int64)
        cdef double[::1] weights = np.empty(n, dtype=np.float64)
        self._open(&s, &weights[0])
        with nogil:
            while status == PLANNED and own < stop:
                if own % every == 0:
                    if filled == snap_ints.shape[0]:
                        break
                    snap_ints[filled, 0], snap_ints[filled, 1] = g, samples
                    for c in range(n):
                        snap_ints[filled, 2 + c], snap_ints[filled, 2 + n + c] = epochs[c], positions[c]
                        snap_ints[filled, 2 + 2 * n + c] = tails[c]
                        snap_acc[filled, c] = acc[c]
                    filled += 1
                status = self._step(&s, &g, &acc[0], &epochs[0], &positions[0], &tails[0], &out[0, 0])
                if status == PLANNED:
                    g += 1
                    own += 1
                    for c in range(n):
                        samples += out[0, c]
        self._close(&s)
        return filled, g, own, samples, status != PLANNED

    def count_lanes(self, int64_t chunk_index, double[::1] acc, int64_t[::1] epochs, int64_t[::1] positions,
                    int64_t[::1] tails, int64_t replicas, int routing, uint64_t lane_key, const int64_t[::1] starts,
                    int64_t[::1] totals, int64_t stop):
        """Walk the global schedule from ``chunk_index`` to chunk ``stop`` (or the stream's end),
        adding each chunk's samples to ``totals`` of the lane that owns it among ``replicas``
        (``routing``, ``lane_key``: the forward rules of zephon/core/routing.py) when the chunk
        is at or after that lane's ``starts`` entry. This Scheduler must own every chunk (lane
        0 of 1). Returns ``(g, ended)``: the next chunk to plan, and whether the stream ended
        there (the state arrays then hold no meaningful state). Defined by
        zephon/core/counting.py::count_lanes_reference.
        """
        cdef Schedule s
        cdef Py_ssize_t c, n = self.tables.totals.shape[0], status = PLANNED
        cdef int64_t g = chunk_index, owner, block = -1, size
        cdef int64_t[:, ::1] out = np.empty((3, n), dtype=np.int64)
        cdef double[::1] weights = np.empty(n, dtype=np.float64)
        cdef Perm lanes
        if self.replicas != 1:
            raise ValueError("count_lanes walks the whole schedule: use the template's Scheduler (lane 0 of 1)")
        if replicas < 1 or chunk_index < 0 or (routing != ROUTE_MODULO and routing != ROUTE_PERMUTE):
            raise ValueError(f"count_lanes: replicas={replicas} must be >= 1, chunk_index={chunk_index} >= 0 and "
                             f"routing={routing} a kernel routing code")
        if starts.shape[0] != replicas or totals.shape[0] != replicas:
            raise ValueError(f"count_lanes: starts and totals need {replicas} entries")
        if acc.shape[0] != n or epochs.shape[0] != n or positions.shape[0] != n or tails.shape[0] != n:
            raise ValueError(f"count_lanes: the state arrays need {n} entries, one per dataset")
        self._open(&s, &weights[0])
        with nogil:
            while g < stop:
                status = self._step(&s, &g, &acc[0], &epochs[0], &positions[0], &tails[0], &out[0, 0])
                if status != PLANNED:
                    break
                if replicas == 1:
                    owner = 0
                elif routing == ROUTE_MODULO:
                    owner = g % replicas
                else:
                    if g // replicas != block:
                        block = g // replicas
                        lanes = perm_make(derive(lane_key, <uint64_t>block), <uint64_t>replicas)
                    owner = <int64_t>perm_apply(&lanes, <uint64_t>(g % replicas))
                if g >= starts[owner]:
                    size = 0
                    for c in range(n):
                        size += out[0, c]
                    totals[owner] += size
                g += 1
        self._close(&s)
        return g, status != PLANNED

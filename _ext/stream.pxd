from libc.stdint cimport int64_t


cdef extern from "stream.h" nogil:
    # Stores past the caches where the CPU has them (x86-64), plain stores elsewhere; a run of
    # them ends with stream_fence(). See stream.h for when they pay.
    void stream_store "zephon_stream"(int64_t* p, int64_t v)
    void stream_fence "zephon_stream_fence"()


cdef inline void stream_put(int64_t* p, int64_t v, bint stream) noexcept nogil:
    """``*p = v``, past the caches with ``stream`` (a loop of them then ends with stream_fence())."""
    if stream:
        stream_store(p, v)
    else:
        p[0] = v

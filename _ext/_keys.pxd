"""Mixing hash and domain constants shared by every kernel.

Must match zephon/core/keys.py, which defines them.
"""
from libc.stdint cimport uint64_t

cdef extern from *:
    """
    /* Must match zephon/core/keys.py. */
    #define ZEPHON_GOLDEN 0x9E3779B97F4A7C15ULL
    #define ZEPHON_DOMAIN_LANE 0x2545F4914F6CDD1DULL
    #define ZEPHON_DOMAIN_READ_RANDOM 0x8CB92BA72F3D8DD7ULL
    #define ZEPHON_DOMAIN_READ_SHUFFLE 0x3C6EF372FE94F82BULL
    """
    const uint64_t GOLDEN "ZEPHON_GOLDEN"
    const uint64_t DOMAIN_LANE "ZEPHON_DOMAIN_LANE"
    const uint64_t DOMAIN_READ_RANDOM "ZEPHON_DOMAIN_READ_RANDOM"
    const uint64_t DOMAIN_READ_SHUFFLE "ZEPHON_DOMAIN_READ_SHUFFLE"


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    cdef uint64_t z = x + GOLDEN
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline uint64_t derive(uint64_t key, uint64_t value) noexcept nogil:
    return mix64(key ^ mix64(value))

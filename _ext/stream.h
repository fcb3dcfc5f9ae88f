/* Stores past the caches (non-temporal), for arrays that are read later or by another
 * process rather than by this core now: a DataLoader worker's shared slot, a reader's bundle.
 * Written through the caches, each line of such an array is first read from memory, and the
 * stores wait for it. x86-64 has them in SSE2 (every such CPU); elsewhere they are plain stores.
 * A run of them ends with zephon_stream_fence(), which orders them before any later store. */
#ifndef ZEPHON_STREAM_H
#define ZEPHON_STREAM_H

#include <stdint.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
static inline void zephon_stream(int64_t* p, int64_t v) { _mm_stream_si64((long long*)p, (long long)v); }
static inline void zephon_stream_fence(void) { _mm_sfence(); }
#else
static inline void zephon_stream(int64_t* p, int64_t v) { *p = v; }
static inline void zephon_stream_fence(void) {}
#endif

#endif

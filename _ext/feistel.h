/* Batched Feistel network of zephon's random-access permutations (_ext/perm.pxd).
 *
 * Defined by zephon/core/perm.py::perm_reference; the scalar network in perm.pxd computes
 * the same function one element at a time. Everything here must match both.
 *
 * zephon_perm_many applies one permutation to x[0..m), zephon_perm_each a different one per
 * element. A group of elements goes through the six rounds together, round by round, in
 * loops without branches, then the few outputs that land in [n, a*b) walk one by one.
 * Integer operations only, so every instruction set gives the same bits.
 *
 * The group width is the one thing that depends on the CPU. With GCC >= 12 on x86-64 Linux
 * (glibc) the loops are also compiled for x86-64-v4 (AVX-512) and x86-64-v3 (AVX2) over
 * groups of ZEPHON_BATCH, which the compiler turns into SIMD code, and the best the CPU runs
 * is picked at call time. Everywhere else (or with -DZEPHON_NO_DISPATCH) groups of
 * ZEPHON_LANES stay in registers, so a scalar CPU overlaps their multiply chains.
 */
#ifndef ZEPHON_FEISTEL_H
#define ZEPHON_FEISTEL_H

#include <stddef.h>
#include <stdint.h>

#define ZEPHON_ROUNDS 6            /* must match PERM_ROUNDS in perm.pxd, ROUNDS in core/perm.py */
#define ZEPHON_MIN_BITS 6          /* must match PERM_MIN_BITS in perm.pxd */
#define ZEPHON_BATCH 64            /* SIMD group; must match PERM_BATCH in perm.pxd */
#define ZEPHON_LANES 8             /* scalar group (8 beat 4 and 16) */
#define ZEPHON_F_GOLDEN 0x9E3779B97F4A7C15ULL  /* must match GOLDEN in _keys.pxd */
#define ZEPHON_F_M1 0xBF58476D1CE4E5B9ULL      /* zephon_f's multipliers */
#define ZEPHON_F_M2 0x94D049BB133111EBULL

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) \
    && defined(__GLIBC__) && __GNUC__ >= 12 && !defined(ZEPHON_NO_DISPATCH)
#define ZEPHON_DISPATCH 1
#else
#define ZEPHON_DISPATCH 0
#endif

#if defined(__GNUC__)  /* bodies are compiled into each caller, with its width and target */
#define ZEPHON_BODY static inline __attribute__((always_inline))
#else
#define ZEPHON_BODY static inline
#endif

/* The round function F_r(v) (v < 2**32): the one C definition (every kernel, through perm.pxd). */
static inline uint64_t zephon_f(uint64_t round_key, uint64_t v) {
    uint64_t z = (v ^ round_key) * ZEPHON_F_M1;
    z = (z ^ (z >> 32)) * ZEPHON_F_M2;
    return z >> 32;
}

/* One pass of the network on x = high*2**bits + low (perm.pxd uses it for single elements). */
static inline uint64_t zephon_network(uint64_t key, uint64_t bits, uint64_t b, uint64_t x) {
    uint64_t mask = ((uint64_t)1 << bits) - 1, low = x & mask, high = x >> bits;
    for (int r = 0; r < ZEPHON_ROUNDS; r++) {
        uint64_t f = zephon_f(key + (uint64_t)r * ZEPHON_F_GOLDEN, (r & 1) ? high : low);
        if ((r & 1) == 0) {
            high += (f * b) >> 32;
            high = high >= b ? high - b : high;
        } else {
            low = (low + f) & mask;
        }
    }
    return (high << bits) | low;
}

/* a = 2**bits and b of the network on [0, n) (must match perm_make in perm.pxd). */
static inline void zephon_shape(uint64_t n, uint64_t *bits, uint64_t *b) {
    uint64_t least = (uint64_t)1 << ZEPHON_MIN_BITS, domain = n > least ? n : least;
    *bits = (uint64_t)(64 - __builtin_clzll(domain - 1)) >> 1;
    *b = ((domain - 1) >> *bits) + 1;
}

/* The six rounds on a group of `width` elements; element j uses key[j*s], b[j*s], mask[j*s]
 * (s = 0: one permutation for all). Inlined with constant width and s. */
ZEPHON_BODY void zephon_rounds(size_t width, uint64_t *low, uint64_t *high, const uint64_t *key,
                               const uint64_t *b, const uint64_t *mask, size_t s) {
    for (int r = 0; r < ZEPHON_ROUNDS; r += 2) {
        uint64_t even = (uint64_t)r * ZEPHON_F_GOLDEN, odd = even + ZEPHON_F_GOLDEN;
        for (size_t j = 0; j < width; j++) {
            uint64_t h = high[j] + ((zephon_f(key[j * s] + even, low[j]) * b[j * s]) >> 32);
            high[j] = h >= b[j * s] ? h - b[j * s] : h;
        }
        for (size_t j = 0; j < width; j++)
            low[j] = (low[j] + zephon_f(key[j * s] + odd, high[j])) & mask[j * s];
    }
}

ZEPHON_BODY void zephon_many_body(size_t width, uint64_t *x, size_t m, uint64_t key, uint64_t n) {
    uint64_t bits, b, mask;
    if (n <= 1)
        return;
    zephon_shape(n, &bits, &b);
    mask = ((uint64_t)1 << bits) - 1;
    for (size_t done = 0; done < m; done += width) {
        uint64_t low[ZEPHON_BATCH], high[ZEPHON_BATCH], pad[ZEPHON_BATCH];
        size_t c = m - done < width ? m - done : width;
        uint64_t *y = x + done;
        if (c < width) {
            for (size_t j = 0; j < width; j++) pad[j] = j < c ? y[j] : 0;
            y = pad;
        }
        for (size_t j = 0; j < width; j++) {
            low[j] = y[j] & mask;
            high[j] = y[j] >> bits;
        }
        zephon_rounds(width, low, high, &key, &b, &mask, 0);
        for (size_t j = 0; j < width; j++)
            y[j] = (high[j] << bits) | low[j];
        if (c < width)
            for (size_t j = 0; j < c; j++) x[done + j] = pad[j];
    }
    for (size_t j = 0; j < m; j++)
        while (x[j] >= n)
            x[j] = zephon_network(key, bits, b, x[j]);
}

ZEPHON_BODY void zephon_each_body(size_t width, uint64_t *x, const uint64_t *keys, const uint64_t *ns,
                                  size_t m) {
    uint64_t least = (uint64_t)1 << ZEPHON_MIN_BITS;
    for (size_t done = 0; done < m; done += width) {
        uint64_t bits[ZEPHON_BATCH], b[ZEPHON_BATCH], mask[ZEPHON_BATCH], low[ZEPHON_BATCH], high[ZEPHON_BATCH];
        uint64_t pad_x[ZEPHON_BATCH], pad_key[ZEPHON_BATCH], pad_n[ZEPHON_BATCH];
        size_t c = m - done < width ? m - done : width;
        uint64_t *y = x + done;
        const uint64_t *key = keys + done, *n = ns + done;
        if (c < width) {  /* a short last group is padded with n = 0 */
            for (size_t j = 0; j < width; j++) {
                pad_x[j] = j < c ? y[j] : 0;
                pad_key[j] = j < c ? key[j] : 0;
                pad_n[j] = j < c ? n[j] : 0;
            }
            y = pad_x, key = pad_key, n = pad_n;
        }
        for (size_t j = 0; j < width; j++) {
            uint64_t domain = n[j] > least ? n[j] : least;
            bits[j] = (uint64_t)(64 - __builtin_clzll(domain - 1)) >> 1;
            b[j] = ((domain - 1) >> bits[j]) + 1;
        }
        for (size_t j = 0; j < width; j++) {
            mask[j] = ((uint64_t)1 << bits[j]) - 1;
            low[j] = y[j] & mask[j];
            high[j] = y[j] >> bits[j];
        }
        zephon_rounds(width, low, high, key, b, mask, 1);
        for (size_t j = 0; j < c; j++) {
            if (n[j] <= 1)
                continue;  /* the identity: x stays */
            x[done + j] = (high[j] << bits[j]) | low[j];
            while (x[done + j] >= n[j])
                x[done + j] = zephon_network(key[j], bits[j], b[j], x[done + j]);
        }
    }
}

#if ZEPHON_DISPATCH
#define ZEPHON_TARGET(level, name, params, args)                                             \
    __attribute__((target("arch=" level), noinline, unused)) static void name params {               \
        args;                                                                                \
    }
ZEPHON_TARGET("x86-64-v4", zephon_many_v4, (uint64_t *x, size_t m, uint64_t key, uint64_t n),
              zephon_many_body(ZEPHON_BATCH, x, m, key, n))
ZEPHON_TARGET("x86-64-v3", zephon_many_v3, (uint64_t *x, size_t m, uint64_t key, uint64_t n),
              zephon_many_body(ZEPHON_BATCH, x, m, key, n))
ZEPHON_TARGET("x86-64-v4", zephon_each_v4, (uint64_t *x, const uint64_t *k, const uint64_t *n, size_t m),
              zephon_each_body(ZEPHON_BATCH, x, k, n, m))
ZEPHON_TARGET("x86-64-v3", zephon_each_v3, (uint64_t *x, const uint64_t *k, const uint64_t *n, size_t m),
              zephon_each_body(ZEPHON_BATCH, x, k, n, m))
#undef ZEPHON_TARGET
#endif

/* x[j] = perm(key, n, x[j]) for j < m (every x[j] < n). */
static inline void zephon_perm_many(uint64_t *x, size_t m, uint64_t key, uint64_t n) {
#if ZEPHON_DISPATCH
    if (__builtin_cpu_supports("x86-64-v4"))
        zephon_many_v4(x, m, key, n);
    else if (__builtin_cpu_supports("x86-64-v3"))
        zephon_many_v3(x, m, key, n);
    else
#endif
        zephon_many_body(ZEPHON_LANES, x, m, key, n);
}

/* x[j] = perm(keys[j], ns[j], x[j]) for j < m (every x[j] < ns[j], or ns[j] <= 1). */
static inline void zephon_perm_each(uint64_t *x, const uint64_t *keys, const uint64_t *ns, size_t m) {
#if ZEPHON_DISPATCH
    if (__builtin_cpu_supports("x86-64-v4"))
        zephon_each_v4(x, keys, ns, m);
    else if (__builtin_cpu_supports("x86-64-v3"))
        zephon_each_v3(x, keys, ns, m);
    else
#endif
        zephon_each_body(ZEPHON_LANES, x, keys, ns, m);
}

#endif /* ZEPHON_FEISTEL_H */

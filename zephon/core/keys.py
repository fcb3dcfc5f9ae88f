"""Keyed 64-bit derivation: every random decision is a pure function of these.

``mix64`` is the SplitMix64 finaliser; ``derive(key, value)`` folds one more integer into a
key. Purposes are separated by the domain constants below, never by shifting small integers
together. The Cython kernels use the same definitions (``_ext/_keys.pxd``).

**Compatibility**: the constants and both functions define every stream zephon produces;
changing any of them changes the checkpoint version.
"""
from __future__ import annotations

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15

# Domain constants, one per purpose. Must match _ext/_keys.pxd.
DOMAIN_SEED = 0x5EED5EED0F1E2D3C
DOMAIN_SHARD_ORDER = 0xA1B2C3D4E5F60718
DOMAIN_WITHIN_SHARD = 0x1F2E3D4C5B6A7988
DOMAIN_BLOCK = 0x6C8E9CF570932BD5
DOMAIN_LANE = 0x2545F4914F6CDD1D
DOMAIN_CHUNK_SEED = 0xD6E8FEB86659FD93
DOMAIN_READ_RANDOM = 0x8CB92BA72F3D8DD7
DOMAIN_READ_SHUFFLE = 0x3C6EF372FE94F82B
DOMAIN_CALIBRATION = 0x7A3D9E1B5C2F4086  # token priming's calibration draws (zephon.work)


def mix64(x: int) -> int:
    """SplitMix64 finaliser of ``x + GOLDEN`` (mod 2**64)."""
    z = (x + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def derive(key: int, value: int) -> int:
    """Fold the integer ``value`` (taken mod 2**64) into ``key``."""
    return mix64(key ^ mix64(value & MASK64))


def seed_key(seed: int) -> int:
    """The root key of a user seed; any Python int, negatives and >64-bit values included."""
    key = mix64(DOMAIN_SEED ^ (1 if seed < 0 else 0))
    magnitude = -seed if seed < 0 else seed
    while True:
        key = derive(key, magnitude & MASK64)
        magnitude >>= 64
        if magnitude == 0:
            return key


def purpose_key(seed: int, domain: int, *path: int) -> int:
    """Key for one purpose (a domain constant) and a path of integers, e.g. (dataset, pass)."""
    key = derive(seed_key(seed), domain)
    for value in path:
        key = derive(key, value)
    return key

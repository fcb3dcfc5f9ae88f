"""The Cython kernels (built by ``pip install .`` from the ``*.pyx`` files beside this one)."""
import importlib.util

_KERNELS = ("perm", "layout", "cursor", "schedule", "readorder", "tokens", "batch", "shapes", "lookup", "labels", "strings", "handout", "rounds")  # must match KERNELS in setup.py
_SHARED = "_cyutility"  # Cython's utility code, shared by the kernels (SHARED in setup.py)
_missing = [name for name in (_SHARED, *_KERNELS) if importlib.util.find_spec(f"{__name__}.{name}") is None]
if _missing:
    raise ImportError(
        f"zephon's compiled kernels {_missing} are missing: zephon was not built. Install it with "
        f"'pip install .' (or 'pip install -e .' in a checkout; a C compiler is needed) instead of "
        f"putting the source tree on sys.path"
    )

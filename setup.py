"""Build the Cython kernels from one table: sources in the top-level ``_ext/``, built as ``zephon._ext.*``.

The ``.pxd``/``.pyi``/``.h`` files are installed with the modules, so a fork can
``cimport zephon._ext.perm``. Cython (for a ``.pxd``) and mypy (for a ``.pyi``) find a module's
interface by its package path, so ``build/interface/zephon/_ext`` links to ``_ext/`` for both
(``mypy_path`` in pyproject.toml); the sources stay in ``_ext/``.
"""
import os
import sys
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

KERNELS = ["perm", "layout", "cursor", "schedule", "readorder", "tokens", "batch", "shapes", "lookup", "labels", "strings", "handout", "rounds"]  # must match _KERNELS in _ext/__init__.py
SOURCES = Path("_ext")
STRIP = ["-s"] if sys.platform.startswith("linux") else []  # symbol tables are most of an unstripped kernel's size
INTERFACE = Path("build") / "interface"


def interface_tree() -> str:
    """``INTERFACE/zephon/_ext``: a link to ``_ext/``, so the kernels' interfaces have their package path."""
    link = INTERFACE / "zephon" / "_ext"
    if not os.path.lexists(link):
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("..", "..", "..", SOURCES), target_is_directory=True)
    return str(INTERFACE)


SHARED = "zephon._ext._cyutility"  # Cython's utility code (memoryviews, ...) once, not in every kernel
extensions = [Extension(SHARED, [str(SOURCES / "_cyutility.c")], extra_compile_args=["-O3"], extra_link_args=STRIP)]
extensions += [
    Extension(
        f"zephon._ext.{name}",
        [str(SOURCES / f"{name}.pyx")],
        include_dirs=[np.get_include(), str(SOURCES)],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3", "-ffp-contract=off"],
        extra_link_args=STRIP,
        depends=[str(SOURCES / "feistel.h"), str(SOURCES / "stream.h")],  # cimported through perm.pxd, stream.pxd
    )
    for name in KERNELS
]  # the shared module first: it is the largest, and the build runs JOBS at a time in this order

JOBS = os.cpu_count() or 1  # Cython and the C compiler run this many kernels at once

setup(
    packages=find_packages(include=["zephon", "zephon.*"]) + ["zephon._ext"],
    package_dir={"zephon._ext": str(SOURCES)},
    ext_modules=cythonize(extensions, language_level=3, include_path=[interface_tree()], nthreads=JOBS,
                          shared_utility_qualified_name=SHARED),
    options={"build_ext": {"parallel": JOBS}},
)

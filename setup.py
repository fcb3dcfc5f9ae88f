"""Build the Cython kernels from one table: sources in the top-level ``_ext/``, built as ``zephon._ext.*``.

The ``.pxd``/``.pyi``/``.h`` files are installed with the modules, so a fork can
``cimport zephon._ext.perm``. Cython finds a ``.pxd`` by its package path, so the ``.pxd``
files are mirrored under ``build/cython-include/zephon/_ext/`` for the compiler (the
sources stay in ``_ext/``).
"""
import shutil
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

KERNELS = ["perm", "cursor", "schedule", "readorder", "tokens", "lookup"]  # must match _KERNELS in _ext/__init__.py
SOURCES = Path("_ext")
INCLUDE = Path("build") / "cython-include"


def mirror_pxd() -> str:
    """``INCLUDE/zephon/_ext/*.pxd``: copies of ``_ext/*.pxd`` (rewritten only when changed)."""
    target = INCLUDE / "zephon" / "_ext"
    target.mkdir(parents=True, exist_ok=True)
    for pxd in SOURCES.glob("*.pxd"):
        copy = target / pxd.name
        if not copy.exists() or copy.read_bytes() != pxd.read_bytes():
            shutil.copy2(pxd, copy)
    return str(INCLUDE)


extensions = [
    Extension(
        f"zephon._ext.{name}",
        [str(SOURCES / f"{name}.pyx")],
        include_dirs=[np.get_include(), str(SOURCES)],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3", "-ffp-contract=off"],
        depends=[str(SOURCES / "feistel.h")],  # cimported through perm.pxd by every kernel
    )
    for name in KERNELS
]

setup(
    packages=find_packages(include=["zephon", "zephon.*"]) + ["zephon._ext"],
    package_dir={"zephon._ext": str(SOURCES)},
    ext_modules=cythonize(extensions, language_level=3, include_path=[mirror_pxd()]),
)

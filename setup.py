"""Build the Cython kernels in zephon/_ext from one table."""
import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

KERNELS = ["perm", "cursor", "schedule", "readorder", "tokens", "lookup"]  # must match _KERNELS in zephon/_ext/__init__.py

extensions = [
    Extension(
        f"zephon._ext.{name}",
        [f"zephon/_ext/{name}.pyx"],
        include_dirs=[np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3", "-ffp-contract=off"],
        depends=["zephon/_ext/feistel.h"],  # cimported through perm.pxd by every kernel
    )
    for name in KERNELS
]

setup(ext_modules=cythonize(extensions, language_level=3))

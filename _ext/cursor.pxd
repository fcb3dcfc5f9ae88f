"""The cursor kernel's C surface, for kernels that write pointers themselves (lookup.pyx).

Defined in cursor.pyx; see its docstring. ``Pass`` and ``PassLayout`` are layout.pxd's,
passed on here so that such a kernel cimports what it hands to ``_take_at`` from one place.
"""
from libc.stdint cimport int64_t
from zephon._ext.layout cimport Pass, PassLayout


cdef void _take_at(int64_t* out, const int64_t* rows, int64_t dataset_id, const Pass* P,
                   const int64_t* positions, Py_ssize_t n) noexcept nogil

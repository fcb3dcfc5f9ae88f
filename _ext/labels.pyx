# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The component names of a bundle's batches: one list per batch, made in one pass.

Defined by zephon/runtime/pipeline.py::split_names_reference: batch ``k`` gets the names of
``ids[bounds[k]:bounds[k + 1]]``. The trainer hands every batch its list of names; made
through numpy (an object array, ``tolist``, a slice per batch) they cost it more than the
batches' pointers do, so here each list is filled at once from the names' tuple.
"""
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport PyObject, Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.stdint cimport int32_t, int64_t

ctypedef fused id_t:
    int32_t
    int64_t


def split_names(tuple names, const id_t[::1] ids, const int64_t[::1] bounds):
    """``[[names[i] for i in ids[a:b]] for a, b in zip(bounds, bounds[1:])]``: ``bounds`` must
    not fall, lie in ``0 .. len(ids)``, and every id they span must index ``names``."""
    cdef Py_ssize_t k, j, a, b, units = max(bounds.shape[0] - 1, 0), kinds = len(names)
    cdef id_t i
    cdef list out = PyList_New(units), batch
    cdef object name
    for k in range(bounds.shape[0]):
        if bounds[k] < (bounds[k - 1] if k else 0) or bounds[k] > ids.shape[0]:
            raise ValueError(f"split_names: bounds[{k}] = {bounds[k]} is outside {bounds[k - 1] if k else 0} .. "
                             f"{ids.shape[0]}")
    for k in range(units):
        a, b = bounds[k], bounds[k + 1]
        batch = PyList_New(b - a)
        for j in range(a, b):
            i = ids[j]
            if i < 0 or i >= kinds:
                raise ValueError(f"split_names: ids[{j}] = {i} names no component (there are {kinds})")
            name = <object>PyTuple_GET_ITEM(names, i)
            Py_INCREF(name)
            PyList_SET_ITEM(batch, j - a, name)
        Py_INCREF(batch)
        PyList_SET_ITEM(out, k, batch)
    return out

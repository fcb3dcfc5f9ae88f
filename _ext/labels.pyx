# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The component names of a bundle's batches, one list per batch, made when the batch is.

Defined by zephon/runtime/pipeline.py::batch_names_reference: batch ``k`` gets the names of
``ids[bounds[k]:bounds[k + 1]]``. The trainer hands every batch its list of names; made
through numpy (an object array, ``tolist``, a slice per batch) they cost it more than the
batches' pointers do. Made all at once, a bundle's lists wait in the garbage collector's
youngest generation and every collection walks their names; so each list is filled when its
batch is handed out, straight from the names' tuple.
"""
from cpython.list cimport PyList_New
from cpython.ref cimport PyObject
from cpython.sequence cimport PySequence_Fast_ITEMS
from libc.stdint cimport int32_t, int64_t


cdef extern from "Python.h":  # the macros on raw pointers: no reference juggling per name
    void incref "Py_INCREF"(PyObject*)
    void set_item "PyList_SET_ITEM"(object, Py_ssize_t, PyObject*)

import numpy as np


cdef class BatchNames:
    """``BatchNames(names, ids, bounds)[k] == [names[i] for i in ids[bounds[k]:bounds[k + 1]]]``:
    ``bounds`` must not fall and lie in ``0 .. len(ids)`` (checked here), and every id must
    index ``names``: checked here for ids of another dtype than int32 (which are cast), else as
    each batch is made (a check here would read every id once more: a tenth of the trainer's
    work per bundle of a DataLoader worker's pointers, which come as int32)."""

    cdef tuple names
    cdef const int32_t[::1] ids
    cdef const int64_t[::1] bounds

    def __init__(self, tuple names not None, ids, bounds):
        ids = np.asarray(ids)
        if ids.dtype != np.int32 and len(ids) and (ids.min() < 0 or ids.max() >= len(names)):  # before a cast wraps
            bad = int(np.flatnonzero((ids < 0) | (ids >= len(names)))[0])
            raise ValueError(f"BatchNames: ids[{bad}] = {ids[bad]} names no component (there are {len(names)})")
        self.names = names
        self.ids = np.ascontiguousarray(ids, dtype=np.int32)
        self.bounds = np.array(bounds, dtype=np.int64)  # a copy: checked here once, for good
        cdef Py_ssize_t k
        cdef int64_t low = 0
        for k in range(self.bounds.shape[0]):
            if self.bounds[k] < low or self.bounds[k] > self.ids.shape[0]:
                raise ValueError(f"BatchNames: bounds[{k}] = {self.bounds[k]} is outside {low} .. {self.ids.shape[0]}")
            low = self.bounds[k]

    def __len__(self):
        return max(self.bounds.shape[0] - 1, 0)

    def __getitem__(self, Py_ssize_t k):
        if k < 0 or k >= self.bounds.shape[0] - 1:
            raise IndexError(f"BatchNames: batch {k} of {len(self)}")
        cdef Py_ssize_t j, a = self.bounds[k], n = self.bounds[k + 1] - a
        cdef const int32_t* ids = &self.ids[a] if n else NULL
        cdef PyObject** names = PySequence_Fast_ITEMS(self.names)
        cdef list batch = PyList_New(n)
        cdef PyObject* name
        cdef Py_ssize_t kinds = len(self.names)
        for j in range(n):
            if ids[j] < 0 or ids[j] >= kinds:
                raise ValueError(f"BatchNames: ids[{a + j}] = {ids[j]} names no component (there are {kinds})")
            name = names[ids[j]]
            incref(name)
            set_item(batch, j, name)
        return batch

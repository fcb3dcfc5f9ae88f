# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A reader's rounds: each of its lanes' turns written to its place among the others'.

``interleave`` is defined by zephon/runtime/_stream.py::interleave_reference and
``same_place`` by zephon/runtime/_stream.py::same_place_reference. A reader of several lanes
hands out a turn of ``unit`` samples of each lane in a round; ``LaneMux`` writes whole rounds
straight into the arrays it fills (a DataLoader worker's shared slot), a lane at a time,
where numpy's strided copy set up every round's assignment and cast the ids; into a slot, past
the caches (``stream.h``), whose cold lines a store through them first reads from memory.
"""
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from zephon._ext.stream cimport stream_fence, stream_put

cnp.import_array()

ctypedef fused ids_t:
    int32_t
    int64_t


def interleave(int64_t[:, ::1] pointers, ids_t[::1] components, const int64_t[:, ::1] lane_pointers,
               const int64_t[::1] lane_components, Py_ssize_t lane, Py_ssize_t lanes, Py_ssize_t unit,
               bint stream):
    """Write turn ``r`` of lane ``lane`` (``lane_pointers[r * unit:(r + 1) * unit]`` and its
    component ids) at sample ``(r * lanes + lane) * unit`` of ``pointers`` and ``components``,
    for every whole turn; ``components`` may be int32 (ids are cast). With ``stream`` the
    pointers go past the caches: for turns of a few cache lines at least (shorter ones leave
    the CPU's write-combining buffers half full) into arrays read later."""
    cdef Py_ssize_t n = lane_pointers.shape[0], r, t, at, rounds
    if unit < 1 or not 0 <= lane < lanes:
        raise ValueError(f"interleave: lane {lane} of {lanes} with turns of {unit}; pass 0 <= lane < lanes, unit >= 1")
    if lane_pointers.shape[1] != 3 or lane_components.shape[0] != n or n % unit:
        raise ValueError(f"interleave: the lane's arrays have shapes ({n}, {lane_pointers.shape[1]}) and "
                         f"({lane_components.shape[0]},); pass (k * unit, 3) and (k * unit,)")
    rounds = n // unit
    if pointers.shape[1] != 3 or pointers.shape[0] < rounds * lanes * unit or components.shape[0] < rounds * lanes * unit:
        raise ValueError(f"interleave: {rounds} rounds of {lanes} lanes need {rounds * lanes * unit} samples; the "
                         f"arrays have shapes ({pointers.shape[0]}, {pointers.shape[1]}) and ({components.shape[0]},)")
    with nogil:
        for r in range(rounds):
            at = (r * lanes + lane) * unit
            for t in range(unit):
                stream_put(&pointers[at + t, 0], lane_pointers[r * unit + t, 0], stream)
                stream_put(&pointers[at + t, 1], lane_pointers[r * unit + t, 1], stream)
                stream_put(&pointers[at + t, 2], lane_pointers[r * unit + t, 2], stream)
                components[at + t] = <ids_t>lane_components[r * unit + t]
        if stream:
            stream_fence()


def same_place(cnp.ndarray array not None, cnp.ndarray place not None):
    """Whether ``array`` starts where ``place`` does, with its dtype and strides: the chunk that
    ``LaneMux`` read into its place in a slot. Through numpy's attributes (``ctypes.data``,
    ``strides``) the look took 1.7 us, four a chunk: about 5 % of a worker's CPU on pointers."""
    cdef int d
    if cnp.PyArray_DATA(array) != cnp.PyArray_DATA(place) or cnp.PyArray_NDIM(array) != cnp.PyArray_NDIM(place):
        return False
    for d in range(cnp.PyArray_NDIM(array)):
        if cnp.PyArray_STRIDES(array)[d] != cnp.PyArray_STRIDES(place)[d]:
            return False
    return bool(cnp.PyArray_EquivTypes(array.descr, place.descr))

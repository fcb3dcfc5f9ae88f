"""Per-lane values as columns: how a loader state stores its lanes in O(lanes) with a small constant.

A *column* holds one JSON value per lane, for ``n`` lanes, in one of these forms:

* ``[v0, v1, …]`` — the values, one per lane;
* ``{"same": v}`` — every lane has ``v``: an int, a string, a bool or null, or (from version 3) a
  non-empty list without a float that is not finite (each lane shares the one list);
* ``{"start": a, "step": s}`` — lane ``k`` has the int ``a + k * s``;
* ``{"fields": {key: column, …}}`` — every lane has a dict with these keys, each a column;
* ``{"float64": "<base64>"}`` — finite floats, exactly, as the little-endian bytes of a float64
  array; with ``"width": w`` every lane has a list of ``w`` floats.

:func:`encode` picks the smallest form that fits and :func:`decode` restores the values, equal
and of the same JSON types. Lanes' source states are alike in shape (a dict per dataset, a
list of accumulators), so their keys are written once and their numbers back to back: about
75 bytes a lane for a mixture of three datasets, where one JSON object per lane takes 370.
"""
from __future__ import annotations

import base64
import binascii
import math
import operator
from itertools import chain
from typing import Any, Callable, Sequence

import numpy as np

from zephon.limits import show

_SAME = (int, str, bool, type(None))  # floats go to float64 columns: exact to the bit, -0.0 included


def encode(values: Sequence[Any]) -> Any:
    """The column of ``values`` (one JSON value per lane)."""
    if not values:
        return []
    first, types = values[0], set(map(type, values))
    if len(types) == 1 and type(first) in _SAME and values.count(first) == len(values):
        return {"same": first}
    if types == {list} and first and _finite(first) and all(identical(value, first) for value in values[1:]):
        return {"same": first}  # a list every lane has (a phased lane's settings, say): kept once
    if types == {dict} and first and all(map(first.keys().__eq__, map(dict.keys, values))):
        return {"fields": {key: encode(list(map(operator.itemgetter(key), values))) for key in first}}
    if types == {int} and len(values) > 1:
        step = values[1] - first
        if step and all(map(operator.eq, values, range(first, first + step * len(values), step))):
            return {"start": first, "step": step}
    if types == {float} and (text := _float64(values)) is not None:
        return {"float64": text}
    if types == {list} and first and set(map(len, values)) == {len(first)}:
        flat = list(chain.from_iterable(values))
        if set(map(type, flat)) == {float} and (text := _float64(flat)) is not None:
            return {"float64": text, "width": len(first)}
    return list(values)


def encode_fields(fields: Any) -> Any:
    """The column of the dicts that ``fields`` holds field by field (a dict of such, non-empty,
    where the dicts nest; a list of one field's values, one per lane, at a leaf): what
    :func:`encode` gives for the list of those dicts, without making them."""
    if type(fields) is dict and fields:
        return {"fields": {key: encode_fields(value) for key, value in fields.items()}}
    return encode(fields)


def identical(a: Any, b: Any) -> bool:
    """Equal as JSON, types included (``1``, ``1.0`` and ``True`` differ; so do ``0.0`` and ``-0.0``)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(map(identical, a, b))
    if type(a) is float:
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


def copied(value: Any) -> Any:
    """A copy of checked JSON, its dicts and lists (and their subclasses) made plain ones anew:
    ``copy.deepcopy`` took 4 times as long, a fifth of parsing a rank's state."""
    if isinstance(value, dict):
        return {key: copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copied(item) for item in value]
    return value


def _finite(value: Any) -> bool:
    """Whether no float in ``value`` (JSON) is infinite or NaN (JSON has no text for them)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(map(_finite, value.values()))
    if isinstance(value, list):
        return all(map(_finite, value))
    return True


def nodes(value: Any) -> int:
    """The JSON values in ``value``, itself included, a string counted once per 64 characters
    (as ``zephon.limits.check_json`` counts them): what making a lane's copy of it costs."""
    if isinstance(value, dict):
        return 1 + sum(map(nodes, value.values()))
    if isinstance(value, list):
        return 1 + sum(map(nodes, value))
    return 1 + (len(value) // 64 if isinstance(value, str) else 0)


def _float64(values: Sequence[float]) -> str | None:
    """The base64 of ``values`` as little-endian float64; None where one is not finite."""
    array = np.asarray(values, dtype="<f8")
    return base64.b64encode(array.tobytes()).decode("ascii") if np.isfinite(array).all() else None


def leaves(column: Any) -> int:
    """Values a column holds per lane at most (its ``fields`` leaves, or those of the value that
    every lane has, a long string counted once per 64 characters): what decoding it for ``n``
    lanes makes, ``n`` times over, whatever the size of its text."""
    fields = column.get("fields") if type(column) is dict else None
    if type(fields) is dict and fields:
        return sum(leaves(c) for c in fields.values())
    return nodes(column.get("same")) if type(column) is dict else 1


def decode(column: Any, n: int, where: str) -> list[Any]:
    """The ``n`` values of ``column``; ``ValueError`` naming ``where`` when it is malformed."""
    if type(column) is list:
        return _values(column, n, where)
    value = getter(column, n, where)
    return [value(k) for k in range(n)]


def getter(column: Any, n: int, where: str) -> Callable[[int], Any]:
    """``value(k)``: the value of lane ``k`` of ``column``, made when asked for (a rank restores
    a few lanes of many). The column's form is checked at once: ``ValueError`` naming ``where``."""
    return assembled(getters(column, n, where))


def getters(column: Any, n: int, where: str) -> Any:
    """The getters of ``column`` field by field: a dict of its fields' getters for a ``fields``
    column, the getter of its values otherwise (checked as :func:`getter`)."""
    if type(column) is list:
        return _values(column, n, where).__getitem__
    if type(column) is not dict:
        raise ValueError(f"{where}: a column is a list or a dict, got {show(column)}")
    keys = set(column)
    if keys == {"same"} and (type(column["same"]) in _SAME or
                             (type(column["same"]) is list and column["same"] and _finite(column["same"]))):
        same = copied(column["same"])  # a later edit of the caller's column changes no lane
        return lambda k: same
    if keys == {"start", "step"} and type(column["start"]) is int and type(column["step"]) is int:
        start, step = column["start"], column["step"]
        return lambda k: start + k * step
    if keys == {"fields"} and type(column["fields"]) is dict and column["fields"]:
        return {key: getters(value, n, f"{where}.{key}") for key, value in column["fields"].items()}
    if keys in ({"float64"}, {"float64", "width"}):
        return _float_getter(column, n, where)
    raise ValueError(f"{where}: not a column: {show(column)}")


def assembled(tree: Any) -> Callable[[int], Any]:
    """``value(k)`` of a :func:`getters` tree: lane ``k``'s value, its dicts made whole."""
    if type(tree) is not dict:
        return tree  # type: ignore[no-any-return]  # a leaf's getter
    fields = [(key, assembled(value)) for key, value in tree.items()]
    return lambda k: {key: value(k) for key, value in fields}


def values(tree: Any, ks: Sequence[int]) -> list[Any]:
    """The values of lanes ``ks`` of a :func:`getters` tree, each lane's dicts made whole: what
    ``assembled(tree)`` gives lane by lane, made field by field (a few times faster)."""
    if type(tree) is not dict:
        return [tree(k) for k in ks]
    keys = list(tree)
    return [dict(zip(keys, lane)) for lane in zip(*(values(value, ks) for value in tree.values()))]


def select(tree: Any, ks: Sequence[int]) -> Any:
    """The values of lanes ``ks`` of a :func:`getters` tree, field by field: a dict of the
    fields' selections for a ``fields`` column, a list of the lanes' values otherwise."""
    if type(tree) is dict:
        return {key: select(value, ks) for key, value in tree.items()}
    return [tree(k) for k in ks]


def _values(column: list[Any], n: int, where: str) -> list[Any]:
    """The values of a list column, copied: a later edit of the caller's list changes nothing."""
    if len(column) != n:
        raise ValueError(f"{where}: {len(column)} values for {n} lanes")
    return list(column)


def _float_getter(column: dict[str, Any], n: int, where: str) -> Callable[[int], Any]:
    width = column.get("width")
    if width is not None and not (type(width) is int and width >= 1):
        raise ValueError(f"{where}: width={show(width)} must be an int >= 1")
    try:
        raw = base64.b64decode(column["float64"], validate=True) if type(column["float64"]) is str else None
    except (binascii.Error, ValueError):
        raw = None
    count = n * (width or 1)
    if raw is None or len(raw) != 8 * count:
        raise ValueError(f"{where}: float64 must be the base64 of {count} float64 values")
    array = np.frombuffer(raw, dtype="<f8")
    if not np.isfinite(array).all():
        raise ValueError(f"{where}: a float is not finite (such floats are stored as a list)")
    floats: list[float] = array.tolist()
    if width is None:
        return floats.__getitem__
    return lambda k: floats[k * width:(k + 1) * width]

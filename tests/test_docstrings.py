"""Docs are product: every parameter of a public constructor is named in its docstring."""
import enum
import importlib
import inspect

import pytest

PACKAGES = ["zephon", "zephon.work", "zephon.io", "zephon.core", "zephon.runtime", "zephon.torch", "zephon.testing"]


def public_classes():
    seen = {}
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if (inspect.isclass(value) and value.__module__.startswith("zephon")
                    and not issubclass(value, (Exception, enum.Enum))):  # an enum is built by value
                seen.setdefault(f"{value.__module__}.{value.__qualname__}", value)
    return sorted(seen.items())


def constructors(cls):
    """``cls(...)`` itself, and its ``from_*`` class methods."""
    yield cls.__qualname__, cls, (cls.__doc__ or "") + (cls.__init__.__doc__ or "")
    for name, member in vars(cls).items():
        if name.startswith("from_") and isinstance(member, classmethod):
            method = getattr(cls, name)
            yield f"{cls.__qualname__}.{name}", method, method.__doc__ or ""


def signature(function):
    """The signature, or None for types without one (a TypedDict is a dict)."""
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def parameters(function):
    found = signature(function)
    return [] if found is None else [p.name for p in found.parameters.values()
                                     if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in ("self", "cls")]


CASES = [(f"{qualified}:{label}", function, doc) for qualified, cls in public_classes()
         for label, function, doc in constructors(cls)]


@pytest.mark.parametrize("label, function, doc", CASES, ids=[c[0] for c in CASES])
def test_every_constructor_parameter_is_documented(label, function, doc):
    missing = [name for name in parameters(function) if f"{name}" not in doc]
    assert not missing, f"{label}: the docstring never names {missing}"


def test_no_docstring_points_at_files_that_are_not_shipped():
    for _, cls in public_classes():
        for _, function, doc in constructors(cls):
            assert "SPEC" not in doc and "<unset>" not in str(signature(function))

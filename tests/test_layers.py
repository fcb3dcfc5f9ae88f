"""The import graph of zephon/ runs one way: no cycle, no upward edge, no cross-package private import.

Every ``import`` in ``zephon/*.py`` is read with ``ast`` (function-level imports included) and
mapped to its package: the first name after ``zephon`` (``core``, ``work``, ...); the kernels'
sources in the top-level ``_ext/`` are read for their ``cimport`` lines. The layers are the
design's table, lowest first.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "zephon"
KERNELS = ROOT / "_ext"

# Lowest first. A package may import its own modules and any package of a lower layer; two
# packages of one layer never import each other (core and io are independent leaves).
LAYERS = (
    ("_ext", "limits"),  # limits: the documented bounds, imported by every layer, importing none
    ("core", "io"),
    ("work",),
    ("ops",),  # operators after the source: tokenize, pack, ensure_mixture
    ("runtime",),
    ("torch",),
    ("lightning", "hf"),  # framework integrations: over the torch layer and the framework
    ("__init__",),  # the facade: zephon.Dataset, zephon.Pipeline, ...
    ("cli", "testing"),
    ("__main__", "_pytest_plugin"),  # entry points: ``python -m zephon``, the pytest plugin (over zephon.testing)
)
RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}
# The one permitted upward reference: the seed names these Pipeline methods, zephon.torch
# implements them, and the import happens inside the method.
UPWARD = {("zephon.runtime.pipeline", "zephon.torch")}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """``zephon.core.step`` -> ``core``; the root facade ``zephon`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` for every import of zephon in ``path`` (names: the ``from`` list)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.split(".")[0] == "zephon"]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; write the absolute zephon.… name"
            if node.module and node.module.split(".")[0] == "zephon":
                found.append((node.module, [alias.name for alias in node.names]))
    return found


def edges() -> dict[str, set[str]]:
    """module -> the zephon modules it imports (a ``from pkg import module`` names the module)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, names in imports(path):
            submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
            targets.update(submodules or [module])
        graph[name] = targets - {name}
    return graph


def private_imports() -> list[str]:
    """Imports of another package's underscore module or name."""
    bad = []
    for path in PACKAGE.rglob("*.py"):
        own = package_of(module_name(path))
        for module, names in imports(path):
            if package_of(module) == own:
                continue
            inner = module.split(".")[2:] + names
            private = [part for part in inner if part.startswith("_") and not part.startswith("__")]
            if private:
                bad.append(f"{module_name(path)} imports {module} {names}")
    return bad


def test_every_package_has_a_layer():
    graph = edges()
    unknown = sorted({package_of(m) for m in graph} - set(RANK))
    assert not unknown, f"packages {unknown} have no layer; add them to LAYERS (and to the design's table)"


def test_imports_point_down():
    upward = []
    for source, targets in edges().items():
        for target in targets:
            a, b = package_of(source), package_of(target)
            allowed = a == b or RANK[b] < RANK[a] or any(
                source == s and (target == t or target.startswith(t + ".")) for s, t in UPWARD)
            if not allowed:
                upward.append(f"{source} -> {target} ({a}: layer {RANK[a]}, {b}: layer {RANK[b]})")
    assert not upward, "imports that point up or sideways:\n" + "\n".join(sorted(upward))


def test_no_cycle():
    graph = {m: {t for t in ts if not any(m == s and t.startswith(u) for s, u in UPWARD)}
             for m, ts in edges().items()}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            pytest.fail("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_no_private_import_across_packages():
    bad = private_imports()
    assert not bad, "imports of another package's private modules (export the name instead):\n" + "\n".join(bad)


def test_upward_reference_is_local_to_its_method():
    """The permitted upward import happens inside a function, never at module level."""
    for source, target in UPWARD:
        path = ROOT / (source.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text())
        top = [n.module for n in tree.body if isinstance(n, ast.ImportFrom)]
        top += [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in top if m and m.startswith(target)], f"{source} imports {target} at module level"


def test_kernels_import_no_python_layer():
    """``_ext/`` sources (``.pyx``, ``.pxd``, ``.pyi``) import and cimport only ``zephon._ext`` of zephon."""
    bad = []
    for path in sorted(KERNELS.glob("*.p[yx]*")):
        for line in path.read_text().splitlines():
            match = re.match(r"\s*(?:from\s+(\S+)\s+c?import|c?import\s+(\S+))", line)
            module = match and (match.group(1) or match.group(2))
            if module and module.split(".")[0] == "zephon" and not module.startswith("zephon._ext"):
                bad.append(f"{path.name}: {line.strip()}")
    assert not bad, "kernel imports above the kernels:\n" + "\n".join(bad)

"""Optional extras: importing their package without the dependency names the extra to install."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("package, dependency, extra", [
    ("zephon.torch", "torch", "zephon-mixtures[torch]"),
    ("zephon.testing", "hypothesis", "zephon-mixtures[testing]"),
])
def test_missing_extra_is_named(package: str, dependency: str, extra: str):
    code = (f"import sys; sys.modules[{dependency!r}] = None  # as if it were not installed\n"
            f"try:\n    import {package}\nexcept ImportError as error:\n    print(type(error).__name__, error)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("ImportError ") and extra in out, out

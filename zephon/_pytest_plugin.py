"""The zephon pytest plugin (``pytest11`` entry point): golden stream digests.

``zephon_golden(name, stream)`` compares a stream's digest with the file
``<golden dir>/<name>.digest`` (the golden dir is ``golden/`` next to the test module,
or the ``zephon_golden_dir`` ini option, relative to the root directory). A missing or
different file fails the test; ``pytest --zephon-update-golden`` writes the files instead.
It lives outside ``zephon.testing`` and imports the kit only when the fixture is used,
so a pytest session without hypothesis installed still starts; the fixture itself needs
the ``zephon-mixtures[testing]`` extra.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import pytest

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
DIGEST = re.compile(r"[0-9a-f]{64}")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("zephon")
    group.addoption("--zephon-update-golden", action="store_true", default=False,
                    help="write the zephon_golden digest files instead of comparing with them")
    parser.addini("zephon_golden_dir", "folder of zephon_golden digest files (default: golden/ next to each test)",
                  default="")


def _folder(request: pytest.FixtureRequest) -> Path:
    configured: str = request.config.getini("zephon_golden_dir")
    if configured:
        return Path(request.config.rootpath) / configured
    return Path(request.path).parent / "golden"


def _digest_of(stream: Any, max_chunks: int) -> str:
    if isinstance(stream, str):
        if not DIGEST.fullmatch(stream):
            raise ValueError(f"zephon_golden: {stream!r} is not a stream digest (64 hex digits from stream_digest)")
        return stream
    from zephon.testing import stream_digest

    return stream_digest(stream, max_chunks)


@pytest.fixture
def zephon_golden(request: pytest.FixtureRequest) -> Callable[..., str]:
    """``check(name, stream, max_chunks=1000) -> digest``: the stream's digest must equal the golden file's.

    ``stream`` is a source, a pipeline or a digest from ``zephon.testing.stream_digest``.
    With ``--zephon-update-golden`` the file is (re)written and the check passes.
    """
    update = request.config.getoption("zephon_update_golden")

    def check(name: str, stream: Any, max_chunks: int = 1000) -> str:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"zephon_golden: name={name!r} must be a file-name-safe str such as 'web_mix'")
        digest = _digest_of(stream, max_chunks)
        path = _folder(request) / f"{name}.digest"
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(digest + "\n")
            return digest
        if not path.exists():
            pytest.fail(f"no golden digest for {name!r} at {path}; run pytest --zephon-update-golden to write it",
                        pytrace=False)
        pinned = path.read_text().strip()
        if pinned != digest:
            pytest.fail(f"the stream {name!r} changed: {path} pins {pinned}, the stream gives {digest}; if the change "
                        "is intended (new data, settings or zephon checkpoint version), run pytest "
                        "--zephon-update-golden", pytrace=False)
        return digest

    return check

"""The same stream in a fresh interpreter: another hash seed, another directory, one thread.

The parent pickles the factory with cloudpickle (an importable function by reference, a
lambda or closure by value) and sends it with its ``sys.path`` to a new ``python``; the
child builds the source, describes its stream as JSON and prints it; the parent compares
that with its own description chunk by chunk and says where they part.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import pickle
import subprocess
import sys
import tempfile
from typing import Any

from zephon.testing._assertions import SourceFactory
from zephon.testing._streams import as_source, read_order, stream_digest, stream_of
from zephon.work import WorkSource

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")
CHILD = "from zephon.testing._process import child_main; child_main()"


def describe(thing: Any, max_chunks: int, max_items: int) -> dict[str, Any]:
    """A JSON description of a stream: its digest, every chunk in read order, and (for a
    pipeline) a digest of each of the first ``max_items`` items' ``repr``."""
    chunks = []
    for chunk in stream_of(thing, max_chunks):
        pointers, names = read_order(chunk)
        chunks.append({"seed": chunk.seed, "pointers": [list(p) for p in pointers], "components": names})
    items = [] if isinstance(thing, WorkSource) else [
        hashlib.sha256(repr(item).encode()).hexdigest()[:16] for item in itertools.islice(thing, max_items)]
    return {"digest": stream_digest(thing, max_chunks), "chunks": chunks, "items": items}


def _one_thread() -> None:
    try:
        import pyarrow
    except ImportError:
        return
    pyarrow.set_cpu_count(1)
    pyarrow.set_io_thread_count(1)


def child_main() -> None:
    """The child's side: read ``(sys.path, factory, max_chunks, max_items)`` from stdin, print the description."""
    paths, payload, max_chunks, max_items = pickle.loads(sys.stdin.buffer.read())
    sys.path[:0] = [p for p in paths if p not in sys.path]
    _one_thread()
    factory = pickle.loads(payload)
    sys.stdout.write(json.dumps(describe(factory(), max_chunks, max_items)))


def _other_hash_seed() -> str:
    current = os.environ.get("PYTHONHASHSEED", "")
    return str((int(current) + 1) % 2**32) if current.isdigit() else "20240229"


def _first_difference(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    for k, (a, b) in enumerate(zip(mine["chunks"], theirs["chunks"])):
        if a == b:
            continue
        pairs = list(zip(zip(a["pointers"], a["components"]), zip(b["pointers"], b["components"])))
        at = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
        if at is not None:
            (p, c), (q, d) = pairs[at]
            return f"chunk {k}, position {at}: this process reads {tuple(p)} of {c!r}, the fresh one {tuple(q)} of {d!r}"
        return (f"chunk {k}: {len(a['pointers'])} pointers (seed {a['seed']}) here, {len(b['pointers'])} "
                f"(seed {b['seed']}) in the fresh process")
    if len(mine["chunks"]) != len(theirs["chunks"]):
        return f"{len(mine['chunks'])} chunks here, {len(theirs['chunks'])} in the fresh process"
    at = next((i for i, (x, y) in enumerate(zip(mine["items"], theirs["items"])) if x != y), None)
    if at is not None:
        return f"the pointers agree, but item {at} differs after the map steps (repr digests {mine['items'][at]} " \
               f"and {theirs['items'][at]})"
    return "the digests differ"


def assert_same_stream_in_fresh_process(factory: SourceFactory, *, max_chunks: int = 200, max_items: int = 200,
                                        timeout: float = 300.0) -> None:
    """``factory()`` gives the identical stream in a new interpreter.

    The child runs with another ``PYTHONHASHSEED``, in an empty temporary working directory,
    with one thread (the usual thread-count variables set to 1, pyarrow's pools at 1), and
    this process's ``sys.path``. It compares the first ``max_chunks`` chunks (pointers,
    components and seeds, in read order) and, for a pipeline, the ``repr`` of the first
    ``max_items`` items after the map steps.

    Parameters
    ----------
    factory : callable
        Picklable with cloudpickle: a module-level function or a ``functools.partial`` of
        one (sent by reference: the child imports its module from this ``sys.path``), or a
        lambda or closure (sent by value, with what it captures).
    max_chunks : int, default 200
    max_items : int, default 200
    timeout : float, default 300.0
        Seconds the child may take.
    """
    import cloudpickle

    try:
        payload = cloudpickle.dumps(factory)
    except Exception as error:
        raise TypeError(f"the factory must be picklable (a module-level function, a functools.partial of one, or "
                        f"a lambda capturing only picklable values), got {factory!r}: {error}") from None
    mine = describe(factory(), max_chunks, max_items)
    as_source(factory())  # a factory that returns something else fails here, not in the child
    paths = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    env = dict(os.environ, PYTHONHASHSEED=_other_hash_seed(), **dict.fromkeys(THREAD_VARIABLES, "1"))
    env["TOKENIZERS_PARALLELISM"] = "false"
    with tempfile.TemporaryDirectory(prefix="zephon-fresh-") as cwd:
        done = subprocess.run([sys.executable, "-c", CHILD], input=pickle.dumps((paths, payload, max_chunks, max_items)),
                              capture_output=True, cwd=cwd, env=env, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"the fresh process failed (exit {done.returncode}):\n{done.stderr.decode()[-3000:]}")
    theirs = json.loads(done.stdout)
    if theirs != mine:
        raise AssertionError(f"the stream differs in a fresh process (PYTHONHASHSEED={env['PYTHONHASHSEED']}, "
                             f"cwd {cwd}, one thread): {_first_difference(mine, theirs)}")

"""Checkpoint directories: each rank saves its own lanes (no collective); a step counts once
every lane is there, and a marker says so.

Layout (``<run>``: the first 16 hex digits of the run's fingerprint)::

    <directory>/step-000000001200.<run>/rank-00000-of-00002.<attempt>.ckpt   # rank 0's lanes
                                       /rank-00001-of-00002.<attempt>.ckpt
                                       /complete.ckpt                         # the marker: every lane

Every file is a checkpoint file (header, sha256, JSON; see ``zephon.runtime._checkpoint``)
written whole or not at all. A rank writes its file, then lists the step's folder: the rank
that finds every rank's file there merges them, checks that they cover every lane and writes
the marker (ranks that finish at the same instant write the same marker). Whoever finishes
last lists after every other rank's write, so a step whose files are all written is marked
unless the rank that marks it dies first (:func:`finalize_checkpoint_dir` marks it then).

``<attempt>`` (16 hex digits, the same on every rank of a job) digests what the job resumed
from (``zephon.runtime._book.attempt_of``), its batch size and lane mapping, so the files a
dead attempt left in a step are not merged with those of a job that resumed from another
global checkpoint or reads other batches. One directory holds one timeline of one run: a save
refuses a directory with another run's steps, or with complete steps after the one it saves.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from zephon.core.checkpoint import digest
from zephon.io import Store
from zephon.limits import MAX_REPLICAS
from zephon.runtime._checkpoint import check_size, decode_checkpoint, encode_checkpoint
from zephon.runtime._state import ATTEMPT, LoaderState, LoaderStateDict, merge_states, parse_state

log = logging.getLogger("zephon")
MARKER = "complete.ckpt"
STEP_FOLDER = re.compile(r"step-(\d{12,})\.([0-9a-f]{16})")
_RANK = re.compile(r"rank-(\d{5,})-of-(\d{5,})\.([0-9a-f]{16})\.ckpt")
DEFAULT_KEEP = 3


@dataclass(frozen=True, slots=True)
class _Step:
    number: int
    run: str  # 16 hex digits
    folder: str


@dataclass(frozen=True, slots=True, order=True)
class _Group:
    """The files of one attempt at a step: ``world`` ranks, ``attempt`` (16 hex digits)."""
    world: int
    attempt: str

    def file(self, rank: int) -> str:
        return f"rank-{rank:05d}-of-{self.world:05d}.{self.attempt}.ckpt"


def _folder(step: int, run: str) -> str:
    return f"step-{step:012d}.{run[:16]}"


def _steps(store: Store) -> list[_Step]:
    """The step folders of the directory, by step number (other entries are left alone)."""
    folders, _ = store.listing()
    found = [(m, name) for name in folders if (m := STEP_FOLDER.fullmatch(name))]
    return sorted((_Step(int(m.group(1)), m.group(2), name) for m, name in found), key=lambda s: (s.number, s.run))


def _rank_files(files: list[str]) -> dict[_Group, set[int]]:
    """The ranks whose files are there, by attempt and topology (names of no possible rank are ignored)."""
    out: dict[_Group, set[int]] = {}
    for name in files:
        match = _RANK.fullmatch(name)
        if match and int(match.group(1)) < int(match.group(2)) <= MAX_REPLICAS:
            out.setdefault(_Group(int(match.group(2)), match.group(3)), set()).add(int(match.group(1)))
    return out


def _read(store: Store, name: str) -> LoaderStateDict:
    return decode_checkpoint(store.read(name, check_size), store.uri_of(name))  # type: ignore[return-value]


def _merged(store: Store, folder: str, group: _Group, ranks: list[int]) -> LoaderStateDict:
    return merge_states(_read(store, f"{folder}/{group.file(r)}") for r in ranks)


def _state_of(loader: Any) -> Any:
    state_dict = getattr(loader, "state_dict", None)
    return state_dict() if callable(state_dict) else loader


def _group_of(parsed: LoaderState) -> tuple[int, _Group]:
    """The rank a per-rank state was taken on, and the group its file belongs to."""
    ranks, world = parsed.topology.get("ranks"), parsed.topology.get("world_size")
    if not (isinstance(ranks, list) and len(ranks) == 1 and type(ranks[0]) is int and type(world) is int
            and 0 <= ranks[0] < world <= MAX_REPLICAS):
        raise ValueError(f"save_checkpoint_dir saves one rank's state (loader.state_dict() on that rank); this one "
                         f"was taken on ranks {ranks} of world_size {world}: save a merged state with save_checkpoint")
    return ranks[0], _Group(world, _attempt(parsed.topology))


def _attempt(topology: dict[str, Any]) -> str:
    """What a rank's file names of the job that saved it (see the module docstring)."""
    return digest({"reading": [topology.get(ATTEMPT), topology.get("batch_size"), topology.get("mapping")]})[:16]


def _check_arguments(step: Any, keep: Any) -> None:
    if type(step) is not int or step < 0:
        raise ValueError(f"save_checkpoint_dir: step={step!r} must be an int >= 0 (the training step the state "
                         "is after)")
    if keep is not None and (type(keep) is not int or keep < 1):
        raise ValueError(f"save_checkpoint_dir: keep={keep!r} must be an int >= 1 (complete steps kept) or None "
                         "(keep every step)")


def _refuse_newer(store: Store, steps: list[_Step], step: int) -> None:
    """Complete steps after ``step`` are another timeline (ranks save in increasing order)."""
    newer = [s.number for s in steps if s.number > step and _is_complete(store, s)]
    if newer:
        raise ValueError(f"save_checkpoint_dir: {store.uri} holds complete steps {newer[:8]} after step {step}; a "
                         "resume would continue from them, not from this run. A run that did not resume from its "
                         "newest step (it started over, or was rolled back) saves into a directory of its own (or "
                         "move those step folders away first)")


def _refuse_other_runs(store: Store, steps: list[_Step], run: str) -> None:
    others = sorted({s.run for s in steps if s.run != run[:16]})
    if others:
        at = [s.number for s in steps if s.run != run[:16]]
        raise ValueError(f"checkpoint directory {store.uri} holds checkpoints of another run ({', '.join(others)}, "
                         f"steps {at[:8]}{'...' if len(at) > 8 else ''}); this loader's run is {run[:16]}. Two jobs "
                         "must not share a checkpoint directory (a run migrated to a new mixture is another run): "
                         "give this one its own directory")


def save_checkpoint_dir(directory: str | os.PathLike[str], loader: Any, *, step: int, keep: int | None = DEFAULT_KEEP,
                        filesystem: Any = None) -> bool:
    """Save this rank's lanes as step ``step`` of the checkpoint directory; no collective.

    Call it on every rank at the same steps, one save after another, in increasing order. ``loader`` is a zephon
    ``DataLoader`` (its ``state_dict()`` is saved) or a state one returned (e.g.
    ``state_dict(lag=1)``). ``directory`` is a local path or an object-store URI
    (``s3://bucket/run1``; or a path with ``filesystem``, a ``pyarrow.fs.FileSystem`` or fsspec
    filesystem). The rank that completes the step (every rank's file is there) marks it
    complete and then removes old steps: all but the newest ``keep`` complete steps (default
    3; ``None`` keeps all) and the incomplete steps before this one. Returns whether the step
    is complete.

    In a job with tensor, pipeline or context parallelism (a loader built with a
    ``device_mesh`` or ``dp_group``), files are per data-parallel rank. Given the loader, a
    rank that is not the first of its replica writes nothing (the first writes the same
    lanes) and returns whether the step is complete yet; given a state, every rank writes
    it (the same bytes as its replica's other ranks).

    Refuses (``ValueError``, before writing) a directory that holds another run's steps or
    complete steps after ``step`` (a run that started over or was rolled back needs its own
    directory), and a step already complete with other positions for this rank's lanes.
    """
    state = _state_of(loader)
    parsed = parse_state(state)
    rank, group = _group_of(parsed)
    _check_arguments(step, keep)
    if parsed.run is None:
        raise ValueError("save_checkpoint_dir: the state names no run (a version 1 state); save a state of this "
                         "zephon's loader")
    store = Store(directory, filesystem)
    steps = _steps(store)
    _refuse_other_runs(store, steps, parsed.run)
    _refuse_newer(store, steps, step)
    folder = _folder(step, parsed.run)
    if not getattr(getattr(loader, "topology", None), "writes", True):
        return MARKER in store.listing(folder)[1]
    if MARKER in store.listing(folder)[1]:
        _check_same(store, folder, parsed, rank)
        return True
    name = f"{folder}/{group.file(rank)}"
    store.write(name, encode_checkpoint(state, store.uri_of(name)))
    if not _complete(store, folder, group, parsed.canonical_replicas):
        return False
    if keep is not None:
        _clean(store, keep, step)
    return True


def _check_same(store: Store, folder: str, parsed: LoaderState, rank: int) -> None:
    """A step saved again after it was complete: this rank's positions must be those it holds."""
    marked = parse_state(_read(store, f"{folder}/{MARKER}"))
    differ = [lane for lane, entry in parsed.entries.items() if marked.entries.get(lane) != entry]
    if differ:
        raise ValueError(f"save_checkpoint_dir: {folder} of {store.uri} is already complete, and rank {rank}'s "
                         f"lanes {differ[:8]} stand elsewhere now; each save needs a new step number (the training "
                         "step the state is after)")


def _complete(store: Store, folder: str, group: _Group, replicas: int) -> bool:
    """Mark ``folder`` complete if every rank of ``group`` has its file there; whether it is complete."""
    files = store.listing(folder)[1]
    if MARKER in files:
        return True
    by_group = _rank_files(files)
    if by_group.get(group, set()) != set(range(group.world)):
        present = {rank for g, ranks in by_group.items() if g.world == group.world for rank in ranks}
        if present == set(range(group.world)):
            log.warning("zephon: %s of %s has a file of every rank, but of %d attempts (a dead attempt's files, or "
                        "ranks whose loaders differ in batch_size or mapping): it completes once every rank of one "
                        "attempt saved", folder, store.uri, len([g for g in by_group if g.world == group.world]))
        return False
    try:
        merged = _merged(store, folder, group, list(range(group.world)))
    except ValueError as error:
        log.warning("zephon: %s of %s has every rank's file but they do not merge (%s); it stays incomplete",
                    folder, store.uri, error)
        return False
    missing = sorted(set(range(replicas)) - set(parse_state(merged).entries))
    if missing:
        log.warning("zephon: %s of %s has every rank's file but lacks lanes %s; it stays incomplete", folder,
                    store.uri, _ranges(missing))
        return False
    marker = f"{folder}/{MARKER}"
    store.write(marker, encode_checkpoint(merged, store.uri_of(marker)))
    if _read(store, marker) != merged:
        raise OSError(f"checkpoint directory {store.uri}: {marker} reads back other than written; the storage "
                      "does not keep what it is given")
    return True


def _is_complete(store: Store, step: _Step) -> bool:
    return MARKER in store.listing(step.folder)[1]


def _clean(store: Store, keep: int, done: int) -> None:
    """After step ``done`` was completed: remove all but the newest ``keep`` complete steps up to
    it (``done`` among them) and the incomplete steps before it."""
    steps = _steps(store)
    kept = {s.folder for s in [s for s in steps if s.number <= done and _is_complete(store, s)][-keep:]}
    removed = [s for s in steps if s.number < done and s.folder not in kept]
    for s in removed:
        store.remove(s.folder)
    if removed:
        log.info("zephon: removed checkpoint steps %s of %s (keep=%d complete steps)", [s.number for s in removed],
                 store.uri, keep)


def complete_steps(directory: str | os.PathLike[str], *, filesystem: Any = None) -> list[int]:
    """The complete steps of a checkpoint directory, ascending ([] if there is none or no directory).

    Raises ``ValueError`` when the directory holds the steps of two runs."""
    store = Store(directory, filesystem)
    return [s.number for s in _one_run(store, _steps(store)) if _is_complete(store, s)]


def _one_run(store: Store, steps: list[_Step]) -> list[_Step]:
    runs = sorted({s.run for s in steps})
    if len(runs) > 1:
        by_run = {run: [s.number for s in steps if s.run == run] for run in runs}
        raise ValueError(f"checkpoint directory {store.uri} holds checkpoints of {len(runs)} runs {by_run}: two "
                         "jobs wrote into it; they are never merged. Move one run's step folders (named "
                         "step-<number>.<run>) to a directory of its own")
    return steps


def load_checkpoint_dir(directory: str | os.PathLike[str], step: int | None = None, *, expect: Any = None,
                        filesystem: Any = None) -> LoaderStateDict:
    """The global state of the newest complete step (or of ``step``) of a checkpoint directory.

    Restores on any topology: pass it to ``loader.load_state_dict`` on every rank. Steps newer
    than the one loaded that are incomplete (a rank died during its save) are skipped, with a
    warning naming their missing ranks. Raises ``FileNotFoundError`` when there is no complete
    step, and ``ValueError`` when ``step`` is incomplete (naming its missing ranks and lanes),
    its marker is damaged or the directory holds two runs. ``expect`` (a zephon loader) also
    checks that the state restores there (its ``check_state_dict``).
    """
    store = Store(directory, filesystem)
    steps = _one_run(store, _steps(store))
    chosen = _chosen(store, steps, step)
    state = _read(store, f"{chosen.folder}/{MARKER}")
    wrong = _marker_problem(parse_state(state), chosen)
    if wrong:
        raise ValueError(f"{store.uri_of(chosen.folder + '/' + MARKER)} is not the marker of its step: it {wrong}; it "
                         "was changed since zephon wrote it: load an earlier step")
    if expect is not None:
        expect.check_state_dict(state)
    return state


def _marker_problem(marker: LoaderState, step: _Step) -> str | None:
    """Why a marker is not that of ``step`` (another run's, or lacking lanes); None when it is."""
    run = (marker.run or "")[:16]
    if run != step.run:
        return f"is of run {run}, the folder's is {step.run}"
    lanes = sorted(set(range(marker.canonical_replicas)) - set(marker.entries))
    return f"lacks lanes {_ranges(lanes)}" if lanes else None


def _chosen(store: Store, steps: list[_Step], step: int | None) -> _Step:
    if step is not None:
        match = [s for s in steps if s.number == step]
        if not match:
            raise FileNotFoundError(f"checkpoint directory {store.uri} has no step {step} (its steps: "
                                    f"{[s.number for s in steps][-16:]})")
        if not _is_complete(store, match[0]):
            raise ValueError(f"step {step} of {store.uri} is incomplete: {_incomplete(store, match[0])}; it is "
                             "never loaded: load an earlier step (or the newest complete one, step=None)")
        return match[0]
    skipped: list[tuple[int, str]] = []
    for s in reversed(steps):
        if _is_complete(store, s):
            for number, why in skipped:
                log.warning("zephon: step %d of %s is incomplete (%s): skipped", number, store.uri, why)
            return s
        skipped.append((s.number, _incomplete(store, s)))
    newest = f"; the newest, step {skipped[0][0]}: {skipped[0][1]}" if skipped else ""
    raise FileNotFoundError(f"checkpoint directory {store.uri} holds no complete step (steps: "
                            f"{[s.number for s in steps][-16:]}){newest}: nothing to resume from")


def _incomplete(store: Store, step: _Step) -> str:
    """What an unmarked step lacks: the missing ranks and lanes of the attempt that got furthest."""
    by_group = _rank_files(store.listing(step.folder)[1])
    if not by_group:
        return "no rank's file was written"
    group = max(by_group, key=lambda g: (len(by_group[g]) / g.world, g))
    present = sorted(by_group[group])
    missing_ranks = sorted(set(range(group.world)) - set(present))
    others = f"; files of {len(by_group) - 1} other attempts are there too" if len(by_group) > 1 else ""
    try:
        merged = parse_state(_merged(store, step.folder, group, present))
    except ValueError as error:
        return f"ranks {_ranges(present)} of {group.world} saved, but their files do not merge ({error}){others}"
    lanes = _ranges(sorted(set(range(merged.canonical_replicas)) - set(merged.entries)))
    if missing_ranks:
        return (f"ranks {_ranges(missing_ranks)} of {group.world} did not save; lanes {lanes} of "
                f"{merged.canonical_replicas} are missing{others}")
    if lanes:
        return f"every rank's file is there, but they lack lanes {lanes}: it never completes{others}"
    return (f"every rank's file is there but the marker is not (the rank that marks it stopped first): "
            f"zephon.torch.finalize_checkpoint_dir(directory, step={step.number}) checks and marks it{others}")


def _ranges(lanes: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5`` (the first 8 runs)."""
    runs: list[list[int]] = []
    for lane in lanes:
        if runs and runs[-1][1] == lane - 1:
            runs[-1][1] = lane
        else:
            runs.append([lane, lane])
    text = ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs[:8])
    return text + (", ..." if len(runs) > 8 else "")


def finalize_checkpoint_dir(directory: str | os.PathLike[str], step: int, *, filesystem: Any = None) -> bool:
    """Mark ``step`` complete if every rank's file is there and they cover every lane (for a
    step whose marking rank died after its save); returns whether the step is complete.

    Raises ``ValueError`` when two attempts each saved every rank's file for the step (which
    one the run continued is not known)."""
    store = Store(directory, filesystem)
    match = [s for s in _one_run(store, _steps(store)) if s.number == step]
    if not match:
        raise FileNotFoundError(f"checkpoint directory {store.uri} has no step {step}")
    folder = match[0].folder
    if _is_complete(store, match[0]):
        return True
    full = sorted(g for g, ranks in _rank_files(store.listing(folder)[1]).items() if ranks == set(range(g.world)))
    if len(full) > 1:
        raise ValueError(f"step {step} of {store.uri}: {len(full)} attempts each saved every rank's file "
                         f"({', '.join(g.file(0) for g in full)}, ...); which one the run continued is not known: "
                         "remove the files of the others from its folder")
    if not full:
        return False
    replicas = parse_state(_read(store, f"{folder}/{full[0].file(0)}")).canonical_replicas
    return _complete(store, folder, full[0], replicas)

"""``zephon inspect CHECKPOINT``: a readable summary of a checkpoint.

Reads a loader checkpoint (written by ``zephon.torch.save_checkpoint``; its header, length
and checksum are checked), a JSON file holding a source's ``state_dict()`` or a loader's
state, or the loader state inside a checkpoint directory, a DCP checkpoint or a Lightning or
``transformers`` checkpoint (:mod:`zephon.cli._locate` lists the kinds). Prints the version, the lanes, each dataset's pass and position, the progress and the
configuration fingerprint; for a phased source, also its phases and the one in progress.
With ``--config CONFIG`` it also says whether the checkpoint would load into the source that
mixture config describes, and what differs if not (mixture configs describe static sources,
so ``--config`` refuses a phased source's state).
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Mapping

from zephon.cli._locate import states_in
from zephon.core import checkpoint as source_checkpoint
from zephon.limits import brief
from zephon.runtime import parse_state
from zephon.work import StaticMixtureWorkSource, received
from zephon.work import phased_mixture as phased

NAME = "inspect"
HELP = ("summarise a checkpoint (a file, a checkpoint directory, DCP, Lightning or transformers checkpoints); "
        "--config checks it would load")
LANES_SHOWN = 16  # lanes listed one by one; more are summarised


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The inspect command's options."""
    parser.add_argument("checkpoint", help="a checkpoint file (save_checkpoint, a JSON state_dict(), a Lightning "
                        ".ckpt) or folder (save_checkpoint_dir, DCP, a transformers checkpoint-N or its output_dir)")
    parser.add_argument("--config", help="a mixture config (.toml / .json): would the checkpoint load into it?")


def run(args: argparse.Namespace) -> int:
    """Print the summary of each state the path holds (and the check against ``--config``);
    returns 1 if one would not load."""
    found = states_in(args.checkpoint)
    if args.config is not None:
        for what, state in found:
            if _holds_phases(state, _is_loader(state)):
                raise ValueError(f"{what} holds a phased source's state and a mixture config describes a static "
                                 "source, so --config cannot check it; run without --config for the summary, and "
                                 "load it into its PhasedMixtureWorkSource to check it")
    summaries = [_summary(what, state) for what, state in found]
    status = 0
    for k, ((what, state), text) in enumerate(zip(found, summaries)):
        print(("\n" if k else "") + f"read: {what}\n{text}")
        status = max(status, _check(state, args.config))
    return status


def _summary(what: str, state: dict[str, Any]) -> str:
    """The state in words; a source state whose parts have the wrong form is refused (a loader
    state is validated whole first)."""
    try:
        return loader_summary(state) if _is_loader(state) else source_summary(state)
    except (AttributeError, KeyError, TypeError, IndexError) as error:
        raise ValueError(f"{what} is not a state zephon wrote: its parts have the wrong form ({brief(error)})") from None


def _is_loader(state: dict[str, Any]) -> bool:
    return state.get(source_checkpoint.KEY_KIND) not in (source_checkpoint.KIND, phased.KIND)


def _check(state: dict[str, Any], config: str | None) -> int:
    """Say whether ``state`` would load into the source ``config`` describes (1 if not)."""
    if config is None:
        return 0
    template = StaticMixtureWorkSource.from_config(config, measure=_never_measured)
    problems = check_against(state, template, _is_loader(state))
    if not problems:
        print(f"\nloads into {config}: yes")
        return 0
    print(f"\nloads into {config}: no")
    for problem in problems:
        print(f"  - {problem}")
    return 1


def _never_measured(record: Any) -> int:
    """A token-aware config's ``measure``: a checkpoint brings its ratios, so nothing is measured."""
    raise RuntimeError("zephon inspect never measures tokens")


def _cursor_rows(state: dict[str, Any]) -> list[str]:
    """One line per dataset: pass, position, progress through the pass."""
    cursors = state.get(source_checkpoint.KEY_STATE, {}).get(source_checkpoint.KEY_CURSORS, {})
    totals = {d.get("name"): d.get("total") for d in state.get(source_checkpoint.KEY_FINGERPRINT, {}).get("datasets", [])}
    rows = []
    for name in [*[n for n in totals if n in cursors], *[n for n in cursors if n not in totals]]:  # mixture order
        cursor, total = cursors[name], totals.get(name)
        position = cursor.get(source_checkpoint.KEY_POSITION)
        progress = f"{position / total:6.1%} of the pass" if total and isinstance(position, int) else ""
        tails = cursor.get(source_checkpoint.KEY_TAILS)
        if tails:
            progress += f"; {tails:,} samples of pass tails skipped so far"
        rows.append(f"    {name:<16} pass {cursor.get(source_checkpoint.KEY_EPOCH)}, "
                    f"position {position:,} of {total if total is None else f'{total:,}'}  {progress}")
    return rows


def _fingerprint_lines(fingerprint: dict[str, Any]) -> list[str]:
    skip = {"datasets"}
    return [f"    {key}: {value}" for key, value in sorted(fingerprint.items()) if key not in skip]


def _extra_keys(state: dict[str, Any], known: tuple[str, ...]) -> list[str]:
    """Anything else the checkpoint carries (migrations, digests, ...), shown as is."""
    return [f"  {key}: {json.dumps(state[key])[:200]}" for key in sorted(state) if key not in known]


def _holds_phases(state: dict[str, Any], loader: bool) -> bool:
    """Whether the source state, or any lane of the loader state, is a phased source's."""
    states = [entry[0] for entry in parse_state(state).entries.values()] if loader else [state]
    return any(s.get(source_checkpoint.KEY_KIND) == phased.KIND for s in states)


def _phase_lines(state: dict[str, Any]) -> list[str]:
    """A phased source's phases, one line each, the one in progress marked."""
    current = state.get(phased.KEY_PHASE)
    lines = []
    for i, phase in enumerate(state.get(phased.KEY_PHASES, [])):
        until = phase.get("until")
        bound = "open-ended" if until is None else f"until {until[0]} {until[1]:,}"
        mark = "  <- in progress" if i == current else ""
        lines.append(f"    phase {i}: weights {phase.get('weights')}, {bound}{mark}")
    return lines


def _static_part(state: dict[str, Any]) -> dict[str, Any]:
    """The static state a source state holds: itself, or a phased source's current phase."""
    return state.get(phased.KEY_INNER, {}) if state.get(source_checkpoint.KEY_KIND) == phased.KIND else state


def _digest_line(state: dict[str, Any]) -> list[str]:
    """Whether the state's digest matches its content (no line without a digest)."""
    c = source_checkpoint
    if c.KEY_DIGEST not in state:
        return []
    intact = "matches the content" if state[c.KEY_DIGEST] == c.digest(state) else "does NOT match: edited or damaged"
    return [f"  digest: {state[c.KEY_DIGEST]} ({intact})"]


def source_summary(state: dict[str, Any]) -> str:
    """A source ``state_dict()`` in words (a phased source's phases, then its current phase)."""
    if state.get(source_checkpoint.KEY_KIND) == phased.KIND:
        header = [f"phased source state: version {state.get(source_checkpoint.KEY_VERSION)} (this zephon reads "
                  f"version {phased.VERSION}); phase {state.get(phased.KEY_PHASE)} in progress", "  phases:",
                  *_phase_lines(state)]
        known = (source_checkpoint.KEY_KIND, source_checkpoint.KEY_VERSION, source_checkpoint.KEY_LANE,
                 source_checkpoint.KEY_REPLICAS, phased.KEY_PHASES, phased.KEY_PHASE, phased.KEY_INNER,
                 source_checkpoint.KEY_DIGEST)
        return "\n".join(header + _digest_line(state) + _extra_keys(state, known)
                         + ["current phase:", source_summary(_static_part(state))])
    c = source_checkpoint
    body = state.get(c.KEY_STATE, {})
    lines = [
        f"source state: {state.get(c.KEY_KIND)} version {state.get(c.KEY_VERSION)} "
        f"(this zephon reads version {c.VERSION})",
        f"  lane {state.get(c.KEY_LANE)} of {state.get(c.KEY_REPLICAS)}; next global chunk "
        f"{body.get(c.KEY_CHUNK)}",
        "  datasets:", *_cursor_rows(state),
        "  fingerprint:", *_fingerprint_lines(state.get(c.KEY_FINGERPRINT, {})),
    ]
    ratios = state.get(c.KEY_RATIOS)
    if ratios:
        lines.append("  tokens per byte: " + ", ".join(
            f"{name} {entry.get(c.KEY_RATIO):.4g} ({entry.get(c.KEY_ORIGIN)})" for name, entry in ratios.items()))
    lines += _digest_line(state)
    known = (c.KEY_KIND, c.KEY_VERSION, c.KEY_LANE, c.KEY_REPLICAS, c.KEY_FINGERPRINT, c.KEY_STATE, c.KEY_RATIOS,
             c.KEY_DIGEST)
    return "\n".join(lines + _extra_keys(state, known))


def loader_summary(state: dict[str, Any]) -> str:
    """A loader state (or checkpoint) in words: lanes, samples consumed, each dataset's passes."""
    parsed = parse_state(state)
    lanes = sorted(parsed.entries)
    lines = [
        f"loader state: {state.get('kind')} version {state.get('version')}",
        f"  canonical_replicas {parsed.canonical_replicas}; lanes held {len(lanes)}"
        + ("" if len(lanes) == parsed.canonical_replicas else f" ({lanes[:LANES_SHOWN]}...)"),
        f"  taken on: {json.dumps(parsed.topology, sort_keys=True)}",
        "  datasets: " + ", ".join(f"{d['name']} (fingerprint {d['fingerprint']})" for d in parsed.datasets),
    ]
    for lane in lanes[:LANES_SHOWN]:
        source_state, consumed, _ = parsed.entries[lane]
        static = _static_part(source_state)
        chunk = static.get(source_checkpoint.KEY_STATE, {}).get(source_checkpoint.KEY_CHUNK)
        phase = f" (phase {source_state.get(phased.KEY_PHASE)})" if static is not source_state else ""
        lines.append(f"  lane {lane}: chunk in flight is its first from global chunk {chunk}{phase}, {consumed:,} of its "
                     "samples taken; before it:")
        lines.extend("  " + row for row in _cursor_rows(static))
    if len(lanes) > LANES_SHOWN:
        lines.append(f"  ... and {len(lanes) - LANES_SHOWN} more lanes")
    lines += _received_rows(parsed.entries, parsed.canonical_replicas)
    if lanes:
        first = parsed.entries[lanes[0]][0]
        if first.get(source_checkpoint.KEY_KIND) == phased.KIND:
            lines += ["  phases:", *_phase_lines(first)]
        fingerprint = _static_part(first).get(source_checkpoint.KEY_FINGERPRINT, {})
        lines += ["  fingerprint (current phase):" if first is not _static_part(first) else "  fingerprint:",
                  *_fingerprint_lines(fingerprint)]
    return "\n".join(lines + _extra_keys(state, ("kind", "version", "canonical_replicas", "datasets", "source",
                                                 "lanes", "topology")))


def _received_rows(entries: Mapping[int, Any], replicas: int) -> list[str]:
    """What the readers of these lanes took from the stream, per dataset (``zephon.work.received``):
    the samples the training loop received and those a filter step or ``drop_last`` dropped (a
    checkpoint does not tell them apart)."""
    held = "all lanes" if len(entries) == replicas else f"{len(entries)} of {replicas} lanes (the others' chunks " \
        "before the cut counted as read)"
    try:
        covered = received({lane: (state, consumed) for lane, (state, consumed, _) in entries.items()})
    except ValueError as error:
        return [f"  received: not computed ({error})"]
    lines = [f"  taken from the stream ({held}; received by the training loop, or dropped by a filter step or "
             "drop_last):"]
    for name, figures in covered.items():
        total = figures["pass_length"]
        lines.append(f"    {name:<16} {figures['passes_completed']:,} passes completed, {figures['position']:,} of "
                     f"{total:,} samples of pass {figures['passes_completed']} read")
    return lines


def check_against(state: dict[str, Any], template: StaticMixtureWorkSource, loader: bool) -> list[str]:
    """Why ``state`` would not load into ``template``'s lanes (empty: it would)."""
    if not loader:
        return _source_problems(state, template)
    parsed = parse_state(state)
    saved = [(d["name"], d["fingerprint"]) for d in parsed.datasets]
    current = [(d.name, d.fingerprint()) for d in template.datasets_by_id.values()]
    if saved != current:
        return [f"datasets: the checkpoint has {saved}, the config gives {current}"]
    lanes = sorted(parsed.entries)
    settings = _differences(parsed.entries[lanes[0]][0], template) if lanes else []
    if settings:
        return settings  # every lane shares the fingerprint
    problems = [f"lane {lane}: {problem}" for lane in lanes for problem in _source_problems(parsed.entries[lane][0], template)]
    return problems[:LANES_SHOWN] + ([f"... and {len(problems) - LANES_SHOWN} more"] if len(problems) > LANES_SHOWN else [])


def _differences(state: dict[str, Any], template: StaticMixtureWorkSource) -> list[str]:
    return source_checkpoint.fingerprint_differences(state.get(source_checkpoint.KEY_FINGERPRINT), template.config)


def _source_problems(state: dict[str, Any], template: StaticMixtureWorkSource) -> list[str]:
    differences = _differences(state, template)
    if differences:
        return differences
    try:
        source_checkpoint.check_header(state, template.config)
        lane = template.clone_for_lane(state[source_checkpoint.KEY_LANE], state[source_checkpoint.KEY_REPLICAS])
        lane.load_state_dict(state)
    except (ValueError, TypeError) as error:
        return [str(error)]
    return []

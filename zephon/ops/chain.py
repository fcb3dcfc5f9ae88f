"""The packing stage of a pipeline as one operator: ``pack``, or ``ensure_mixture(mode="strict")``
over it. The runtime drives a lane's stage through this one interface (``init``, ``step`` per
document, ``take`` finished sequences, ``finish`` at the lane's end) and checkpoints its state
with ``to_json`` / ``from_json``."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from zephon.ops import mixture, pack
from zephon.ops.mixture import MixtureConfig, StrictState
from zephon.ops.pack import Doc, PackConfig, PackState, Row
from zephon.ops.tokenize import TokenizeConfig
from zephon.work import tokenizer_identity

State = PackState | StrictState


Settings = tuple[tuple[str, Any], ...]  # (name, JSON scalar) pairs, in a fixed order


def settings(packing: PackConfig, mixing: MixtureConfig | None, tokenizers: Sequence[TokenizeConfig],
             content: bool = True) -> Settings:
    """The settings that make a packed stream, one JSON scalar each: a checkpoint's packer state
    restores only where they are the same, and a restore names those that differ. A mixture
    rule counts only where it drives the packer (``mode="strict"``). ``content=False``: the
    tokenizers as checkpoints written before their vocabularies counted name them
    (``tokenizer_identity``)."""
    out: list[tuple[str, Any]] = [(f"pack.{key}", value) for key, value in asdict(packing).items()]
    if mixing is not None and mixing.mode == mixture.STRICT:
        out += [("ensure_mixture.shares", " ".join(repr(s) for s in mixing.shares)),
                ("ensure_mixture.tolerance", repr(mixing.tolerance)), ("ensure_mixture.queue", mixing.queue)]
    out.append(("tokenize.steps", len(tokenizers)))
    for k, t in enumerate(tokenizers):
        out += [(f"tokenize[{k}].tokenizer", tokenizer_identity(t.tokenizer, content)), (f"tokenize[{k}].field", t.field),
                (f"tokenize[{k}].eos_id", t.eos_id)]
    return tuple(out)


def legacy_digest(packing: PackConfig, mixing: MixtureConfig | None, tokenizers: Sequence[TokenizeConfig]) -> str:
    """What checkpoints written before the settings were spelled out held instead: 32 hex digits of them."""
    steps = [{"field": t.field, "eos_id": t.eos_id, "tokenizer": tokenizer_identity(t.tokenizer, content=False)}
             for t in tokenizers]
    old = {"pack": asdict(packing), "mixture": None if mixing is None else asdict(mixing), "tokenize": steps}
    return hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:32]


def held_documents(data: Any) -> tuple[int, ...]:
    """The documents (from the base) a packing stage's JSON state holds, of either stage,
    ascending; refuses one of neither form."""
    return mixture.held(data) if isinstance(data, dict) and "queued" in data else pack.held(data)


@dataclass(frozen=True)
class Packing:
    """A pipeline's packer and its optional mixture rule (``mixture.mode == "strict"`` drives the packer)."""

    pack: PackConfig
    mixture: MixtureConfig | None = None
    settings: Settings = ()  # what makes its sequences: its settings and the tokenize steps before it
    named: Settings = ()  # the same with the tokenizers named as checkpoints before their vocabularies counted did
    digest: str = ""  # the same, as checkpoints before the settings were spelled out held them

    @classmethod
    def of(cls, packing: PackConfig, mixing: MixtureConfig | None, tokenizers: Sequence[TokenizeConfig]) -> Packing:
        """The packing stage after ``tokenizers``."""
        return cls(packing, mixing, settings(packing, mixing, tokenizers), settings(packing, mixing, tokenizers, False),
                   legacy_digest(packing, mixing, tokenizers))

    @property
    def strict(self) -> bool:
        return self.mixture is not None and self.mixture.mode == mixture.STRICT

    @property
    def name(self) -> str:
        """The operator's name in a loader checkpoint."""
        return "ensure_mixture" if self.strict else "pack"

    def init(self) -> State:
        return mixture.init(self.mixture, self.pack) if self.strict else pack.init(self.pack)  # type: ignore[arg-type]

    def step(self, state: State, doc: Doc) -> State:
        if isinstance(state, StrictState):
            return mixture.step(self.mixture, self.pack, state, doc)  # type: ignore[arg-type]
        return pack.step(self.pack, state, doc)

    def ready(self, state: State) -> int:
        """Finished sequences :meth:`take` can give without another document."""
        return pack.available(self.pack, state.pack if isinstance(state, StrictState) else state)

    def take(self, state: State, n: int) -> tuple[list[Row], State]:
        if isinstance(state, StrictState):
            rows, packed = pack.take(self.pack, state.pack, n)
            return rows, replace(state, pack=packed)
        return pack.take(self.pack, state, n)

    def finish(self, state: State) -> tuple[State, int]:
        """The lane ended: the state and the tokens a final ``"drop"`` dropped."""
        if isinstance(state, StrictState):
            return mixture.finish(self.mixture, self.pack, state)  # type: ignore[arg-type]
        return pack.finish(self.pack, state)

    def oldest(self, state: State) -> int | None:
        """The lane index of the oldest document the state holds."""
        return mixture.oldest(state) if isinstance(state, StrictState) else pack.oldest(state)

    def to_json(self, state: State, base: int, window: int) -> dict[str, Any]:
        if isinstance(state, StrictState):
            return mixture.state_to_json(state, base, window)
        return pack.state_to_json(state, base)

    def documents_held(self, data: Any) -> tuple[int, int] | None:
        """The first and one past the last document (from the base) a JSON state holds, None
        when it holds none; refuses a state this stage could not have made."""
        if self.strict:
            return mixture.documents_held(self.mixture, self.pack, data)  # type: ignore[arg-type]
        return pack.documents_held(self.pack, data)

    def from_json(self, data: Any, docs: Sequence[Doc | None]) -> State:
        if self.strict:
            return mixture.state_from_json(self.mixture, self.pack, data, docs)  # type: ignore[arg-type]
        return pack.state_from_json(self.pack, data, docs)

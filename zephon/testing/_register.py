"""Hypothesis integration: strategies for zephon's types, so ``st.from_type`` works downstream.

Hypothesis calls :func:`_hypothesis_setup_hook` through the ``hypothesis`` entry point that
the zephon package declares, whenever hypothesis is imported and zephon is installed. That
import may come from ``zephon.testing`` itself, so the hook registers functions that look the
strategies up when a test first asks for them, never the strategies' module at import time.
"""
from __future__ import annotations

from typing import Any, Callable

from hypothesis import strategies as st

from zephon.io import Dataset
from zephon.work import (MixtureReadConfig, MixtureSpec, PhasedMixtureWorkSource, StaticMixtureWorkSource, WorkChunk,
                         WorkSource)


def _spec_strategy(kit: Any) -> st.SearchStrategy:
    names = st.lists(st.text("abcdefgh", min_size=1, max_size=4), min_size=1, max_size=4, unique=True)
    return names.flatmap(lambda chosen: kit.mixtures(names=chosen)).map(MixtureSpec)


STRATEGIES: dict[type, Callable[[Any], st.SearchStrategy]] = {
    Dataset: lambda kit: kit.datasets(),
    StaticMixtureWorkSource: lambda kit: kit.sources(),
    PhasedMixtureWorkSource: lambda kit: kit.phased_sources(),
    WorkSource: lambda kit: kit.sources(),
    WorkChunk: lambda kit: kit.work_chunks(),
    MixtureReadConfig: lambda kit: kit.mixture_read_configs(),
    MixtureSpec: _spec_strategy,
}


def _resolver(make: Callable[[Any], st.SearchStrategy]) -> Callable[[type], st.SearchStrategy]:
    def resolve(_: type) -> st.SearchStrategy:
        import zephon.testing as kit

        return make(kit)

    return resolve


def _hypothesis_setup_hook() -> None:
    """Register a strategy for each public zephon type a test may ask ``st.from_type`` for."""
    for kind, make in STRATEGIES.items():
        st.register_type_strategy(kind, _resolver(make))

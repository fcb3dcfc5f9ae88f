"""The scheduling kernel against the reference, and the allocator contract (SPEC §3–4)."""
import contextlib
import json

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from helpers import accumulator_states
from zephon import Dataset, StaticMixtureWorkSource
from zephon.core import alloc, schedule
from zephon.core.alloc import AccumulatorAllocator, FixedAllocator
from zephon.core.schedule import Ended, initial_state, plan_next, plan_next_reference
from zephon.testing import collect, source_configs


def _walk(plan, state, config, limit=300):
    out = []
    for _ in range(limit):
        planned = plan(state, config)
        out.append(planned)
        if isinstance(planned, Ended):
            break
        state = planned.state
    return out


@given(source_configs(), st.integers(1, 5), st.data())
def test_kernel_matches_reference(kwargs, replicas, data):
    lane = data.draw(st.integers(0, replicas - 1))
    config = StaticMixtureWorkSource(**kwargs).clone_for_lane(lane, replicas).config
    state = initial_state(config)
    assert _walk(plan_next, state, config) == _walk(plan_next_reference, state, config)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.floats(0.01, 1.0)), min_size=9, max_size=40),
       st.integers(9, 600), st.sampled_from(["accumulator", "fixed"]), st.sampled_from(["repeat", "redistribute"]))
def test_kernel_matches_reference_over_many_datasets(sizes, chunk_size, allocation, policy):
    """More datasets than the kernel ranks by selection: it sorts them, in the same order."""
    datasets = [Dataset.from_counts(f"d{i}", [count]) for i, (count, _) in enumerate(sizes)]
    mixture = {d.name: weight for d, (_, weight) in zip(datasets, sizes)}
    try:
        source = StaticMixtureWorkSource(datasets, mixture, chunk_size=chunk_size, allocation=allocation,
                                         exhausted_policy=policy, max_repeats=1 if policy == "repeat" else None)
    except ValueError:  # the fixed allocator refuses shares below one sample
        assume(False)
    config = source.clone_for_lane(0, 1).config
    state = initial_state(config)
    assert _walk(plan_next, state, config, limit=40) == _walk(plan_next_reference, state, config, limit=40)


@given(source_configs(), st.integers(2, 7), st.data())
def test_a_walk_paused_after_every_chunk_plans_the_same(kwargs, replicas, data):
    """The kernel skips other lanes' chunks in stretches (answering Ctrl-C between them): one
    chunk per stretch gives the same plans as one stretch."""
    lane = data.draw(st.integers(0, replicas - 1))
    config = StaticMixtureWorkSource(**kwargs).clone_for_lane(lane, replicas).config
    state = initial_state(config)
    whole = _walk(plan_next, state, config)
    with _walk_steps(1):
        assert _walk(plan_next, state, config) == whole


@contextlib.contextmanager
def _walk_steps(steps):
    saved = schedule.WALK_STEPS
    schedule.WALK_STEPS = steps
    try:
        yield
    finally:
        schedule.WALK_STEPS = saved


class _Fork:
    """A research fork's allocator: the accumulator's arithmetic in plain Python, JSON state."""

    name = "fork"

    def init(self, n):
        return [0.0] * n

    def allocate(self, state, weights, chunk_size):
        quotas, acc = AccumulatorAllocator().allocate(state, weights, chunk_size)
        return quotas, list(acc)


@given(source_configs(allocations="accumulator"))
def test_a_forked_allocator_runs_in_python_with_the_same_quotas(kwargs):
    built_in = StaticMixtureWorkSource(**kwargs).clone_for_lane(0, 1)
    fork = StaticMixtureWorkSource(**dict(kwargs, allocation=_Fork())).clone_for_lane(0, 1)
    for _ in range(100):
        a, b = built_in.next_chunk(), fork.next_chunk()
        assert a == b
        if a is None:
            break
    state = json.loads(json.dumps(fork.state_dict()))
    restored = StaticMixtureWorkSource(**dict(kwargs, allocation=_Fork())).clone_for_lane(0, 1)
    restored.load_state_dict(state)
    assert restored.next_chunk() == fork.next_chunk()


class _Sloppy(_Fork):
    """A fork whose quotas break the protocol: one short of ``chunk_size``, or one too many."""

    name = "sloppy"

    def __init__(self, off):
        self.off = off

    def allocate(self, state, weights, chunk_size):
        quotas, acc = super().allocate(state, weights, chunk_size)
        if self.off == "bools":
            return tuple(q == 1 for q in quotas), acc
        return (*quotas[:-1], quotas[-1] + self.off), acc


@pytest.mark.parametrize("off, chunk_size", [(-1, 8), (1, 8), ("bools", 2)])  # 2: quotas (True, True) sum to it
def test_an_allocator_whose_quotas_do_not_fill_the_chunk_is_named(off, chunk_size):
    data = [Dataset.from_counts("a", [50]), Dataset.from_counts("b", [50])]
    source = StaticMixtureWorkSource(data, {"a": 1, "b": 1}, chunk_size=chunk_size,
                                     allocation=_Sloppy(off)).clone_for_lane(0, 1)
    with pytest.raises(ValueError, match=rf"allocator 'sloppy' returned quotas .* to chunk_size={chunk_size}.*fix its"):
        source.next_chunk()
    assert source.state_dict()["state"]["chunk_index"] == 0


ALLOCATORS = [AccumulatorAllocator(), FixedAllocator(), _Fork()]
weight_vectors = st.lists(st.floats(0.01, 1.0) | st.just(0.0), min_size=1, max_size=6).filter(any)


@pytest.mark.parametrize("allocator", ALLOCATORS, ids=lambda a: a.name)
@given(weights=weight_vectors, chunk_size=st.integers(1, 5000), steps=st.integers(1, 30))
def test_allocator_contract(allocator, weights, chunk_size, steps):
    total = sum(weights)
    weights = [w / total for w in weights]
    if allocator.name == "fixed" and any(0 < w * chunk_size < 1 for w in weights):
        return  # refused at construction (SPEC §3)
    state = allocator.init(len(weights))
    for _ in range(steps):
        before = json.dumps(state)
        quotas, new_state = allocator.allocate(state, weights, chunk_size)
        assert json.dumps(state) == before, "allocate must not mutate its input"
        assert allocator.allocate(state, weights, chunk_size) == (quotas, new_state), "allocate must be pure"
        assert sum(quotas) == chunk_size and all(q >= 0 for q in quotas)
        assert all(q == 0 for q, w in zip(quotas, weights) if w == 0.0)
        restored = json.loads(json.dumps(state))
        assert allocator.allocate(restored, weights, chunk_size)[0] == quotas, "state must survive JSON"
        checked = alloc.state_from_json(allocator, json.loads(json.dumps(new_state)), len(weights))
        assert json.dumps(checked) == json.dumps(new_state), "a checkpoint must accept every state a run reaches"
        state = new_state


@given(weights=weight_vectors, chunk_size=st.integers(1, 40), data=st.data())
def test_an_accepted_accumulator_state_leads_only_to_accepted_states(weights, chunk_size, data):
    """What a checkpoint may hold is closed under allocate, and never gives a negative quota."""
    weights = [w / sum(weights) for w in weights]
    allocator = AccumulatorAllocator()
    state = data.draw(accumulator_states(len(weights)))
    for _ in range(30):
        quotas, state = allocator.allocate(state, weights, chunk_size)
        assert sum(quotas) == chunk_size and min(quotas) >= 0
        assert allocator.state_from_json(list(state), len(weights)) == state


@example(weights=[0.0625, 0.001, 0.001, 0.0625, 0.0625], chunk_size=5)  # an accumulator of 1.03 at chunk 17
@given(weights=st.lists(st.sampled_from([0.001, 0.0625, 1.0]) | st.floats(0.001, 1.0), min_size=2, max_size=6),
       chunk_size=st.integers(1, 8))
def test_every_checkpoint_of_small_shares_loads(weights, chunk_size):
    """Shares below one sample leave accumulators above 1 now and then; their checkpoints load."""
    datasets = [Dataset.from_counts(f"d{i}", [1000]) for i in range(len(weights))]
    make = lambda: StaticMixtureWorkSource(datasets, {d.name: w for d, w in zip(datasets, weights)},
                                           chunk_size=chunk_size, exhausted_policy="repeat").clone_for_lane(0, 1)
    source = make()
    for _ in range(40):
        source.next_chunk()
        make().load_state_dict(source.state_dict())


@pytest.mark.parametrize("value, n", [([0.0] * 7 + [-1.0, -1.0], 9), ([1.0, 0.0], 2), ([1.5, -1.5], 2),
                                      ([0.5, float("nan")], 2), ([float("inf"), -1.0], 2), ([0.0, 0], 2), ([0.0], 2)])
def test_accumulators_no_run_leaves_are_refused(value, n):
    """A sum outside [-1, 1) or one below -1 never comes from a run (from [0]*7 + [-1, -1] a
    chunk gets a negative quota); nor do other types, or another count."""
    with pytest.raises(ValueError, match=rf"{n} accumulators, floats >= -1 whose sum lies in \[-1, 1\)"):
        AccumulatorAllocator().state_from_json(value, n)


@given(weights=st.lists(st.floats(0.001, 1.0) | st.sampled_from([1.0, 0.1, 0.02, 0.001]), min_size=1, max_size=10),
       chunk_size=st.integers(1, 20000) | st.integers(1, 8))
@example(weights=[1.0, 0.1, 1.0, 1.0, 0.02], chunk_size=1)
def test_accumulator_stays_one_sample_ahead_and_under_two_behind_the_target(weights, chunk_size):
    """After every chunk a dataset has drawn at most one sample more than its share and less
    than two fewer: the take-back of an overshoot leaves an accumulator in [1, 2)."""
    total = sum(weights)
    weights = [w / total for w in weights]
    allocator, state = AccumulatorAllocator(), AccumulatorAllocator().init(len(weights))
    drawn = [0] * len(weights)
    for chunk in range(1, 120):
        quotas, state = allocator.allocate(state, weights, chunk_size)
        drawn = [d + q for d, q in zip(drawn, quotas)]
        assert all(-2 < d - w * chunk * chunk_size <= 1 + 1e-6 for d, w in zip(drawn, weights))


def test_a_rare_component_draws_16_or_17_of_16384():
    weights = [0.001, 0.999]
    allocator, state = AccumulatorAllocator(), (0.0, 0.0)
    seen = set()
    for _ in range(200):
        quotas, state = allocator.allocate(state, weights, 16384)
        seen.add(quotas[0])
    assert seen == {16, 17}


def test_fixed_allocation_gives_the_same_quotas_every_chunk():
    quotas, _ = FixedAllocator().allocate((), [0.5, 0.3, 0.2], 16384)
    assert sum(quotas) == 16384 and quotas == FixedAllocator().allocate((), [0.5, 0.3, 0.2], 16384)[0]
    assert FixedAllocator().allocate((), [0.98, 0.01, 0.01], 100)[0] == (98, 1, 1)


def test_near_tie_quotas_follow_the_two_stage_renormalisation():
    """A configuration where renormalising the raw weights once would give chunk 13 quotas
    (0, 11, 4, 0): SPEC §3 normalises over all datasets first, then over the survivors."""
    counts = [[54, 57, 4], [31, 52], [24], [50]]
    datasets = [Dataset.from_counts(f"d{i}", c) for i, c in enumerate(counts)]
    source = StaticMixtureWorkSource(datasets, {"d0": 81, "d1": 7, "d2": 2, "d3": 59}, chunk_size=15,
                                     exhausted_policy="redistribute").clone_for_lane(0, 1)
    config = source.config
    quotas = lambda plan: [p.quotas for p in _walk(plan, initial_state(config), config) if not isinstance(p, Ended)]
    kernel = quotas(plan_next)
    assert kernel == quotas(plan_next_reference)
    assert kernel[13] == (0, 12, 3, 0)
    assert {name: len(a) for name, a in collect(source, 20)[13].components.items()} == {"d1": 12, "d2": 3}

"""The zephon command: --version, --help, demo, preview (numbers and figures), inspect."""
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zephon
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIXTURE = os.path.join(ROOT, "examples", "mixture.toml")
SMALL = """chunk_size = 64
seed = 5
shuffle_block_size = "auto"
[mixture]
a = 3
b = 1
[[datasets]]
name = "a"
shards = 6
rows_per_shard = 100
[[datasets]]
name = "b"
counts = [30, 50, 20]
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return str(path)


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"zephon {zephon.__version__}"
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(command in out for command in ("demo", "preview", "inspect"))


def test_the_console_script_and_python_m_run_the_demo():
    version = subprocess.run([sys.executable, "-m", "zephon", "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"zephon {zephon.__version__}"
    demo = subprocess.run([sys.executable, "-m", "zephon"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "resumed stream equals the uninterrupted one: True" in demo.stdout


def test_preview_prints_the_resolved_plan(small, capsys):
    assert main(["preview", small, "--lanes", "3"]) == 0
    out = capsys.readouterr().out
    source = StaticMixtureWorkSource.from_config(small)
    samples = len(source)
    chunks = -(-samples // 64)
    assert f"stream: {chunks:,} chunks, {samples:,} samples" in out
    assert "ends once every dataset has completed 1 pass" in out
    assert "  600  " in out  # "auto": 8 x the largest shard (100), capped at the dataset's 600 samples
    lanes = [len(list(iter(source.clone_for_lane(lane, 3).next_chunk, None))) for lane in range(3)]
    assert f"lanes: {min(lanes):,}–{max(lanes):,} chunks each" in out


def test_preview_shows_how_far_a_batch_strays_from_the_mixture(small, capsys):
    assert main(["preview", small, "--lanes", "3", "--batch-size", "5"]) == 0
    out = capsys.readouterr().out.split("|count - share x size| per dataset\n")[1]
    lane = StaticMixtureWorkSource.from_config(small).clone_for_lane(0, 3)
    names = [name for chunk in iter(lane.next_chunk, None) for _, name in chunk]
    batches = [names[a:a + 5] for a in range(0, len(names) - len(names) % 5, 5)]
    for row in filter(None, out.splitlines()[1:]):
        name, share, _, _, batch_max, batch_mean = row.split()
        share = names.count(name) / len(names)
        strays = [abs(b.count(name) - share * 5) for b in batches]
        assert float(batch_max) == pytest.approx(max(strays), abs=0.006) and float(batch_max) <= 2
        assert float(batch_mean) == pytest.approx(sum(strays) / len(strays), abs=0.006)


def test_preview_of_an_endless_stream_stops_at_the_cap(tmp_path, capsys):
    path = tmp_path / "endless.json"
    path.write_text(json.dumps({"datasets": [{"name": "a", "counts": [10, 20]}], "mixture": {"a": 1},
                                "chunk_size": 4, "exhausted_policy": "repeat"}))
    assert main(["preview", str(path), "--max-chunks", "50"]) == 0
    assert "endless; the first 50 chunks (200 samples)" in capsys.readouterr().out


def test_preview_of_a_finite_stream_cut_at_the_cap_gives_its_true_length(small, capsys):
    assert main(["preview", small, "--lanes", "3", "--max-chunks", "4"]) == 0
    out = capsys.readouterr().out
    samples = len(StaticMixtureWorkSource.from_config(small))
    assert f"stream: {-(-samples // 64):,} chunks, {samples:,} samples; only the first 4 (256 samples) are shown" in out
    assert "endless" not in out
    assert "lanes: 1–2 chunks each, 64–128 samples each, of the chunks shown" in out


def test_preview_writes_every_figure(tmp_path, small, capsys):
    out = tmp_path / "figures"
    assert main(["preview", small, "--plot", str(out), "--lanes", "4"]) == 0
    names = sorted(os.listdir(out))
    assert names == ["coverage.png", "mixture.png", "passes.png", "shuffle.png"]
    for name in names:
        with open(out / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_preview_of_the_example_mixture_writes_its_figures(tmp_path):
    assert main(["preview", MIXTURE, "--plot", str(tmp_path)]) == 0
    assert len(os.listdir(tmp_path)) == 4


def test_shuffle_levels_separate_adjacent_samples_further_each_step():
    from zephon.cli._plots import adjacent_gaps, shuffle_levels
    from zephon.io import Dataset

    source = StaticMixtureWorkSource([Dataset.from_counts("a", [200] * 20)], {"a": 1}, chunk_size=50)
    medians = [sorted(adjacent_gaps(source.datasets_by_id[0], 3, s))[1900]
               for s in shuffle_levels(source, 0).values()]
    assert medians[0] == medians[1] == 1  # no shuffle, shard order: neighbours stay neighbours
    assert 1 < medians[2] < medians[3] < medians[4]


def test_plot_without_matplotlib_names_the_extra(small, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["preview", small, "--plot", "unused"]) == 2
    assert "zephon-mixtures[plot]" in capsys.readouterr().err


def test_a_bad_config_is_one_line_naming_the_problem(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text('chunk_size = 0\n[mixture]\na = 1\n[[datasets]]\nname = "a"\ncounts = [5]\n')
    assert main(["preview", str(path)]) == 2
    assert "chunk_size" in capsys.readouterr().err


@pytest.fixture
def token_config(tmp_path, monkeypatch):
    """A token-aware mixture file whose ratios are measured, and the tokenizer file to measure them."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))  # measurements are cached per node

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    for name, words in (("short", 3), ("long", 30)):
        (tmp_path / name).mkdir()
        for shard in range(4):
            lines = [json.dumps({"text": " ".join(["a b"] * words)}) for _ in range(50)]
            (tmp_path / name / f"part-{shard}.jsonl").write_text("\n".join(lines) + "\n")
    config = {"datasets": [{"name": "short", "path": "short"}, {"name": "long", "path": "long"}],
              "mixture": {"short": 1, "long": 1}, "chunk_size": 20,
              "token_estimation": {"calibration_samples": 40}}
    (tmp_path / "tokens.json").write_text(json.dumps(config))
    return str(tmp_path / "tokens.json"), str(tmp_path / "tokenizer.json")


def test_preview_of_a_token_mixture_to_measure_without_a_tokenizer_names_the_option(token_config, capsys):
    assert main(["preview", token_config[0]]) == 2
    err = capsys.readouterr().err
    assert "neither tokenizer nor measure" in err and "pass --tokenizer FILE" in err


def test_preview_of_a_finite_token_stream_cut_at_the_cap_is_not_called_endless(token_config, capsys):
    config, tokenizer = token_config
    assert main(["preview", config, "--tokenizer", tokenizer, "--max-chunks", "3"]) == 0
    assert "stream: finite, longer than the 3 chunks" in capsys.readouterr().out


def test_preview_measures_a_token_mixture_with_a_tokenizer_file(token_config, capsys):
    config, tokenizer = token_config
    assert main(["preview", config, "--tokenizer", tokenizer]) == 0
    out = capsys.readouterr().out
    assert "weights in tokens" in out
    datasets = out.split("composition of lane 0")[0]
    short, long = (line.split() for line in datasets.splitlines() if line.startswith(("short ", "long ")))
    assert float(short[-1]) > 5 * float(long[-1])  # the same token share takes ten times more short samples


def test_inspect_checks_a_token_checkpoint_without_measuring(token_config, tmp_path, capsys):
    from tokenizers import Tokenizer

    config, tokenizer = token_config
    source = StaticMixtureWorkSource.from_config(config, tokenizer=Tokenizer.from_file(tokenizer))
    source.prime(progress=False)
    lane = source.clone_for_lane(0, 1)
    lane.next_chunk()
    (tmp_path / "state.json").write_text(json.dumps(lane.state_dict()))
    assert main(["inspect", str(tmp_path / "state.json"), "--config", config]) == 0
    out = capsys.readouterr().out
    assert "tokens per byte: short" in out and ": yes" in out


def test_inspect_summarises_a_source_state_and_checks_it_against_a_config(small, tmp_path, capsys):
    lane = StaticMixtureWorkSource.from_config(small).clone_for_lane(1, 2)
    for _ in range(3):
        lane.next_chunk()
    path = tmp_path / "state.json"
    path.write_text(json.dumps(lane.state_dict()))
    assert main(["inspect", str(path), "--config", small]) == 0
    out = capsys.readouterr().out
    cursor = lane.state.cursors[0]
    assert "lane 1 of 2" in out and f"pass {cursor.epoch}, position {cursor.position:,} of 600" in out
    assert "loads into" in out and ": yes" in out and "(matches the content)" in out

    edited = lane.state_dict()
    edited["state"]["chunk_index"] += 1
    path.write_text(json.dumps(edited))
    assert main(["inspect", str(path), "--config", small]) == 1
    assert "does NOT match" in capsys.readouterr().out
    path.write_text(json.dumps(lane.state_dict()))

    other = tmp_path / "other.toml"
    other.write_text(SMALL.replace("seed = 5", "seed = 6"))
    assert main(["inspect", str(path), "--config", str(other)]) == 1
    assert "seed: checkpoint has 5, this source has 6" in capsys.readouterr().out


def test_inspect_reads_a_loader_checkpoint_file(small, tmp_path, capsys):
    import zephon.torch as zt

    loader = zt.DataLoader(Pipeline(StaticMixtureWorkSource.from_config(small)), batch_size=16, canonical_replicas=3)
    batches = iter(loader)
    received = [name for _ in range(5) for name in next(batches)["_component"]]
    path = tmp_path / "data.ckpt"
    zt.save_checkpoint(path, loader.state_dict())
    assert main(["inspect", str(path), "--config", small]) == 0
    out = capsys.readouterr().out
    assert "canonical_replicas 3; lanes held 3" in out and "lane 2:" in out and ": yes" in out
    rows = out.split("taken from the stream (all lanes; received by the training loop, or dropped by a filter "
                     "step or drop_last):\n")[1].splitlines()
    for name in set(received):  # what the loop received, the parts of the chunks in flight counted
        row = next(r.split() for r in rows if r.split()[0] == name)
        assert row[1:5] == ["0", "passes", "completed,", str(received.count(name))]
    path.write_bytes(path.read_bytes()[:-5])
    assert main(["inspect", str(path)]) == 2
    assert "truncated" in capsys.readouterr().err


@settings(max_examples=20)
@given(st.integers(1, 40), st.integers(1, 8), st.integers(1, 6), st.booleans())
def test_inspect_and_stats_count_what_drop_last_and_filters_dropped_as_taken(count, chunk_size, batch_size, keep_all):
    """A checkpoint holds how much of each chunk a lane's reader took, not why: the figures of
    ``zephon inspect`` and ``stats()["datasets"]`` are the samples the loop received plus those
    filter steps and drop_last dropped, and inspect says so."""
    import contextlib
    import io
    import tempfile

    import zephon.torch as zt

    source = StaticMixtureWorkSource([Dataset.from_counts("web", [count])], {"web": 1.0},
                                     chunk_size=min(chunk_size, count), shuffle_shards=False)
    pipeline = Pipeline(source) if keep_all else Pipeline(source).filter(lambda item: item["_sample_id"][2] % 2 == 0)
    loader = zt.DataLoader(pipeline, batch_size=batch_size, canonical_replicas=1, rank=0, world_size=1,
                           drop_last=True)
    received = sum(len(batch["_component"]) for batch in loader)
    stats = loader.stats()
    figures = stats["datasets"]["web"]
    taken = figures["passes_completed"] * figures["pass_length"] + figures["position"] - figures["never_read"]
    assert taken == received + stats["filtered"] + stats["drop_last"]
    with tempfile.TemporaryDirectory() as directory, contextlib.redirect_stdout(io.StringIO()) as out:
        path = f"{directory}/data.ckpt"
        zt.save_checkpoint(path, zt.merge_states([loader.state_dict()]))
        assert main(["inspect", path]) == 0
    rows = out.getvalue().split("received by the training loop, or dropped by a filter step or drop_last):\n")[1]
    row = next(r.split() for r in rows.splitlines() if r.split()[0] == "web")
    assert row[1] == str(figures["passes_completed"]) and row[4] == str(figures["position"])


def _phased(small):
    from zephon.work import Phase, PhasedMixtureWorkSource

    static = StaticMixtureWorkSource.from_config(small)
    datasets = list(static.datasets_by_id.values())
    return PhasedMixtureWorkSource(datasets, [Phase({"a": 3, "b": 1}, until_chunk=2), Phase({"a": 1, "b": 1})],
                                   chunk_size=64, seed=5)


def test_inspect_summarises_a_phased_source_state_and_refuses_to_check_it(small, tmp_path, capsys):
    lane = _phased(small).clone_for_lane(0, 2)
    for _ in range(2):
        lane.next_chunk()
    path = tmp_path / "phased.json"
    path.write_text(json.dumps(lane.state_dict()))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    cursor = lane.state.inner.cursors[0]
    assert "phase 1 in progress" in out and "phase 0: weights [0.75, 0.25], until chunk 2" in out
    assert "phase 1: weights [0.5, 0.5], open-ended  <- in progress" in out
    assert f"pass {cursor.epoch}, position {cursor.position:,} of 600" in out
    assert out.count("(matches the content)") == 2  # the phased state's digest and its current phase's
    assert main(["inspect", str(path), "--config", small]) == 2
    captured = capsys.readouterr()
    assert "phased source's state" in captured.err and captured.out == ""


def test_inspect_reads_a_loader_checkpoint_of_a_phased_source(small, tmp_path, capsys):
    import zephon.torch as zt

    loader = zt.DataLoader(Pipeline(_phased(small)), batch_size=16, canonical_replicas=2)
    batches = iter(loader)
    for _ in range(12):
        next(batches)
    path = tmp_path / "data.ckpt"
    zt.save_checkpoint(path, loader.state_dict())
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "lane 1: chunk in flight is its first from global chunk" in out and "(phase " in out
    assert "phase 1: weights [0.5, 0.5], open-ended" in out and "fingerprint (current phase):" in out
    assert "a                pass 0, position" in out


def test_preview_refuses_more_lanes_than_a_source_may_have(small, capsys):
    assert main(["preview", small, "--lanes", str(2**40)]) == 2
    assert "--lanes 1099511627776 is more than the" in capsys.readouterr().err

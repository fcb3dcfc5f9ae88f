"""Every example runs, as the docs show it (each is a subprocess of a few seconds at most)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = [
    "examples/guide/worksources/repeat_passes.py",
    "examples/guide/worksources/per_dataset_repeat_settings.py",
    "examples/guide/worksources/stopping_rules.py",
    "examples/custom_allocator.py",
    "examples/custom_worksource.py",
]


def run(args, **kwargs):
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=240, **kwargs)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs(script):
    assert run([sys.executable, script])


def test_repeat_passes_reaches_two_passes_of_the_larger_dataset():
    out = run([sys.executable, SCRIPTS[0]])
    assert "books: 16,000 samples drawn = 2 passes" in out


def test_the_seeds_table_ends_each_row_where_its_rule_holds():
    rows = dict(line.split(": ", 1) for line in run([sys.executable, SCRIPTS[2]]).splitlines())
    assert rows["nothing"] == "ended after 58 chunks; big 1 passes + 60, small 5 passes + 285"  # 58 x 70 >= 4,000
    assert rows["exhausted_policy='repeat'"].startswith("still going after 200 chunks")
    assert rows["exhausted_policy='stop'"].endswith("small 0 passes + 270")  # its next 30 exceed the 291
    assert rows["stop_after_passes=3"].startswith("ended") and "big 3 passes + 40," in rows["stop_after_passes=3"]
    assert rows["max_repeats=2"].endswith("small 2 passes + 288")  # its third pass, up to its last quota of 30


def test_per_dataset_settings_end_when_books_cannot_supply_its_quota():
    out = run([sys.executable, SCRIPTS[1]])
    assert "books: in pass 0, 7,980 of 8,000 samples read" in out  # its next 30 do not fit


def test_train_tiny_runs_checkpoints_and_resumes_under_torchrun(tmp_path):
    """Each way to checkpoint: a "crash" after step 15 (one process without torchrun, or two),
    then a resume from step 10's checkpoint on more processes under torchrun. The checkpoint
    directory and DCP continue to the same model."""
    script = os.path.join(ROOT, "examples", "train_tiny.py")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    last = {}
    for style, before, after in [("file", [], "2"), ("dir", [*torchrun, "2"], "3"), ("dcp", [*torchrun, "2"], "3")]:
        args = [script, "--steps", "20", "--checkpoint", style, "--checkpoint-dir", str(tmp_path / style)]
        first = run([*(before or [sys.executable]), *args, "--stop-at", "15"], env=env)
        assert "step 10: loss" in first and "step 20" not in first
        again = run([*torchrun, after, *args], env=env)
        assert again.startswith("resumed at step 10") and "step 20: loss" in again
        last[style] = again.splitlines()[-1]
    assert last["dir"] == last["dcp"], last


def test_every_example_is_included_in_the_docs():
    docs = os.path.join(ROOT, "docs")
    pages = "".join(Path(docs, name).read_text(encoding="utf-8") for name in os.listdir(docs) if name.endswith(".md"))
    examples = [os.path.relpath(os.path.join(folder, name), ROOT)
                for folder, _, names in os.walk(os.path.join(ROOT, "examples")) for name in names
                if name.endswith((".py", ".toml"))]
    assert examples
    missing = [path for path in examples if f"```{{literalinclude}} ../{path}" not in pages]
    assert not missing, f"examples not shown in docs/: {missing}"

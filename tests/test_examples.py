"""Every example runs, as the docs show it (each is a subprocess of a few seconds at most)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = [
    "examples/guide/worksources/repeat_passes.py",
    "examples/guide/worksources/per_dataset_repeat_settings.py",
    "examples/custom_allocator.py",
    "examples/custom_worksource.py",
]


def run(args, **kwargs):
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=240, **kwargs)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs(script):
    assert run([sys.executable, script])


def test_repeat_passes_reaches_two_passes_of_the_larger_dataset():
    out = run([sys.executable, SCRIPTS[0]])
    assert "books: 16,000 samples drawn = 2 passes" in out


def test_train_tiny_checkpoints_and_resumes(tmp_path):
    script = os.path.join(ROOT, "examples", "train_tiny.py")
    first = run([sys.executable, script, "--steps", "30", "--stop-at", "25", "--checkpoint-dir", str(tmp_path)])
    assert "step 20: loss" in first and "step 30" not in first
    again = run([sys.executable, script, "--steps", "30", "--checkpoint-dir", str(tmp_path)])
    assert again.startswith("resumed at step 20") and "step 30: loss" in again


def test_train_tiny_resumes_under_torchrun_on_two_processes(tmp_path):
    script = os.path.join(ROOT, "examples", "train_tiny.py")
    run([sys.executable, script, "--steps", "10", "--checkpoint-dir", str(tmp_path)])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               script, "--steps", "20", "--checkpoint-dir", str(tmp_path)], env=env)
    assert "resumed at step 10" in out and "step 20: loss" in out

"""Fuzz hostile constructor arguments, edited states, damaged checkpoint files and odd indices in a
subprocess (fuzz_hostile.py), so that a crash of the interpreter fails this test instead of
ending the run."""
import json
import os
import subprocess
import sys
from pathlib import Path


def test_hostile_input_is_refused_or_harmless():
    script = Path(__file__).with_name("fuzz_hostile.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert done.returncode == 0, f"the fuzzer failed (rc {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["constructor refused"] > 0 and counts["constructor built"] > 0
    assert counts["state refused"] > 0 and counts["state accepted, same stream"] > 0
    assert counts["file refused"] > 0 and counts["index refused"] > 0 and counts["index answered"] > 0

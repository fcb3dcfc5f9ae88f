"""examples/anneal_and_migrate.py runs end to end: anneal, checkpoint, migrate, resume on 4 ranks."""
from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "anneal_and_migrate.py"


def test_the_example_anneals_migrates_and_resumes_without_reading_twice(capsys):
    spec = importlib.util.spec_from_file_location("anneal_and_migrate", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    summary = module.main(12000)
    starts = summary["phase_starts"]
    assert starts[0] == 0 and 0 < starts[1] <= summary["cut_chunk"]  # the anneal phase had begun
    assert summary["read_after"] > 0 and summary["unread_at_cut"]["math"] == 0
    assert summary["continues_at"]["math"] == {"pass": 0, "position": 0}
    assert '"cut_chunk"' in capsys.readouterr().out

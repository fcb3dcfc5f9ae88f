"""The README's Python snippets up to the training loop run as written, one after the other
(the training loop itself needs data on disk and a model: examples/train_tiny.py is its
runnable twin, run by tests/test_examples.py)."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def snippets_before(heading: str) -> list[str]:
    text = README.read_text()
    return re.findall(r"```python\n(.*?)```", text[:text.index(heading)], re.S)


def test_the_readme_snippets_run_as_written():
    blocks = snippets_before("## Training loop")
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102  (the README's own code)
    lane = namespace["lane"]
    assert lane.sample_id_at(1_234_567) == tuple(lane.sample_ids_at([1_234_567])[0])
    assert not namespace["source"].requires_token_priming

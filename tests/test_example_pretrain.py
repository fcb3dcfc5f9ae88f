"""examples/pretrain_llm.py under torchrun: killed (SIGKILL) at step 12, resumed from step 8's
checkpoint on 2 ranks (the same sequences as the uninterrupted run, token for token) and on 3
(every token read exactly once: what the run trained on plus what its last checkpoint holds
unread equals the whole stream)."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "pretrain_llm.py"
pytest.importorskip("tokenizers")


def torchrun(out, ranks, *extra, check=True):
    """The example under torchrun, in a session of its own: a run past its time is killed with
    every process it started (its ranks and their workers would outlive torchrun)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               str(SCRIPT), "--out", str(out), *extra]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"torchrun {' '.join(extra)} ran past 300 s and was killed; its stderr:\n{stderr[-3000:]}")
        except BaseException:  # an interrupted test leaves no run behind either
            os.killpg(process.pid, signal.SIGKILL)
            raise
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def trained(out, ranks):
    """Per rank, step -> the pieces of its sequences (the last run's record of a step wins)."""
    logs = {}
    for rank in range(ranks):
        steps = {}
        for line in (out / f"seen.{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            steps[record["step"]] = record["sequences"]
        logs[rank] = steps
    return logs


def pieces(sequences):
    return Counter(tuple(piece) for sequence in sequences for piece in sequence)


def unread(out):
    """What the run's last data checkpoint holds unread, read in one process to the end."""
    sys.path.insert(0, str(SCRIPT.parent))
    import pretrain_llm
    import zephon.torch as zt

    paths = {name: out / "data" / name for name in pretrain_llm.CORPORA}
    tokenizer = pretrain_llm.train_tokenizer(paths, out / "tokenizer.json")
    args = argparse.Namespace(seq_len=64, batch_size=8, workers=0)
    loader = pretrain_llm.make_loader(args, paths, tokenizer, even_batches=False)
    loader.load_state_dict(zt.load_checkpoint(out / "data.ckpt"))
    sequences = [s for batch in loader for s in batch["_documents"]]
    loader = pretrain_llm.make_loader(args, paths, tokenizer, even_batches=False)
    everything = [s for batch in loader for s in batch["_documents"]]
    return sequences, everything


def test_a_killed_run_resumes_exactly_on_two_ranks_and_on_three(tmp_path):
    whole = tmp_path / "whole"
    torchrun(whole, 2)
    crashed = tmp_path / "crashed"
    done = torchrun(crashed, 2, "--crash-at", "12", check=False)
    assert done.returncode != 0  # killed: the rank that gets there first, then torchrun stops the other
    assert torch.load(crashed / "model.pt")["step"] == 8
    assert all(max(steps) > 8 for steps in trained(crashed, 2).values())  # both trained past the checkpoint
    elastic = tmp_path / "elastic"
    shutil.copytree(crashed, elastic)

    torchrun(crashed, 2)
    assert trained(crashed, 2) == trained(whole, 2)

    torchrun(elastic, 3)
    before = trained(crashed, 2)  # the same until the crash
    seen = [s for rank in range(2) for step in range(1, 9) for s in before[rank][step]]
    after = trained(elastic, 3)
    seen += [s for rank in range(3) for step, sequences in after[rank].items() if step > 8 for s in sequences]
    rest, everything = unread(elastic)
    assert pieces(seen) + pieces(rest) == pieces(everything)
    assert sum(pieces(seen).values()) > 0

"""zephon.hf: ``transformers.Trainer`` reading a zephon DataLoader on every process, with exact resumes.

:class:`Trainer` takes ``train_loader=zt.DataLoader(...)`` and uses it as it is on every
process: no dispatching from rank 0, no splitting of batches, no skipping by replay. Each
``checkpoint-*`` directory also holds the loader's global state (``zephon_loader.ckpt``, every
rank's lanes, written atomically), and ``train(resume_from_checkpoint=...)`` restores it: the
next step trains on the batch after the last one the checkpoint's steps trained on, on any
number of processes. Needs ``transformers`` (``zephon-mixtures[hf]``).
"""
from __future__ import annotations

import inspect
import json
import logging
import os
from typing import Any

import torch
import torch.distributed as dist
import transformers
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

import zephon.torch as zt
from zephon.runtime import HF_STATE_FILE
from zephon.io import write_atomically

RUN_FILE = "zephon_run.json"  # the run's total steps, so that a resume keeps max_steps, and its data-parallel ranks
log = logging.getLogger("zephon")
_skip_first_batches = getattr(transformers.trainer, "skip_first_batches", None)  # accelerate's (transformers>=4.41)


def _skip_nothing_of_zephon(dataloader: Any, num_batches: int = 0) -> Any:
    """What ``transformers.Trainer`` calls to skip a resumed epoch's batches before its checkpoint
    (accelerate's ``skip_first_batches``, which would rebuild the loader around its dataset): a
    zephon loader restored from the checkpoint stands after them already; any other loader is
    skipped as before. Trainer then counts the epoch's batches on from the checkpoint's, so its
    accumulation groups and the epoch's last, partial one step as in an uninterrupted run."""
    if isinstance(dataloader, zt.DataLoader) or _skip_first_batches is None:
        return dataloader
    return _skip_first_batches(dataloader, num_batches)


transformers.trainer.skip_first_batches = _skip_nothing_of_zephon


class Trainer(transformers.Trainer):
    """A ``transformers.Trainer`` whose training batches come from ``train_loader``.

    Parameters
    ----------
    *args, **kwargs
        What ``transformers.Trainer`` takes (``model``, ``args``, …), without a train dataset.
    train_loader : zephon.torch.DataLoader
        The training data. Every process reads its own lanes. Batch keys the model's
        ``forward`` does not take (``_sample_id``, ``_documents``, ``segment_ids``, …) are left
        out of its inputs, as ``remove_unused_columns`` does for datasets.

    ``args.max_steps`` defaults to ``train_loader.remaining()`` batches at the run's start, in
    optimizer steps (with ``even_batches``, the same on every process), kept across resumes; a
    loader that cannot count what is left (an endless stream) needs ``max_steps`` set.
    ``args.ignore_data_skip`` is set to False: Trainer's skip of a resumed epoch's batches
    before the checkpoint takes none from the loader (its own checkpoint places the data,
    nothing is replayed) and lets Trainer count the epoch's batches, and so its gradient
    accumulation groups and ``state.epoch``, on from the checkpoint. Trainer's tokens-per-second
    estimate is 0 (it would read a batch of the loader).
    """

    def __init__(self, *args: Any, train_loader: zt.DataLoader, **kwargs: Any):
        if not isinstance(train_loader, zt.DataLoader):
            raise TypeError(f"Trainer(train_loader=...) needs a zephon.torch.DataLoader, got "
                            f"{type(train_loader).__name__}")
        training = kwargs.get("args", args[1] if len(args) > 1 else None)
        if training is not None and training.device.type == "cpu" and training.device.index is not None:
            # accelerate names each CPU process's device "cpu:<rank>", and Trainer maps a resumed
            # optimizer state there, which torch.load cannot do: on CPU the index means nothing
            training.__dict__["_setup_devices"] = torch.device("cpu")
        super().__init__(*args, **kwargs)
        self.train_loader = train_loader
        self.args.ignore_data_skip = False  # see _skip_nothing_of_zephon
        self._zephon_steps: int | None = None

    def get_train_dataloader(self) -> Any:
        """The loader as it is: accelerate's preparation would dispatch or split its batches."""
        return self.train_loader

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``transformers.Trainer.train``; a checkpoint to resume from (``True``: the newest in
        ``args.output_dir``) also restores the loader and the run's ``max_steps``."""
        folder = get_last_checkpoint(self.args.output_dir) if resume_from_checkpoint is True else resume_from_checkpoint
        if resume_from_checkpoint is True and folder is None:
            raise ValueError(f"resume_from_checkpoint=True: no checkpoint-* directory in {self.args.output_dir}")
        saved_on = self._restore(folder) if isinstance(folder, str) and folder else None
        chosen = self.args.max_steps > 0
        if not chosen:  # optimizer steps: one per gradient_accumulation_steps batches
            self.args.max_steps = self._zephon_steps or -(-self._remaining()
                                                          // max(1, self.args.gradient_accumulation_steps))
        self._zephon_steps = self.args.max_steps
        if saved_on is not None and saved_on != self.train_loader.topology.world_size:
            assert isinstance(folder, str)  # saved_on comes from a checkpoint folder
            self._say_steps(folder, saved_on, chosen)
        return super().train(folder or None, *args, **kwargs)

    def _restore(self, folder: str) -> int | None:
        """Restore the loader's state and the run's ``max_steps`` from checkpoint ``folder``;
        ``FileNotFoundError`` where zephon's files are not there (a plain Trainer's checkpoint).
        Returns the data-parallel ranks the checkpoint was saved on (None: older files do not say)."""
        missing = [name for name in (HF_STATE_FILE, RUN_FILE) if not os.path.isfile(os.path.join(folder, name))]
        if missing:
            raise FileNotFoundError(f"checkpoint {folder!r} has no {' or '.join(missing)}: it was not saved by "
                                    "zephon.hf.Trainer (a plain transformers.Trainer does not save the loader's "
                                    "position), so the data cannot resume from it. Resume from a checkpoint that "
                                    "zephon.hf.Trainer saved, or start without resume_from_checkpoint")
        self.train_loader.load_state_dict(zt.load_checkpoint(os.path.join(folder, HF_STATE_FILE)))
        with open(os.path.join(folder, RUN_FILE)) as f:
            run = json.load(f)
        self._zephon_steps = int(run["max_steps"])
        saved_on = run.get("data_parallel")
        return saved_on if isinstance(saved_on, int) else None

    def _say_steps(self, folder: str, saved_on: int, chosen: bool) -> None:
        """Warn that a resume on another number of data-parallel ranks trains ``max_steps`` (the
        run's, its learning-rate schedule's, unless ``chosen`` for this run), which may now end
        before the data does, or after it."""
        steps = self.args.max_steps
        try:
            with open(os.path.join(folder, transformers.trainer.TRAINER_STATE_NAME)) as f:
                done = int(json.load(f)["global_step"])
            data = f"; the loader has {self.train_loader.remaining()} batches left on this process, " \
                   f"in updates of {max(1, self.args.gradient_accumulation_steps)}"
        except (OSError, KeyError, ValueError, TypeError):
            done, data = -1, ""
        left = "" if done < 0 else f" ({steps - done} left)"
        whose = "set for this run" if chosen else "the run's, kept across resumes"
        log.warning("zephon.hf.Trainer: checkpoint %s was saved on %d data-parallel ranks and resumes on %d: max_steps "
                    "is %d (%s)%s%s. Set TrainingArguments(max_steps=...) to train another number of steps", folder,
                    saved_on, self.train_loader.topology.world_size, steps, whose, left, data)

    def _remaining(self) -> int:
        """``train_loader.remaining()``, or a ``ValueError`` that says to set ``max_steps`` where
        the loader cannot count what is left."""
        try:
            return self.train_loader.remaining()
        except TypeError as error:
            raise ValueError(f"zephon.hf.Trainer: TrainingArguments(max_steps=...) is not set, and it defaults to the "
                             f"batches train_loader has left, which it cannot count ({error}); set max_steps, the "
                             "optimizer steps to train") from error

    @staticmethod
    def num_tokens(train_dl: Any, max_steps: int | None = None) -> int:
        """Trainer estimates tokens/s by reading a batch of the loader, which would take it from
        the run: zephon's loader is not read here (0; ``train_loader.stats()`` counts tokens)."""
        return 0

    def _prepare_inputs(self, inputs: Any) -> Any:
        """The batch without the keys the model's ``forward`` does not take (with
        ``remove_unused_columns``): a ``forward`` with ``**kwargs`` loses only zephon's
        ``_``-keys."""
        if isinstance(inputs, dict) and self.args.remove_unused_columns:
            self._set_signature_columns_if_needed()
            accepted: set[str] = set(self._signature_columns or ())
            forward = getattr(self.model, "forward", None)
            takes_any = forward is not None and any(p.kind is inspect.Parameter.VAR_KEYWORD
                                                    for p in inspect.signature(forward).parameters.values())
            inputs = {key: value for key, value in inputs.items()
                      if (not key.startswith("_") if takes_any else key in accepted)}
        return super()._prepare_inputs(inputs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """The loader's global state (a collective: every process gathers its lanes), then the
        Trainer's checkpoint into the same directory: a checkpoint-* directory is never without
        it. Trainer fetches exactly the batches of each update before training them, so the
        loader's state is that of the step's last batch."""
        state = self.train_loader.state_dict()
        if _world_size() > 1:
            state = zt.all_gather_state(state)
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            zt.save_checkpoint(os.path.join(folder, HF_STATE_FILE), state)
            run = {"max_steps": self._zephon_steps, "data_parallel": self.train_loader.topology.world_size}
            write_atomically(os.path.join(folder, RUN_FILE), json.dumps(run).encode())
        super()._save_checkpoint(model, trial)


def _world_size() -> int:
    """The processes of the run (1 without torch.distributed)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

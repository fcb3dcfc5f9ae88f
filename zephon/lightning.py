"""zephon.lightning: a LightningDataModule over a zephon pipeline, with exact and elastic resumes.

Lightning fetches a batch ahead of the step it trains, so the loader's own position is one
batch past what the step trained on. :class:`DataModule` counts the batches the training step
received (a callback's ``on_train_batch_start`` runs once per step, after the fetch; the
model's own batch hooks stay its own) and saves the loader's state as of the last of them
(``state_dict(lag=k)``), gathered from every rank, in Lightning's own checkpoint;
``Trainer.fit(..., ckpt_path=...)`` restores it, on any number of devices. Lightning starts its
processes and ``torch.distributed`` in ``fit``, so the loader is built (again, if it was built
before for another topology) when ``fit`` asks for it. Needs the ``lightning`` package
(``zephon-mixtures[lightning]``).
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Iterator

import lightning.pytorch as pl
import torch.distributed as dist

import zephon.torch as zt
from zephon.runtime import LIGHTNING_KEY, log_once

log = logging.getLogger("zephon")
TOPOLOGY_ARGS = ("rank", "world_size", "device_mesh", "dp_dims", "dp_group", "dp_rank", "dp_size")


class DataModule(pl.LightningDataModule):
    """The training data of a Lightning run: ``pipeline`` read by a :class:`zephon.torch.DataLoader`.

    Parameters
    ----------
    pipeline : zephon.Pipeline or WorkSource
        What to read.
    **loader_kwargs
        Arguments of :class:`zephon.torch.DataLoader` (``batch_size``, ``num_workers``, …).
        Each rank reads its own lanes (Lightning's distributed sampler does not apply).
        Under ``ModelParallelStrategy`` the readers are its mesh's ``"data_parallel"`` ranks
        (a tensor-parallel group receives the same batches) unless ``device_mesh``,
        ``dp_group`` or ``dp_rank`` / ``dp_size`` say otherwise.

    The data state in Lightning's checkpoint is the loader's global state as of the batch the
    last training step received. ``loader`` is the loader (after ``train_dataloader()``; ``fit``
    builds it again for the trainer's ranks when it was built before for others);
    :meth:`remaining` is what is left to read, e.g. for ``max_steps``.
    """

    def __init__(self, pipeline: Any, **loader_kwargs: Any):
        super().__init__()
        self._pipeline, self._kwargs = pipeline, loader_kwargs
        self.loader: zt.DataLoader | None = None
        self._restored: dict[str, Any] | None = None
        self._yielded = self._trained = 0  # in the running iteration
        self._fed = False  # whether Lightning has iterated the loader
        self._counter = _StepCounter(self)

    def train_dataloader(self) -> Any:
        """What ``fit`` iterates: the loader, built for the trainer's ranks (called before
        ``fit``, it is built for the process as it is then, and ``fit`` builds it again if the
        trainer's ranks differ)."""
        kwargs = {**self._layout(), **self._kwargs}
        if self.loader is None or self._stale(kwargs):
            self.loader = zt.DataLoader(self._pipeline, **kwargs)
            if self._restored is not None:
                self.loader.load_state_dict(self._restored)
        if self.trainer is not None:
            callbacks: list[pl.Callback] = self.trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning
            if self._counter not in callbacks:
                callbacks.append(self._counter)
        return _Feed(self)

    def _stale(self, kwargs: dict[str, Any]) -> bool:
        """Whether the loader was built for other ranks than the trainer's: before ``fit``, where
        Lightning had not yet started its processes (``RuntimeError`` if it has read from it)."""
        assert self.loader is not None
        if self.trainer is None:
            return False
        now = zt.detect_topology(**{name: kwargs[name] for name in TOPOLOGY_ARGS if name in kwargs})
        built = self.loader.topology
        if (now.rank, now.world_size) == (built.rank, built.world_size):
            return False
        if self._fed:
            raise RuntimeError(f"zephon.lightning.DataModule: the loader read as rank {built.rank} of "
                               f"{built.world_size}, but this trainer runs rank {now.rank} of {now.world_size}; use a "
                               "new DataModule per Trainer (resume from the checkpoint to continue the data)")
        log.info("zephon: the DataModule's loader was built as rank %d of %d (before Trainer.fit started its "
                 "processes); building it again as rank %d of %d", built.rank, built.world_size, now.rank,
                 now.world_size)
        return True

    def remaining(self, world_size: int | None = None) -> int:
        """Batches (items) left to read per data-parallel rank, e.g. for ``max_steps``: with
        ``even_batches`` (the default) the same on every rank, else rank 0's.

        ``world_size`` (default None): the trainer's data-parallel ranks (devices x nodes under
        DDP, the data-parallel size under ``ModelParallelStrategy``), to count before ``fit``:
        Lightning starts its processes in ``fit``, so before it this process cannot tell how
        many there will be. None: counted for the loader (built by ``train_dataloader()`` if
        need be), which before ``fit`` is built for the process as it is then, a single one
        unless a launcher such as torchrun started it (then said in a warning).
        """
        if world_size is None:
            if self.loader is None:
                self.train_dataloader()
            assert self.loader is not None
            if self.trainer is None and self.loader.topology.origin == "single process":
                log_once("zephon: DataModule.remaining() before Trainer.fit counts for a single process: pass "
                         "world_size=<devices x nodes> when the trainer runs on several")
            return self.loader.remaining()
        if type(world_size) is not int or world_size < 1:
            raise ValueError(f"remaining(world_size={world_size!r}) must be an int >= 1 (the trainer's data-parallel "
                             "ranks) or None")
        kwargs = {name: value for name, value in self._kwargs.items() if name not in TOPOLOGY_ARGS}
        counting = zt.DataLoader(self._pipeline, **kwargs, rank=0, world_size=world_size)
        if self._restored is not None:
            counting.load_state_dict(self._restored)
        return counting.remaining()

    def _layout(self) -> dict[str, Any]:
        """The trainer's data-parallel mesh (``ModelParallelStrategy``), unless the arguments give a layout."""
        try:
            from lightning.pytorch.strategies import ModelParallelStrategy  # Lightning 2.3 on
        except ImportError:
            return {}
        strategy = getattr(self.trainer, "strategy", None)
        given = {"device_mesh", "dp_group", "dp_rank", "dp_size", "rank", "world_size"} & set(self._kwargs)
        if not isinstance(strategy, ModelParallelStrategy) or given:
            return {}
        return {"device_mesh": strategy.device_mesh, "dp_dims": ("data_parallel",)}  # the loader's dp_dims win

    def state_dict(self) -> dict[str, Any]:
        """The loader's global state as of the batch the last step received (a collective
        under torch.distributed: Lightning calls it on every rank)."""
        if self.loader is None:
            return {LIGHTNING_KEY: self._restored}
        state = self.loader.state_dict(lag=self._yielded - self._trained)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            state = zt.all_gather_state(state)
        return {LIGHTNING_KEY: state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = state_dict.get(LIGHTNING_KEY)
        if self.loader is not None and self._restored is not None:
            self.loader.load_state_dict(self._restored)
            self._yielded = self._trained = 0  # an iteration of an earlier fit no longer counts


class _StepCounter(pl.Callback):
    """Counts the batches the training steps receive (``on_train_batch_start`` runs once per
    step, after Lightning fetched the next batch): a callback, so that the model's own
    ``on_before_batch_transfer`` (which a data module's would replace) still runs."""

    def __init__(self, module: DataModule):
        self._module = module

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._module._trained += 1


class _Feed:
    """What Lightning iterates: the loader's batches, counted. It has no ``state_dict`` (the
    data module checkpoints the loader) and no length (an epoch ends with the stream)."""

    def __init__(self, module: DataModule):
        self._module = module

    def __iter__(self) -> Iterator[Any]:
        module = self._module
        loader, trainer = module.loader, module.trainer
        assert loader is not None  # set by train_dataloader()
        if trainer is not None and "dataloader_iter" in inspect.signature(trainer.lightning_module.training_step).parameters:
            raise TypeError("zephon.lightning.DataModule counts the batches the training step receives, which a "
                            "training_step(self, dataloader_iter) hides; take (batch, batch_idx) instead")
        if module._yielded > module._trained:  # Lightning left an epoch with a batch fetched ahead: not trained
            loader.load_state_dict(loader.state_dict(lag=module._yielded - module._trained))
        module._yielded = module._trained = 0
        module._fed = True
        for batch in loader:
            module._yielded += 1
            yield batch
        if not module._yielded and trainer is not None:  # the stream has ended: later epochs would be empty too
            log.warning("zephon: the training stream has ended before max_steps; stopping the Lightning run")
            trainer.should_stop = True

"""zephon.lightning: a LightningDataModule over a zephon pipeline, with exact and elastic resumes.

Lightning fetches a batch ahead of the step it trains, so the loader's own position is one
batch past what the step trained on. :class:`DataModule` counts the batches the training step
received (its ``on_before_batch_transfer`` hook runs once per step, after the fetch) and saves
the loader's state as of the last of them (``state_dict(lag=k)``), gathered from every rank,
in Lightning's own checkpoint; ``Trainer.fit(..., ckpt_path=...)`` restores it, on any number
of devices. Needs the ``lightning`` package (``zephon-mixtures[lightning]``).
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Iterator

import lightning.pytorch as pl
import torch.distributed as dist

import zephon.torch as zt
from zephon.runtime import LIGHTNING_KEY

log = logging.getLogger("zephon")


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
    last training step received. ``loader`` is the loader (after ``train_dataloader()``);
    ``dm.loader.remaining()`` is what is left to read, e.g. for ``max_steps``.
    """

    def __init__(self, pipeline: Any, **loader_kwargs: Any):
        super().__init__()
        self._pipeline, self._kwargs = pipeline, loader_kwargs
        self.loader: zt.DataLoader | None = None
        self._restored: dict[str, Any] | None = None
        self._yielded = self._trained = 0  # in the running iteration

    def train_dataloader(self) -> Any:
        if self.loader is None:
            self.loader = zt.DataLoader(self._pipeline, **{**self._layout(), **self._kwargs})
            if self._restored is not None:
                self.loader.load_state_dict(self._restored)
        return _Feed(self)

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

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Count a batch the training step is about to receive."""
        if self.trainer is not None and self.trainer.training:
            self._trained += 1
        return batch

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
        for batch in loader:
            module._yielded += 1
            yield batch
        if not module._yielded and trainer is not None:  # the stream has ended: later epochs would be empty too
            log.warning("zephon: the training stream has ended before max_steps; stopping the Lightning run")
            trainer.should_stop = True

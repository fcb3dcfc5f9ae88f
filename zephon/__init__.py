"""zephon: deterministic, resumable, elastic data mixtures for training runs.

| use | for |
|---|---|
| :class:`Dataset` | a named, sharded dataset (``zephon.io``) |
| :class:`StaticMixtureWorkSource` | datasets + weights → per-lane streams of work chunks |
| :class:`WorkSource`, :class:`WorkChunk` | the source interface and its unit of work |
| :class:`Pipeline` | items (records + ``_sample_id``, ``_component``) of a source, with ``map`` steps |
| ``zephon.torch`` | the torch DataLoader, checkpoints and elastic resume (``zephon-mixtures[torch]``) |
| ``zephon.core`` | the pure functional core: ``step(state, config) -> (chunk, state')`` |
| ``zephon.testing`` | hypothesis strategies and replay assertions for your own suite |
"""
from zephon.io import Dataset
from zephon.runtime import Pipeline
from zephon.work import StaticMixtureWorkSource, WorkChunk, WorkSource

__all__ = ["Dataset", "Pipeline", "StaticMixtureWorkSource", "WorkChunk", "WorkSource"]
__version__ = "0.1.0"

"""Replay buffers (uniform ring, prioritized sum tree) and the replay sources built on them (``SOURCES``, the
table ``popjax.registry.SOURCES``: name -> SourceDef).

A new replay source is one module with a ``SourceDef`` and one line here (or ``register_source`` from a script).
"""

from popjax import registry
from popjax.buffers.prioritized import (
    PERHyperparams,
    PrioritizedBuffer,
    PrioritizedBufferState,
    SampleInfo,
    make_prioritized_buffer,
    per_hyperparams,
)
from popjax.buffers.sources import PRIORITIZED, UNIFORM, FifoView, ReplaySource, SourceDef
from popjax.buffers.uniform import (
    Buffer,
    BufferState,
    drop_oldest,
    make_uniform_buffer,
    oldest_items,
    sample_windows,
)
from popjax.registry import SOURCES

for _definition in (UNIFORM, PRIORITIZED):
    registry.add(SOURCES, _definition, "replay source")


def register_source(definition: SourceDef) -> SourceDef:
    """Adds a replay source defined outside popjax (a script, a plugin); its name must be new.

    Register it again in the process that resumes its runs."""
    return registry.add(SOURCES, definition, "replay source")


__all__ = [
    "Buffer",
    "BufferState",
    "FifoView",
    "PERHyperparams",
    "PrioritizedBuffer",
    "PrioritizedBufferState",
    "ReplaySource",
    "SOURCES",
    "SampleInfo",
    "SourceDef",
    "drop_oldest",
    "make_prioritized_buffer",
    "make_uniform_buffer",
    "oldest_items",
    "per_hyperparams",
    "register_source",
    "sample_windows",
]

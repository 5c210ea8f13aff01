from popjax.buffers.prioritized import (
    PERHyperparams,
    PrioritizedBuffer,
    PrioritizedBufferState,
    SampleInfo,
    make_prioritized_buffer,
    per_hyperparams,
)
from popjax.buffers.uniform import (
    Buffer,
    BufferState,
    drop_oldest,
    make_uniform_buffer,
    oldest_items,
    sample_windows,
)

__all__ = [
    "Buffer",
    "BufferState",
    "PERHyperparams",
    "PrioritizedBuffer",
    "PrioritizedBufferState",
    "SampleInfo",
    "drop_oldest",
    "make_prioritized_buffer",
    "make_uniform_buffer",
    "oldest_items",
    "per_hyperparams",
    "sample_windows",
]

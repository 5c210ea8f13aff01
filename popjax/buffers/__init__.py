from popjax.buffers.prioritized import (
    PERHyperparams,
    PrioritizedBuffer,
    PrioritizedBufferState,
    SampleInfo,
    make_prioritized_buffer,
    per_hyperparams,
)
from popjax.buffers.uniform import Buffer, BufferState, make_uniform_buffer, sample_windows

__all__ = [
    "Buffer",
    "BufferState",
    "PERHyperparams",
    "PrioritizedBuffer",
    "PrioritizedBufferState",
    "SampleInfo",
    "make_prioritized_buffer",
    "make_uniform_buffer",
    "per_hyperparams",
    "sample_windows",
]

from popjax.buffers.uniform import Buffer, BufferState, make_uniform_buffer

__all__ = ["Buffer", "BufferState", "make_uniform_buffer"]

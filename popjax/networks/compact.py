"""Sparse MLPs executed sparsely: each masked kernel kept as its active links only (coordinate lists).

A trained RLx2 actor stores dense kernels with zeros; for inference only the active links matter. A
``CompactLayer`` holds them as ``(inputs, outputs, values)`` index/value arrays, and ``forward`` computes
``y[o] = sum_{links l into o} x[inputs[l]] * values[l]`` with a gather and a ``segment_sum``, so the work is
proportional to the active links. Layers that are dense (density 1, e.g. the saturated output layers of the
Erdos-Renyi allocation) stay dense matrices. This is also the export format of ``popjax export``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class CompactLayer:
    """One layer: a dense ``kernel`` (``inputs``/``outputs`` None) or active links ``inputs -> outputs``.

    A pytree whose ``shape`` is static, so jitted code may take layers as arguments."""

    shape: tuple[int, int] = struct.field(pytree_node=False)
    bias: np.ndarray
    kernel: np.ndarray | None = None
    inputs: np.ndarray | None = None  # int32 [links]
    outputs: np.ndarray | None = None  # int32 [links], sorted
    values: np.ndarray | None = None  # float32 [links]


def compact_layers(kernels: Sequence[np.ndarray], biases: Sequence[np.ndarray]) -> list[CompactLayer]:
    """The layers of an MLP whose masked kernels hold exact zeros; fully dense kernels stay dense."""
    layers = []
    for kernel, bias in zip(kernels, biases, strict=True):
        kernel, bias = np.asarray(kernel, np.float32), np.asarray(bias, np.float32)
        if np.count_nonzero(kernel) == kernel.size:
            layers.append(CompactLayer(kernel.shape, bias, kernel=kernel))
            continue
        outputs, inputs = np.nonzero(kernel.T)  # sorted by output unit, then input
        layers.append(CompactLayer(kernel.shape, bias, inputs=inputs.astype(np.int32),
                                   outputs=outputs.astype(np.int32), values=kernel[inputs, outputs]))
    return layers


def layer_forward(layer: CompactLayer, x: jax.Array) -> jax.Array:
    """``x [B, inputs] -> [B, outputs]`` through one layer (no activation)."""
    if layer.kernel is not None:
        return x @ layer.kernel + layer.bias
    contributions = x[:, layer.inputs] * layer.values  # [B, links]
    summed = jax.ops.segment_sum(contributions.T, layer.outputs, num_segments=layer.shape[1],
                                 indices_are_sorted=True)
    return summed.T + layer.bias


def forward(layers: Sequence[CompactLayer], x: jax.Array, output=jnp.tanh) -> jax.Array:
    """An MLP with ReLU hidden layers and ``output`` on the last one (``tanh``: popjax's deterministic actor)."""
    for layer in layers[:-1]:
        x = jax.nn.relu(layer_forward(layer, x))
    return output(layer_forward(layers[-1], x))


def active_links(layers: Sequence[CompactLayer]) -> int:
    return sum(int(layer.kernel.size) if layer.kernel is not None else int(layer.values.size) for layer in layers)


def to_arrays(layers: Sequence[CompactLayer]) -> dict[str, np.ndarray]:
    """Flat ``{name: array}`` of the layers (an ``.npz``'s content)."""
    arrays = {}
    for i, layer in enumerate(layers):
        arrays[f"layer{i}.shape"] = np.asarray(layer.shape, np.int64)
        arrays[f"layer{i}.bias"] = layer.bias
        for field in ("kernel", "inputs", "outputs", "values"):
            value = getattr(layer, field)
            if value is not None:
                arrays[f"layer{i}.{field}"] = value
    return arrays


def from_arrays(arrays) -> list[CompactLayer]:
    """The layers ``to_arrays`` wrote."""
    layers, i = [], 0
    while f"layer{i}.shape" in arrays:
        fields = {f: np.asarray(arrays[f"layer{i}.{f}"]) for f in ("kernel", "inputs", "outputs", "values")
                  if f"layer{i}.{f}" in arrays}
        layers.append(CompactLayer(tuple(int(n) for n in arrays[f"layer{i}.shape"]),
                                   np.asarray(arrays[f"layer{i}.bias"]), **fields))
        i += 1
    return layers

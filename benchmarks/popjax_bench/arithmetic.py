"""Equal arithmetic on both sides of a speed ratio: the JAX programs and the PyTorch baselines of a study compute
their matrix products the same way (float32, TF32 or bfloat16), and the study's JSON records both sides.

``--matmul-precision`` (``popjax.precision``: default | tf32 | highest | bf16) names JAX's side;
``popjax.precision.arithmetic`` says what the device then computes (``default`` is TF32 on a GPU, float32 on a CPU),
and PyTorch is set to compute the same (``torch_call``). The record (``record``) goes into the study's payload as
``arithmetic``; the report prints it beside every ratio (``describe``) and withholds the ratios of a payload whose
sides differ (``paired``). Payloads written before the record existed: on a CPU both sides computed float32 (JAX has
no TF32 there and PyTorch's default is float32); on another device they are unknown, so not comparable.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

# popjax.precision (and so JAX) is imported where it is used: the report reads payloads without JAX.


def choice(options: Any) -> str:
    """A study's ``matmul_precision`` (``default`` for the studies that have no such option)."""
    return getattr(options, "matmul_precision", "default")


def jax_program(fn: Callable, name: str) -> Callable:
    """``fn`` traced with the matrix-product choice ``name`` (before ``jax.jit``)."""
    from popjax import precision

    return precision.apply(fn, name)


def torch_arithmetic(name: str, torch_device: str) -> str:
    """What PyTorch on ``torch_device`` must compute to match JAX under ``name`` on the same device."""
    from popjax import precision

    return precision.arithmetic(name, "gpu" if str(torch_device).startswith("cuda") else "cpu")


@contextlib.contextmanager
def torch_settings(arith: str, torch_device: str):
    """PyTorch computing matrix products in ``arith`` inside the block (the global flags are restored after):
    ``torch.set_float32_matmul_precision``, cuDNN's TF32 flag, and for ``bf16`` autocast to bfloat16."""
    import torch

    from popjax import precision

    settings = precision.torch_settings(arith)
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision(settings["float32_matmul_precision"])
    torch.backends.cudnn.allow_tf32 = settings["cudnn_allow_tf32"]
    device_type = "cuda" if str(torch_device).startswith("cuda") else "cpu"
    try:
        with (torch.autocast(device_type, dtype=torch.bfloat16) if settings["autocast"] else contextlib.nullcontext()):
            yield settings
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def torch_call(call: Callable, arith: str, torch_device: str) -> Callable:
    """``call`` run under ``torch_settings(arith, torch_device)`` at every call (studies time implementations
    interleaved, so each call sets its own arithmetic). Attributes of ``call`` are kept (``functools.wraps``)."""

    @functools.wraps(call)
    def wrapped(*args, **kwargs):
        with torch_settings(arith, torch_device):
            return call(*args, **kwargs)

    return wrapped


def record(name: str, torch_device: str | None = None) -> dict[str, Any]:
    """The payload's ``arithmetic``: the choice, what JAX and PyTorch compute (None: no PyTorch side ran), and
    PyTorch's settings."""
    from popjax import precision

    jax_side = precision.arithmetic(name)
    torch_side = None if torch_device is None else torch_arithmetic(name, torch_device)
    return {"matmul_precision": name, "jax": jax_side, "torch": torch_side,
            "torch_settings": None if torch_side is None else precision.torch_settings(torch_side)}


def sides(payload: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(jax, torch)`` arithmetic of a payload (see the module docstring for payloads without the record)."""
    found = payload.get("arithmetic")
    if found is not None:
        return found.get("jax"), found.get("torch")
    if (payload.get("machine") or {}).get("backend") == "cpu":
        return "fp32", "fp32"
    return None, None


def paired(payload: dict[str, Any]) -> bool:
    """Whether the payload's JAX and PyTorch sides computed the same arithmetic (ratios between them are fair)."""
    jax_side, torch_side = sides(payload)
    return jax_side is not None and (torch_side is None or jax_side == torch_side)


def describe(payload: dict[str, Any]) -> str:
    """One line for beside the ratios: ``arithmetic: fp32 on both sides (matmul_precision highest)``."""
    jax_side, torch_side = sides(payload)
    found = payload.get("arithmetic") or {}
    choice = f" (matmul_precision {found['matmul_precision']})" if found.get("matmul_precision") else \
        " (not recorded: a CPU computes float32 on both sides)" if jax_side else ""
    if jax_side is None:
        return "arithmetic: not recorded; ratios against PyTorch withheld (the sides may differ)"
    if torch_side is None or torch_side == jax_side:
        return f"arithmetic: {jax_side} on both sides{choice}" if torch_side else f"arithmetic: {jax_side}{choice}"
    return (f"arithmetic: JAX {jax_side}, PyTorch {torch_side}{choice}: unequal, so the ratios against PyTorch "
            "are withheld")

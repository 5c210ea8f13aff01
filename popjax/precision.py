"""The arithmetic of matrix products: one named choice (``matmul_precision``) applied to a whole compiled program.

On a GPU, JAX multiplies float32 matrices in TF32 unless told otherwise, and PyTorch in full float32: a speed
or learning comparison means something only when the arithmetic is chosen and recorded. The choices:

- ``default``: JAX's own default (TF32 on recent NVIDIA GPUs, float32 on a CPU, one bfloat16 pass on a TPU);
- ``tf32``: float32 matrices multiplied on TF32 tensor cores (``jax.default_matmul_precision("tensorfloat32")``);
  a CPU has no TF32 and computes in float32;
- ``highest``: full float32 products (``"float32"``), on every device;
- ``bf16``: the products of the learners' networks, forward and backward, take their operands rounded to bfloat16
  and accumulate in float32 (PyTorch's autocast to bfloat16 for matmuls); every other product (env physics, CEM's
  distribution update, DvD's kernel and Cholesky, evaluation) is full float32 as under ``highest``, and
  parameters, optimizer moments and every other operation stay float32. The rounding is a rewrite of the traced
  network pass (``bf16_products``), so it computes the same on a CPU as on a GPU.

A network pass is a function marked with ``network``: every ``Learner``'s ``act``, ``policy``, replay or rollout
update and hooks are marked when its ``LearnerDef`` makes it (``popjax.learners.base``), and a population learner
marks its networks' ``apply`` (``network_module``). ``apply`` wraps a whole program so that its trace uses the
choice; ``popjax.loop.Compiler`` applies it to every program a run compiles. ``arithmetic`` names what a device then
computes, which is what the speed studies record and pair with PyTorch's side (``torch_settings``).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core

MATMUL_PRECISIONS = ("default", "tf32", "highest", "bf16")
# jax.default_matmul_precision for the choices set through JAX's own option (None: leave JAX's default); under bf16
# every product outside a network pass is float32.
_JAX_SETTING = {"default": None, "tf32": "tensorfloat32", "highest": "float32", "bf16": "float32"}
# Whether the program being traced rounds its network passes (set by ``apply`` while it traces).
_ROUND_NETWORKS = contextvars.ContextVar("popjax_round_networks", default=False)
_PRODUCTS = (core.primitives.dot_general_p, core.primitives.conv_general_dilated_p)


def check(name: str) -> str:
    """``name`` when it is a known choice, else a ValueError of one line naming the allowed ones."""
    if name not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision: unknown precision {name!r} (allowed: {', '.join(MATMUL_PRECISIONS)})")
    return name


def apply(fn: Callable, name: str) -> Callable:
    """``fn`` traced with the matrix-product arithmetic ``name`` (``fn`` itself for ``default``); under ``bf16`` the
    network passes it calls (``network``) round their operands."""
    check(name)
    if name == "default":
        return fn

    @functools.wraps(fn)
    def traced(*args):
        token = _ROUND_NETWORKS.set(name == "bf16")  # read when each network pass is traced
        try:
            with jax.default_matmul_precision(_JAX_SETTING[name]):  # read when each product is traced
                return fn(*args)
        finally:
            _ROUND_NETWORKS.reset(token)

    return traced


def network(fn: Callable) -> Callable:
    """``fn`` marked as a network pass: traced inside a ``bf16`` program (``apply``), its products, and those of its
    gradient when a caller differentiates through it, take bfloat16-rounded operands; elsewhere it is ``fn``.
    Marking twice is marking once."""
    if getattr(fn, "_popjax_network", False):
        return fn

    @functools.wraps(fn)
    def scoped(*args, **kwargs):
        if not _ROUND_NETWORKS.get():
            return fn(*args, **kwargs)
        return _bf16_pass(lambda a, kw: fn(*a, **kw))(args, kwargs)

    scoped._popjax_network = True
    return scoped


class network_module:  # noqa: N801 (used like a function: ``network_module(Dense(...))``)
    """A flax module whose ``apply`` is a network pass (``network``); everything else is the module's."""

    def __init__(self, module):
        self.module = module
        self.apply = network(module.apply)

    def __getattr__(self, name: str):
        return getattr(self.module, name)


def _bf16_pass(fn: Callable) -> Callable:
    """``bf16_products(fn)`` whose gradient is ``fn``'s gradient with its products rounded the same way (the
    rewrite sees the gradient's program, as if the caller's whole program had been rewritten)."""
    call = jax.custom_vjp(bf16_products(functools.partial(_whole, fn)))

    def forward(*args):
        return bf16_products(functools.partial(_whole, lambda *a: jax.vjp(fn, *a)))(*args)

    def backward(pullback, cotangent):
        return bf16_products(lambda pull, ct: pull(ct))(pullback, cotangent)

    call.defvjp(forward, backward)
    return call


def _whole(fn: Callable, *args):
    """``fn(*args)`` traced as one pass: the network passes it calls are plain (the rewrite covers them)."""
    token = _ROUND_NETWORKS.set(False)
    try:
        return fn(*args)
    finally:
        _ROUND_NETWORKS.reset(token)


def arithmetic(name: str, platform: str | None = None) -> str:
    """What a device of ``platform`` (``cpu``, ``gpu``/``cuda``, ``tpu``; default: JAX's backend) computes float32
    matrix products in under the choice ``name``: ``fp32``, ``tf32`` or ``bf16``. For ``default`` on a GPU this
    assumes TF32 tensor cores (NVIDIA Ampere or newer, as the GPUs popjax was measured on)."""
    check(name)
    platform = {"cuda": "gpu", "rocm": "gpu"}.get(platform or jax.default_backend(), platform or jax.default_backend())
    if name == "bf16":
        return "bf16"
    if name == "highest":
        return "fp32"
    if platform == "gpu":
        return "tf32"
    if platform == "tpu" and name == "default":
        return "bf16"
    return "fp32"


def torch_settings(arith: str) -> dict[str, Any]:
    """The PyTorch settings that compute matrix products in ``arith`` (``fp32``, ``tf32`` or ``bf16``):
    ``float32_matmul_precision`` (``torch.set_float32_matmul_precision``), ``cudnn_allow_tf32``
    (``torch.backends.cudnn.allow_tf32``) and ``autocast`` (a dtype name for ``torch.autocast``, or None).
    Plain data, so that a study records it beside its figures; the benchmarks apply it."""
    if arith not in ("fp32", "tf32", "bf16"):
        raise ValueError(f"arithmetic: unknown {arith!r} (allowed: fp32, tf32, bf16)")
    return {"float32_matmul_precision": "high" if arith == "tf32" else "highest", "cudnn_allow_tf32": arith == "tf32",
            "autocast": "bfloat16" if arith == "bf16" else None}


# --- bf16: a rewrite of the traced network pass ----------------------------------------------------------------
def bf16_products(fn: Callable) -> Callable:
    """``fn`` with every float32 matrix product (``dot_general``) and convolution computed from bfloat16-rounded
    operands with float32 accumulation and a float32 result, in its own body and in every nested program
    (``scan``/``while``/``cond`` bodies, nested ``jit``, ``vmap``-ed and differentiated code: the rewrite sees
    the traced program after vmap and grad, so backward products are rewritten too)."""

    @functools.wraps(fn)
    def rewritten(*args):
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        out = core.jaxpr_as_fun(rewrite_closed(closed))(*jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(shape), out)

    return rewritten


def rewrite_closed(closed: core.ClosedJaxpr) -> core.ClosedJaxpr:
    return closed.replace(jaxpr=rewrite(closed.jaxpr))


def rewrite(jaxpr: core.Jaxpr) -> core.Jaxpr:
    """``jaxpr`` with each float32 product's operands converted to bfloat16 first (types of every variable the
    program already had are unchanged, so the rewritten body fits wherever the original one was used)."""
    eqns = []
    for eqn in jaxpr.eqns:
        eqn = eqn.replace(params={k: _rewrite_param(v) for k, v in eqn.params.items()})
        if eqn.primitive in _PRODUCTS and _float32_operands(eqn):
            converted = []
            for operand in eqn.invars[:2]:
                var = core.Var(operand.aval.update(dtype=jnp.dtype(jnp.bfloat16), weak_type=False))
                eqns.append(core.new_jaxpr_eqn([operand], [var], core.primitives.convert_element_type_p,
                                               {"new_dtype": jnp.dtype(jnp.bfloat16), "weak_type": False,
                                                "sharding": None}, core.no_effects, eqn.source_info, eqn.ctx))
                converted.append(var)
            eqn = eqn.replace(invars=converted + list(eqn.invars[2:]),
                              params={**eqn.params, "preferred_element_type": jnp.dtype(jnp.float32)})
        eqns.append(eqn)
    return jaxpr.replace(eqns=eqns)


def _float32_operands(eqn) -> bool:
    return all(getattr(v.aval, "dtype", None) == jnp.float32 for v in eqn.invars[:2]) and \
        eqn.params.get("preferred_element_type") in (None, jnp.float32)


def _rewrite_param(value):
    """A parameter holding programs (a scan body, cond branches, a nested jit) with them rewritten."""
    if isinstance(value, core.ClosedJaxpr):
        return rewrite_closed(value)
    if isinstance(value, core.Jaxpr):
        return rewrite(value)
    if isinstance(value, tuple) and any(isinstance(v, core.ClosedJaxpr | core.Jaxpr) for v in value):
        return tuple(_rewrite_param(v) for v in value)
    return value

"""Sparse dense-layer weights for RLx2 (Tan et al., ICLR 2023): masks, ER allocation, drop/grow.

Storage is "masked dense": every kernel is a dense array already holding zeros where its bool mask is
False, and the forward pass uses the kernel as it is. That keeps the dense gradient ``dL/dW`` (non-zero on
inactive links), which growing needs; computing ``W * M`` in the forward would zero it. Biases stay dense.

Every count here may be traced: members of one vmapped population may differ in sparsity and drop fraction,
so selections rank with a stable double ``argsort`` and keep ``rank < n`` instead of ``top_k`` (whose k must be
static). Ties go to the lower flat index, so a selection is a pure function of its inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from popjax.types import Key, PyTree

# --------------------------------------------------------------------------------------------- allocation


def er_densities(shapes: Sequence[tuple[int, int]], sparsity) -> jax.Array:
    """Per-layer densities ``1 - S_l`` of the Erdos-Renyi allocation (Tan et al. 2023, App. B).

    ``shapes`` are the kernels' ``(inputs, outputs)``; ``sparsity`` S (may be traced) is the fraction of all
    their weights that is masked. Layer l keeps ``k (I_l + O_l) / (I_l O_l)`` of its weights with one k for all,
    so that the total kept is ``(1 - S) sum_l I_l O_l``; a layer whose density would exceed 1 is made dense
    (with every layer tied at that maximum) and k is solved again over the rest.
    """
    fan = jnp.asarray([i + o for i, o in shapes], jnp.float32)
    size = jnp.asarray([i * o for i, o in shapes], jnp.float32)
    sparsity = jnp.asarray(sparsity, jnp.float32)
    dense = jnp.zeros(len(shapes), bool)
    for _ in shapes:  # each pass makes at least one more layer dense, or changes nothing
        k = (jnp.sum(jnp.where(dense, -sparsity * size, (1 - sparsity) * size))
             / jnp.maximum(jnp.sum(jnp.where(dense, 0.0, fan)), 1.0))
        density = jnp.where(dense, 1.0, k * fan / size)
        top = jnp.max(jnp.where(dense, -jnp.inf, density))
        dense = dense | ((density >= top) & (top > 1.0))
    k = (jnp.sum(jnp.where(dense, -sparsity * size, (1 - sparsity) * size))
         / jnp.maximum(jnp.sum(jnp.where(dense, 0.0, fan)), 1.0))
    return jnp.where(dense, 1.0, jnp.clip(k * fan / size, 0.0, 1.0))


def kept_counts(shapes: Sequence[tuple[int, int]], densities: jax.Array) -> jax.Array:
    """Active weights per layer: ``N_l - floor(S_l N_l)`` (int32), as the released RLx2 code rounds."""
    size = jnp.asarray([i * o for i, o in shapes], jnp.float32)
    masked = jnp.floor((1.0 - densities) * size)
    return (size - masked).astype(jnp.int32)


# --------------------------------------------------------------------------------------------- selection


def ranks(scores: jax.Array) -> jax.Array:
    """Rank of every entry of ``scores`` (any shape) in descending order, 0 for the largest; stable."""
    flat = scores.reshape(-1)
    order = jnp.argsort(-flat, stable=True)
    return jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32)).reshape(
        scores.shape)


def keep_largest(scores: jax.Array, count: jax.Array) -> jax.Array:
    """Bool mask of the ``count`` largest entries of ``scores`` (``count`` may be traced)."""
    return ranks(scores) < count


# --------------------------------------------------------------------------------------------- param trees


def _is_kernel(path, leaf) -> bool:
    return getattr(path[-1], "key", None) == "kernel" and jnp.ndim(leaf) == 2


def kernel_shapes(params: PyTree) -> list[tuple[int, int]]:
    """``(inputs, outputs)`` of the 2-D ``kernel`` leaves of a flax param tree in tree order: the sparse layers."""
    return [tuple(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(params) if _is_kernel(path, leaf)]


def map_kernels(fn, params: PyTree, *rest: PyTree, outputs: int = 1):
    """``fn(layer_index, kernel, *rest_leaves)`` on every sparse kernel; other leaves pass through unchanged.

    With ``outputs > 1``, ``fn`` returns that many arrays and so many trees are returned (other leaves are taken
    from ``params`` and then from ``rest`` in order, e.g. ``(params, masks)`` for ``fn -> (w, m)``).
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    others = [treedef.flatten_up_to(tree) for tree in rest]
    results, layer = [], 0
    for j, (path, leaf) in enumerate(flat):
        extra = [o[j] for o in others]
        if _is_kernel(path, leaf):
            out = fn(layer, leaf, *extra)
            layer += 1
        else:
            out = (leaf, *extra)[:outputs] if outputs > 1 else leaf
        results.append(out if outputs > 1 else (out,))
    trees = [treedef.unflatten([r[k] for r in results]) for k in range(outputs)]
    return tuple(trees) if outputs > 1 else trees[0]


def full_masks(params: PyTree) -> PyTree:
    """All-True bool masks shaped like ``params`` (biases and other leaves are never masked)."""
    return jax.tree.map(lambda x: jnp.ones(jnp.shape(x), bool), params)


def magnitude_masks(params: PyTree, counts: jax.Array) -> PyTree:
    """Masks keeping the ``counts[l]`` largest ``|w|`` of each kernel (the released RLx2 initialisation)."""
    return map_kernels(lambda i, m, w: keep_largest(jnp.abs(w), counts[i]), full_masks(params), params)


def random_masks(key: Key, params: PyTree, counts: jax.Array) -> PyTree:
    """Masks keeping ``counts[l]`` uniformly random entries of each kernel."""
    keys = jax.random.split(key, max(1, len(kernel_shapes(params))))
    return map_kernels(lambda i, m: keep_largest(jax.random.uniform(keys[i], m.shape), counts[i]),
                       full_masks(params))


def uniform_like(key: Key, tree: PyTree) -> PyTree:
    """Independent U(0, 1) draws shaped like every leaf of ``tree`` (SET's random grow scores)."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, max(1, len(leaves)))
    return treedef.unflatten([jax.random.uniform(k, jnp.shape(x)) for k, x in zip(keys, leaves, strict=False)])


def apply_masks(params: PyTree, masks: PyTree) -> PyTree:
    """``params`` with masked-out weights set to exactly 0."""
    return jax.tree.map(lambda p, m: jnp.where(m, p, jnp.zeros_like(p)), params, masks)


def active_counts(masks: PyTree) -> jax.Array:
    """Active weights per sparse kernel (int32 ``[layers]``)."""
    counts = [jnp.sum(m, dtype=jnp.int32) for path, m in jax.tree_util.tree_leaves_with_path(masks)
              if _is_kernel(path, m)]
    return jnp.stack(counts) if counts else jnp.zeros((0,), jnp.int32)


# --------------------------------------------------------------------------------------------- evolution


def drop_fraction(step, zeta0, end) -> jax.Array:
    """Cosine-annealed drop fraction ``zeta0 / 2 (1 + cos(pi t / T_end))``, 0 from ``T_end`` on."""
    step = jnp.asarray(step, jnp.float32)
    zeta = 0.5 * zeta0 * (1.0 + jnp.cos(jnp.pi * step / end))
    return jnp.where(step < end, zeta, 0.0)


def drop_and_grow(weight: jax.Array, mask: jax.Array, grow_score: jax.Array, fraction,
                  forbid_regrow: bool = False) -> tuple[jax.Array, jax.Array]:
    """One RigL step on one kernel. Returns ``(weight, mask)`` with the same number of active links.

    Drops the ``floor(n_active * fraction)`` active links of smallest ``|w|`` (ranked among active links only:
    an active weight may be exactly 0), then grows as many links with the largest ``grow_score`` among those
    not kept (RigL: the dense ``|dL/dW|``; SET: random). A link dropped and regrown in the same step keeps its
    value (as the released code); a newly grown link starts at 0. ``forbid_regrow`` excludes the just-dropped
    links from growing (the paper's Alg. 2).
    """
    n_active = jnp.sum(mask, dtype=jnp.int32)
    n_drop = jnp.floor(n_active.astype(jnp.float32) * fraction).astype(jnp.int32)
    kept = keep_largest(jnp.where(mask, jnp.abs(weight), -jnp.inf), n_active - n_drop)
    excluded = (kept | mask) if forbid_regrow else kept
    grown = keep_largest(jnp.where(excluded, -jnp.inf, grow_score), n_drop)
    new_mask = kept | grown
    weight = jnp.where(grown & ~mask, 0.0, weight)
    return jnp.where(new_mask, weight, 0.0).astype(weight.dtype), new_mask


def evolve(params: PyTree, masks: PyTree, grow_scores: PyTree, fraction, evolving: jax.Array,
           forbid_regrow: bool = False) -> tuple[PyTree, PyTree]:
    """``drop_and_grow`` on every sparse kernel whose ``evolving[l]`` is True (dense layers never evolve).

    Returns ``(params, masks)``; ``grow_scores`` is shaped like ``params``.
    """

    def layer(i, w, m, score):
        new_w, new_m = drop_and_grow(w, m, score, fraction, forbid_regrow)
        return jnp.where(evolving[i], new_w, w), jnp.where(evolving[i], new_m, m)

    return map_kernels(layer, params, masks, grow_scores, outputs=2)


# --------------------------------------------------------------------------------------------- accounting


def model_size(shapes: Sequence[tuple[int, int]], densities) -> float:
    """Active weights ``sum_l (1 - S_l) I_l O_l`` (biases not counted, as in the paper's accounting)."""
    return float(sum(d * i * o for (i, o), d in zip(shapes, np.asarray(densities, np.float64), strict=True)))


def forward_flops(shapes: Sequence[tuple[int, int]], densities) -> float:
    """One sample's forward FLOPs ``sum_l (1 - S_l)(2 I_l - 1) O_l`` (Tan et al. 2023, App. C.3)."""
    return float(sum(d * (2 * i - 1) * o for (i, o), d in zip(shapes, np.asarray(densities, np.float64),
                                                                   strict=True)))


def train_flops(actor_flops: float, q_flops: float, batch: int, policy_delay: int, kind: str) -> float:
    """Training FLOPs per iteration (App. C.3): ``critic_update + actor_update / d``.

    ``q_flops`` is ONE Q-network's forward FLOPs. TD3: critic ``B (F_A + 8 F_C)``, actor ``B (3 F_A + F_C)``;
    SAC: critic ``B (2 F_A + 8 F_C)``, actor ``B (3 F_A + 2 F_C)``.
    """
    critic, actor = {"td3": (actor_flops + 8 * q_flops, 3 * actor_flops + q_flops),
                     "sac": (2 * actor_flops + 8 * q_flops, 3 * actor_flops + 2 * q_flops)}[kind]
    return batch * (critic + actor / policy_delay)

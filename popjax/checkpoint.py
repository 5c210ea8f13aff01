"""Checkpoints of a training run (orbax-checkpoint), with fallback past corrupt ones.

A checkpoint is two items written by one orbax ``CheckpointManager`` step:
  * ``arrays``: every array leaf of the saved pytree (population state incl. replay buffers
    and hparams, the JAX env state), flattened to ``{"00000": np.ndarray, ...}`` so orbax
    only ever sees plain numpy arrays (no custom pytree nodes, no PRNG keys);
  * ``meta``: JSON with the loop counters, evaluation history, driver state and a CRC32
    per leaf, so a damaged file that still decodes is caught too.

Restoring needs a *template* of the same structure (``jax.eval_shape`` of the init
functions): the leaves are checked against its shapes and dtypes and unflattened into it.
Orbax writes each step into a temporary directory and renames it when complete, so a
process killed while saving leaves no partial step behind; a step damaged afterwards
(truncated or edited files) fails to restore or fails its checksum, and ``restore_latest``
falls back to the previous step with a warning.
"""

from __future__ import annotations

import logging
import shutil
import warnings
import zlib
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from popjax.distributed import fetch
from popjax.types import PyTree


class CheckpointWarning(UserWarning):
    """A checkpoint could not be used (it is skipped and the previous one is tried)."""


class CheckpointMismatch(ValueError):
    """A readable checkpoint whose arrays do not fit the run (another config or popjax version).

    Raised, never skipped: the checkpoint is not damaged, and it is never deleted.
    """


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1).data)


def flatten(tree: PyTree) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """Pytree -> (``{index: numpy leaf}`` without empty leaves, per-leaf signatures)."""
    arrays, sigs = {}, []
    for i, leaf in enumerate(jax.tree.leaves(tree)):
        if _is_key(leaf):
            raise TypeError("PRNG keys must not be checkpointed (derive them from the seed instead)")
        a = np.asarray(fetch(leaf))  # gathered from every process when split over several
        sigs.append({"shape": list(a.shape), "dtype": a.dtype.str, "crc32": _crc(a)})
        if a.size:  # orbax cannot store empty arrays; they are rebuilt from the signature
            arrays[f"{i:05d}"] = a
    return arrays, sigs


def unflatten(template: PyTree, arrays: dict[str, Any], sigs: list[dict[str, Any]]) -> PyTree:
    """Inverse of ``flatten`` into the structure of ``template``; checks shapes, dtypes, CRCs."""
    leaves, treedef = jax.tree.flatten(template)
    if len(leaves) != len(sigs):
        raise CheckpointMismatch(f"checkpoint has {len(sigs)} leaves, the run expects {len(leaves)}")
    out = []
    for i, (leaf, sig) in enumerate(zip(leaves, sigs, strict=True)):
        shape, dtype = tuple(sig["shape"]), np.dtype(sig["dtype"])
        if tuple(leaf.shape) != shape or np.dtype(leaf.dtype) != dtype:
            raise CheckpointMismatch(f"leaf {i}: checkpoint has {dtype}{list(shape)}, the run expects "
                             f"{np.dtype(leaf.dtype)}{list(leaf.shape)} (was the config changed?)")
        a = np.asarray(arrays[f"{i:05d}"]) if int(np.prod(shape)) else np.zeros(shape, dtype)
        if a.shape != shape or a.dtype != dtype or _crc(a) != sig["crc32"]:
            raise ValueError(f"leaf {i}: data does not match its checksum")
        out.append(a)
    return jax.tree.unflatten(treedef, out)


class Checkpointer:
    """Saves and restores ``(pytree, meta)`` pairs under ``directory/<step>``; keeps the last few."""

    def __init__(self, directory: str | Path, max_to_keep: int = 3):
        self.directory = Path(directory).absolute()
        self.max_to_keep = max_to_keep
        logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every save at INFO
        self._manager = self._open()

    def _open(self) -> ocp.CheckpointManager:
        options = ocp.CheckpointManagerOptions(max_to_keep=self.max_to_keep, create=True,
                                               enable_async_checkpointing=False)
        return ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def save(self, step: int, tree: PyTree, meta: dict[str, Any]) -> None:
        """Writes step ``step`` (synchronously: it is complete on disk when this returns)."""
        arrays, sigs = flatten(tree)
        args = ocp.args.Composite(arrays=ocp.args.StandardSave(arrays),
                                  meta=ocp.args.JsonSave({**meta, "leaves": sigs}))
        self._manager.save(step, args=args, force=True)
        self._manager.wait_until_finished()

    def restore(self, step: int, template: PyTree) -> tuple[PyTree, dict[str, Any]]:
        args = ocp.args.Composite(arrays=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
        restored = self._manager.restore(step, args=args)
        meta = dict(restored["meta"])
        tree = unflatten(template, restored["arrays"], meta.pop("leaves"))
        return tree, meta

    def latest_meta(self) -> dict[str, Any] | None:
        """The JSON meta of the newest step that reads (no arrays are loaded); None without one."""
        for step in reversed(self.steps()):
            try:
                return dict(self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
            except Exception:  # noqa: BLE001 - damaged: restore_latest reports and sets it aside
                continue
        return None

    def restore_latest(self, template: PyTree) -> tuple[int, PyTree, dict[str, Any]] | None:
        """The newest step that restores cleanly, as ``(step, tree, meta)``; None if there is none.

        Damaged steps are reported with a ``CheckpointWarning`` and set aside (renamed
        ``damaged-<step>``, never deleted), so that the resumed run can write those step numbers
        again. A step that reads cleanly but does not fit ``template`` raises
        ``CheckpointMismatch`` and nothing is moved.
        """
        for step in reversed(self.steps()):
            try:
                tree, meta = self.restore(step, template)
                return step, tree, meta
            except CheckpointMismatch:
                raise
            except Exception as err:  # noqa: BLE001 - any damage means: use the previous one
                msg = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
                warnings.warn(f"checkpoint {self.directory / str(step)} is unusable ({msg}); "
                              "falling back to the previous one", CheckpointWarning, stacklevel=2)
                self.set_aside(step)
        return None

    def set_aside(self, step: int) -> Path:
        """Renames a damaged step out of the manager's sight (``damaged-<step>[-n]``); returns its new path."""
        self._manager.close()
        source = self.directory / str(step)
        target = self.directory / f"damaged-{step}"
        n = 1
        while target.exists():
            target, n = self.directory / f"damaged-{step}-{n}", n + 1
        source.rename(target)
        self._manager = self._open()
        return target

    def damaged(self) -> list[Path]:
        """The steps set aside as damaged."""
        return sorted(self.directory.glob("damaged-*"))

    def delete(self, step: int) -> None:
        try:
            self._manager.delete(step)
        except Exception:  # noqa: BLE001 - a damaged step may not even delete cleanly
            shutil.rmtree(self.directory / str(step), ignore_errors=True)
        self._manager.close()
        self._manager = self._open()

    def close(self) -> None:
        self._manager.close()

"""Compile once: JAX's persistent compilation cache, on by default for ``train``, ``resume`` and the speed studies.

A run's programs are compiled by XLA the first time and loaded from the cache by every later run with the same
programs (same learner, shapes, options, devices, JAX version): on a GPU that is 15-30 s saved per run. The cache
lives in the user's cache folder, ``$XDG_CACHE_HOME/popjax/jax`` (``~/.cache/popjax/jax``), never inside a run
directory. ``POPJAX_COMPILE_CACHE`` (or ``--compile-cache`` on the command line) moves it to another folder or
turns it off (``off``). A cache folder that JAX's own ``JAX_COMPILATION_CACHE_DIR`` names is respected.

Thresholds: every program is stored (``MIN_COMPILE_S`` 0; JAX's default skips programs compiled in under 1 s). A
run compiles many small programs (keys, evaluation, buffer writes) besides its large ones: measured on a 2-core CPU
(TD3, ``probe:pendulum``, pop 4), a repeated run compiled 5.2-5.7x faster than the first when every program was
stored and 3.7-4.2x when only those over 0.2 s were. The folder is kept under ``MAX_BYTES`` by JAX (least
recently used entries go first).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "POPJAX_COMPILE_CACHE"
OFF = ("off", "none", "0", "false", "no")
MIN_COMPILE_S = 0.0
MAX_BYTES = 4 * 2**30


def default_folder() -> Path:
    """``$XDG_CACHE_HOME/popjax/jax``, or ``~/.cache/popjax/jax``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "popjax" / "jax"


def folder(setting: str | os.PathLike | None = None) -> Path | None:
    """The cache folder for ``setting`` (a folder, ``off``, or None: ``$POPJAX_COMPILE_CACHE``, else JAX's own
    ``JAX_COMPILATION_CACHE_DIR``, else ``default_folder()``); None when the cache is off."""
    if setting is None:
        setting = os.environ.get(ENV) or os.environ.get("JAX_COMPILATION_CACHE_DIR") or default_folder()
    if str(setting).strip().lower() in OFF:
        return None
    return Path(setting).expanduser().absolute()


def enable(setting: str | os.PathLike | None = None, run_dir: str | os.PathLike | None = None) -> Path | None:
    """Points JAX's persistent compilation cache at ``folder(setting)`` (or turns it off) for the programs compiled
    from now on in this process; returns the folder (None: off).

    Raises ValueError (one line) when the folder would be inside ``run_dir``: a run directory holds the run's own
    files only (it is copied, compared and deleted as a whole)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    path = folder(setting)
    if path is not None and run_dir is not None:
        run = Path(run_dir).expanduser().absolute()
        if path == run or run in path.parents:
            raise ValueError(f"compile_cache: {path} is inside the run directory {run}; give a folder outside it "
                             f"(allowed: a folder, or off)")
    current = jax.config.jax_compilation_cache_dir
    wanted = None if path is None else str(path)
    if wanted != current:
        compilation_cache.reset_cache()  # JAX opens its cache once per process: let it reopen at the new folder
        jax.config.update("jax_compilation_cache_dir", wanted)
    jax.config.update("jax_enable_compilation_cache", path is not None)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return path

"""Compile once: JAX's persistent compilation cache, on by default for ``train``, ``resume`` and the speed studies.

A run's programs are compiled by XLA the first time and loaded from the cache by every later run with the same
programs (same learner, shapes, options, devices, JAX version). The cache lives in the user's cache folder,
``$XDG_CACHE_HOME/popjax/jax`` (``~/.cache/popjax/jax``), never inside a run directory. ``POPJAX_COMPILE_CACHE``
(or ``--compile-cache`` on the command line) moves it to another folder or turns it off (``off``). A cache folder
the user gave JAX (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config.update``) is respected, and so are a minimum
compile time and a size limit set there; otherwise every program is stored (``MIN_COMPILE_S``) and the folder is
kept under ``MAX_BYTES`` by JAX (least recently used entries go first; see docs/gpu.md for what storing the small
programs saves). ``restoring`` gives JAX back the user's settings when ``train`` or ``resume`` returns.

A damaged entry (JAX cannot read it back) is a miss: it is removed, so that the program compiled in its place is
stored again, and one line says so.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from pathlib import Path

ENV = "POPJAX_COMPILE_CACHE"
OFF = ("off", "none", "0", "false", "no")
MIN_COMPILE_S = 0.0
MAX_BYTES = 4 * 2**30
ALLOWED = "allowed: a writable folder, or off"
# The JAX options popjax sets, with JAX's defaults: a value other than its default was set by the user.
_DIR, _ENABLED, _MIN_S, _MAX = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
                                "jax_persistent_cache_min_compile_time_secs", "jax_compilation_cache_max_size")
_JAX_DEFAULTS = {_MIN_S: 1.0, _MAX: -1}


def default_folder() -> Path:
    """``$XDG_CACHE_HOME/popjax/jax``, or ``~/.cache/popjax/jax``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "popjax" / "jax"


def folder(setting: str | os.PathLike | None = None) -> Path | None:
    """The cache folder for ``setting`` (a folder, ``off``, or None: ``$POPJAX_COMPILE_CACHE``, else the folder JAX
    was given, ``JAX_COMPILATION_CACHE_DIR`` or ``jax.config.update``, else ``default_folder()``); None when the
    cache is off."""
    setting = _setting(setting)[0]
    if str(setting).strip().lower() in OFF:
        return None
    return Path(setting).expanduser().absolute()


def _setting(setting) -> tuple[str | os.PathLike, str]:
    """The setting in force, and where it comes from as the start of a message."""
    if setting is not None:
        return setting, "compile_cache:"
    if os.environ.get(ENV):
        return os.environ[ENV], f"compile_cache: {ENV}"
    import jax

    given = jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if given:
        return given, "compile_cache: JAX's cache folder"
    return default_folder(), "compile_cache: the default folder"


def check(setting: str | os.PathLike | None = None, run_dir: str | os.PathLike | None = None) -> Path | None:
    """``folder(setting)`` when popjax can keep its cache there, else a ValueError of one line: an empty path, a
    path that is a file, a folder that cannot be written or created, a folder inside ``run_dir`` (a run directory
    holds the run's own files only: it is copied, compared and deleted as a whole). Writes nothing."""
    value, source = _setting(setting)
    if not isinstance(value, str | os.PathLike) or not str(value).strip():
        raise ValueError(f"{source} {value!r} is not a folder ({ALLOWED})")
    path = folder(value)
    if path is None:
        return None
    if run_dir is not None:
        run = Path(run_dir).expanduser().absolute()
        if path == run or run in path.parents:
            raise ValueError(f"{source} {path} is inside the run directory {run}; give a folder outside it "
                             f"(allowed: a folder, or off)")
    existing = next(p for p in (path, *path.parents) if p.exists() or p == Path(p.anchor))
    if not existing.is_dir():
        what = "is a file" if existing == path else f"cannot be created: {existing} is a file"
        raise ValueError(f"{source} {path} {what}, not a folder ({ALLOWED})")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        raise ValueError(f"{source} {path} {what} ({ALLOWED})")
    return path


def enable(setting: str | os.PathLike | None = None, run_dir: str | os.PathLike | None = None) -> Path | None:
    """Points JAX's persistent compilation cache at ``check(setting, run_dir)`` (or turns it off) for the programs
    compiled from now on in this process; returns the folder (None: off). A minimum compile time or size limit the
    user set in JAX is kept; JAX's defaults are replaced by popjax's (``MIN_COMPILE_S``, ``MAX_BYTES``)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    path = check(setting, run_dir)
    wanted = None if path is None else str(path)
    if wanted != getattr(jax.config, _DIR):
        compilation_cache.reset_cache()  # JAX opens its cache once per process: let it reopen at the new folder
        jax.config.update(_DIR, wanted)
    jax.config.update(_ENABLED, path is not None)
    for name, ours in ((_MIN_S, MIN_COMPILE_S), (_MAX, MAX_BYTES)):
        if getattr(jax.config, name) == _JAX_DEFAULTS[name]:
            jax.config.update(name, ours)
    _replace_damaged_entries()
    return path


def restoring(fn: Callable) -> Callable:
    """``fn`` that leaves JAX's cache settings as it found them (``train``, ``resume``: ``enable`` holds for the
    run only), whether it returns or raises."""

    @functools.wraps(fn)
    def restored(*args, **kwargs):
        import jax

        before = {name: getattr(jax.config, name) for name in (_DIR, _ENABLED, _MIN_S, _MAX)}
        try:
            return fn(*args, **kwargs)
        finally:
            if getattr(jax.config, _DIR) != before[_DIR]:
                from jax.experimental.compilation_cache import compilation_cache

                compilation_cache.reset_cache()
            for name, value in before.items():
                if getattr(jax.config, name) != value:
                    jax.config.update(name, value)

    return restored


# --- damaged entries ---------------------------------------------------------------------------------------------
def _replace_damaged_entries() -> None:
    """Installs (once per process) ``_read_or_miss`` in place of JAX's reader of cache entries."""
    from jax._src import compilation_cache as jax_cache

    if not getattr(jax_cache.get_executable_and_time, "_popjax", False):
        jax_cache.get_executable_and_time = _read_or_miss(jax_cache.get_executable_and_time)


def _read_or_miss(read: Callable) -> Callable:
    """JAX's reader, with a damaged entry (its reader raises) read as a miss: removed, so that JAX stores the program
    it compiles instead (it never replaces an entry that exists), with one line for the first in this process."""
    reported = []

    @functools.wraps(read)
    def read_or_miss(cache_key, compile_options, backend, executable_devices):
        from jax._src import compilation_cache as jax_cache

        try:
            return read(cache_key, compile_options, backend, executable_devices)
        except Exception as err:  # noqa: BLE001 (whatever JAX raises for an unreadable entry)
            cache = jax_cache._get_cache(backend)
            where = Path(str(getattr(cache, "path", "")))
            for suffix in ("-cache", "-atime"):
                (where / f"{cache_key}{suffix}").unlink(missing_ok=True)
            if not reported:
                reported.append(cache_key)
                warnings.warn(f"compile_cache: a damaged entry in {where} ({type(err).__name__}) was compiled again "
                              "and replaced", RuntimeWarning, stacklevel=2)
            return None, None

    read_or_miss._popjax = True
    return read_or_miss

"""Compile once (``popjax.compile_cache``): JAX's persistent compilation cache, on by default for runs, in the user's
cache folder, movable and switchable off, never inside a run directory; a repeated run loads its programs."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from rundir_helpers import TINY

import popjax
from popjax import compile_cache
from popjax.cli import main
from popjax.config import ConfigError

CACHE_HIT = "/jax/compilation_cache/cache_hits"


@pytest.fixture
def restore_suite_cache():
    """Leaves JAX's persistent cache as the suite runs it (its own folder, conftest.py) whatever the test set."""
    yield
    suite = os.environ["POPJAX_TEST_SUITE_CACHE"]  # the folder conftest.py gave (a test may have changed the rest)
    jax.config.update("jax_compilation_cache_max_size", -1)  # JAX's defaults, which popjax replaces by its own
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    compile_cache.enable(suite)
    assert jax.config.jax_compilation_cache_dir == suite


def test_the_folder_follows_xdg_the_variable_and_off(monkeypatch, tmp_path, restore_suite_cache):
    jax.config.update("jax_compilation_cache_dir", None)  # as in a process where nothing set it
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.folder() == tmp_path / "xdg" / "popjax" / "jax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.folder() == tmp_path / "home" / ".cache" / "popjax" / "jax"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax-own"))  # JAX's own setting is respected
    assert compile_cache.folder() == tmp_path / "jax-own"
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "updated"))  # and one set in Python
    assert compile_cache.folder() == tmp_path / "updated"
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "moved"))
    assert compile_cache.folder() == tmp_path / "moved"
    for off in ("off", "OFF", "0", "none"):
        monkeypatch.setenv(compile_cache.ENV, off)
        assert compile_cache.folder() is None
    assert compile_cache.folder(tmp_path / "given") == tmp_path / "given"  # an explicit setting wins


def test_a_cache_inside_the_run_directory_is_refused_and_nothing_is_written(tmp_path, capsys, restore_suite_cache):
    out = tmp_path / "run"
    refused = r"^compile_cache: .*inside the run directory .*\(allowed: a folder, or off\)$"
    with pytest.raises(ConfigError, match=refused):
        popjax.train(out_dir=out, compile_cache=out / "cache", **TINY)
    assert not out.exists()
    code = main(["train", "--env", "probe:pendulum", "--out", str(out), "--compile-cache", str(out / "sub" / "c")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "inside the run directory" in err and not out.exists()


@pytest.mark.long
def test_a_repeated_run_loads_its_programs_from_the_cache(tmp_path, compilers, restore_suite_cache):
    events: list[str] = []
    listen = lambda event, **_: events.append(event)  # noqa: E731
    jax.monitoring.register_event_listener(listen)
    cache = tmp_path / "cache"
    try:
        first = popjax.train(out_dir=tmp_path / "first", compile_cache=cache, **TINY)
        entries = sorted(p.name for p in cache.iterdir() if p.name.endswith("-cache"))  # one per program
        assert entries and events.count(CACHE_HIT) == 0  # a new folder: every program compiled and stored
        second = popjax.train(out_dir=tmp_path / "second", compile_cache=cache, **TINY)
    finally:
        jax.monitoring.unregister_event_listener(listen)
    programs = len(compilers[-1]._programs)  # the second run's: each compiled from a new function
    assert programs >= 3 and events.count(CACHE_HIT) >= programs  # each loaded, none compiled again
    assert sorted(p.name for p in cache.iterdir() if p.name.endswith("-cache")) == entries  # nothing new stored
    assert not any((tmp_path / name / "jax").exists() for name in ("first", "second"))
    for run in (first, second):  # the summary still reports what compiling cost
        assert json.loads((run.out_dir / "summary.json").read_text())["compile_s"] > 0
    assert second.summary["compile_s"] < first.summary["compile_s"]
    assert second.summary["final_returns"] == first.summary["final_returns"]  # the loaded programs compute the same


# --- issue 49: the user's settings, bad paths, damaged entries, several processes, the size limit -----------------
JAX_OPTIONS = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
               "jax_persistent_cache_min_compile_time_secs", "jax_compilation_cache_max_size")


def _jax_options() -> dict:
    return {name: getattr(jax.config, name) for name in JAX_OPTIONS}


def _entries(folder):
    return sorted(p for p in folder.iterdir() if p.name.endswith("-cache"))


def test_a_run_respects_the_users_jax_settings_and_gives_them_back(tmp_path, monkeypatch, restore_suite_cache):
    monkeypatch.delenv(compile_cache.ENV)  # nothing given to popjax: the folder JAX was given is used
    user = tmp_path / "user-cache"
    jax.config.update("jax_compilation_cache_dir", str(user))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.5)
    before = _jax_options()
    seen = []
    observe = lambda name, program: (seen.append(_jax_options()), program)[1]  # noqa: E731 (during the run)
    popjax.train(out_dir=tmp_path / "run", instrument=observe, **TINY)
    assert seen[0]["jax_compilation_cache_dir"] == str(user)
    assert seen[0]["jax_persistent_cache_min_compile_time_secs"] == 2.5  # the user's threshold, not popjax's 0
    assert seen[0]["jax_compilation_cache_max_size"] == compile_cache.MAX_BYTES  # JAX's default: popjax's limit
    assert _jax_options() == before  # all given back
    seen.clear()
    popjax.train(out_dir=tmp_path / "moved", compile_cache=tmp_path / "given", instrument=observe, **TINY)
    assert seen[0]["jax_compilation_cache_dir"] == str(tmp_path / "given") and _jax_options() == before
    with pytest.raises(ConfigError):
        popjax.train(out_dir=tmp_path / "bad", compile_cache=tmp_path / "bad" / "c", **TINY)
    assert _jax_options() == before  # also when the run is refused
    popjax.resume(tmp_path / "run", compile_cache=tmp_path / "given")
    assert _jax_options() == before


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_a_cache_path_that_is_empty_or_a_file_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, monkeypatch,
                                                                                    how, restore_suite_cache):
    monkeypatch.chdir(tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    cases = [(str(a_file), "is a file, not a folder"), (str(a_file / "sub"), f"cannot be created: {a_file} is a file")]
    if how == "flag":
        cases.append(("", "'' is not a folder"))  # an empty variable is an unset one
    for value, problem in cases:
        before = sorted(tmp_path.iterdir())
        args = ["train", "--env", "probe:pendulum", "--out", str(tmp_path / "run")]
        if how == "flag":
            args += ["--compile-cache", value]
        else:
            monkeypatch.setenv(compile_cache.ENV, value)
        code = main(args)
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.count("\n") == 0, err
        assert f"compile_cache: {'' if how == 'flag' else compile_cache.ENV + ' '}" in err and problem in err, err
        assert err.endswith("(allowed: a writable folder, or off)")
        assert sorted(tmp_path.iterdir()) == before  # no run directory, no cache entries, no lock file


def test_an_unwritable_cache_folder_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, monkeypatch,
                                                                         restore_suite_cache):
    import stat

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    if os.geteuid() == 0:  # root writes anywhere: the folder is denied to it as the mode denies it to a user
        access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: access(path, mode) and (
            not mode & os.W_OK or os.stat(path).st_mode & stat.S_IWUSR))
    for cache, problem in ((locked, f"{locked} is not writable"),
                           (locked / "cache", f"{locked / 'cache'} cannot be created: {locked} is not writable")):
        monkeypatch.setenv(compile_cache.ENV, str(cache))
        code = main(["train", "--env", "probe:pendulum", "--out", str(tmp_path / "run")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.count("\n") == 0, err
        assert f"compile_cache: {compile_cache.ENV} {problem} (allowed: a writable folder, or off)" in err, err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["locked"] and not any(locked.iterdir())


def _square_program(n):
    return jax.jit(lambda x: (x @ x.T).sum() + n)


def test_a_damaged_entry_is_a_miss_replaced_once_with_one_line(tmp_path, restore_suite_cache):
    import warnings

    cache = tmp_path / "cache"
    compile_cache.enable(cache)
    x = np.ones((3, 3), np.float32)
    assert float(_square_program(1.0)(x)) == 28.0
    (entry,) = _entries(cache)
    good = entry.read_bytes()
    entry.write_bytes(b"damaged" + good[7:-7])
    jax.clear_caches()  # forget the program in memory: the next call reads the folder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert float(_square_program(1.0)(x)) == 28.0  # compiled again: the same program, the same result
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and messages[0].startswith(f"compile_cache: a damaged entry in {cache}"), messages
    assert "replaced" in messages[0] and "\n" not in messages[0]
    assert _entries(cache) == [entry] and not entry.read_bytes().startswith(b"damaged")
    events = []
    jax.monitoring.register_event_listener(lambda event, **_: events.append(event))
    jax.clear_caches()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert float(_square_program(1.0)(x)) == 28.0
    assert not caught and CACHE_HIT in events  # the replaced entry loads


def test_the_folder_stays_under_its_size_limit(tmp_path, monkeypatch, restore_suite_cache):
    cache = tmp_path / "cache"
    compile_cache.enable(cache)
    x = np.ones((3, 3), np.float32)
    _square_program(0.5)(x)
    size = _entries(cache)[0].stat().st_size
    limit = int(2.5 * size)  # room for two such programs
    jax.config.update("jax_compilation_cache_max_size", limit)  # the user's limit is respected
    compile_cache.enable(tmp_path / "limited")
    assert jax.config.jax_compilation_cache_max_size == limit
    for n in range(6):
        _square_program(float(n))(x)
        assert sum(p.stat().st_size for p in _entries(tmp_path / "limited")) <= limit
    assert len(_entries(tmp_path / "limited")) == 2  # the least recently used went first
    jax.config.update("jax_compilation_cache_max_size", -1)


_WORKER = """
import sys
import jax
import numpy
from popjax import compile_cache
compile_cache.enable(sys.argv[1])
x = numpy.ones((3, 3), numpy.float32)
values = [float(jax.jit(lambda x, n=n: (x @ x.T).sum() + n)(x)) for n in range(8)]
assert values == [27.0 + n for n in range(8)], values
print("ok")
"""


@pytest.mark.processes
def test_several_processes_share_one_folder(tmp_path):
    import subprocess
    import sys

    cache = tmp_path / "cache"
    for _ in range(2):  # first they all compile and store at once, then they all load at once
        workers = [subprocess.Popen([sys.executable, "-c", _WORKER, str(cache)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for _ in range(4)]
        outputs = [worker.communicate(timeout=300) for worker in workers]
        for worker, (out, err) in zip(workers, outputs, strict=True):
            assert worker.returncode == 0 and out.strip() == "ok", err
            assert "compilation cache" not in err and "compile_cache" not in err, err  # no damaged or failed entry
        assert len(_entries(cache)) == 8

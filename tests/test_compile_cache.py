"""Compile once (``popjax.compile_cache``): JAX's persistent compilation cache, on by default for runs, in the user's
cache folder, movable and switchable off, never inside a run directory; a repeated run loads its programs."""

from __future__ import annotations

import json

import jax
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
    compile_cache.enable()
    assert jax.config.jax_compilation_cache_dir == str(compile_cache.folder())


def test_the_folder_follows_xdg_the_variable_and_off(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.folder() == tmp_path / "xdg" / "popjax" / "jax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.folder() == tmp_path / "home" / ".cache" / "popjax" / "jax"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax-own"))  # JAX's own setting is respected
    assert compile_cache.folder() == tmp_path / "jax-own"
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

"""A value of the wrong type, None, an empty value or a nested structure for any top-level option or driver
block is one line naming the option (exit 2 on the CLI), before presets are looked up and before anything is
written (issue 29, item 2: a mapping given for ``env`` used to end in a TypeError from the preset lookup)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import tempfile
from pathlib import Path

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

import popjax
from popjax import cli, schema
from popjax.config import MemorySize, RunConfig
from popjax.drivers import DRIVERS

FIELDS = [f.name for f in dataclasses.fields(RunConfig)]
OPTIONS = [*FIELDS, *DRIVERS]

scalars = st.one_of(st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=8))
nested = st.recursive(scalars | st.none(), lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
lists = st.lists(nested, max_size=3)  # [] included
not_a_number = st.one_of(st.booleans(), st.sampled_from(["", " ", "ten", "1,5", "[]"]))


def wrong_values(name: str):
    """Values ``name`` never accepts: None and lists everywhere; mappings where a name, number or flag is
    expected; scalars where a mapping is expected; numbers and flags where a name is expected."""
    if name in DRIVERS:
        kind = schema.AnyMapping()
    else:
        kind = schema.kind_of(schema.schema_fields(RunConfig)[name])
    always = st.one_of(st.none(), lists)
    if isinstance(kind, schema.AnyMapping):
        return always | scalars | st.dictionaries(st.integers(0, 9), nested, min_size=1, max_size=2)
    mappings = st.dictionaries(st.text(max_size=5), nested, max_size=3)  # {} included
    if isinstance(kind, schema.Number):
        return always | mappings | not_a_number
    if isinstance(kind, schema.Flag):
        return always | mappings | st.integers(-5, 5) | st.text(max_size=6)
    if isinstance(kind, MemorySize):  # a number is a size in bytes, a string may be one ("141GB")
        return always | mappings | st.booleans() | st.sampled_from(["", "ten", "1 parsec", "GB"])
    if isinstance(kind, schema.Choices):  # a list of names is its value ([] too): lists only with a non-name in them
        allowed = set(schema.Choice(kind.values).allowed())
        non_names = nested.filter(lambda v: not (isinstance(v, str) and v in allowed))
        return (st.none() | mappings | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False)
                | st.lists(non_names, min_size=1, max_size=3) | st.text(max_size=6).filter(lambda t: t not in allowed))
    return always | mappings | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False)  # names


@st.composite
def option_and_value(draw):
    name = draw(st.sampled_from(OPTIONS))
    return name, draw(wrong_values(name))


def wrong_options(test):
    """``test(option)`` with hypothesis's ``(name, wrong value)`` draws; the issue's two cases (names the preset
    lookup used to hash) are always among them."""
    test = example(("learner", ["td3"]))(test)
    test = example(("env", {"name": "probe:pendulum"}))(test)
    return settings(max_examples=60, deadline=None)(given(option_and_value())(test))


@wrong_options
def test_a_value_of_the_wrong_type_is_one_line_naming_the_option(option):
    name, value = option
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        try:
            popjax.train(out_dir=out, **{"progress": False, name: value})
        except popjax.ConfigError as err:
            line = str(err)
        else:
            raise AssertionError(f"{name}={value!r} was accepted")
        assert "\n" not in line and line.startswith(f"{name}:"), line
        assert list(Path(tmp).iterdir()) == []


@wrong_options
def test_the_cli_refuses_it_from_a_config_file_with_exit_2(option):
    name, value = option
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(yaml.safe_dump({name: value}))
        out = Path(tmp) / "run"
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = cli.main(["train", "--config", str(config), "--out", str(out)])
        err = stderr.getvalue()
        assert status == 2, err
        assert stdout.getvalue() == "" and err.count("\n") == 1 and err.startswith(f"popjax: error: {name}:"), err
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["config.yaml"]

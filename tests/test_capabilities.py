"""Capabilities are data: no learner, driver or replay source name is tested outside the registries.

What a run may combine is read from the entries (``LearnerDef``, ``DriverDef``, ``SourceDef``) when the run is built,
so a new learner, driver or source is a module and one registry line. This parses every module of the package and
fails on a comparison (``==``, ``!=``, ``in``, ``not in``) with a registered name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import popjax
from popjax.registry import DRIVERS, LEARNERS, SOURCES

PACKAGE = Path(popjax.__file__).parent
# The modules that fill the registries (a definition names itself there).
REGISTRIES = {"registry.py", "learners/__init__.py", "drivers/__init__.py", "buffers/__init__.py"}
# Option values that happen to spell a registered name; each is a module's own option, not a registry lookup.
OWN_OPTION_VALUES = {
    ("drivers/cem.py", "uniform"): "CEM's elite weighting (log or uniform)",
    ("drivers/hts.py", "pbt"): "the hts driver's population option (pbt: PBT's transformer around it)",
    ("learners/memr.py", "prioritized"): "MEMR's start_states option",
    ("learners/memr.py", "uniform"): "MEMR's start_states option",
}


def registered_names() -> set[str]:
    return set(LEARNERS) | set(DRIVERS) | set(SOURCES)


def name_tests(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of every comparison of a string constant in ``names`` (either side, or in a literal tuple,
    list or set on the right of ``in``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            items = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
            found += [(node.lineno, item.value) for item in items
                      if isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value in names]
    return found


def test_the_scan_sees_a_name_test():
    """The negative: each form of name test is found (so the package scan below can fail)."""
    source = 'a = driver == "pbt"\nb = "uniform" != buffer\nc = learner in ("td3", "other")\nd = name == "none"\n'
    assert name_tests(source, {"pbt", "uniform", "td3"}) == [(1, "pbt"), (2, "uniform"), (3, "td3")]


def test_no_registry_name_is_tested_outside_the_registries():
    names = registered_names()
    assert {"td3", "pbt", "uniform"} <= names
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in REGISTRIES:
            continue
        offenders += [f"popjax/{relative}:{line}: {name!r}" for line, name in name_tests(path.read_text(), names)
                      if (relative, name) not in OWN_OPTION_VALUES]
    assert not offenders, "registry names tested outside the registries:\n" + "\n".join(offenders)

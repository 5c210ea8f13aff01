"""popjax's layer order (docs/design.md, "Layers"): every import of every module, function-level ones included,
goes to the same or a lower layer, and the module graph has no cycle. ``import popjax`` loads neither matplotlib
nor torch, and the benchmarks are not part of the package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import popjax

PACKAGE = Path(popjax.__file__).parent

# Lowest first; a module belongs to the first entry that is it or a package above it.
LAYERS = [
    ("popjax.types", "popjax.schema", "popjax.registry", "popjax.progress", "popjax.plots", "popjax.stats",
     "popjax.precision", "popjax.compile_cache"),
    ("popjax.distributed", "popjax.population", "popjax.networks"),
    ("popjax.buffers", "popjax.envs"),
    ("popjax.config", "popjax.rundir", "popjax.checkpoint", "popjax.loggers"),
    ("popjax.learners",),
    ("popjax.drivers",),
    ("popjax.loop", "popjax.presets", "popjax.planning"),
    ("popjax.resolve", "popjax.experiment", "popjax.export", "popjax.comparison", "popjax.sweeps"),
    ("popjax.cli", "popjax.__main__", "popjax"),
]


def module_names() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = module_names()


def resolve(name: str) -> str | None:
    """The popjax module ``name`` refers to (a name inside a module resolves to the module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """Every popjax module ``module`` imports, at any depth of its code."""
    return imports_in(MODULES[module].read_text(), module)


def imports_in(source: str, module: str) -> set[str]:
    """Every popjax module the code ``source`` of ``module`` imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(resolve(n) for n in names if n.split(".")[0] == "popjax")
    found.discard(None)
    found.discard(module)
    return found


def layer(module: str) -> int:
    for index, members in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members if m != "popjax"):
            return index
    assert module == "popjax", f"{module} is in no layer: add it to LAYERS and docs/design.md"
    return len(LAYERS) - 1


GRAPH = {module: imports(module) for module in MODULES}


def test_every_import_goes_down_or_sideways():
    upward = sorted(f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
                    for m, targets in GRAPH.items() for t in targets if layer(t) > layer(m))
    assert not upward, "\n".join(upward)


def test_the_module_graph_has_no_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                return path + [module, target]
            if target not in state and (cycle := visit(target, path + [module])):
                return cycle
        state[module] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state:
            cycle = visit(module, [])
            assert cycle is None, " -> ".join(cycle[cycle.index(cycle[-1]):])


def module_level_imports(module: str) -> set[str]:
    """The popjax modules imported by ``module``'s top-level statements only (what a parser blind to
    function bodies would see)."""
    found = set()
    for node in ast.parse(MODULES[module].read_text()).body:
        found |= imports_in(ast.unparse(node), module) if isinstance(node, ast.Import | ast.ImportFrom) else set()
    return found


def test_the_graph_sees_function_level_imports():
    """A negative check of the parser: imports found only inside functions (a method's nested block in a
    snippet; ``cli`` imports ``experiment`` only in its command functions) are edges; a parser that read only
    module-level statements fails here."""
    snippet = ("import numpy\n"
               "class A:\n"
               "    def f(self):\n"
               "        if True:\n"
               "            from popjax.stats import iqm\n"
               "def g():\n"
               "    import popjax.population.tree\n")
    assert imports_in(snippet, "popjax.x") == {"popjax.stats", "popjax.population.tree"}
    assert "popjax.experiment" not in module_level_imports("popjax.cli")  # the edge is function-level only
    assert "popjax.experiment" in GRAPH["popjax.cli"]
    assert not any(m.startswith("popjax.bench") for m in MODULES)


def test_importing_popjax_loads_no_plotting_or_torch():
    code = ("import sys, popjax, popjax.cli, popjax.experiment, popjax.drivers, popjax.learners\n"
            "loaded = [m for m in ('matplotlib', 'torch') if m in sys.modules]\n"
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True)

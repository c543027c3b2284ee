"""The architecture, as rules the code keeps: packages by layer with every import pointing down, no import cycle,
no import hidden inside a function but a heavy or optional dependency's, with its reason in a comment."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "profkit"
# Each layer and the profkit layers it may import (its own modules aside), from the bottom up.
LAYERS = {
    "core": set(),
    "store": {"core"},
    "model": {"core"},
    "configs": {"core"},
    "predict": {"core", "store", "model"},
    "record": {"core", "store", "model"},
    "launch": {"core", "store", "model", "predict", "record"},
    "analyze": {"core", "store"},
    "report": {"core", "store", "analyze"},
    "api": {"core", "store", "predict", "record"},
    "cli": {"core", "store", "model", "configs", "predict", "launch", "analyze", "report"},
    "__main__": {"cli"},
    "__init__": {"api"},
}
HEAVY = ("torch", "transformers", "peft", "bitsandbytes", "deepspeed", "datasets", "accelerate")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _layer(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import in ``path``; ``from X import y`` names the
    module ``X.y`` where it is one."""
    tree = ast.parse(path.read_text())
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in inside) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
            out += [(m, node.lineno, id(node) in inside) for m in subs or [node.module]]
    return out


def _graph(include_functions: bool = True) -> dict[str, set[str]]:
    return {m: {i for i, _, fn in _imports(p) if i in MODULES and i != m and (include_functions or not fn)}
            for m, p in MODULES.items()}


def test_every_module_belongs_to_a_layer():
    assert {_layer(m) for m in MODULES} <= set(LAYERS), set(map(_layer, MODULES)) - set(LAYERS)


def test_imports_point_down_the_layers():
    wrong = [f"{m} imports {i}" for m, targets in _graph().items() for i in targets
             if _layer(i) != _layer(m) and _layer(i) not in LAYERS[_layer(m)]]
    assert not wrong, wrong


def test_no_import_cycle():
    graph, state, cycles = _graph(), {}, []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_imports_inside_functions_say_why():
    """A function-level import is allowed for a heavy or optional dependency only, and says so in a comment on
    its line or the line before."""
    silent = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        for name, line, in_function in _imports(path):
            if in_function and "#" not in lines[line - 1] and not _comment_above(lines, line - 1):
                silent.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    assert not silent, silent


def _comment_above(lines: list[str], index: int) -> bool:
    """A comment line right above ``lines[index]``, over a block of imports that shares it."""
    i = index - 1
    while i >= 0 and lines[i].strip().startswith(("import ", "from ")):
        i -= 1
    return i >= 0 and lines[i].strip().startswith("#")


@pytest.mark.parametrize("layer, forbidden", [("core", HEAVY), ("store", HEAVY), ("analyze", HEAVY)])
def test_layers_without_torch(layer, forbidden):
    found = [f"{m} imports {i}" for m, p in MODULES.items() if _layer(m) == layer
             for i, _, _ in _imports(p) if i.split(".")[0] in forbidden]
    assert not found, found


def test_only_the_command_line_imports_typer():
    found = [m for m, p in MODULES.items() if _layer(m) != "cli" and any(i.split(".")[0] == "typer"
                                                                            for i, _, _ in _imports(p))]
    assert not found, found

"""The package's architecture stays what `ls lib/reward_density` shows: subpackages whose imports point one way."""
from __future__ import annotations

import ast
from pathlib import Path

import reward_density

PACKAGE = Path(reward_density.__file__).parent
# Lowest first: a subpackage may import itself and those before it, never one after it.
LAYERS = ("data", "grpo", "rewards", "experiment", "world", "analysis", "run", "tools")


def module_name(path: Path, package: Path) -> str:
    """reward_density.grpo.loss for <package>/grpo/loss.py (a package is its __init__)."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, package: Path, modules: set[str]) -> set[str]:
    """Every module of the package a file imports, wherever the statement sits (deferred imports too)."""
    name = module_name(path, package)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            # `from . import cell_folder` imports a module; `from .loss import X` imports loss.
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m in modules and m != name}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package's own __init__ excluded: importing a child runs it)."""
    files = sorted(package.rglob("*.py"))
    modules = {module_name(path, package) for path in files}
    graph = {}
    for path in files:
        name = module_name(path, package)
        graph[name] = {m for m in imports_of(path, package, modules) if not name.startswith(m + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each import cycle found by a depth-first search, as 'a -> b -> a'."""
    state: dict[str, str] = {}
    found = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                found.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_module_sits_in_a_layered_subpackage():
    loose = [m for m in import_graph() if m != "reward_density" and layer(m) is None]
    assert not loose, f"modules outside the layered subpackages {LAYERS}: {loose}"


def test_imports_point_down_the_layers():
    wrong = [
        f"{module} imports {target} "
        f"({layer(module)} may import only {', '.join(LAYERS[:LAYERS.index(layer(module)) + 1])})"
        for module, targets in import_graph().items() if layer(module)
        for target in targets if layer(target) and LAYERS.index(layer(target)) > LAYERS.index(layer(module))
    ]
    assert not wrong, "imports pointing up the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle_between_modules():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_check_sees_a_cycle_hidden_in_a_deferred_import(tmp_path):
    package = tmp_path / "reward_density"
    (package / "grpo").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "grpo" / "__init__.py").write_text("")
    (package / "grpo" / "a.py").write_text("from .b import x\n")
    (package / "grpo" / "b.py").write_text("def f():\n    from . import a\n")
    graph = import_graph(package)
    assert graph["reward_density.grpo.a"] == {"reward_density.grpo.b"}
    assert cycles(graph) == ["reward_density.grpo.a -> reward_density.grpo.b -> reward_density.grpo.a"]

"""The import rules import-linter cannot check (docs/architecture.md): no import circles, type-only
imports included (import-linter is told to skip those), and a worker whose package and
`--help` load no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.support.processes import REPO, worker_env

PACKAGES = ("neuro", "master", "worker", "deploy", "bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(unresolved: list[str] | None = None) -> dict[str, set[str]]:
    """Module -> the project modules it imports, from every import statement anywhere in it:
    at the top, inside functions, and under `if TYPE_CHECKING:`. `unresolved` collects the
    imports of a project package that name no module of it (a lazy import left behind by a
    move fails only when its line runs)."""
    modules = {
        module_name(path): path for package in PACKAGES for path in (REPO / package).rglob("*.py")
    }
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolved against the importing package
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from a import b` imports module a.b where b is one, else a.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            graph[name].update(t for t in targets if t in modules and t != name)
            if unresolved is not None:
                unresolved += [
                    f"{name}: {t}" for t in targets
                    if t.split(".")[0] in PACKAGES and t not in modules
                ]  # fmt: skip
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_import_of_the_project_names_a_module_of_it() -> None:
    unresolved: list[str] = []
    import_graph(unresolved)
    assert unresolved == []


def test_no_module_imports_itself_through_others_not_even_for_types() -> None:
    graph = import_graph()
    assert len(graph) > 90 and sum(map(len, graph.values())) > 250  # the walk saw the tree
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_type_only_circle(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from worker.cli import x\n"
    tree = ast.parse(source)
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert "worker.cli" in imported  # ast.walk reaches under `if TYPE_CHECKING:`


def _loaded_modules(code: str) -> set[str]:
    script = f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=worker_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


def test_importing_the_worker_and_its_help_load_no_torch() -> None:
    """`neuro-worker --help`, a bad flag and `import worker` answer without torch (or ONNX
    Runtime): the engines load theirs when a policy is built."""
    heavy = {"torch", "onnxruntime", "onnx"}
    assert not heavy & _loaded_modules("import worker")
    help_run = (
        "import contextlib, io\nfrom worker.cli import worker_main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    worker_main(['--help'])"
    )
    assert not heavy & _loaded_modules(help_run)
    registry = "from worker.inference.registry import ENGINES, preferred_engine\npreferred_engine()"
    assert not heavy & _loaded_modules(registry)
    # The check sees torch when it is there: building a policy loads it.
    built = (
        "import gymnasium as gym\nfrom worker.inference.policy import build_policy\n"
        "build_policy('mlp', gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))"
    )
    assert "torch" in _loaded_modules(built)

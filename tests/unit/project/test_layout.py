"""The import contract of ghosted/ (docs/ARCHITECTURE.md): sub-packages by pipeline stage, imports one way.

Every ``import`` and ``from`` statement of every module is read from its syntax tree (also those inside
functions; relative imports resolved), so a lazy import cannot slip past. The rules:

(a) a module under ghosted/<package>/ imports only its own package or lower ones, in ``LAYERS`` order;
    ghosted/__init__.py, ghosted/__main__.py and ghosted/cli/ may import anything; nothing imports cli;
(b) no import cycle between modules;
(c) no module left flat in ghosted/ but __init__.py and __main__.py;
(d) no ghosted module imports streamlit (the app's pages do);
(e) the app (app.py and pages/, helpers included) imports from ghosted only its one backend
    (``APP_BACKEND``: ghosted.service.frontend, which names what pages use, and the session API);
(f) the app computes nothing: it imports no numeric library (``NUMERIC``), so every number it shows comes
    from the backend's typed results (``workbench``, ``comparison``, ``lessons``, ``probes``) and its pages
    only lay them out and draw them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3] / "ghosted"
LAYERS = ("core", "models", "data", "calibration", "evaluation", "operators", "recovery", "selection",
          "experiments", "grid", "service")  # lowest first: a package imports only those at or before its own place
FRONT_ENDS = ("cli",)  # above every layer; nothing below imports them
FLAT_ALLOWED = {"__init__.py", "__main__.py"}
APP_BACKEND = ("ghosted.service.frontend", "ghosted.experiments.session")  # what the app may import
NUMERIC = ("torch", "numpy", "scipy")  # what the app never imports: its numbers come from the library


def module_name(path: Path, root: Path = ROOT) -> str:
    """ghosted/recovery/fitting.py -> ghosted.recovery.fitting (a package's __init__ -> the package)."""
    parts = (root.name, *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports, anywhere in the file, as absolute dotted names.

    ``from a.b import c`` yields a.b and, when a.b.c is a module of the package, a.b.c as well (so
    ``from ghosted.recovery import fitting`` counts as importing ghosted.recovery.fitting)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..data import windows
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules of the package it imports (only names that are real modules or packages)."""
    paths = sorted(root.rglob("*.py"))
    names = {module_name(p, root) for p in paths}
    return {module_name(p, root): {m for m in imports_of(p, root) if m in names and m != module_name(p, root)}
            for p in paths}


def layer_of(module: str) -> str | None:
    """The sub-package of ``ghosted.<package>.<...>``, or None for ghosted/__init__ and __main__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS + FRONT_ENDS) else None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """(a): imports that go up the layers, or into the front ends."""
    out = []
    for module, targets in graph.items():
        source = layer_of(module)
        for target in sorted(targets):
            to = layer_of(target)
            if to in FRONT_ENDS and source in LAYERS:
                out.append(f"{module} imports the front end {target}")
            elif source in LAYERS and (to is None or to in FRONT_ENDS or LAYERS.index(to) > LAYERS.index(source)):
                out.append(f"{module} ({source}) imports {target} ({to or 'the top level'}), a higher layer")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """(b): the strongly connected components with more than one module (Tarjan), or a self-import."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_each_package_imports_only_lower_ones():
    assert layer_violations(module_graph()) == []


def test_no_import_cycle():
    assert cycles(module_graph()) == []


def test_no_module_left_flat():
    flat = {p.name for p in ROOT.glob("*.py")} - FLAT_ALLOWED
    assert not flat, f"modules left flat in ghosted/: {sorted(flat)}; move each into its sub-package"
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS + FRONT_ENDS), packages ^ set(LAYERS + FRONT_ENDS)


def test_subpackage_inits_hold_only_a_docstring():
    for layer in LAYERS:
        body = ast.parse((ROOT / layer / "__init__.py").read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), layer


def test_library_never_imports_streamlit():
    users = [module_name(p) for p in ROOT.rglob("*.py")
             if any(m.split(".")[0] == "streamlit" for m in imports_of(p))]
    assert users == []


def app_files() -> list[Path]:
    pages = ROOT.parent / "pages"
    return [ROOT.parent / "app.py", *sorted(pages.glob("*.py"))]


def backend_violations(files: list[Path]) -> list[str]:
    """(e): imports of ghosted modules other than the app's backend, in app.py and pages/."""
    out = []
    for path in files:
        for name in sorted(imports_of(path, path.parent)):
            if name.split(".")[0] == "ghosted" and not any(name == b or name.startswith(b + ".")
                                                             for b in APP_BACKEND):
                out.append(f"{path.parent.name}/{path.name} imports {name}")
    return out


def test_the_app_imports_only_its_backend():
    assert len(app_files()) > 5
    assert backend_violations(app_files()) == []


def numeric_imports(files: list[Path]) -> list[str]:
    """(f): imports of a numeric library in app.py and pages/."""
    return [f"{path.parent.name}/{path.name} imports {name}" for path in files
            for name in sorted(imports_of(path, path.parent)) if name.split(".")[0] in NUMERIC]


def test_the_app_computes_nothing():
    assert numeric_imports(app_files()) == []


def test_the_compute_rule_flags_a_numeric_import(tmp_path):
    page = tmp_path / "pages" / "x.py"
    page.parent.mkdir()
    page.write_text("import streamlit as st\ndef f():\n    import numpy as np\n    from torch import nn\n")
    assert numeric_imports([page]) == ["pages/x.py imports numpy", "pages/x.py imports torch",
                                       "pages/x.py imports torch.nn"]


def test_the_backend_rule_flags_a_library_import(tmp_path):
    page = tmp_path / "pages" / "x.py"
    page.parent.mkdir()
    page.write_text("from ghosted.service.frontend import workbench\n"
                    "def f():\n    from ghosted.recovery.fitting import recover\n")
    assert backend_violations([page]) == ["pages/x.py imports ghosted.recovery.fitting",
                                          "pages/x.py imports ghosted.recovery.fitting.recover"]


@pytest.mark.parametrize("graph, expected", [
    ({"ghosted.core.a": {"ghosted.recovery.b"}, "ghosted.recovery.b": set()}, "higher layer"),
    ({"ghosted.models.a": {"ghosted.cli.run"}, "ghosted.cli.run": set()}, "front end"),
    ({"ghosted.data.a": {"ghosted.experiments"}, "ghosted.experiments": set()}, "higher layer"),
])
def test_the_checker_flags_an_upward_import(graph, expected):
    found = layer_violations(graph)
    assert len(found) == 1 and expected in found[0]
    assert layer_violations({"ghosted.recovery.b": {"ghosted.core.a", "ghosted.recovery.c"},
                             "ghosted.cli.run": {"ghosted.experiments.run"}, "ghosted": {"ghosted.cli"}}) == []


def test_the_checker_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_are_read_inside_functions_and_relative(tmp_path):
    pkg = tmp_path / "ghosted"
    (pkg / "core").mkdir(parents=True)
    (pkg / "recovery").mkdir()
    for init in (pkg / "__init__.py", pkg / "core" / "__init__.py", pkg / "recovery" / "__init__.py"):
        init.write_text('"""x"""\n')
    (pkg / "recovery" / "fitting.py").write_text("")
    (pkg / "core" / "a.py").write_text("def f():\n    from ..recovery import fitting\n    import streamlit\n")
    assert imports_of(pkg / "core" / "a.py", pkg) >= {"ghosted.recovery.fitting", "streamlit"}
    assert layer_violations(module_graph(pkg)) == [
        "ghosted.core.a (core) imports ghosted.recovery (recovery), a higher layer",
        "ghosted.core.a (core) imports ghosted.recovery.fitting (recovery), a higher layer"]


def test_public_api_names_are_kept():
    import ghosted

    assert set(ghosted.__all__) == {
        "load", "calibrate", "influence", "select", "fit", "prune", "evaluate", "generate", "save", "run",
        "save_recovered", "load_recovered", "IllConditionedFitWarning", "NonFiniteError", "__version__"}
    missing = [name for name in ghosted.__all__ if not hasattr(ghosted, name)]
    assert missing == []


@pytest.mark.parametrize("site", ["after", "before", "branch"])
def test_operator_check_below_operators_agrees_with_operators_of(site):
    """The statistics cache asks ``has_operators`` (models/) instead of importing operators/: same answer."""
    from torch import nn

    from ghosted.models.architecture import has_operators
    from ghosted.operators.sites import PatchSite, attach_branch_operator, attach_stream_operators, operators_of
    from tests.tiny import tiny_model

    model = tiny_model("llama", layers=3)
    assert not has_operators(model) and operators_of(model) == []
    if site == "branch":
        attach_branch_operator(model, 1, nn.Identity())
    else:
        attach_stream_operators(model, PatchSite(1, before=site == "before"), [nn.Identity()])
    assert has_operators(model) and len(operators_of(model)) == 1

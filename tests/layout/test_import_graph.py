"""The package's layout: no import cycles between spice_core's modules, nothing in spice_core
imports the front end (pages, app) or the training scripts, and the pages reach the engine only
through spice_core.api (STYLE.md), which exports every type the tuner takes and returns. Function-level imports count
too: a cycle hidden inside a function is still a cycle in the design."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "spice_core"
PAGES = ROOT / "pages"
# What a page may import of the engine: the API, and its error types (plain types a handler catches).
PAGE_ENGINE_MODULES = ("spice_core.api", "spice_core.errors")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    pkg = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    return _source_imports(path.read_text(encoding="utf-8"), pkg)


def _source_imports(source: str, pkg: str) -> set[str]:
    """Every module (and module.name) imported anywhere in ``source``, relative imports resolved from ``pkg``."""
    tree = ast.parse(source)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    g = {}
    for name, path in modules.items():
        deps = set()
        for imp in _imports(path):
            # resolve to the longest known module name (a "from x import y" may name a module or a symbol)
            while imp and imp not in modules:
                imp = imp.rpartition(".")[0]
            if imp and imp != name and not name.startswith(imp + ".") and imp != "spice_core":
                deps.add(imp)
        g[name] = deps
    return g


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_spice_core_has_no_import_cycles():
    assert _cycles(graph()) == []


def test_spice_core_imports_neither_the_front_end_nor_training():
    bad = {}
    for path in PKG.rglob("*.py"):
        up = sorted(i for i in _imports(path) if i.split(".")[0] in ("pages", "app", "training", "benchmarks"))
        if up:
            bad[_module_name(path)] = up
    assert bad == {}


def _engine_imports_of_a_page(imports: set[str]) -> list[str]:
    """The spice_core modules (or names in them) among a page's ``imports`` beyond PAGE_ENGINE_MODULES; ``from
    spice_core import tuner`` names spice_core.tuner."""
    return sorted(i for i in imports if i.startswith("spice_core.")
                  and not any(i == m or i.startswith(m + ".") for m in PAGE_ENGINE_MODULES))


def test_pages_reach_the_engine_only_through_the_api():
    """Regression: pages/tuning.py imported spice_core.tuner itself (the api re-exports the tuner now)."""
    files = sorted(PAGES.rglob("*.py")) + sorted(PAGES.rglob("*.pyi"))
    assert files
    bad = {str(p.relative_to(ROOT)): up for p in files if (up := _engine_imports_of_a_page(_imports(p)))}
    assert bad == {}


def test_the_page_rule_sees_every_way_of_importing_the_tuner():
    for source in ("from spice_core import tuner", "import spice_core.tuner", "from spice_core.tuner import tune",
                   "def f():\n    from spice_core.tuned import save\n"):
        assert _engine_imports_of_a_page(_source_imports(source, "pages")), source
    allowed = "from spice_core import api\nfrom spice_core.api import tune\nfrom spice_core.errors import SpiceError\n"
    assert _engine_imports_of_a_page(_source_imports(allowed, "pages")) == []


def _spice_types(hint) -> set[type]:
    """The spice_core classes named in a resolved type hint (``Confirm | Mapping | None`` -> {Confirm})."""
    import typing

    found = {hint} if isinstance(hint, type) and hint.__module__.startswith("spice_core.") else set()
    for arg in typing.get_args(hint):
        found |= _spice_types(arg)
    return found


def test_the_api_exports_every_type_the_tuners_entry_points_take_and_return():
    """Regression: spice_core.api did not export Confirm, the confirmation sample `tune(confirm=...)` takes, so a
    page could only build one by importing spice_core.tuner, which the rule above forbids. Every spice_core type in
    the signatures of the tuner and its file is exported, and so is the vocabulary of TuneRecord.verdict."""
    import typing

    from spice_core import api, tuned, tuner

    entry_points = (tuner.tune, tuner.Tuner.__init__, tuner.Tuner.run, tuned.find, tuned.load_all, tuned.save,
                    tuned.tuned_path)
    used = set().union(*(_spice_types(h) for f in entry_points for h in typing.get_type_hints(f).values()))
    assert used >= {tuner.Budget, tuner.Confirm, tuned.TuneRecord}, used
    assert sorted(t.__name__ for t in used if getattr(api, t.__name__, None) is not t) == []
    verdicts = ("EXACT", "HELD", "FAILED", "RULED_OUT", "UNCONFIRMED", "MISSED", "WITHIN")
    assert [getattr(api, name, None) for name in verdicts] == [getattr(tuner, name) for name in verdicts]
    assert (api.CONFIRM_PROMPTS, api.DEFAULT_REPLY_TOKENS) == (tuner.CONFIRM_PROMPTS, tuner.DEFAULT_REPLY_TOKENS)

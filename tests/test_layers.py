"""The package's layers run one way. Every import of every dynspec module is read with ast, none is
run: module level, inside functions and under TYPE_CHECKING alike, relative ones resolved, each
module found through pyproject.toml's package-dir (runtime/ is dynspec.runtime, and so on).

The layers, lowest first (a module imports its own layer or a lower one, never a higher one):
    0  dynspec.errors                        (and dynspec/__init__.py, empty)
    1  dynspec.artifacts
    2  dynspec.checkpoint, dynspec.corpus, dynspec.parsers  what HF folders, the tiny pair's text
                                                             and every argparse parser share
    3  dynspec.runtime, dynspec.config       config reads runtime.serving.loop and runtime.policy, and
                                             runtime's engine setup and generate command read
                                             config, so the two are one layer
    4  dynspec.convert
    5  dynspec.build                         engine dirs: convert's manifest, runtime's policy
    6  dynspec.pairs                         the tiny and random pairs: runtime's reference model
    7  dynspec.triton_repo                   serving: build's options, runtime's executor
    8  dynspec.benchmarks                    drives all of the above
    9  dynspec.cli                           the `dynspec` command (it loads each subcommand module
                                             by name: SUBCOMMAND_MODULES, not an import statement)
so in particular runtime imports nothing from convert, build, pairs, triton_repo, benchmarks or
cli: what they share with it lives at or below it (runtime/policy/tune.py, runtime/policy/schedule_args.py,
runtime/engines/trtllm_options.py, runtime/engines/trtllm_release.py, dynspec/corpus.py,
dynspec/checkpoint/shapes.py).

No import cycle anywhere, function-level imports included: a cycle is reported as its module path,
"dynspec.a -> dynspec.b -> dynspec.a". One import style inside each package: all absolute or all
relative.

What still breaks these rules sits in files with another owner; each is named below (KNOWN_*),
with the fix, and reported by the test while it stands. A new offender fails the test; an entry
that no longer holds is reported as a warning, so its line here can go.
"""
from __future__ import annotations

import ast
import tomllib
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = (
    ("dynspec.errors",),
    ("dynspec.artifacts",),
    ("dynspec.checkpoint", "dynspec.corpus", "dynspec.parsers"),
    ("dynspec.runtime", "dynspec.config"),
    ("dynspec.convert",),
    ("dynspec.build",),
    ("dynspec.pairs",),
    ("dynspec.triton_repo",),
    ("dynspec.benchmarks",),
    ("dynspec.cli",),
)

# Imports from a lower layer to a higher one that remain, each (importer, imported): the fix.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}

# Import cycles that remain, each as its sorted set of modules: the fix.
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}

# Packages whose modules mix relative and absolute imports of the package: the fix.
KNOWN_MIXED_STYLE: dict[str, str] = {}


def modules() -> dict[str, Path]:
    """{dotted module name: file} of every module of the package, from pyproject's package-dir."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    out: dict[str, Path] = {}
    for pkg, folder in sorted(dirs.items(), key=lambda kv: -kv[0].count(".")):   # the deepest mapping wins
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if not all((base.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
                continue                                    # scripts and templates: no package of ours
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.setdefault(".".join([pkg, *parts]), path)
    return out


def imports(name: str, path: Path, known: set[str]) -> dict[str, int]:
    """{imported dynspec module: first line} of every import statement in `path`, wherever it stands.
    `from dynspec.runtime import policy` names dynspec.runtime.policy; `from .x import y` in package
    p names p.x.y when that is a module, else p.x; an import of a name inside a module names the module."""
    is_pkg = path.name == "__init__.py"
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_pkg else name.split(".")[:-1]
                here = here[:len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.setdefault(t, node.lineno)
    return out


def graph() -> dict[str, dict[str, int]]:
    mods = modules()
    return {m: imports(m, p, set(mods)) for m, p in mods.items()}


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (sorted), and modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
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
            if len(comp) > 1 or v in g.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def cycle_path(g: dict[str, dict[str, int]], comp: list[str]) -> str:
    """One cycle through the component, as 'a -> b -> c -> a': the shortest way back to its first module."""
    members, start = set(comp), comp[0]
    back: dict[str, str | None] = {start: None}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(g[v]):
            if w == start:
                path = [v]
                while back[path[-1]] is not None:
                    path.append(back[path[-1]])
                return " -> ".join(path[::-1] + [start])
            if w in members and w not in back:
                back[w] = v
                todo.append(w)
    return " -> ".join(comp + [start])


def layer_of(module: str) -> int | None:
    if module == "dynspec":                # the package's own __init__.py: empty, below everything
        return 0
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    return None


def stale(known: dict, found: set, what: str) -> None:
    for entry in sorted(set(known) - found):
        warnings.warn(f"{what} {entry} no longer holds: remove it from tests/test_layers.py", stacklevel=2)


def test_the_walker_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    f = pkg / "m.py"
    f.write_text("from dynspec.runtime import policy\nimport dynspec.errors\n\ndef f():\n"
                 "    from .n import x\n    from . import o\n    from ..q import y\n")
    known = {"dynspec.runtime", "dynspec.runtime.policy", "dynspec.errors", "a.p.n", "a.p.o", "a.q"}
    assert set(imports("a.p.m", f, known)) == {"dynspec.runtime", "dynspec.runtime.policy", "dynspec.errors",
                                                "a.p.n", "a.p.o", "a.q"}
    g = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"d": 1}, "e": {"a": 1}}
    assert cycles(g) == [["a", "b", "c"], ["d"]]
    assert cycle_path(g, ["a", "b", "c"]) == "a -> b -> c -> a"


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer_of(m) is None] == []


def test_runtime_imports_no_higher_layer():
    """runtime (and config, its layer) imports nothing from convert, build, pairs, triton_repo,
    benchmarks or cli; no module imports a higher layer than its own. KNOWN_UPWARD lists what stands."""
    g = graph()
    found = {(m, t): f"{modules()[m].relative_to(ROOT)}:{line}" for m, ts in g.items() for t, line in ts.items()
             if layer_of(t) > layer_of(m)}
    new = {k: where for k, where in found.items() if k not in KNOWN_UPWARD}
    assert not new, "imports of a higher layer:\n" + "\n".join(f"  {where}: {a} imports {b}"
                                                               for (a, b), where in sorted(new.items()))
    higher = ("dynspec.benchmarks", "dynspec.cli", "dynspec.pairs", "dynspec.convert")
    assert not [k for k in found if k[0].startswith("dynspec.runtime.") and k[1].startswith(higher)]
    for (a, b), where in sorted(found.items()):
        warnings.warn(f"known upward import {where}: {a} imports {b}; fix: {KNOWN_UPWARD[(a, b)]}", stacklevel=1)
    stale(KNOWN_UPWARD, set(found), "KNOWN_UPWARD entry")


def test_no_import_cycles():
    """No cycle, through function-level and TYPE_CHECKING imports too. KNOWN_CYCLES lists what stands:
    a known cycle must not grow (its modules are matched exactly)."""
    g = graph()
    found = {tuple(c): cycle_path(g, c) for c in cycles(g)}
    new = [path for comp, path in found.items() if comp not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(f"  {p}" for p in new)
    for comp, path in sorted(found.items()):
        warnings.warn(f"known import cycle {path}; fix: {KNOWN_CYCLES[comp]}", stacklevel=1)
    stale(KNOWN_CYCLES, set(found), "KNOWN_CYCLES entry")


def test_one_import_style_inside_each_package():
    """Inside one package, its own modules are imported either all absolutely or all relatively."""
    styles: dict[str, dict[str, set[str]]] = {}
    for name, path in modules().items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                styles.setdefault(pkg, {}).setdefault("relative", set()).add(name)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(pkg + "."):
                styles.setdefault(pkg, {}).setdefault("absolute", set()).add(name)
    mixed = {pkg: s for pkg, s in styles.items() if len(s) > 1}
    new = {pkg: s for pkg, s in mixed.items() if pkg not in KNOWN_MIXED_STYLE}
    assert not new, "packages with both import styles:\n" + "\n".join(
        f"  {pkg}: relative in {sorted(s['relative'])}" for pkg, s in sorted(new.items()))
    for pkg in sorted(mixed):
        warnings.warn(f"known mixed import style in {pkg}; fix: {KNOWN_MIXED_STYLE[pkg]}", stacklevel=1)
    stale(KNOWN_MIXED_STYLE, set(mixed), "KNOWN_MIXED_STYLE entry")

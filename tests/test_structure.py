"""The packages' structure: no import cycle, and no module importing another module's private
name. Read from the source (every import statement, at module level or inside a function, and
under ``TYPE_CHECKING`` too), so an import moved into a function to dodge a cycle still counts.

Checked for ``clkernels``, ``pyclad`` and ``solvers``. Attributes too: ``obj._name`` (``obj`` not
``self`` or ``cls``) must name something the same module defines (a function, a class or an
attribute it assigns); reaching another module's object by a private name is an error."""
import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("clkernels", "pyclad", "solvers")


def modules(package):
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return found


def imports(name, path, known):
    """(imported module, the names taken from it) for each import of ``name`` (at ``path``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in known:       # a submodule
                    yield f"{target}.{alias.name}", []
                elif target in known:
                    yield target, [alias.name]


def graph(packages):
    known = {}
    for p in packages:
        known.update(modules(p))
    edges = {m: set() for m in known}
    private = []
    for name, path in known.items():
        for target, names in imports(name, path, known):
            if target != name:
                edges[name].add(target)
            private += [f"{name} imports {target}.{n}" for n in names
                        if n.startswith("_") and not n.startswith("__") and target != name]
    return edges, private


# namedtuple's public API, spelled with an underscore so as not to clash with field names.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}
# Other projects' underscored names that are their only way to something, each with why.
THIRD_PARTY_API = {
    # torch.Tensor's version counter: the one way to tell that a tensor changed in place
    # (clkernels.interop reads an index table from the GPU once per tensor and version).
    "_version",
    # os._exit: the standard library's documented exit without the interpreter's teardown
    # (solvers.split.cli.exit_process).
    "_exit",
}


def private_reaches(packages):
    """``module:line reaches obj._name`` for each private attribute a module takes from an object
    of another module (its name defined nowhere in the module that reads it)."""
    found = []
    for p in packages:
        for name, path in modules(p).items():
            tree = ast.parse(path.read_text(), str(path))
            own = set()
            for n in ast.walk(tree):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    own.add(n.name)
                elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                    own.add(n.attr)
                elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    own.add(n.id)
            for n in ast.walk(tree):
                if (isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
                        and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
                        and n.attr not in own and n.attr not in NAMEDTUPLE_API | THIRD_PARTY_API):
                    found.append(f"{name}:{n.lineno} reaches {ast.unparse(n)}")
    return found


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_and_no_private_import(package):
    edges, private = graph([package])
    assert cycles(edges) == []
    assert private == []
    assert private_reaches([package]) == []


def test_the_checks_find_a_cycle_and_a_private_import(tmp_path, monkeypatch):
    # The checker itself, on a made-up package: a -> b -> a, and b taking a's private name.
    pkg = tmp_path / "made_up"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("from .a import _hidden\n\ndef g():\n    pass\n")
    # c reaches a's object by a private name; its own private attribute and namedtuple's API pass.
    (pkg / "c.py").write_text("def h(state, t):\n    state._step()\n    state._mine = 1\n"
                              "    t._replace(x=1)\n    return state._mine\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    edges, private = graph(["made_up"])
    assert cycles(edges) == [["made_up.a", "made_up.b"]]
    assert private == ["made_up.b imports made_up.a._hidden"]
    assert private_reaches(["made_up"]) == ["made_up.c:2 reaches state._step"]


def public_classes(packages):
    """{class name: [module, ...]} of every public class (a name without a leading underscore)
    defined at module level in the packages."""
    found = {}
    for p in packages:
        for name, path in modules(p).items():
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    found.setdefault(node.name, []).append(name)
    return found


def test_no_two_public_classes_share_a_name():
    """One name, one class across clkernels, pyclad and solvers (a reader of ``Options`` or
    ``Problem`` knows which is meant)."""
    twice = {k: v for k, v in public_classes(PACKAGES).items() if len(v) > 1}
    assert not twice, f"public classes defined more than once: {twice}"

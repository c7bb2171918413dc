"""Inside engine: no import circle (imports inside functions count), and no module importing a higher floor."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A module may import its own floor and those below; its longest matching prefix names its floor
# (a prefix covers a module and everything inside it; "engine" alone is the package's own __init__).
FLOORS = (
    ("base", ("engine", "engine.errors", "engine.fsutil", "engine.registry", "engine.jobs", "engine.cpu",
              "engine.provenance", "engine.options", "engine.weightfiles")),
    ("targets", ("engine.targets",)),
    ("format", ("engine.format",)),
    ("generate", ("engine.generate",)),
    ("algos", ("engine.algos",)),
    ("serving", ("engine.serve", "engine.llamacpp")),
    ("data", ("engine.data",)),
    ("training", ("engine.train", "engine.convert")),
    ("measure", ("engine.measure",)),
    ("recipes", ("engine.recipes",)),
    ("commands", ("engine.commands", "engine.cli", "engine.__main__")),
)


def engine_modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    mods = {}
    for path in (root / "engine").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def _imported_names(node: ast.AST, package: str) -> list[str]:
    """Dotted names an import statement may bind (`from a import b` may be module a.b or a name in a)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [module, *(f"{module}.{a.name}" for a in node.names)]


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the engine modules it imports anywhere in its file (top level, functions, TYPE_CHECKING)."""
    mods = engine_modules(root)

    def known(name: str) -> str | None:  # the longest module prefix of a dotted name
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, (path, is_pkg) in mods.items():
        package = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _imported_names(node, package):
                target = known(name) if name.split(".")[0] == "engine" else None
                if target and target != mod and not mod.startswith(target + "."):  # a package above: not an edge
                    graph[mod].add(target)
    for mod, loaded in importlib_edges(root).items():  # imports the ast cannot see as such
        graph[mod] |= loaded & set(mods)
    return graph


def importlib_edges(root: Path = ROOT) -> dict[str, set[str]]:
    """engine.cli loads the command modules named in its COMMANDS table through importlib: those edges."""
    tree = ast.parse((root / "engine" / "cli.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign)
                                                                       else None)
        if isinstance(target, ast.Name) and target.id == "COMMANDS":
            table = ast.literal_eval(node.value)
            return {"engine.cli": {f"engine.commands.{module}" for module, _help in table.values()}}
    raise AssertionError("engine/cli.py has no COMMANDS table: teach importlib_edges how it loads commands")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def floor_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, floor)
    for level, (_name, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != "engine"
            if (module == prefix or inside) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), level)
    return best[1] if best else None


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_engine():
    found = circles(import_graph())
    assert not found, "import circles (imports inside functions count):\n" + "\n".join(" ".join(c) for c in found)


def test_the_command_modules_cli_loads_through_importlib_are_edges(tmp_path):
    """A command module importing engine.cli closes a loop the import statements alone do not show."""
    edges = importlib_edges()["engine.cli"]
    assert {"engine.commands.train", "engine.commands.data", "engine.commands.recipe"} <= edges
    assert "engine.commands.train" in import_graph()["engine.cli"]
    looped = {**import_graph(), "engine.commands.train": import_graph()["engine.commands.train"] | {"engine.cli"}}
    assert ["engine.cli", "engine.commands.train"] in circles(looped)  # as commands/train.py once did


def test_standard_library_only_modules_are_imported_at_the_top():
    """errors, fsutil, jobs and cpu pull in nothing heavy: importing them inside a function hides a dependency."""
    light = {"engine.errors", "engine.fsutil", "engine.jobs", "engine.cpu"}
    bad = []
    for mod, (path, _) in sorted(engine_modules().items()):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    names = _imported_names(node, mod) if isinstance(node, (ast.Import, ast.ImportFrom)) else []
                    if set(names) & light:
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {fn.name}")
    assert not bad, "import these at the top of the file:\n" + "\n".join(bad)


MAX_PARAMETERS = 8


def engine_functions(root: Path = ROOT):
    """(where, name, parameters other than self/cls) of every function in engine/."""
    for path in sorted((root / "engine").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs) if p.arg not in ("self", "cls")]
                yield f"{path.relative_to(root).as_posix()}:{node.lineno}", node.name, len(params)


def test_no_engine_function_takes_more_than_eight_parameters():
    """A verb takes its options model plus a few collaborators; more parameters means a model is missing."""
    over = sorted(f"{where} {name} ({n})" for where, name, n in engine_functions() if n > MAX_PARAMETERS)
    assert not over, "functions over 8 parameters (pass an options model):\n" + "\n".join(over)


def test_every_engine_module_has_a_floor():
    missing = sorted(m for m in engine_modules() if floor_of(m) is None)
    assert not missing, f"declare the floor of {missing} in FLOORS"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a (floor) imports b (higher floor)' for every edge of the graph that climbs."""
    bad = []
    for mod, targets in sorted(graph.items()):
        level = floor_of(mod)
        for target in sorted(targets):
            if level is not None and (floor_of(target) is None or floor_of(target) > level):
                above = FLOORS[floor_of(target)][0] if floor_of(target) is not None else "no floor"
                bad.append(f"{mod} ({FLOORS[level][0]}) imports {target} ({above})")
    return bad


def test_no_module_imports_a_higher_floor():
    bad = upward_imports(import_graph())
    assert not bad, "imports going up a floor:\n" + "\n".join(bad)


def test_an_upward_import_between_core_packages_is_found():
    """The core packages have floors of their own: targets under format, generate under the algorithms (the two
    upward imports this house once had)."""
    graph = import_graph()
    for low, high in (("engine.targets.verifier", "engine.format.checkpoint"),
                      ("engine.generate.prompt", "engine.algos.loading"),
                      ("engine.algos.loading", "engine.data.store.files")):
        climbed = {**graph, low: graph[low] | {high}}
        assert upward_imports(climbed) == [f"{low} ({FLOORS[floor_of(low)][0]}) imports {high} "
                                           f"({FLOORS[floor_of(high)][0]})"]



def test_batching_draft_loading_and_validation_sit_on_their_floors():
    """Batching beside the algorithms that use it, draft loading beside the registry, validation registering
    nothing (whoever needs the registry fills it: the CLI, the app, the tests' conftest)."""
    graph = import_graph()
    trains = [m for m in graph if m.startswith("engine.algos.") and m.endswith(".train")]
    assert trains and all("engine.algos.common.batching" in graph[m] for m in trains), trains
    assert not [m for m in trains if any(t.startswith("engine.train") for t in graph[m])]
    assert not [t for t in graph if t.startswith("engine.generate") and any(u.startswith("engine.algos")
                                                                          for u in graph[t])]
    assert not [t for t in graph["engine.format.validate"] if t.startswith("engine.algos")]


def test_the_readme_floor_table_is_the_floors():
    """README's layout table names every floor, in order, with each of its modules (and no other)."""
    rows = [line.split("|")[1:3] for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| floor")]
    table = {name.strip(): cell for name, cell in rows if name.strip() in dict(FLOORS)}
    assert list(table) == [name for name, _ in FLOORS], "README's floor table: rows missing or out of order"
    for name, prefixes in FLOORS:
        listed = {m.strip("`/ ") for m in re.sub(r"\(.*?\)", "", table[name]).split(", ")}  # (submodules) aside
        declared = {p.removeprefix("engine.").replace(".", "/") for p in prefixes if p != "engine"}
        declared = {"cli.py" if d == "cli" else "__main__.py" if d == "__main__" else d for d in declared}
        assert listed == declared, f"README's {name} row lists {sorted(listed)}, FLOORS has {sorted(declared)}"

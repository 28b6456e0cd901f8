"""Check flashtune's import structure against its layers (see ARCHITECTURE.md).

    python scripts/check_layers.py            # report; exit 1 when (a)-(d) find anything
    python scripts/check_layers.py --json     # the same, machine-readable

Every module under src/flashtune is parsed with `ast` (nothing is imported) and mapped to a
layer, top to bottom:

    cli       the package root and the `flashtune` command with its sub-commands
    features  bench, report, capture, apply, serve
    models    model code built from the ops (flashtune.models: the end-to-end decoder)
    ops       the kernels and their public functions
    core      tune (the autotuner) and schema
    base      data, platform, timing, env, model shapes, the bundled dataset, FlashInfer's
              name table (flashinfer_names)

Reported:
  (a) private names used across modules: `from m import _x`, `m._x` on an imported module,
      or a private module imported from outside its package. An op family's package
      (`flashtune.ops.<family>`, `flashtune.ops.attention.<job>`) is one unit: its modules
      (kernels, launch, plan, ...) share private names, nothing outside it may use them;
  (b) upward imports: a module importing from a layer above its own;
  (c) import cycles (function-level imports count: they run too; `if TYPE_CHECKING:` ones
      do not);
  (d) modules loaded by string: importlib.import_module / __import__ / find_spec /
      run_module / a forkserver preload list / a package walk, naming flashtune modules
      (a package walking its own `__path__` to find its own modules is not a dodge and is
      allowed);
  (e) source files over 800 lines: a warning, never a failure. A module is split by job
      (an op family's package has one module per job), not by size.

The package root's dunder constants (`from flashtune import __version__`) are not edges:
the root defines them before it imports anything.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

PACKAGE = "flashtune"
SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 800


# The root's submodules under FlashInfer's names (flashtune.decode, ...): the root's layer.
def _facade_names() -> tuple[str, ...]:
    """FlashInfer's submodules flashtune serves (flashtune.<name> facades): the keys of
    flashinfer_names.TOP_LEVEL, read from its source (plain data; nothing is imported)."""
    path = Path(__file__).resolve().parents[1] / "src" / "flashtune" / "flashinfer_names.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "TOP_LEVEL":
            assert node.value is not None
            return tuple(ast.literal_eval(node.value))
    raise SystemExit(f"no TOP_LEVEL table in {path}")


FACADES = tuple(f"flashtune.{name}" for name in _facade_names())

# Top to bottom. A module belongs to the layer of the longest prefix naming it ("flashtune"
# itself names only the package root).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cli", ("flashtune", "flashtune.cli", *FACADES)),
    (
        "features",
        (
            "flashtune.bench",
            "flashtune.report",
            "flashtune.capture",
            "flashtune.apply",
            "flashtune.serve",
        ),
    ),
    ("models", ("flashtune.models",)),
    ("ops", ("flashtune.ops",)),
    ("core", ("flashtune.tune", "flashtune.schema")),
    (
        "base",
        (
            "flashtune.data",
            "flashtune.platform",
            "flashtune.timing",
            "flashtune.env",
            "flashtune.switches",
            "flashtune.model_shapes",
            "flashtune.dataset",
            "flashtune.flashinfer_names",
        ),
    ),
)
LAYER_NAMES = tuple(name for name, _ in LAYERS)

# Calls that import the module named by their first argument (or, for a preload, by each
# string of a list).
_DYNAMIC_IMPORTS = {"import_module", "__import__", "find_spec", "run_module"}
_PRELOADS = {"set_forkserver_preload"}
_WALKS = {"walk_packages", "iter_modules"}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Finding:
    check: str  # private | upward | cycle | by_string | too_long
    module: str  # the module the finding is about (for a cycle: its first member)
    path: str  # relative to the repository root
    line: int
    message: str
    members: tuple[str, ...] = ()  # a cycle's modules


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)  # modules no layer names

    def of(self, check: str) -> list[Finding]:
        return [f for f in self.findings if f.check == check]


@dataclass(frozen=True)
class _Edge:
    source: str
    target: str
    line: int
    lazy: bool  # inside a function
    type_only: bool  # under `if TYPE_CHECKING:`
    names: tuple[str, ...]  # the names a from-import takes


# --------------------------------------------------------------------------- discovery


def discover(src: Path = SRC) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        modules[name] = Module(name, path, is_package)
    return modules


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact_only = prefix == PACKAGE
            if module == prefix or (not exact_only and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


def _resolve(name: str, modules: dict[str, Module]) -> str | None:
    """The flashtune module an import of `name` loads: itself, else its longest existing
    prefix (an attribute path such as flashtune.cli.app)."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


# --------------------------------------------------------------------------- parsing


class _Visitor(ast.NodeVisitor):
    """Collects one module's imports (with context) and dynamic-import calls."""

    def __init__(self, module: Module, modules: dict[str, Module]) -> None:
        self.module = module
        self.modules = modules
        self.edges: list[_Edge] = []
        self.aliases: dict[str, str] = {}  # local name -> flashtune module it refers to
        self.private_imports: list[tuple[int, str, str]] = []  # (line, target, name)
        self.private_modules: list[tuple[int, str]] = []  # (line, module)
        self.dynamic: list[tuple[int, str]] = []  # (line, message)
        self.strings: list[tuple[int, str]] = []  # string constants naming flashtune modules
        self._depth = 0
        self._type_checking = 0

    # -- context
    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        is_tc = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )
        if is_tc:
            self._type_checking += 1
            for stmt in node.body:
                self.visit(stmt)
            self._type_checking -= 1
            for stmt in node.orelse:
                self.visit(stmt)
        else:
            self.generic_visit(node)

    # -- imports
    def _edge(self, target: str, line: int, names: tuple[str, ...] = ()) -> None:
        self.edges.append(
            _Edge(
                self.module.name,
                target,
                line,
                lazy=self._depth > 0,
                type_only=self._type_checking > 0,
                names=names,
            )
        )
        self._check_private_module(target, line)

    def _check_private_module(self, target: str, line: int) -> None:
        parts = target.split(".")
        for i, part in enumerate(parts):
            if _is_private(part):
                parent = ".".join(parts[:i])
                inside = self.module.name == parent or self.module.name.startswith(parent + ".")
                if not inside:
                    self.private_modules.append((line, target))
                return

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            target = _resolve(alias.name, self.modules)
            if target is None:
                continue
            self._edge(target, node.lineno)
            if alias.asname:
                self.aliases[alias.asname] = target
            else:
                self.aliases.setdefault(alias.name.split(".")[0], alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._absolute(node)
        if base is None:
            return
        if _resolve(base, self.modules) is None:
            return
        plain: list[str] = []
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in self.modules:  # `from pkg import module`
                self._edge(submodule, node.lineno)
                self.aliases[alias.asname or alias.name] = submodule
            else:
                plain.append(alias.name)
        if plain:
            target = _resolve(base, self.modules)
            assert target is not None
            if target == PACKAGE and all(_is_dunder(n) for n in plain):
                return  # the root's constants: not an edge (see the module docstring)
            self._edge(target, node.lineno, tuple(plain))
            for name in plain:
                if (
                    _is_private(name)
                    and target != self.module.name
                    and not _same_family(self.module.name, target, self.modules)
                ):
                    self.private_imports.append((node.lineno, target, name))

    def _absolute(self, node: ast.ImportFrom) -> str | None:
        if node.level == 0:
            return node.module
        package = self.module.package.split(".")
        if node.level > 1:
            package = package[: len(package) - (node.level - 1)]
        return ".".join([*package, node.module] if node.module else package)

    # -- dynamic imports and strings
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = (
            func.id
            if isinstance(func, ast.Name)
            else func.attr
            if isinstance(func, ast.Attribute)
            else ""
        )
        if name == "getLogger":
            return  # a logger's name ("flashtune.apply") is not a module to load
        if name in _DYNAMIC_IMPORTS | _PRELOADS and node.args:
            named = self._flashtune_strings(node.args[0])
            if named:
                self.dynamic.append((node.lineno, f"{name}() of {', '.join(named)}"))
            elif not _is_constant(node.args[0]):
                self.dynamic.append((node.lineno, f"{name}() of a computed name"))
        elif name in _WALKS:
            walked = self._walked_package(node)
            if walked is not None:
                self.dynamic.append((node.lineno, f"{name}() over {walked}"))
        self.generic_visit(node)

    def _flashtune_strings(self, node: ast.AST) -> list[str]:
        found = []
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                if sub.value == PACKAGE or sub.value.startswith(PACKAGE + "."):
                    found.append(repr(sub.value))
        return found

    def _walked_package(self, node: ast.Call) -> str | None:
        """The flashtune package a walk covers, unless it is this package's own __path__."""
        if not node.args:
            return None
        arg = node.args[0]
        if isinstance(arg, ast.Name) and arg.id == "__path__":
            return None  # a package finding its own modules
        text = ast.unparse(arg)
        if PACKAGE in text or any(text.startswith(a + ".") for a in self.aliases):
            return text
        return None

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, str) and value.startswith(PACKAGE + "."):
            head = value.split(":")[0]
            if _resolve(head, self.modules) is not None and " " not in head:
                self.strings.append((node.lineno, value))


# Packages whose sub-packages are op families (one unit for private names).
FAMILY_PARENTS = ("flashtune.ops", "flashtune.ops.attention")


def family_of(module: str, modules: dict[str, Module]) -> str | None:
    """The op-family package `module` belongs to (None: not inside one)."""
    for parent in sorted(FAMILY_PARENTS, key=len, reverse=True):
        if not module.startswith(parent + "."):
            continue
        family = f"{parent}.{module[len(parent) + 1 :].split('.')[0]}"
        if family in modules and modules[family].is_package and family not in FAMILY_PARENTS:
            return family
    return None


def _same_family(a: str, b: str, modules: dict[str, Module]) -> bool:
    family = family_of(a, modules)
    return family is not None and family == family_of(b, modules)


def _is_constant(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant)


def _private_attributes(
    tree: ast.AST, aliases: dict[str, str], own: str, modules: dict[str, Module]
) -> Iterator[tuple[int, str]]:
    """`alias._name` where alias is an imported flashtune module (or a dotted chain of them)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
            continue
        chain = _dotted(node.value)
        if chain is None:
            continue
        head, _, rest = chain.partition(".")
        if head not in aliases:
            continue
        module = aliases[head] + (f".{rest}" if rest else "")
        if module != own and not _same_family(own, module, modules):
            yield node.lineno, f"{module}.{node.attr}"


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


# --------------------------------------------------------------------------- checks


def check(src: Path = SRC) -> Report:
    modules = discover(src)
    root = src.parent
    report = Report()
    edges: list[_Edge] = []
    for module in modules.values():
        text = module.path.read_text(encoding="utf-8")
        rel = str(module.path.relative_to(root))
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if lines > MAX_LINES:
            report.findings.append(
                Finding("too_long", module.name, rel, 0, f"{lines} lines (limit {MAX_LINES})")
            )
        if layer_of(module.name) is None:
            report.unmapped.append(module.name)
        tree = ast.parse(text, filename=str(module.path))
        visitor = _Visitor(module, modules)
        visitor.visit(tree)
        edges += visitor.edges
        for line, target, name in visitor.private_imports:
            report.findings.append(
                Finding("private", module.name, rel, line, f"imports {name} from {target}")
            )
        for line, target in visitor.private_modules:
            report.findings.append(
                Finding("private", module.name, rel, line, f"imports private module {target}")
            )
        module_aliases = {k: v for k, v in visitor.aliases.items() if v in modules}
        for line, dotted in _private_attributes(tree, module_aliases, module.name, modules):
            report.findings.append(Finding("private", module.name, rel, line, f"uses {dotted}"))
        for line, message in visitor.dynamic:
            if "computed name" in message and not visitor.strings:
                continue  # a generic loader (user entry points, peers): no flashtune string
            if "computed name" in message:
                names = ", ".join(sorted({repr(s) for _, s in visitor.strings})[:4])
                message += f" (the module names flashtune modules by string: {names})"
            report.findings.append(Finding("by_string", module.name, rel, line, message))
        for edge in visitor.edges:
            source_layer, target_layer = layer_of(edge.source), layer_of(edge.target)
            if source_layer is None or target_layer is None:
                continue
            if target_layer < source_layer:
                what = f"imports {edge.target} ({LAYER_NAMES[target_layer]})"
                where = "in a function" if edge.lazy else "at module level"
                report.findings.append(
                    Finding(
                        "upward",
                        module.name,
                        rel,
                        edge.line,
                        f"{what} from layer {LAYER_NAMES[source_layer]}, {where}",
                    )
                )
    report.findings += _cycles(edges, modules, root)
    return report


def _cycles(edges: list[_Edge], modules: dict[str, Module], root: Path) -> list[Finding]:
    graph: dict[str, set[str]] = {m: set() for m in modules}
    first_line: dict[tuple[str, str], int] = {}
    for e in edges:
        if e.type_only or e.source == e.target:
            continue
        graph[e.source].add(e.target)
        first_line.setdefault((e.source, e.target), e.line)
    findings = []
    for component in _strongly_connected(graph):
        if len(component) < 2:
            continue
        members = tuple(sorted(component))
        path = _cycle_path(graph, members)
        steps = " -> ".join(path)
        head = modules[path[0]]
        findings.append(
            Finding(
                "cycle",
                path[0],
                str(head.path.relative_to(root)),
                first_line.get((path[0], path[1]), 0),
                f"import cycle: {steps}",
                members,
            )
        )
    return findings


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (the graph is small, but recursion limits are not)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components


def _cycle_path(graph: dict[str, set[str]], members: tuple[str, ...]) -> list[str]:
    """One concrete cycle through the component's first member (breadth-first)."""
    start, allowed = members[0], set(members)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & allowed):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if child not in previous:
                    previous[child] = node
                    nxt.append(child)
        frontier = nxt
    return [start, start]


# --------------------------------------------------------------------------- output

TITLES = {
    "private": "(a) private names used across modules",
    "upward": "(b) upward imports",
    "cycle": "(c) import cycles",
    "by_string": "(d) modules loaded by string",
    "too_long": f"(e) files over {MAX_LINES} lines (a warning, not a failure)",
}
FAILING = ("private", "upward", "cycle", "by_string")


def format_report(report: Report) -> str:
    out = []
    for check_name, title in TITLES.items():
        found = report.of(check_name)
        out.append(f"{title}: {len(found)}")
        for f in sorted(found, key=lambda f: (f.path, f.line)):
            out.append(f"  {f.path}:{f.line}: {f.message}")
    if report.unmapped:
        out.append(f"modules in no layer: {', '.join(report.unmapped)}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--src", type=Path, default=SRC, help=f"source root (default {SRC})")
    args = parser.parse_args(argv)
    report = check(args.src)
    if args.json:
        print(
            json.dumps(
                {"findings": [asdict(f) for f in report.findings], "unmapped": report.unmapped},
                indent=2,
            )
        )
    else:
        print(format_report(report))
    failing = any(report.of(c) for c in FAILING) or report.unmapped
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())

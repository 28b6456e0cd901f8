"""Rules about what the repository itself may contain."""

from __future__ import annotations

import ast
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
STUBS = TESTS / "interop" / "stubs"
# Packages are fetched by name through pip's configuration, never from a written address.
# (Spelled in pieces so that this file does not match itself.)
REGISTRY_HOSTS = tuple(
    ".".join(parts)
    for parts in (("pypi", "org"), ("files", "pythonhosted", "org"), ("download", "pytorch", "org"))
)


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / line for line in out.splitlines() if line]


def test_no_package_registry_address_in_the_repository():
    offenders = []
    for path in _tracked_files():
        if path.suffix not in (".py", ".sh", ".md", ".toml", ".txt", ".cfg", ".yml", ".yaml"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        offenders += [f"{path.relative_to(ROOT)}: {h}" for h in REGISTRY_HOSTS if h in text]
    assert offenders == []


def test_test_folders_are_not_packages():
    # pytest (default "prepend" import mode) puts each test file's folder on sys.path and
    # imports the file by its name; helpers are imported the same way (`from _bench_helpers
    # import ...`). An __init__.py would make its folder a package and break those imports.
    # Stand-in packages (tests/interop/stubs: a fake `flashinfer` a child process imports,
    # never collected by pytest) are packages by design.
    assert [str(p.relative_to(ROOT)) for p in TESTS.rglob("__init__.py") if not _stub(p)] == []


def _stub(path: Path) -> bool:
    return STUBS in path.parents


def test_test_module_names_are_unique():
    # Imported by name (above), two files of one name in different folders would clash.
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py" and not _stub(p))
    assert sorted(name for name, count in names.items() if count > 1) == []


# pytest.<name>(...) calls that fail a test by themselves.
_PYTEST_CHECKS = {"raises", "warns", "fail", "deprecated_call"}


def _called_names(node: ast.AST) -> Iterator[tuple[str, str | None]]:
    """(function name, name of the object it is called on or None) for each call in node."""
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        if isinstance(call.func, ast.Name):
            yield call.func.id, None
        elif isinstance(call.func, ast.Attribute):
            owner = call.func.value.id if isinstance(call.func.value, ast.Name) else None
            yield call.func.attr, owner


def _checks_directly(function: ast.AST) -> bool:
    if any(isinstance(node, ast.Assert) for node in ast.walk(function)):
        return True
    return any(
        (owner == "pytest" and name in _PYTEST_CHECKS) or name.startswith("assert")
        for name, owner in _called_names(function)
    )


def test_every_test_can_fail():
    """Each test asserts, expects an exception or warning, or calls a helper that does
    (helpers are matched by name among the functions defined under tests/)."""
    functions: dict[str, list[ast.AST]] = {}
    modules = {path: ast.parse(path.read_text(encoding="utf-8")) for path in TESTS.rglob("*.py")}
    for tree in modules.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.setdefault(node.name, []).append(node)
    checking = {name for name, defs in functions.items() if any(map(_checks_directly, defs))}
    grown = True
    while grown:  # a helper that calls a checking helper checks too
        before = len(checking)
        checking |= {
            name
            for name, defs in functions.items()
            if any(called in checking for d in defs for called, _ in _called_names(d))
        }
        grown = len(checking) > before

    offenders = []
    for path, tree in sorted(modules.items()):
        if not path.name.startswith("test_"):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            calls = {called for called, _ in _called_names(node)}
            if node.name.startswith("test") and not (_checks_directly(node) or calls & checking):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert offenders == []


def test_ci_runs_the_readme_test_command_last():
    """.ci/run runs the README's test command exactly, as its last command: under `set -e` a
    failure inside an && list does not stop the script, so a command after the list would
    decide CI's status and let a failing test land."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    test_command = [line for line in block.splitlines() if "pytest" in line]
    assert len(test_command) == 1, test_command
    ci = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert ci[-1] == test_command[0]


def test_no_result_row_is_recorded_twice():
    """A row copied into a results file twice (a GPU call's $OUT copy appended beside the
    original) would count twice in every geomean read from the file."""
    twice = {}
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.jsonl")):
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        repeated = len(lines) - len(set(lines))
        if repeated:
            twice[path.name] = repeated
    assert not twice, f"identical rows recorded more than once: {twice}"

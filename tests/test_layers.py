"""The package's import structure (scripts/check_layers.py): no private name used across
modules, no upward import, no cycle, no module loaded by string; files stay under 800 lines.
The checker itself is tested on a small tree made here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_checker():
    spec = importlib.util.spec_from_file_location("check_layers", ROOT / "scripts/check_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


@pytest.fixture(scope="module")
def report():
    return checker.check(ROOT / "src")


@pytest.mark.parametrize("check", checker.FAILING)
def test_no_layering_violation(report, check: str) -> None:
    found = report.of(check)
    assert found == [], "\n" + "\n".join(f"{f.path}:{f.line}: {f.message}" for f in found)


def test_every_module_has_a_layer(report) -> None:
    assert report.unmapped == []


# --------------------------------------------------------------------------- the checker


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for rel, text in files.items():
        path = src / "flashtune" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in {p.parent for p in (src / "flashtune").rglob("*.py")}:
        (folder / "__init__.py").touch()
    return src


def test_checker_finds_each_kind_of_violation(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "cli.py": "",
            "env.py": "_SECRET = 1\n",
            "ops/a.py": "from flashtune.env import _SECRET\nfrom flashtune import cli\n",
            "apply/x.py": "def f():\n    from flashtune.apply import y\n",
            "apply/y.py": "from flashtune.apply import x\nimport flashtune.env as e\nv = e._SECRET\n",
            "schema/load.py": (
                "import importlib\n"
                "def plugins():\n    importlib.import_module('flashtune.capture')\n"
            ),
            "tune/big.py": "x = 1\n" * 801,
            "stray.py": "",
        },
    )
    report = checker.check(src)
    private = sorted(f.message for f in report.of("private"))
    assert private == ["imports _SECRET from flashtune.env", "uses flashtune.env._SECRET"]
    assert [(f.module, f.line) for f in report.of("upward")] == [("flashtune.ops.a", 2)]
    (cycle,) = report.of("cycle")
    assert set(cycle.members) == {"flashtune.apply.x", "flashtune.apply.y"}
    (by_string,) = report.of("by_string")
    assert (
        by_string.module == "flashtune.schema.load" and "'flashtune.capture'" in by_string.message
    )
    assert [f.module for f in report.of("too_long")] == ["flashtune.tune.big"]
    assert report.unmapped == ["flashtune.stray"]


def test_checker_allows_what_the_rules_allow(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "__init__.py": "__version__ = '1'\n",
            "platform.py": "from flashtune import __version__\n",
            "cli.py": "from flashtune.bench import run\n",
            "bench/run.py": (
                "import importlib\nimport logging\nfrom typing import TYPE_CHECKING\n"
                "log = logging.getLogger('flashtune.bench')\n"
                "if TYPE_CHECKING:\n    from flashtune.report import r\n"
                "def load(entry):\n    return importlib.import_module(entry)\n"
            ),
            "report/r.py": "from flashtune.bench import run\n",
            "ops/__init__.py": (
                "import importlib, pkgutil\n"
                "def load_all():\n"
                "    for m in pkgutil.walk_packages(__path__, __name__ + '.'):\n"
                "        importlib.import_module(m.name)\n"
            ),
            "ops/_kernels.py": "",
            "ops/norm.py": "from flashtune.ops._kernels import *\n",
        },
    )
    report = checker.check(src)
    assert report.findings == [] and report.unmapped == []

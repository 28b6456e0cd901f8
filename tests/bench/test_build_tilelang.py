"""TileLang solutions (issue 36): their code is Python importing the tilelang package, so they
build as FlashInfer-Bench's TileLangBuilder builds them (a Python module, the kernel compiled
on first call); where tilelang is missing they are SKIPPED saying what to install. On the CPU
a stand-in tilelang package checks the build; the GPU test needs the real one."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _bench_helpers import toy_definition

from flashtune import platform
from flashtune.bench import build as build_module
from flashtune.bench.build import (
    MissingRequirement,
    build_solution,
    check_requirements,
    solution_hash,
)
from flashtune.bench.evaluate import BenchConfig, evaluate_workload
from flashtune.data import Solution, Workload

# y[i, j] = x[i, j] * w[j], toy_definition's reference, written in TileLang's language.
TILELANG_SCALE = """import torch
import tilelang
import tilelang.language as T


@tilelang.jit(out_idx=[-1])
def scale_kernel(N, H, block_N, dtype="float32"):
    @T.prim_func
    def scale(x: T.Tensor((N, H), dtype), w: T.Tensor((H,), dtype), y: T.Tensor((N, H), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), threads=128) as bx:
            for i, j in T.Parallel(block_N, H):
                y[bx * block_N + i, j] = x[bx * block_N + i, j] * w[j]

    return scale


def run(x, w):
    return scale_kernel(x.shape[0], x.shape[1], 32)(x, w)
"""

# A stand-in for the parts of tilelang the source names: the decorated kernel factory returns
# a callable computing the same product in torch (enough to check the build, not TileLang).
STAND_IN = {
    "tilelang/__init__.py": (
        "def jit(**options):\n"
        "    def wrap(factory):\n"
        "        def make(*args, **kwargs):\n"
        "            return lambda x, w: x * w\n"
        "        return make\n"
        "    return wrap\n"
    ),
    "tilelang/language.py": "",
}


def _solution(content: str = TILELANG_SCALE, language: str = "tilelang") -> Solution:
    return Solution.model_validate(
        {
            "name": f"scale_{language}",
            "definition": "toy_scale_h8",
            "author": "tests",
            "spec": {
                "language": language,
                "target_hardware": ["cuda"],
                "entry_point": "main.py::run",
                "dependencies": ["torch"],
                "destination_passing_style": False,
            },
            "sources": [{"path": "main.py", "content": content}],
        }
    )


@pytest.fixture
def stand_in_tilelang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for path, text in STAND_IN.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(build_module, "_importable", lambda module: True)
    yield
    for name in ("tilelang.language", "tilelang"):  # later tests must not find the stand-in
        sys.modules.pop(name, None)


def test_without_tilelang_the_solution_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setattr(build_module, "_importable", lambda module: module != "tilelang")
    with pytest.raises(MissingRequirement, match=r"pip install tilelang"):
        check_requirements(_solution(), torch.device("cuda"))


def test_tilelang_is_a_gpu_language() -> None:
    with pytest.raises(MissingRequirement, match="no CUDA device for a tilelang solution"):
        check_requirements(_solution(), torch.device("cpu"))


def test_a_tilelang_solution_builds_as_a_python_module(stand_in_tilelang) -> None:
    solution = _solution()
    check_requirements(solution, torch.device("cuda"))  # tilelang "installed": no objection
    run = build_solution(solution)
    x, w = torch.randn(5, 8), torch.randn(8)
    torch.testing.assert_close(run(x, w), x * w)
    # The language is part of what is hashed: the same source as Python is another build.
    assert solution_hash(solution) != solution_hash(_solution(language="python"))


@pytest.mark.cuda
@pytest.mark.skipif(
    not build_module._importable("tilelang"), reason="the tilelang package is not installed"
)
def test_tilelang_solution_passes_on_the_gpu() -> None:
    device = torch.device("cuda")
    events = evaluate_workload(
        toy_definition(),
        Workload(uuid="w", axes={"n": 67}),
        [_solution()],
        BenchConfig(warmup=1, iterations=3, trials=1),
        device,
        platform.snapshot("cuda"),
    )
    (trace,) = [t for kind, t in events if kind == "trace"]
    assert trace.evaluation.status.value == "PASSED", trace.evaluation.reason

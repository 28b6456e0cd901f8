"""Shared test setup.

Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors: TRITON_INTERPRET
must be set before triton is first imported, hence here, at collection time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from _cheap_timing import cheap_cpu_timing
from _trace_corpus import corpus_root

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_cuda = pytest.mark.skip(
        reason="needs an NVIDIA GPU (run `pytest -m cuda` on the GPU machine)"
    )
    # Tests written for the interpreter hand CPU tensors to Triton kernels, which a GPU build
    # of Triton refuses: on a GPU machine they run only under TRITON_INTERPRET=1.
    skip_interpreter = pytest.mark.skip(
        reason="runs Triton kernels on CPU tensors: needs the interpreter (TRITON_INTERPRET=1)"
    )
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)
        if "interpreter" in item.keywords and not INTERPRETING:
            item.add_marker(skip_interpreter)


@pytest.fixture(scope="session", autouse=True)
def _cheap_cpu_timing() -> Iterator[None]:
    # Benchmark runs in the test process time each CPU triple briefly (_cheap_timing.py).
    with cheap_cpu_timing():
        yield


@pytest.fixture(scope="session")
def trace_corpus() -> Path:
    root = corpus_root()
    if not (root / "definitions").is_dir():
        pytest.skip(
            f"FlashInfer-Trace corpus not found at {root}; set FLASHTUNE_TRACE_CORPUS to a copy "
            "of flashinfer_trace/ to run these tests"
        )
    return root


@pytest.fixture
def device() -> torch.device:
    """Where kernel tests run: the GPU when present, else CPU under the Triton interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture(autouse=True)
def _fresh_seed(request: pytest.FixtureRequest) -> None:
    # Fresh random inputs each run, but reproducible from the printed seed on failure.
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    request.node.user_properties.append(("seed", seed))

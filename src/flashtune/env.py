"""Every FLASHTUNE_* setting, typed, with its default and meaning, read lazily.

Read a setting with ``env.DATASET.get()``; nothing is read at import time, so tests and
users can change ``os.environ`` at any point. ``flashtune env`` prints them all.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = ["Setting", "SETTINGS", "describe"]

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None


def _parse_path(name: str, raw: str) -> Path:
    return Path(raw).expanduser()


def _parse_str(name: str, raw: str) -> str:
    return raw


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: its name, default, meaning and parser."""

    name: str
    default: Callable[[], T]
    meaning: str
    parse: Callable[[str, str], T]

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default()
        return self.parse(self.name, raw)

    def source(self) -> str:
        return "environment" if self.name in os.environ else "default"


SETTINGS: dict[str, Setting[Any]] = {}


def _setting(
    name: str, default: Callable[[], T], meaning: str, parse: Callable[[str, str], T]
) -> Setting[T]:
    setting = Setting(name, default, meaning, parse)
    SETTINGS[name] = setting
    return setting


def _cache_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "flashtune"


DATASET = _setting(
    "FLASHTUNE_DATASET",
    lambda: _cache_root() / "dataset",
    "Root of the benchmark database (definitions/, solutions/, workloads/, traces/, blob/).",
    _parse_path,
)
CACHE_DIR = _setting(
    "FLASHTUNE_CACHE_DIR",
    _cache_root,
    "Where flashtune keeps build caches (compiled CUDA solutions) and autotune files.",
    _parse_path,
)
SANDBOX = _setting(
    "FLASHTUNE_SANDBOX",
    lambda: True,
    "Isolate each benchmarked solution at the OS level (user/network namespaces, Landlock, "
    "seccomp: docs/evaluation.md). 0 turns it off, for debugging only: solutions then run as "
    "this user with its files, network and processes, and `flashtune run` and every trace "
    "say so.",
    _parse_bool,
)
MAX_JSON_MB = _setting(
    "FLASHTUNE_MAX_JSON_MB",
    lambda: 64,
    "Largest dataset JSON file (a definition, a solution) or JSONL line (a workload, a trace) "
    "read, in MiB; a larger one is one load error (`flashtune validate` lists it), not a crash.",
    _parse_int,
)
LOG_LEVEL = _setting(
    "FLASHTUNE_LOG_LEVEL",
    lambda: "WARNING",
    "Logging level of the 'flashtune' logger (DEBUG, INFO, WARNING, ERROR).",
    _parse_str,
)
TRACE_CORPUS = _setting(
    "FLASHTUNE_TRACE_CORPUS",
    lambda: Path("../shared/flashinfer-trace"),
    "The FlashInfer-Trace compatibility corpus used by the tests; a relative path is taken from the "
    "repository root. Tests that need it skip, saying why, when it is absent.",
    _parse_path,
)
FIB_HEAD = _setting(
    "FLASHTUNE_FIB_HEAD",
    lambda: Path("../shared/flashinfer-bench-head"),
    "FlashInfer-Bench's source at the commit the interop tests pin (a folder holding its "
    "flashinfer_bench/ package; `python scripts/fetch_flashinfer_bench.py` places it); a "
    "relative path is taken from the repository root.",
    _parse_path,
)
REQUIRE_INTEROP = _setting(
    "FLASHTUNE_REQUIRE_INTEROP",
    lambda: False,
    "When on (CI: .ci/run), an interop test fails instead of skipping when FlashInfer-Bench "
    "(0.1.2 installed, or its pinned source at FLASHTUNE_FIB_HEAD) is missing.",
    _parse_bool,
)
DUMP_DEFINITIONS = _setting(
    "FLASHTUNE_DUMP_DEFINITIONS",
    lambda: False,
    "When on, every schema'd op call writes its Definition JSON (once per name) before launching.",
    _parse_bool,
)
DUMP_DIR = _setting(
    "FLASHTUNE_DUMP_DIR",
    lambda: Path.cwd() / "flashtune-definitions",
    "Folder that FLASHTUNE_DUMP_DEFINITIONS writes into.",
    _parse_path,
)
AUTOTUNE_LOAD_BUNDLED = _setting(
    "FLASHTUNE_AUTOTUNE_LOAD_BUNDLED",
    lambda: True,
    "Use the autotune configs bundled with the package (not while tuning); each applies only "
    "on the GPU and torch/triton/CUDA versions it was measured with (its _metadata).",
    _parse_bool,
)
SAMPLING_SPLIT_DEFAULT = _setting(
    "FLASHTUNE_SAMPLING_SPLIT_DEFAULT",
    lambda: True,
    "Let the untuned sampling kernels spread a row over several programs at batch <= 256 "
    "(split-row tactics; 2-4x faster than one program a row at batch 1-64 on an H100). Set "
    "to 0 for one program a row; the autotuner offers the split tactics either way.",
    _parse_bool,
)
PREFILL_GLUON = _setting(
    "FLASHTUNE_PREFILL_GLUON",
    lambda: True,
    "Run batch prefill on Hopper (sm_90) with the Gluon FA3-style kernel "
    "(ops/attention/prefill/hopper.py) where it applies; 0 keeps the Triton kernel.",
    _parse_bool,
)
MOE_FP8_C_FP16 = _setting(
    "FLASHTUNE_MOE_FP8_C_FP16",
    lambda: False,
    "Keep fused MoE's intermediate (SwiGLU output) in fp16 with fp8 expert weights, instead "
    "of bf16: 8-18% faster on an H200 at DeepSeek-V3 / Qwen3-30B shapes and more precise, "
    "but values past fp16's 65504 saturate there (a model whose intermediate stays below "
    "that: real ones do; unit-variance random inputs at H=7168 do not).",
    _parse_bool,
)
CAPTURE = _setting(
    "FLASHTUNE_CAPTURE",
    lambda: False,
    "When on, every schema'd op call records its workload into FLASHTUNE_DATASET.",
    _parse_bool,
)
CAPTURE_DUMP_POLICY = _setting(
    "FLASHTUNE_CAPTURE_DUMP_POLICY",
    lambda: "dump_int",
    "input_dump_policy of FLASHTUNE_CAPTURE=1: dump_none, dump_int, dump_all or a "
    "comma-separated list of input names.",
    lambda name, raw: raw.strip(),
)
CAPTURE_FILTER_POLICY = _setting(
    "FLASHTUNE_CAPTURE_FILTER_POLICY",
    lambda: "shape_only",
    "filter_policy of FLASHTUNE_CAPTURE=1: keep_all, keep_first, keep_first_k, "
    "keep_first_k_by_axes, shape_only or keep_none.",
    lambda name, raw: raw.strip(),
)
CAPTURE_QUEUE = _setting(
    "FLASHTUNE_CAPTURE_QUEUE",
    lambda: 1024,
    "Capture queue bound in records; beyond it records are dropped (one warning).",
    _parse_int,
)
CAPTURE_QUEUE_MB = _setting(
    "FLASHTUNE_CAPTURE_QUEUE_MB",
    lambda: 256,
    "Capture queue bound in MiB of dumped tensors (host memory, pinned on CUDA).",
    _parse_int,
)
APPLY = _setting(
    "FLASHTUNE_APPLY",
    lambda: False,
    "When on, schema'd ops dispatch to the best solution the dataset's traces prove correct.",
    _parse_bool,
)
DEBUG_CHECKS = _setting(
    "FLASHTUNE_DEBUG_CHECKS",
    lambda: False,
    "When on, run input checks that need a device-to-host sync (index bounds, monotone indptr).",
    _parse_bool,
)
FORCE_REFERENCE = _setting(
    "FLASHTUNE_FORCE_REFERENCE",
    lambda: False,
    "When on, public ops compute with the PyTorch reference even where a kernel could run.",
    _parse_bool,
)
BENCH_COMMIT = _setting(
    "FLASHTUNE_BENCH_COMMIT",
    lambda: "",
    "The commit being measured, named by the caller where the checkout's .git is stale or "
    "absent (the GPU machine's copy). Traces and benchmark rows then record their code "
    'provenance with "source": "env" beside the hash of flashtune\'s own source files.',
    lambda name, raw: raw.strip(),
)


def describe() -> list[tuple[str, str, str, str]]:
    """(name, value, source, meaning) for every setting, for `flashtune env`."""
    rows = []
    for setting in SETTINGS.values():
        try:
            value = str(setting.get())
        except ValueError as exc:
            value = f"<invalid: {exc}>"
        rows.append((setting.name, value, setting.source(), setting.meaning))
    return rows

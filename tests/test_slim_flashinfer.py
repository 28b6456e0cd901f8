"""Slimming FlashInfer 0.7.2's wheel for the GPU machine (scripts/slim_flashinfer_wheel.py,
scripts/wheel_slim.py, scripts/check_flashinfer_slim.py's include scan), on a small wheel
made here: the RECORD is rewritten for the kept files, dropped files are gone, kept ones are
byte for byte the same. The real wheel (from scripts/fetch_flashinfer072.sh) is checked when
it is present."""

from __future__ import annotations

import importlib.util
import json
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


wheel_slim = _load("wheel_slim")
slim_fi = _load("slim_flashinfer_wheel")
check_fi = _load("check_flashinfer_slim")

DIST = "flashinfer_python-9.9.9.dist-info"
FILES = {
    "flashinfer/__init__.py": b"from .decode import run\nfrom . import jit\n",
    "flashinfer/decode.py": b"def run():\n    from .utils import helper\n    return helper()\n",
    "flashinfer/utils.py": b"def helper():\n    return 1\n",
    "flashinfer/jit/__init__.py": b"from .core import gen\n",
    "flashinfer/jit/core.py": b"import os\n\ndef gen():\n    from ..cli import main\n",
    "flashinfer/cli.py": b"def main():\n    pass\n",
    "flashinfer/jit/tables.json": b"{}",
    "flashinfer/experimental/__init__.py": b"",
    "flashinfer/experimental/blackwell.py": b"import importlib\n",
    "flashinfer/experimental/kernel.cu": b"__global__ void k() {}\n",
    "flashinfer/data/csrc/norm.cu": b'#include "norm_impl.cuh"\n#include <flashinfer/norm.cuh>\n',
    "flashinfer/data/csrc/norm_impl.cuh": b"// impl\n",
    "flashinfer/data/csrc/sm100_gemm.cu": b"#include <cutlass/sm100.h>\n",
    "flashinfer/data/include/flashinfer/norm.cuh": b"#include <cuda_runtime.h>\n#include <cute/t.hpp>\n",
    "flashinfer/data/cutlass/include/cute/t.hpp": b"#include CUDA_STD_HEADER(cstdint)\n",
    "flashinfer/data/cutlass/include/cutlass/sm100.h": b"// Blackwell\n",
    "flashinfer/data/cccl/libcudacxx/include/cuda/std/cstdint": b"// cstdint\n",
    "top_level_shim.py": b"",
}


def _make_wheel(tmp_path: Path) -> Path:
    wheel = tmp_path / "in" / "flashinfer_python-9.9.9-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        record = []
        for name, data in FILES.items():
            zf.writestr(name, data)
            record.append(f"{name},{wheel_slim.record_hash(data)},{len(data)}")
        for name, data in ((f"{DIST}/METADATA", b"Name: flashinfer-python\nVersion: 9.9.9\n"),
                           (f"{DIST}/entry_points.txt", b"[console_scripts]\nfi = flashinfer.cli:main\n")):  # fmt: skip
            zf.writestr(name, data)
            record.append(f"{name},{wheel_slim.record_hash(data)},{len(data)}")
        record.append(f"{DIST}/RECORD,,")
        zf.writestr(f"{DIST}/RECORD", "\n".join(record) + "\n")
    return wheel


def _unpack(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    return dest


def test_include_closure_follows_quoted_angle_and_macro_includes(tmp_path):
    root = _unpack(_make_wheel(tmp_path), tmp_path / "x") / "flashinfer" / "data"
    search = [root / "cccl/libcudacxx/include", root / "include", root / "csrc",
              root / "cutlass/include"]  # fmt: skip
    files, unresolved = check_fi.include_closure([root / "csrc/norm.cu"], search)
    rel = {str(f.relative_to(root)) for f in files}
    assert rel == {
        "csrc/norm.cu",
        "csrc/norm_impl.cuh",
        "include/flashinfer/norm.cuh",
        "cutlass/include/cute/t.hpp",
        "cccl/libcudacxx/include/cuda/std/cstdint",
    }
    assert list(unresolved) == ["<cuda_runtime.h>"]  # the toolkit's, not shipped


def test_python_closure_follows_imports_inside_functions(tmp_path):
    root = _unpack(_make_wheel(tmp_path), tmp_path / "x")
    mods = slim_fi.python_closure(root, ["flashinfer"])
    assert mods == {"flashinfer", "flashinfer.decode", "flashinfer.utils", "flashinfer.jit",
                    "flashinfer.jit.core", "flashinfer.cli"}  # fmt: skip


def test_slimmed_wheel_is_valid_and_keeps_files_byte_identical(tmp_path):
    wheel = _make_wheel(tmp_path)
    root = _unpack(wheel, tmp_path / "x")
    manifest = {"files": ["data/csrc/norm.cu", "data/csrc/norm_impl.cuh",
                          "data/include/flashinfer/norm.cuh", "data/cutlass/include/cute/t.hpp",
                          "data/cccl/libcudacxx/include/cuda/std/cstdint"]}  # fmt: skip
    keep, py_files, data_files = slim_fi.keep_rule(root, manifest)
    result = wheel_slim.write_filtered_wheel(wheel, tmp_path / "out", keep)

    assert wheel_slim.verify_record(result.path) == []
    dropped = {name for name, _ in result.dropped}
    assert dropped == {
        "flashinfer/experimental/__init__.py",
        "flashinfer/experimental/blackwell.py",
        "flashinfer/experimental/kernel.cu",
        "flashinfer/data/csrc/sm100_gemm.cu",
        "flashinfer/data/cutlass/include/cutlass/sm100.h",
    }
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(result.path) as out:
        names = set(out.namelist())
        assert not names & dropped
        assert "flashinfer/jit/tables.json" in names  # a kept package's data file
        assert "top_level_shim.py" in names and f"{DIST}/entry_points.txt" in names
        for name in names - {f"{DIST}/RECORD"}:
            assert out.read(name) == src.read(name), name
            assert out.getinfo(name).date_time == src.getinfo(name).date_time
        record = out.read(f"{DIST}/RECORD").decode().splitlines()
    listed = {line.rsplit(",", 2)[0] for line in record}
    assert listed == names
    assert f"{DIST}/RECORD,," in record


def test_verify_record_finds_a_wrong_hash(tmp_path):
    wheel = _make_wheel(tmp_path)
    bad = tmp_path / "bad.whl"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, data + b"#" if info.filename == "flashinfer/utils.py" else data)
    assert wheel_slim.verify_record(bad) == ["hash or size differs: flashinfer/utils.py"]


SLIM = ROOT / ".peer/fi072/flashinfer_python-0.7.2.post1-py3-none-any.whl"


@pytest.mark.skipif(not SLIM.is_file(), reason="no .peer/fi072 (scripts/fetch_flashinfer072.sh)")
def test_the_fetched_slim_wheel():
    """The slim wheel in .peer/fi072: a valid RECORD, every file its manifest names, and no
    Blackwell-only or trtllm-gen kernel source."""
    assert wheel_slim.verify_record(SLIM) == []
    manifest = json.loads((SLIM.parent / "hopper-manifest.json").read_text())
    assert not manifest["errors"]
    labels = set(manifest["modules"])
    for prefix in ("norm", "silu_and_mul", "rope", "sampling", "decode_", "xqa_", "prefill_fa2_",
                   "prefill_fa3_", "mla_fa2_", "mla_fa3_"):  # fmt: skip
        assert any(label.startswith(prefix) for label in labels), prefix
    with zipfile.ZipFile(SLIM) as zf:
        names = set(zf.namelist())
    assert {f"flashinfer/{f}" for f in manifest["files"]} <= names
    for needed in ("flashinfer/data/csrc/xqa/mha_sm90.cu", "flashinfer/data/csrc/sampling.cu",
                   "flashinfer/data/csrc/batch_prefill_sm90.cu", "flashinfer/decode.py"):  # fmt: skip
        assert needed in names
    csrc = [n for n in names if n.startswith("flashinfer/data/csrc/")]
    assert not [n for n in csrc if "sm100" in n or "trtllm_fmha" in n or "/fused_moe/" in n]
    assert SLIM.stat().st_size < 16 * 2**20

"""Write a slim copy of FlashInfer 0.7.2's wheel holding what its Hopper (sm90) JIT paths need.

The `device` tool carries at most 64 MiB to the GPU machine, the working tree included, and
the wheel is ~62 MB: kernel sources for every architecture (Blackwell sm100/sm103/sm120,
trtllm-gen, CuTe-DSL and cuTile kernels, experimental packages), CUTLASS's and CCCL's examples,
tests, docs and Python bindings. The copy keeps, by allow-list:

* under flashinfer/data/ (the JIT's sources and include trees: csrc, include, cutlass, cccl,
  spdlog): exactly the files that scripts/check_flashinfer_slim.py finds the Hopper modules
  need: FlashInfer's own JIT generators (`flashinfer.jit.gen_*_module`) are run on the
  unpacked wheel with FLASHINFER_CUDA_ARCH_LIST=9.0 for decode (CUDA-core and tensor-core),
  XQA, FA2 and FA3 prefill, MLA, norms, activations, RoPE, sampling, paging, cascade merge,
  packbits and Mamba's selective-state update; kept are the sources each JitSpec names, the
  files the generators read (jinja templates, sources copied into the workspace) and every
  file reachable from them through `#include` on the JIT's include path. Everything else
  there (other architectures' kernels, trtllm-gen, CUTLASS/CCCL examples, tests, docs, Python
  DSLs) is dropped;
* Python modules of the `flashinfer` package: those reachable from flashinfer/__init__.py
  through import statements at any depth (module level, inside functions, lazy `__getattr__`
  hooks) and from the console script's entry point, with their packages' data files (JSON
  tables). Modules no import statement reaches (experimental/ with b12x, moe_ep/, most of
  fused_moe's backends: ~1360 of ~2320) are dropped, and a computed `importlib` name into
  them would fail; so are non-Python kernel sources inside Python packages that hold no kept
  module;
* everything outside flashinfer/ (the .dist-info, small top-level shims).

The RECORD is rewritten for the kept files (scripts/wheel_slim.py), the manifest the rule used
is written beside the wheel as hopper-manifest.json (check_flashinfer_slim.py compares an
install against it), and what was dropped is summarized.

    python scripts/slim_flashinfer_wheel.py flashinfer_python-0.7.2.post1-py3-none-any.whl \\
        .peer/fi072 [--host-site DIR]

--host-site: a directory of packages that `import flashinfer` needs on this machine and its
Python lacks (apache-tvm-ffi, nvidia-ml-py, tqdm, ...), prepended to PYTHONPATH for the run of
the generators. Needs torch (a CPU build will do); nothing is compiled.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from wheel_slim import verify_record, write_filtered_wheel  # noqa: E402  (a sibling script)

PACKAGE = "flashinfer"
DATA = f"{PACKAGE}/data/"


def _imports(path: Path, module: str) -> set[str]:
    """Absolute names of the modules (and possible submodules) `path` imports, anywhere."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def python_closure(root: Path, roots: list[str]) -> set[str]:
    """Modules of `PACKAGE` (dotted names) reachable from `roots` through imports, with the
    packages above each (importing a.b.c runs a/__init__ and a/b/__init__)."""

    def file_of(module: str) -> Path | None:
        p = root.joinpath(*module.split("."))
        for candidate in (p / "__init__.py", p.with_suffix(".py")):
            if candidate.is_file():
                return candidate
        return None

    seen: set[str] = set()
    stack = list(roots)
    while stack:
        module = stack.pop()
        if module in seen or not (module == PACKAGE or module.startswith(PACKAGE + ".")):
            continue
        path = file_of(module)
        if path is None:
            continue
        seen.add(module)
        parts = module.split(".")
        stack += [".".join(parts[:i]) for i in range(1, len(parts))]
        stack += _imports(path, module)
    return seen


def _entry_point_modules(root: Path) -> list[str]:
    out = []
    for ep in root.glob("*.dist-info/entry_points.txt"):
        for line in ep.read_text().splitlines():
            if "=" in line and ":" in line:
                out.append(line.split("=", 1)[1].strip().split(":")[0])
    return out


def run_manifest(root: Path, work: Path, host_site: Path | None) -> dict:
    """The JIT manifest of the unpacked wheel at `root` (check_flashinfer_slim.py --manifest)."""
    out = work / "manifest.json"
    env = dict(os.environ)
    path = [str(root)] + ([str(host_site.resolve())] if host_site else [])
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(
        FLASHINFER_NO_DOWNLOAD="1",
        FLASHINFER_CUDA_ARCH_LIST="9.0",
        FLASHINFER_WORKSPACE_BASE=str(work / "ws"),
    )
    cmd = [sys.executable, str(HERE / "check_flashinfer_slim.py"), "--manifest", str(out)]
    proc = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True)
    print(proc.stdout.strip())
    manifest = json.loads(out.read_text()) if out.is_file() else None
    if proc.returncode != 0 or manifest is None:
        sys.stderr.write(proc.stderr[-6000:])
        raise SystemExit(f"the JIT generators failed on {root} (exit {proc.returncode})")
    return manifest


def keep_rule(root: Path, manifest: dict):
    """The predicate on wheel member names (see the module docstring) and its Python set."""
    modules = python_closure(root, [PACKAGE] + _entry_point_modules(root))
    py_files = set()
    for m in modules:
        p = Path(*m.split("."))
        py_files.add(str(p / "__init__.py") if (root / p / "__init__.py").is_file() else f"{p}.py")
    kept_dirs = {str(Path(f).parent) for f in py_files}
    data_files = {f"{PACKAGE}/{f}" for f in manifest["files"]}

    def keep(name: str) -> bool:
        if not name.startswith(PACKAGE + "/") or name in data_files:
            return True
        if name.startswith(DATA):
            return name in data_files
        if name.endswith((".py", ".pyc")):
            return name in py_files
        return str(Path(name).parent) in kept_dirs  # a kept package's data files

    return keep, py_files, data_files


def _group(name: str) -> str:
    parts = name.split("/")
    if name.startswith(DATA):
        return "/".join(parts[:4]) if len(parts) > 4 else "/".join(parts[:3])
    return "/".join(parts[:2]) + ("/" if len(parts) > 2 else "")


def slim(wheel: Path, out_dir: Path, host_site: Path | None = None) -> Path:
    work = Path(tempfile.mkdtemp(prefix="fi-slim-"))
    try:
        root = work / "wheel"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(root)
        manifest = run_manifest(root, work, host_site)
        keep, py_files, data_files = keep_rule(root, manifest)
        absent = sorted(f for f in data_files if not (root / f).is_file())
        if absent:
            raise SystemExit(f"manifest names files the wheel lacks: {absent[:10]}")
        result = write_filtered_wheel(wheel, out_dir, keep)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    problems = verify_record(result.path)
    if problems:
        raise SystemExit(f"{result.path}: RECORD wrong: {problems[:10]}")
    (out_dir / "hopper-manifest.json").write_text(
        json.dumps(manifest, separators=(",", ":")) + "\n"
    )

    by_group: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for name, size in result.dropped:
        by_group[_group(name)][0] += 1
        by_group[_group(name)][1] += size
    print(
        f"dropped {len(result.dropped)} files, {sum(s for _, s in result.dropped) / 2**20:.1f} "
        f"MiB uncompressed; the largest groups:"
    )
    for group, (n, size) in sorted(by_group.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"  {size / 2**20:8.2f} MiB {n:6d} files  {group}")
    print(
        f"kept {len(result.kept)} files: {len(py_files)} Python modules, {len(data_files)} JIT "
        f"sources and headers ({len(manifest['modules'])} Hopper modules)"
    )
    before, after = wheel.stat().st_size, result.path.stat().st_size
    print(f"{wheel.name}: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB ({result.path})")
    return result.path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--host-site", type=Path, help="packages `import flashinfer` needs here")
    args = ap.parse_args()
    slim(args.wheel, args.out_dir, args.host_site)


if __name__ == "__main__":
    main()

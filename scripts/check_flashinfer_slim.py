"""Check that an installed FlashInfer (0.7.2, slimmed by scripts/slim_flashinfer_wheel.py) holds
every file its JIT needs for the Hopper paths flashtune benchmarks against.

The paths: batch decode (CUDA-core kernels, and the tensor-core path, which runs FA2 prefill
modules), XQA decode (`trtllm_batch_decode_with_kv_cache`, sm90 GMMA sources), batch and single
prefill (FA2 and FA3/sm90, paged and ragged, fp16/bf16/fp8), MLA (FA2 and FA3), norms,
activations, RoPE, sampling, paged-KV append, merge-state (cascade), packbits and Mamba's
selective-state update (its sm90 module). Each is named by FlashInfer's own JIT generator
functions (`flashinfer.jit.gen_*_module`), called with `FLASHINFER_CUDA_ARCH_LIST=9.0` and
without building: they write their generated sources into the JIT workspace and return a JitSpec
whose `sources` and include flags say what nvcc will compile. From those, and from the data
files the generators read (jinja templates, sources they copy), this follows `#include`
directives through FlashInfer's include path (data/include, data/csrc, the bundled CUTLASS,
CCCL and spdlog trees, tvm-ffi's headers), the same search list flashinfer/jit/cpp_ext.py gives
nvcc. The scan is textual: an include inside an `#if` is followed whichever way the condition
goes, so the set it finds is a superset of what a compile opens.

    python scripts/check_flashinfer_slim.py                  # check; exit 1 on a missing file
    python scripts/check_flashinfer_slim.py --manifest M.json  # write the file list (slimming)
    python scripts/check_flashinfer_slim.py --build '^(norm|silu_and_mul)$' --smoke
        # on a GPU: also compile and load the modules whose labels match (a regex, --list
        # names them), and run silu_and_mul and rmsnorm against torch

The check fails when a generator raises (a template it reads is gone), a source it names is
missing, an include that resolved when the manifest was written no longer does (with
--reference, default .peer/fi072/hopper-manifest.json if present), or a header from CUDA's
libraries that the kernels include (cuRAND, cuBLAS) is found nowhere on the include path
(CUDA_HOME/include, CPATH, the compiler's own directories), on a machine with nvcc.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# Includes that name one of the trees FlashInfer ships (or tvm-ffi's): they must resolve in the
# installed package, never fall through to the CUDA toolkit's own (different) copies.
SHIPPED_PREFIXES = (
    "flashinfer/",
    "cutlass/",
    "cute/",
    "cub/",
    "thrust/",
    "cuda/",
    "nv/",
    "spdlog/",
    "tvm/",
    "dlpack/",
)
# Headers of CUDA's libraries that FlashInfer's kernels include: the GPU image may lack them
# (scripts/flashinfer072.sh puts a bundle of them on CPATH).
LIBRARY_HEADERS = ("curand_kernel.h", "curand.h", "cublas_v2.h", "cublasLt.h", "cublas_api.h")

# The Python names flashtune's benchmarks and drop-in runs call (module: names), which must
# import from the slim package (a module dropped by the slimming fails here, not on the GPU).
API_NAMES = {
    "flashinfer": ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
                   "BatchPrefillWithRaggedKVCacheWrapper", "rmsnorm", "silu_and_mul",
                   "merge_state", "__version__"),
    "flashinfer.decode": ("BatchDecodeWithPagedKVCacheWrapper",
                          "trtllm_batch_decode_with_kv_cache", "single_decode_with_kv_cache"),
    "flashinfer.prefill": ("BatchPrefillWithPagedKVCacheWrapper",
                           "BatchPrefillWithRaggedKVCacheWrapper", "single_prefill_with_kv_cache"),
    "flashinfer.mla": ("BatchMLAPagedAttentionWrapper",),
    "flashinfer.norm": ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm",
                        "gemma_fused_add_rmsnorm"),
    "flashinfer.activation": ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"),
    "flashinfer.rope": ("apply_rope_with_cos_sin_cache", "apply_rope_with_cos_sin_cache_inplace"),
    "flashinfer.sampling": ("top_k_sampling_from_probs", "top_p_sampling_from_probs",
                            "top_k_top_p_sampling_from_probs", "min_p_sampling_from_probs"),
    "flashinfer.page": ("append_paged_kv_cache", "get_seq_lens"),
    "flashinfer.cascade": ("merge_state", "merge_states"),
    "flashinfer.sparse": ("BlockSparseAttentionWrapper",),
    "flashinfer.quantization": ("packbits",),
    "flashinfer.mamba": ("selective_state_update",),
}  # fmt: skip

INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
MACRO_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*include[ \t]+([A-Za-z_]\w*)[ \t]*\(([^)\n]*)\)", re.M)
# Includes spelled through a macro, as the bundled trees define them for nvcc (CUTLASS's
# CUDA_STD_HEADER; Thrust's device system CUDA and host system C++).
MACRO_INCLUDES = {
    "CUDA_STD_HEADER": "cuda/std/{}",
    "__THRUST_DEVICE_SYSTEM_ALGORITH_HEADER_INCLUDE": "thrust/system/cuda/{}",
    "__THRUST_DEVICE_SYSTEM_ALGORITH_DETAIL_HEADER_INCLUDE": "thrust/system/cuda/detail/{}",
    "__THRUST_HOST_SYSTEM_ALGORITH_HEADER_INCLUDE": "thrust/system/cpp/{}",
    "__THRUST_HOST_SYSTEM_ALGORITH_DETAIL_HEADER_INCLUDE": "thrust/system/cpp/detail/{}",
}

_includes_of: dict[Path, list[tuple[str, str]]] = {}  # file -> its (kind, name) includes
_resolved: dict[tuple[str, Path | None, tuple[Path, ...]], Path | None] = {}


def _includes(path: Path) -> list[tuple[str, str]]:
    if path not in _includes_of:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            text = ""
        found = [(kind, name.strip()) for kind, name in INCLUDE_RE.findall(text)]
        for macro, arg in MACRO_INCLUDE_RE.findall(text):
            spelled = MACRO_INCLUDES.get(macro)
            # an unknown macro stays unresolved: kind "?" never resolves
            found.append(
                ("<", spelled.format(arg.strip())) if spelled else ("?", f"{macro}({arg})")
            )
        _includes_of[path] = found
    return _includes_of[path]


def include_closure(
    roots: Iterable[Path], search_dirs: list[Path]
) -> tuple[set[Path], dict[str, list[str]]]:
    """Every file reachable from `roots` through #include, and the includes found nowhere.

    Quoted includes are looked up beside the including file first, then (like angle ones) in
    `search_dirs` in order. Returns (files, {include spelled as '<x>' or '"x"': [files that
    include it]}) for the includes that resolve to no file."""
    dirs = tuple(search_dirs)
    seen: set[Path] = set()
    unresolved: dict[str, list[str]] = {}
    stack = [Path(p).resolve() for p in roots]
    while stack:
        path = stack.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for kind, name in _includes(path):
            here = path.parent if kind == '"' else None
            key = (name, here, dirs)
            if key not in _resolved:
                where = ([here] if here is not None else []) + list(dirs)
                _resolved[key] = (
                    None
                    if kind == "?"
                    else next((c.resolve() for d in where if (c := d / name).is_file()), None)
                )
            target = _resolved[key]
            if target is None:
                spelled = {"<": f"<{name}>", '"': f'"{name}"'}.get(kind, name)
                unresolved.setdefault(spelled, []).append(str(path))
            elif target not in seen:
                stack.append(target)
    return seen, unresolved


def _setup_env() -> None:
    os.environ.setdefault("FLASHINFER_NO_DOWNLOAD", "1")
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0")
    if "FLASHINFER_WORKSPACE_BASE" not in os.environ:
        os.environ["FLASHINFER_WORKSPACE_BASE"] = tempfile.mkdtemp(prefix="fi-check-ws-")


def hopper_factories() -> list[tuple[str, Callable[[], Any]]]:
    """(label, generator call) for every JIT module of the benchmarked Hopper paths."""
    import torch
    from flashinfer import jit
    from flashinfer.jit import attention as att
    from flashinfer.jit.attention import modules as attm
    from flashinfer.jit.cascade import gen_cascade_module
    from flashinfer.jit.mamba import selective_state_update as ssu
    from flashinfer.jit.norm import gen_norm_module
    from flashinfer.jit.page import gen_page_module
    from flashinfer.jit.quantization import gen_quantization_module
    from flashinfer.jit.rope import gen_rope_module
    from flashinfer.jit.sampling import gen_sampling_module
    from flashinfer.jit.xqa import gen_xqa_module

    f16, bf16, e4m3, f32, i32 = (torch.float16, torch.bfloat16, torch.float8_e4m3fn,
                                 torch.float32, torch.int32)  # fmt: skip
    short = {f16: "f16", bf16: "bf16", e4m3: "e4m3", f32: "f32"}
    out: list[tuple[str, Callable[[], Any]]] = []

    def add(label: str, gen: Callable[..., Any], *args: Any) -> None:
        out.append((label, functools.partial(gen, *args)))

    for label, gen in [("norm", gen_norm_module), ("rope", gen_rope_module),
                       ("sampling", gen_sampling_module), ("page", gen_page_module),
                       ("cascade", gen_cascade_module), ("quantization", gen_quantization_module)]:  # fmt: skip
        add(label, gen)
    for act in ("silu", "gelu", "gelu_tanh"):
        add(f"{act}_and_mul", jit.gen_act_and_mul_module, act)
    # Batch decode's CUDA-core kernels; its tensor-core path runs the FA2 prefill modules
    # (primary with equal K/V strides, independent-stride paged, and the full one)
    fa2_prefill = (("primary", attm._gen_batch_prefill_primary_module),
                   ("indep_paged", attm._gen_batch_prefill_independent_paged_module),
                   ("full", att.gen_batch_prefill_module))  # fmt: skip
    for q in (f16, bf16):
        for kv in (q, e4m3):
            for hd in (64, 128, 256):
                # pos_encoding_mode (0 none, 1 RoPE), sliding window, logits soft cap
                for pe, swa, cap in ((0, False, False), (1, True, True)):
                    v = f"{short[q]}_kv_{short[kv]}_h{hd}_pe{pe}" + ("_swa_cap" if swa else "")
                    add(f"decode_{v}", att.gen_batch_decode_module,
                        q, kv, q, i32, hd, hd, pe, swa, cap)  # fmt: skip
                    add(f"single_decode_{v}", att.gen_single_decode_module,
                        q, kv, q, hd, hd, pe, swa, cap)  # fmt: skip
                    for kind, gen in fa2_prefill:
                        add(f"prefill_fa2_{kind}_{v}", gen,
                            "fa2", q, kv, q, i32, hd, hd, pe, swa, cap, False)  # fmt: skip
                    add(f"single_prefill_fa2_{v}", att.gen_single_prefill_module,
                        "fa2", q, kv, q, hd, hd, pe, swa, cap, False)  # fmt: skip
        # FA3 (sm90): 16-bit and fp8 q/k/v, head dims 64/128/256 and DeepSeek's 192/128
        for qkv, o in ((q, q), (e4m3, q)):
            for hd, hd_vo in ((64, 64), (128, 128), (256, 256), (192, 128)):
                for swa, cap in ((False, False), (True, True)):
                    v = f"{short[qkv]}_o_{short[o]}_h{hd}x{hd_vo}" + ("_swa_cap" if swa else "")
                    add(f"prefill_fa3_{v}", att.gen_batch_prefill_module,
                        "fa3", qkv, qkv, o, i32, hd, hd_vo, 0, swa, cap, False)  # fmt: skip
                    add(f"single_prefill_fa3_{v}", att.gen_single_prefill_module,
                        "fa3", qkv, qkv, o, hd, hd_vo, 0, swa, cap, False)  # fmt: skip
        for backend in ("fa2", "fa3"):
            add(f"mla_{backend}_{short[q]}", att.gen_batch_mla_module,
                backend, q, q, q, i32, 512, 64, False)  # fmt: skip
        # XQA (trtllm_batch_decode_with_kv_cache on sm90): fp16/bf16 or fp8 KV
        for kv in (q, e4m3):
            for page in (16, 32, 64):
                for hd in (64, 128, 256):
                    for grp in (1, 4, 8):
                        add(f"xqa_{short[q]}_kv_{short[kv]}_p{page}_h{hd}_g{grp}",
                            gen_xqa_module, q, kv, page, hd, grp, False, q)  # fmt: skip
        # Mamba's selective-state update: on sm90 its sm90 module (the generic one targets
        # sm8x only and refuses a 9.0 target list)
        for state in (q, f32):
            add(f"mamba_ssu_sm90_{short[state]}_{short[q]}",
                ssu.gen_selective_state_update_sm90_module,
                state, q, q, f32, i32, None, 64, 128, 1, i32, i32)  # fmt: skip
    return out


def _spec_search_dirs(spec: Any) -> list[Path]:
    """The include directories nvcc gets for `spec`, in flashinfer/jit/cpp_ext.py's order."""
    import tvm_ffi
    from flashinfer.jit import env as jit_env

    dirs: list[Path] = []
    flags = list(spec.extra_cuda_cflags or []) + list(spec.extra_cflags or [])
    dirs += [Path(p) for p in (spec.extra_include_dirs or [])]
    dirs += [Path(f[2:]) for f in flags if f.startswith("-I") and len(f) > 2]
    dirs += list(jit_env.CCCL_INCLUDE_DIRS)
    dirs += [
        Path(tvm_ffi.libinfo.find_include_path()),
        Path(tvm_ffi.libinfo.find_dlpack_include_path()),
    ]
    dirs += [jit_env.FLASHINFER_INCLUDE_DIR, jit_env.FLASHINFER_CSRC_DIR]
    dirs += list(jit_env.CUTLASS_INCLUDE_DIRS) + [jit_env.SPDLOG_INCLUDE_DIR]
    return dirs


def _short(path: Path, pkg: Path, gen_dir: Path) -> str:
    """`path` relative to the flashinfer package, or gen/NAME for a file the generators wrote
    into the JIT workspace (its folder there is named after the module)."""
    if path.is_relative_to(pkg):
        return str(path.relative_to(pkg))
    if path.is_relative_to(gen_dir):
        return "gen/" + path.name
    return str(path)


def collect(pattern: str | None = None) -> dict[str, Any]:
    """Run the generators; return the manifest: per module its sources and the data files it
    needs, and the whole set of package files (relative to the flashinfer package dir)."""
    _setup_env()
    import flashinfer
    from flashinfer.jit import env as jit_env

    pkg = Path(flashinfer.__file__).resolve().parent
    data = (pkg / "data").resolve()
    opened: list[Path] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and isinstance(args[0], (str, os.PathLike)):
            p = Path(os.fsdecode(args[0]))
            if p.is_absolute() and str(p).startswith(str(data)):
                opened.append(p)

    sys.addaudithook(hook)  # audit hooks cannot be removed; the process is short-lived
    modules: dict[str, Any] = {}
    errors: dict[str, str] = {}
    all_files: set[Path] = set()
    all_unresolved: dict[str, list[str]] = {}
    gen_dir = jit_env.FLASHINFER_GEN_SRC_DIR.resolve()
    for label, factory in hopper_factories():
        if pattern and not re.search(pattern, label):
            continue
        opened.clear()
        try:
            spec = factory()
        except Exception as e:  # a generator that fails is a finding, not a crash
            errors[label] = f"{type(e).__name__}: {e}"
            continue
        sources = [Path(s).resolve() for s in spec.sources]
        read = sorted({p.resolve() for p in opened})
        files, unresolved = include_closure(sources + read, _spec_search_dirs(spec))
        missing = [str(s) for s in sources if not s.is_file()]
        in_pkg = sorted(str(f.relative_to(pkg)) for f in files if f.is_relative_to(pkg))
        all_files.update(f for f in files if f.is_relative_to(pkg))
        for k, v in unresolved.items():
            all_unresolved.setdefault(k, []).extend(v)
        modules[label] = {
            "name": spec.name,
            "sources": [_short(s, pkg, gen_dir) for s in sources],
            "missing_sources": missing,
            "files": len(in_pkg),
            "unresolved": len(unresolved),
        }
    rel = sorted(str(f.relative_to(pkg)) for f in all_files)
    return {
        "flashinfer": flashinfer.__version__,
        "modules": modules,
        "errors": errors,
        "files": rel,
        # an include found nowhere, with (at most 3 of) the files that include it
        "unresolved": {
            k: sorted({_short(Path(p), pkg, gen_dir) for p in v})[:3]
            for k, v in sorted(all_unresolved.items())
        },
    }


def compiler_include_dirs() -> list[Path]:
    """Where the C++ compiler looks for <...> headers by default (`c++ -E -v`), and CPATH."""
    dirs = [Path(p) for p in os.environ.get("CPATH", "").split(":") if p]
    try:
        out = subprocess.run(
            ["c++", "-xc++", "-E", "-v", "/dev/null"], capture_output=True, text=True, timeout=60
        ).stderr
    except (OSError, subprocess.SubprocessError):
        return dirs
    inside = False
    for line in out.splitlines():
        if line.startswith("#include <...> search starts here"):
            inside = True
        elif line.startswith("End of search list"):
            inside = False
        elif inside:
            dirs.append(Path(line.strip()))
    return dirs


def cuda_include_dirs() -> list[Path]:
    """CUDA's include directory as FlashInfer's JIT finds it (CUDA_HOME, else nvcc's), if any,
    and the flags FLASHINFER_EXTRA_CUDAFLAGS adds with -I / -isystem."""
    dirs: list[Path] = []
    try:
        from flashinfer.jit.cpp_ext import get_cuda_path

        dirs.append(Path(get_cuda_path()) / "include")
    except Exception:
        pass
    flags = os.environ.get("FLASHINFER_EXTRA_CUDAFLAGS", "").split()
    for i, f in enumerate(flags):
        if f == "-isystem" and i + 1 < len(flags):
            dirs.append(Path(flags[i + 1]))
        elif f.startswith(("-I", "-isystem")) and f not in ("-I", "-isystem"):
            dirs.append(Path(f[8:] if f.startswith("-isystem") else f[2:]))
    return [d for d in dirs if d.is_dir()]


def missing_api() -> list[str]:
    """The names of API_NAMES that do not import."""
    import importlib

    problems = []
    for module, names in API_NAMES.items():
        try:
            mod = importlib.import_module(module)
        except Exception as e:
            problems.append(f"import {module}: {type(e).__name__}: {e}")
            continue
        for name in names:
            try:
                getattr(mod, name)
            except Exception as e:
                problems.append(f"{module}.{name}: {type(e).__name__}: {e}")
    return problems


def check(manifest: dict[str, Any], reference: dict[str, Any] | None) -> list[str]:
    """Problems found in `manifest` (this install), against `reference` (the full wheel's)."""
    problems = [f"generator {k} failed: {v}" for k, v in manifest["errors"].items()]
    problems += missing_api()
    for label, m in manifest["modules"].items():
        problems += [f"{label}: source missing: {s}" for s in m["missing_sources"]]
    unresolved = manifest["unresolved"]
    if reference is not None:
        if reference.get("flashinfer") != manifest["flashinfer"]:
            problems.append(f"reference manifest is for FlashInfer {reference.get('flashinfer')}")
        for inc in sorted(set(unresolved) - set(reference["unresolved"])):
            problems.append(f"include no longer found: {inc} (from {unresolved[inc][:3]})")
        for label in set(reference["modules"]) - set(manifest["modules"]) - set(manifest["errors"]):
            problems.append(f"module in the reference, not generated here: {label}")
    else:
        shipped = [i for i in unresolved if i[1:].startswith(SHIPPED_PREFIXES) or i[0] == '"']
        if shipped:
            print(
                f"note: {len(shipped)} quoted or shipped-tree includes not found (no reference "
                f"manifest to tell whether the full wheel lacks them too): {shipped[:8]}"
            )
    cuda_dirs = cuda_include_dirs()
    if cuda_dirs:
        search = cuda_dirs + compiler_include_dirs()
        for inc in unresolved:
            name = inc[1:-1]
            if name in LIBRARY_HEADERS and not any((d / name).is_file() for d in search):
                problems.append(
                    f"CUDA library header {inc} not found in {[str(d) for d in search]}"
                )
        external = [i for i in unresolved if i[0] == "<" and not i[1:].startswith(SHIPPED_PREFIXES)]
        absent = [i for i in external if not any((d / i[1:-1]).is_file() for d in search)]
        print(
            f"external <...> includes: {len(external)}, found on CUDA/compiler paths: "
            f"{len(external) - len(absent)}; not found (most sit under #if for other "
            f"toolkits or targets): {absent[:20]}"
        )
    else:
        print("no CUDA toolkit found (CUDA_HOME / nvcc): CUDA library headers not checked")
    return problems


def build(pattern: str, deadline: float) -> list[str]:
    """Compile and load the modules whose labels match `pattern`, one at a time (ninja runs
    each module's sources in parallel; MAX_JOBS), the smaller first, printing each as it lands;
    none is started after `deadline` (a time.time())."""
    _setup_env()
    specs = [(label, f()) for label, f in hopper_factories() if re.search(pattern, label)]
    unique = list({spec.name: (label, spec) for label, spec in specs}.values())
    unique.sort(key=lambda item: len(item[1].sources))  # the modules of fewer sources first
    print(f"building {len(unique)} modules: {[label for label, _ in unique]}", flush=True)
    problems = []
    for label, spec in unique:
        if time.time() > deadline:
            problems.append(f"{label}: not built (deadline)")
            continue
        start = time.time()
        try:
            spec.build_and_load()
            print(f"  built and loaded {label} in {time.time() - start:.0f} s", flush=True)
        except Exception as e:
            problems.append(f"{label}: {type(e).__name__}: {str(e)[-3000:]}")
            print(f"  FAILED {label} after {time.time() - start:.0f} s", flush=True)
    return problems


def smoke() -> list[str]:
    """On a GPU: silu_and_mul and rmsnorm (JIT-built as needed) against torch, bf16."""
    import flashinfer
    import torch

    torch.manual_seed(0)
    x = torch.randn(64, 2 * 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    xf = x.float()
    refs = {
        "silu_and_mul": (flashinfer.activation.silu_and_mul(x),
                         torch.nn.functional.silu(xf[:, :4096]) * xf[:, 4096:]),
        "rmsnorm": (flashinfer.norm.rmsnorm(x[:, :4096].contiguous(), w, eps=1e-6),
                    xf[:, :4096] * torch.rsqrt(xf[:, :4096].pow(2).mean(-1, keepdim=True) + 1e-6)
                    * w.float()),
    }  # fmt: skip
    problems = []
    for name, (out, ref) in refs.items():
        err = ((out.float() - ref).norm() / ref.norm()).item()
        print(f"  smoke {name}: relative error {err:.2e}")
        if not err < 1e-2:
            problems.append(f"smoke {name}: relative error {err:.2e}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", type=Path, help="write the manifest (JSON) here and stop")
    ap.add_argument(
        "--reference",
        type=Path,
        default=Path(".peer/fi072/hopper-manifest.json"),
        help="the full wheel's manifest (slim_flashinfer_wheel.py writes it)",
    )
    ap.add_argument("--only", help="regex: only the module labels that match")
    ap.add_argument("--build", metavar="REGEX", help="compile and load matching modules (GPU)")
    ap.add_argument(
        "--deadline",
        type=float,
        default=480.0,
        help="seconds from the start after which --build starts no module",
    )
    ap.add_argument("--list", action="store_true", help="print the module labels and stop")
    ap.add_argument("--smoke", action="store_true", help="run silu_and_mul, rmsnorm (GPU)")
    args = ap.parse_args()
    if args.list:
        _setup_env()
        print("\n".join(label for label, _ in hopper_factories()))
        return 0
    start = time.time()
    manifest = collect(args.only)
    import flashinfer

    print(
        f"flashinfer {flashinfer.__version__} at {Path(flashinfer.__file__).parent}: "
        f"{len(manifest['modules'])} modules generated in {time.time() - start:.1f} s, "
        f"{len(manifest['files'])} package files needed"
    )
    if args.manifest:
        args.manifest.write_text(json.dumps(manifest, separators=(",", ":")) + "\n")
        print(f"wrote {args.manifest}")
        return 1 if manifest["errors"] else 0
    reference = None
    if args.reference.is_file():
        reference = json.loads(args.reference.read_text())
        if args.only:  # compare only the modules checked here
            reference["modules"] = {
                k: v for k, v in reference["modules"].items() if re.search(args.only, k)
            }
        print(f"reference: {args.reference}")
    problems = check(manifest, reference)
    if args.build:
        problems += build(args.build, start + args.deadline)
    if args.smoke:
        problems += smoke()
    for p in problems:
        print("PROBLEM:", p)
    print("OK" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

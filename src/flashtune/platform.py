"""Device detection and the environment snapshot recorded with every measurement.

Nothing here initializes CUDA at import time; `snapshot()` only touches CUDA when torch says
a device is available, and works (reporting "cpu") on a machine without a GPU.

Every snapshot also says which code measured (`code_provenance`): the git tree and commit of
the flashtune checkout and whether it was dirty, computed here, never typed by a person.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import platform as _py_platform
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flashtune import env

__all__ = [
    "MAX_GRID_YZ",
    "cuda_homes",
    "has_cuda",
    "default_device",
    "device_name",
    "compute_capability",
    "driver_version",
    "DeviceLimits",
    "STAND_IN_LIMITS",
    "device_limits",
    "snapshot",
    "triton_interpret",
    "kernels_available",
    "code_provenance",
    "files_hash",
    "source_hash",
    "triton_version",
    "library_versions",
]

_PACKAGE_DIR = Path(__file__).resolve().parent


def cuda_homes() -> list[Path]:
    """Where a CUDA toolkit may be, in order: CUDA_HOME, CUDA_PATH, /usr/local/cuda (the
    agent tools' executables, the TVM-FFI builder's libraries)."""
    bases = (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda")
    return [Path(base) for base in bases if base]


def has_cuda() -> bool:
    """True when torch sees at least one CUDA device (no context is created)."""
    return torch.cuda.is_available()


def default_device() -> torch.device:
    return torch.device("cuda") if has_cuda() else torch.device("cpu")


def triton_interpret() -> bool:
    """True when Triton kernels run in its interpreter on CPU tensors (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernels_available(device: torch.device | str) -> bool:
    """Whether a Triton kernel can run on tensors of `device` in this process."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return True
    return dev.type == "cpu" and triton_interpret() and triton_version() is not None


def device_name(device: torch.device | str | None = None) -> str:
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return "cpu"


def compute_capability(device: torch.device | str | None = None) -> tuple[int, int] | None:
    dev = torch.device(device) if device is not None else default_device()
    if dev.type != "cuda":
        return None
    return torch.cuda.get_device_capability(dev)


@dataclass(frozen=True)
class DeviceLimits:
    """The hardware facts launch policy depends on (grid sizes, tiles that fit, cold L2).

    `stand_in` is True when no GPU was asked: the values are then an H100's, so that tactic
    spaces and plans computed off-GPU (CPU, Triton interpreter) are those of the common
    target. Callers that must not pretend (the interpreter's CTA count) check it.
    """

    name: str
    sm_count: int
    shared_memory_per_sm: int  # bytes
    shared_memory_per_block: int  # bytes: the most one CTA may use (the opt-in maximum)
    l2_bytes: int
    max_threads_per_sm: int
    stand_in: bool = False


# H100 SXM: 132 SMs, 228 KB shared memory per SM of which one CTA may use 227 KB, 50 MB L2.
# CUDA's limit on a grid's y and z dimensions (x goes to 2**31 - 1): kernels that put a count
# on those axes check it against this.
MAX_GRID_YZ = 65535

STAND_IN_LIMITS = DeviceLimits(
    name="H100 (stand-in)",
    sm_count=132,
    shared_memory_per_sm=228 * 1024,
    shared_memory_per_block=227 * 1024,
    l2_bytes=50 * 2**20,
    max_threads_per_sm=2048,
    stand_in=True,
)


def device_limits(device: torch.device | str | None = None) -> DeviceLimits:
    """The launch limits of `device` (default: `default_device()`); `STAND_IN_LIMITS` for a
    device that is not a GPU. Cached per device: launch paths call it per call."""
    dev = torch.device(device) if device is not None else default_device()
    return _device_limits(dev)


@functools.lru_cache(maxsize=16)
def _device_limits(dev: torch.device) -> DeviceLimits:
    if dev.type != "cuda":
        return STAND_IN_LIMITS
    props = torch.cuda.get_device_properties(dev)
    # Older torch builds lack some fields: those fall back to the stand-in's values.
    fallback = STAND_IN_LIMITS

    def prop(name: str, default: int) -> int:
        return int(getattr(props, name, 0) or default)

    return DeviceLimits(
        name=str(props.name),
        sm_count=int(props.multi_processor_count),
        shared_memory_per_sm=prop(
            "shared_memory_per_multiprocessor", fallback.shared_memory_per_sm
        ),
        shared_memory_per_block=prop(
            "shared_memory_per_block_optin", fallback.shared_memory_per_block
        ),
        l2_bytes=prop("L2_cache_size", fallback.l2_bytes),
        max_threads_per_sm=prop("max_threads_per_multi_processor", fallback.max_threads_per_sm),
    )


@functools.lru_cache(maxsize=1)
def triton_version() -> str | None:
    try:
        import triton
    except Exception:  # triton is optional off Linux
        return None
    return str(triton.__version__)


@functools.lru_cache(maxsize=1)
def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def driver_version() -> str | None:
    """The NVIDIA driver's version (nvidia-smi, read once), or None where there is none."""
    return _driver_version()


def _flashtune_version() -> str:
    from flashtune import __version__

    return __version__


# --------------------------------------------------------------------------- provenance

_Stamp = tuple[str, int, int, int]  # (relative path, mtime_ns, size, inode)
_FILES_CACHE: dict[tuple[str, str], tuple[tuple[_Stamp, ...], str]] = {}
_FILES_LOCK = threading.Lock()


def _stamps(folder: str, rel: str, suffix: str, out: list[_Stamp]) -> None:
    # os.scandir, not Path.glob: 1.5 ms instead of 10 ms over flashtune's 120 folders, which
    # matters because resume keys hash flashtune's sources once per solution and workload.
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                if e.name != "__pycache__":
                    _stamps(e.path, f"{rel}{e.name}/", suffix, out)
            elif e.name.endswith(suffix):
                st = e.stat()
                out.append((rel + e.name, st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:  # removed while we looked
            continue


def files_hash(root: str | os.PathLike[str], suffix: str = ".py") -> str:
    """sha256 over the sorted relative paths and contents of the files under `root` whose
    names end in `suffix`, at any depth (`root` a file: that file alone, named by its name).

    Cached per process by every file's (path, mtime, size, inode), so calling it per solution
    costs a few stats; a changed, added or removed file changes the hash."""
    base = Path(root).resolve()
    stamps: list[_Stamp] = []
    if base.is_file():
        rel_base = base.parent
        st = base.stat()
        stamps.append((base.name, st.st_mtime_ns, st.st_size, st.st_ino))
    else:
        rel_base = base
        _stamps(str(base), "", suffix, stamps)
    stamp = tuple(sorted(stamps))
    key = (str(base), suffix)
    with _FILES_LOCK:
        hit = _FILES_CACHE.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    digest = hashlib.sha256()
    for rel, *_ in stamp:
        try:
            data = (rel_base / rel).read_bytes()
        except OSError:
            data = b""
        # Length-framed, so no two different file sets hash alike.
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
    value = digest.hexdigest()
    with _FILES_LOCK:
        _FILES_CACHE[key] = (stamp, value)
    return value


def source_hash() -> str:
    """Hash of flashtune's own source files (src/flashtune/**/*.py), checkout or wheel."""
    return files_hash(_PACKAGE_DIR)


def _git(cwd: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(cwd), *args],
            capture_output=True,
            text=True,
            timeout=10,
            # Read-only: `status` may otherwise refresh (write) the index, racing other git users.
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def code_provenance(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Which code is running, computed, never typed: ``{tree, commit, dirty, source, files}``.

    `path` is the code's folder (default: the flashtune package). `source` says where the
    answer came from:
    - "git": the folder is tracked in a git checkout; `tree` is ``HEAD^{tree}``, `commit`
      ``HEAD``, `dirty` whether ``git status --porcelain --untracked-files=no`` lists anything
      (then `tree` alone does not pin the code: `files` does);
    - "env": FLASHTUNE_BENCH_COMMIT names the commit (a copy whose .git is stale or absent);
      `tree` is that commit's tree when git knows it, `dirty` is unknown (None);
    - "files": no git or not a checkout (an installed wheel): only `files`.
    `files` is always `files_hash` of the folder's .py files, so any result can be checked
    against a checkout of the named commit.
    """
    where = Path(path).resolve() if path is not None else _PACKAGE_DIR
    folder = where if where.is_dir() else where.parent
    files = files_hash(where)
    named = env.BENCH_COMMIT.get()
    if named:
        tree = _git(folder, "rev-parse", "--verify", "-q", f"{named}^{{tree}}")
        commit = _git(folder, "rev-parse", "--verify", "-q", f"{named}^{{commit}}")
        return {
            "tree": tree.strip() if tree else None,
            "commit": commit.strip() if commit else named,
            "dirty": None,
            "source": "env",
            "files": files,
        }
    heads = _git(folder, "rev-parse", "--show-toplevel", "HEAD", "HEAD^{tree}")
    # The folder must be tracked in that repository: a wheel installed into a virtualenv that
    # lives inside some other project's checkout is not that project's code.
    tracked = _git(folder, "ls-files", "--", ".") if heads else None
    if heads and tracked and tracked.strip() and len(heads.split("\n")) >= 3:
        top, commit, tree = heads.split("\n")[:3]
        status = _git(Path(top), "status", "--porcelain", "--untracked-files=no")
        if status is not None:
            return {
                "tree": tree,
                "commit": commit,
                "dirty": bool(status.strip()),
                "source": "git",
                "files": files,
            }
    return {"tree": None, "commit": None, "dirty": None, "source": "files", "files": files}


def library_versions() -> dict[str, str | None]:
    """The versions a measurement depends on: torch, Triton, the CUDA torch was built with,
    and FlashInfer (the main peer; None where it is not installed)."""
    return {
        "torch": torch.__version__,
        "triton": triton_version(),
        "cuda": torch.version.cuda,
        "flashinfer": flashinfer_version(),
    }


def flashinfer_version() -> str | None:
    """FlashInfer's version without importing it (its import initializes CUDA): an installed
    distribution's metadata, or the `_build_meta.py` of a source tree on the path."""
    module = sys.modules.get("flashinfer")
    if module is not None and isinstance(getattr(module, "__version__", None), str):
        return module.__version__
    for dist in ("flashinfer-python", "flashinfer"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError):
        return None
    # getattr: a stand-in module in sys.modules may carry a spec of any shape.
    for folder in getattr(spec, "submodule_search_locations", None) or ():
        meta = Path(folder) / "_build_meta.py"
        if meta.is_file():
            found = re.search(r"__version__\s*=\s*[\"']([^\"']+)", meta.read_text())
            if found:
                return found.group(1)
    return None


def snapshot(
    device: torch.device | str | None = None, run_started: str | None = None
) -> dict[str, Any]:
    """The environment a measurement was taken in: hardware, library versions, the code
    (`code_provenance`) and, when given, the run's own start time (ISO 8601, UTC)."""
    dev = torch.device(device) if device is not None else default_device()
    versions = {**library_versions(), "flashtune": _flashtune_version()}
    info: dict[str, Any] = {
        "hardware": device_name(dev),
        "device": str(dev),
        "python": _py_platform.python_version(),
        **versions,
        # Where FlashInfer-Bench reads them (its Environment.libs: name -> version string).
        "libs": {name: version for name, version in versions.items() if version is not None},
        "host": _py_platform.node(),
        "code": code_provenance(),
    }
    if run_started is not None:
        info["run_started"] = run_started
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(
            compute_capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            driver=_driver_version(),
        )
    else:
        info.update(compute_capability=None, sm_count=None, memory_gib=None, driver=None)
    return info

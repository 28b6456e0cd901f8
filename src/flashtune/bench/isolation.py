"""OS-level isolation of the sandboxes that run solutions, and hardening of the processes
that hold the harness (docs/evaluation.md, "Isolation").

The processes of a run, and who starts whom:

    runner --spawns--> fork server A --forks--> worker --spawns--> fork server B --forks--> sandbox

- `harden_harness()`, in the runner, the worker and both fork servers: not dumpable, so no
  other process of the same user can ptrace them or open their /proc/<pid>/mem. The fork
  servers harden themselves as they import this module (`FORKSERVER_MARK`).
- `enter_sandbox()`, first thing in every sandbox (bench/sandbox_child.py), before anything
  of the solution exists; each layer where the platform has it, the report says which:
  1. user + network + mount namespaces: no network at all (not even loopback); a root
     runner's sandbox holds no capability over the host; the mount namespace lays the shared
     build caches under the sandbox's scratch (overlay: read the shared entry, write to the
     scratch), so warm kernels stay warm and nothing shared can be poisoned;
  2. a private scratch folder (made by the worker, removed when the sandbox closes): TMPDIR,
     HOME and every cache (Triton through `triton_cache.LayeredCacheManager`, CUDA, torch
     extensions, FlashInfer, flashtune's own builds) write there; the process works in it;
  3. Landlock: writes only to the scratch, the GPU's device nodes (and /dev/null & co) and
     the process's own /proc/<pid>; reads only an allow-list (system folders, Python's, every
     sys.path entry, the dataset roots, CUDA's, the shared caches; as root, only the
     world-readable files of /etc); TCP bind/connect denied (ABI >= 4); no signal and no
     abstract unix socket outside the sandbox (ABI >= 6). FLASHTUNE_CACHE_DIR (signing keys,
     build caches) and the home folder are out of reach, --out and flashtune's sources too
     unless a sys.path entry covers them (then read-only);
  4. seccomp: no connect() (every unix socket, the fork servers' first: they fork an
     unsandboxed process for whoever connects; docker's, dbus'), no io_uring (it connects
     without connect()); no IP socket either where there is no network namespace;
  5. every capability dropped, no new privileges, core dumps off, files capped at
     `FILE_SIZE_LIMIT` (a write past it fails with EFBIG instead of killing the process),
     SIGKILL when the fork server (its parent) dies.
- `reap_strays()`, in the worker (a child subreaper): processes a sandbox left behind after
  it died (a double fork, a setsid) end up the worker's children; they are killed whenever a
  sandbox closes.

A layer the platform lacks (no Landlock: gVisor's kernel 4.4; no user namespaces: docker's
default seccomp profile) is skipped, never fatal; the report names it (`missing`) and the
runner prints `describe(report)`. FLASHTUNE_SANDBOX=0 turns every layer off, for debugging.

No PID namespace: CUDA fails to initialise in one (error 304, measured on an H100), so the
worker keeps finding a sandbox's processes by their parents, sessions and groups.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import platform as _py_platform
import re
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from flashtune import env
from flashtune.bench import confine
from flashtune.bench.confine import FS_EXECUTE, FS_READ, FS_READ_DIR, FS_READ_FILE

__all__ = [
    "FILE_SIZE_LIMIT",
    "FORKSERVER_MARK",
    "TRITON_CACHE_MANAGER",
    "TRITON_SHARED_ENV",
    "harden_harness",
    "marked_for_forkserver",
    "send_with_fds",
    "set_fd_channel",
    "PassedFd",
    "enter_sandbox",
    "enter_namespaces",
    "enter_tool_namespaces",
    "describe",
    "weaker",
    "isolated",
]

FILE_SIZE_LIMIT = 1 << 30  # bytes: a sandbox's largest file (its log, a build product)
FORKSERVER_MARK = "FLASHTUNE_HARDEN_FORKSERVER"
# Triton's cache manager in a sandbox (TRITON_CACHE_MANAGER takes "module:class"), and where
# it finds the shared cache it reads.
TRITON_CACHE_MANAGER = f"{__name__.rpartition('.')[0]}.triton_cache:LayeredCacheManager"
TRITON_SHARED_ENV = "FLASHTUNE_TRITON_SHARED_CACHE"
# What `weaker` compares: everything but the diagnostics.
_COMPARED = (
    "enabled",
    "landlock_abi",
    "userns",
    "netns",
    "mountns",
    "seccomp",
    "capabilities",
    "fs",
    "reads",
    "signals",
    "network",
    "unix_sockets",
)
# Read-only for everyone: where programs, libraries and drivers live. /proc and /dev get
# their own rules (`_landlock_rules`); /etc is only the world-readable part when root.
_SYSTEM_READS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys")
# Device nodes a solution may open read-write: the usual pseudo-devices and the GPUs'
# (measured on an H100: CUDA finds no GPU unless its nodes are writable). Not the rest of
# /dev: as root, a writable /dev would be the raw disks.
_DEVICES = ("null", "zero", "full", "random", "urandom", "shm", "dri", "kfd", "infiniband")
_DEVICE_PREFIXES = ("nvidia",)


# --------------------------------------------------------------------------- the harness


def harden_harness() -> bool:
    """Make this process non-dumpable: a process of the same user (a solution, where Landlock
    does not already stop it) can then neither ptrace it nor open its /proc/<pid>/mem.
    False where the platform has no prctl (not Linux)."""
    try:
        confine.set_dumpable(False)
    except (OSError, AttributeError):
        return False
    return True


@contextlib.contextmanager
def marked_for_forkserver() -> Iterator[None]:
    """Around the start of a fork server: the server hardens itself when it imports this
    module (a preloaded module: bench/sandbox.py's `_PRELOAD` imports it)."""
    os.environ[FORKSERVER_MARK] = "1"
    try:
        yield
    finally:
        os.environ.pop(FORKSERVER_MARK, None)


# --------------------------------------------------------------------------- file descriptors


class _FdCollector:
    """Stands in for a spawning Popen while a message is pickled: multiprocessing's
    `reduction.DupFd` (what torch's shared CPU tensors pickle their memory's file descriptor
    with) then asks it to pass each fd, instead of serving it from a unix socket the
    receiver would have to connect to (the sandbox may make no unix socket)."""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return len(self.fds) - 1

    def DupFd(self, index: int) -> PassedFd:  # noqa: N802 - multiprocessing's name
        return PassedFd(index)


def send_with_fds(conn: Any, message: Any) -> None:
    """`conn.send(message)` to a sandbox, the file descriptors the message pickles (shared
    CPU tensors) passed right after it over the same connection (SCM_RIGHTS)."""
    from multiprocessing import context, reduction

    collector = _FdCollector()
    context.set_spawning_popen(collector)  # type: ignore[arg-type]
    try:
        data = reduction.ForkingPickler.dumps(message)
    finally:
        context.set_spawning_popen(None)
    conn.send_bytes(data)
    for fd in collector.fds:
        reduction.send_handle(conn, fd, None)


_CHANNEL: Any = None  # the sandbox's connection to the worker (`set_fd_channel`)
_RECEIVED: list[int] = []


def set_fd_channel(conn: Any) -> None:
    """In the sandbox: where `PassedFd` reads the descriptors `send_with_fds` passes."""
    global _CHANNEL
    _CHANNEL = conn


class PassedFd:
    """A file descriptor of a message from `send_with_fds`, in the sandbox: unpickling the
    message (the same order as pickling it) takes each from the connection."""

    def __init__(self, index: int) -> None:
        self.index = index

    def detach(self) -> int:
        from multiprocessing import reduction

        if _CHANNEL is None:
            raise RuntimeError("no connection to receive file descriptors from")
        if self.index == 0:  # the first of a new message's
            _RECEIVED.clear()
        while len(_RECEIVED) <= self.index:
            _RECEIVED.append(reduction.recv_handle(_CHANNEL))
        return _RECEIVED[self.index]


# --------------------------------------------------------------------------- the sandbox


def enter_namespaces(report: dict[str, Any], net_alone: bool = True) -> None:
    """User + network + mount namespaces; a network namespace alone where only that is
    allowed (a privileged root where user namespaces are not), unless not `net_alone`.
    `report`: `enter_sandbox`'s (its "userns", "netns", "mountns" and "errors" are set)."""
    try:
        confine.enter_user_namespace()
    except OSError as exc:
        report["errors"]["userns"] = str(exc)
        if not net_alone:
            return
        try:
            confine.enter_network_namespace()
            report["netns"] = True
        except OSError as exc2:
            report["errors"]["netns"] = str(exc2)
        return
    report["userns"] = report["netns"] = report["mountns"] = True


def _scratch_layout(scratch: Path) -> dict[str, Path]:
    """The scratch's folders. Only the temporary one is made here (tempfile falls back to
    the current folder without it): every cache makes its own, and each folder costs its
    removal when the sandbox closes (milliseconds each on some disks)."""
    names = ("tmp", "home", "xdg", "cache", "triton", "cuda", "torch_extensions", "inductor")
    folders = {name: scratch / name for name in names}
    folders["tmp"].mkdir(mode=0o700, parents=True, exist_ok=True)
    return folders


def _shared_caches() -> dict[str, str]:
    """The shared caches' folders, as this process's environment names them (before the
    sandbox redirects it)."""
    home = os.path.expanduser("~")
    triton = os.environ.get("TRITON_CACHE_DIR") or os.path.join(
        os.environ.get("TRITON_HOME") or home, ".triton", "cache"
    )
    flashinfer_base = os.environ.get("FLASHINFER_WORKSPACE_BASE") or home
    return {
        "triton": triton,
        "flashinfer": os.path.join(flashinfer_base, ".cache", "flashinfer"),
        "flashtune": str(env.CACHE_DIR.get()),
        "home": home,
    }


def _overlay(target: str, scratch: Path, name: str, report: dict[str, Any]) -> bool:
    """Show the shared cache `target` as an overlay: its own files read-only below, writes
    into the scratch."""
    upper, work = scratch / "overlay" / name / "upper", scratch / "overlay" / name / "work"
    try:
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        confine.mount_overlay(target, str(upper), str(work))
    except OSError as exc:
        report["errors"][f"overlay {name}"] = str(exc)
        return False
    return True


def _bind(source: Path, target: str, report: dict[str, Any]) -> bool:
    try:
        source.mkdir(parents=True, exist_ok=True)
        os.makedirs(target, exist_ok=True)  # in the shared cache: an empty folder
        confine.bind_mount(str(source), target)
    except OSError as exc:
        report["errors"][f"bind {target}"] = str(exc)
        return False
    return True


def _cache_targets(shared: dict[str, str]) -> tuple[str, str, str]:
    """Where flashtune's builds, its Python solutions and FlashInfer's workspace are shared."""
    flashtune_cache = Path(shared["flashtune"])
    build, solutions = str(flashtune_cache / "build"), str(flashtune_cache / "solutions")
    return build, solutions, shared["flashinfer"]


def _mount_caches(scratch: Path, shared: dict[str, str], report: dict[str, Any]) -> set[str]:
    """In a mount namespace: flashtune's build cache and FlashInfer's JIT workspace keep
    their paths (their build files name them: torch's extension builder and FlashInfer's
    ninja files would rebuild elsewhere) as overlays on the shared folders, and flashtune's
    Python solutions are written into the scratch, mounted where build.py puts them. Only
    over shared caches that exist: without one, the builds are cold anyway. -> what was
    mounted ("build", "flashinfer")."""
    build, solutions, flashinfer = _cache_targets(shared)
    mounted: set[str] = set()
    if (
        os.path.isdir(build)
        and _overlay(build, scratch, "build", report)
        and _bind(scratch / "cache", solutions, report)
    ):
        mounted.add("build")
    if os.path.isdir(flashinfer) and _overlay(flashinfer, scratch, "flashinfer", report):
        mounted.add("flashinfer")
    return mounted


def _mount_points() -> dict[str, str]:
    """This mount namespace's mount points -> their file system types (/proc/self/mountinfo;
    its paths escape blanks as octal)."""
    points: dict[str, str] = {}
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return points
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields = head.split()
        if len(fields) >= 5 and tail:
            path = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])
            points[path] = tail.split()[0]
    return points


def _mounted_caches(scratch: Path, shared: dict[str, str]) -> set[str]:
    """What `_mount_caches` mounted for `scratch` in this namespace (the tool launcher did,
    in the process that became the tool): read from the mount table, not taken on trust."""
    points = _mount_points()
    build, solutions, flashinfer = _cache_targets(shared)
    mounted: set[str] = set()
    if points.get(build) == "overlay" and solutions in points:
        mounted.add("build")
    if points.get(flashinfer) == "overlay":
        mounted.add("flashinfer")
    return mounted


def _redirect_caches(
    scratch: Path, shared: dict[str, str], report: dict[str, Any], mounted: set[str]
) -> tuple[list[str], list[str]]:
    """Point every cache at the scratch; -> (extra folders to read, extra folders to write).

    `mounted`: the shared caches `_mount_caches` laid over themselves in this mount
    namespace; the others move into the scratch, cold. Triton reads its shared cache through
    `triton_cache.LayeredCacheManager` either way."""
    folders = _scratch_layout(scratch)
    environ: dict[str, Any] = {
        "TMPDIR": folders["tmp"],
        "HOME": folders["home"],
        "XDG_CACHE_HOME": folders["xdg"],
        "CUDA_CACHE_PATH": folders["cuda"],
        "TORCH_EXTENSIONS_DIR": folders["torch_extensions"],
        "TORCHINDUCTOR_CACHE_DIR": folders["inductor"],
        "TRITON_CACHE_DIR": folders["triton"],
        "TRITON_HOME": folders["home"],
    }
    reads, writes, layers = [shared["triton"]], [], []
    build, solutions, flashinfer = _cache_targets(shared)
    if "build" in mounted:
        writes += [build, solutions]
        layers.append("flashtune builds")
    else:
        environ["FLASHTUNE_CACHE_DIR"] = folders["cache"]
    if "flashinfer" in mounted:
        writes.append(flashinfer)
        layers.append("flashinfer")
    else:
        environ["FLASHINFER_WORKSPACE_BASE"] = scratch / "flashinfer"
    if importlib.util.find_spec("triton") is not None:
        environ["TRITON_CACHE_MANAGER"] = TRITON_CACHE_MANAGER
        environ[TRITON_SHARED_ENV] = shared["triton"]
        layers.append("triton")
    for key, value in environ.items():
        os.environ[key] = str(value)
    # tempfile keeps the folder it chose first (the fork server's /tmp, for its socket):
    # forget it, so Triton's compiles and the solution's temporary files land in the scratch.
    tempfile.tempdir = None
    report["shared_caches"] = "read-only: " + (", ".join(layers) or "none")
    os.chdir(scratch)
    return reads, writes


def _covers(folder: str, path: str) -> bool:
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder if folder == "/" else folder + "/")


def _read_folders(roots: Sequence[str], extra: Sequence[str], shared: dict[str, str]) -> list[str]:
    """The folders a sandbox reads (`shared`: `_shared_caches()`, taken before the sandbox
    moved HOME and the caches). None may contain flashtune's cache (its signing keys) or the
    home folder, nor lie in flashtune's cache: a sys.path entry such as the home folder or
    the current one is left out (nothing a sandbox imports lives there)."""
    candidates = [
        *_SYSTEM_READS,
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(sys.executable),
        *sys.path,
        *roots,
        *extra,
        *(os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)),
        *(os.environ.get(k, "") for k in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")),
    ]
    cache = os.path.realpath(shared["flashtune"])
    protected = [cache, os.path.realpath(shared["home"])]
    folders: list[str] = []
    for candidate in candidates:
        if not candidate:
            continue
        path = os.path.realpath(candidate)
        if not os.path.exists(path) or path in folders:
            continue
        if any(_covers(path, p) for p in protected) or _covers(cache, path):
            continue
        folders.append(path)
    return folders


_ETC_RULES: list[tuple[str, int]] | None = None


def _etc_rules() -> list[tuple[str, int]]:
    """/etc: for a root process only what any user may read (root would read the shadow file
    and the ssh host keys, and print them into its trace's log); for anyone else all of it
    (the permissions already keep them out). Computed once per process: the fork servers
    compute it as they start, their children inherit it."""
    global _ETC_RULES
    if _ETC_RULES is None:
        _ETC_RULES = [("/etc", FS_READ)] if os.geteuid() != 0 else _world_readable("/etc")
    return _ETC_RULES


def _world_readable(top: str) -> list[tuple[str, int]]:
    """Rules reading what anyone may read below `top`: whole folders where everything in
    them is, else their world-readable files one by one (few rules: each costs a syscall in
    every sandbox). Symbolic links count as readable: a rule never follows them."""
    rules: list[tuple[str, int]] = []
    anyone = stat.S_IROTH | stat.S_IXOTH

    def clean(folder: str) -> bool:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return False
        dirs, files, dirty = [], [], False
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                dirty = True
                continue
            if stat.S_ISLNK(mode):
                continue
            if stat.S_ISDIR(mode):
                if mode & anyone == anyone and clean(entry.path):
                    dirs.append(entry.path)
                else:
                    dirty = True
            elif mode & stat.S_IROTH:
                files.append(entry.path)
            else:
                dirty = True
        if dirty:
            rules.extend((d, FS_READ) for d in dirs)
            rules.extend((f, FS_READ_FILE | FS_EXECUTE) for f in files)
        return not dirty

    rules.append((top, FS_READ if clean(top) else FS_READ_DIR))
    return rules


def _device_rules(full: int) -> list[tuple[str, int]]:
    rules = [("/dev", FS_READ_DIR)]
    try:
        names = os.listdir("/dev")
    except OSError:
        return rules
    for name in names:
        if name in _DEVICES or name.startswith(_DEVICE_PREFIXES):
            rules.append((f"/dev/{name}", full))
    return rules


def _landlock_rules(
    scratch: Path, reads: Sequence[str], writes: Sequence[str], abi: int
) -> list[tuple[str, int]]:
    """Read the allow-list; write the scratch, the overlays, the device nodes and this
    process's own /proc/<pid>."""
    full = confine.landlock_rights(abi)
    rules = [(folder, FS_READ) for folder in reads]
    rules += _etc_rules()
    rules += _device_rules(full)
    # /proc: readable; writable only below this process's own /proc/<pid> (its threads'
    # names and the like). /proc/sys is not: uid 0 may write the kernel's settings there.
    rules += [("/proc", FS_READ), (f"/proc/{os.getpid()}", full)]
    rules += [(str(scratch), full), *((w, full) for w in writes)]
    return rules


def _new_report(enabled: bool) -> dict[str, Any]:
    return {
        "enabled": enabled,
        "landlock_abi": 0,
        "userns": False,
        "netns": False,
        "mountns": False,
        "seccomp": False,
        "capabilities": "kept",
        "fs": "unrestricted",
        "reads": "unrestricted",
        "signals": "not scoped",
        "network": "open",
        "unix_sockets": "reachable",
        "missing": [],
        "errors": {},
    }


def enter_sandbox(
    scratch: str | Path, roots: Sequence[str] = (), in_tool_namespaces: bool = False
) -> dict[str, Any]:
    """Isolate this process (a sandbox, single-threaded, before any of the solution's code)
    with every layer the platform has; -> the report of what was applied (JSON-able).

    `scratch`: the sandbox's private folder (the only writable one); `roots`: the dataset
    roots (read-only). Never raises for a missing layer: `report["missing"]` names it.

    `in_tool_namespaces` (only bench/probe.py, once `tool_sandbox.inherited_namespaces()`
    has verified it): this process already runs in the namespaces `enter_tool_namespaces`
    made for a CUDA tool and its target; every other layer applies, except that TCP stays
    open on those namespaces' own loopback (the tool's channel: Landlock leaves TCP alone,
    seccomp leaves IP sockets), and CUDA initialises before seccomp (`_harden_sandbox`)."""
    started = time.perf_counter()
    scratch = Path(scratch) if str(scratch) else Path(tempfile.mkdtemp(prefix="flashtune-"))
    parent = os.getppid()
    enabled = env.SANDBOX.get()
    report = _new_report(enabled)
    with contextlib.suppress(OSError, AttributeError):
        # Dumpable (the fork server is not): the worker opens this process's CUDA memory
        # with pidfd_getfd, which needs ptrace access, and an unprivileged process may write
        # its own uid_map only while dumpable. Landlock keeps other sandboxes out.
        confine.set_dumpable(True)
    if enabled:  # disabled: everything as it was before sandboxes were isolated
        shared = _shared_caches()
        if in_tool_namespaces:
            # The tool launcher (bench/tool_sandbox.py) entered them and mounted the caches;
            # the caller checked that this process is in its namespaces.
            report.update(userns=True, netns=True, mountns=True, tool_namespaces=True)
            mounted = _mounted_caches(scratch, shared)
        else:
            enter_namespaces(report)
            mounted = _mount_caches(scratch, shared, report) if report["mountns"] else set()
        reads, writes = _redirect_caches(scratch, shared, report, mounted)
        folders = _read_folders(roots, reads, shared)
        _harden_sandbox(scratch, folders, writes, report, tool=in_tool_namespaces)
    with contextlib.suppress(OSError, AttributeError):
        confine.set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the fork server died before the line above: so do we
        os._exit(1)
    report["missing"] = _missing(report)
    report["enter_ms"] = round((time.perf_counter() - started) * 1e3, 2)
    return report


def enter_tool_namespaces(scratch: str | Path) -> dict[str, Any]:
    """For the tool launcher (bench/tool_sandbox.py), in the process that becomes a CUDA
    tool's front-end: the sandbox's user + network + mount namespaces (`enter_namespaces`),
    and the shared caches laid over themselves for `scratch` (the probe that runs in them
    has no capability left to mount after the tool's exec). -> a report with "userns",
    "netns", "mountns", "errors" and "mounted"."""
    report = _new_report(True)
    # Not a network namespace alone: the probe would not recognise it, and would enter one
    # of its own, away from the tool's.
    enter_namespaces(report, net_alone=False)
    mounted: set[str] = set()
    if report["mountns"]:
        mounted = _mount_caches(Path(scratch), _shared_caches(), report)
    report["mounted"] = sorted(mounted)
    return report


def _init_cuda(report: dict[str, Any]) -> None:
    """cuInit, in a tool's target before seccomp: the tool's injection library loads there
    and opens its channel to the front-end, with connect() still allowed. -> report's
    "cuda_before_seccomp": the driver's answer (0: initialised)."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        report["errors"]["cuInit"] = f"no CUDA driver: {exc}"
        return
    report["cuda_before_seccomp"] = int(driver.cuInit(0))


def _harden_sandbox(
    scratch: Path,
    reads: Sequence[str],
    writes: Sequence[str],
    report: dict[str, Any],
    tool: bool = False,
) -> None:
    """Limits, no new privileges, Landlock, seccomp, no capabilities: in this order (Landlock
    and seccomp need no_new_privs; dropping the bounding set needs CAP_SETPCAP, last).

    `tool` (a CUDA tool's target in the tool's namespaces): Landlock leaves TCP alone (the
    namespaces' loopback is the tool's channel; nothing else is on it), CUDA initialises
    after Landlock and the capability drop (its threads inherit both) and before seccomp
    (the injection library connects as it loads), and seccomp then covers every thread
    (TSYNC)."""
    confine.limit_file_size(FILE_SIZE_LIMIT)
    try:
        confine.set_no_new_privs()
    except OSError as exc:
        report["errors"]["no_new_privs"] = str(exc)
    abi = confine.landlock_abi()
    if abi:
        try:
            rules = _landlock_rules(scratch, reads, writes, abi)
            scoped = confine.landlock_restrict(abi, rules, tcp=not tool)
            report.update(landlock_abi=abi, fs="scratch-only", reads="allow-list")
            if scoped:
                report["signals"] = "scoped"
        except OSError as exc:
            report["errors"]["landlock"] = str(exc)
    if tool:
        # Capabilities are per thread: gone before CUDA's threads exist (as root, the probe
        # keeps the user namespace's across the tool's exec).
        _drop_capabilities(report)
        _init_cuda(report)
    try:
        report["seccomp"] = confine.install_seccomp(
            _py_platform.machine(), deny_ip=not report["netns"], all_threads=tool
        )
    except OSError as exc:
        report["errors"]["seccomp"] = str(exc)
    if report["seccomp"]:
        report["unix_sockets"] = "no connect"
    if tool:
        report["network"] = "the tool's loopback only"
    elif report["netns"]:
        report["network"] = "none"
    elif report["seccomp"]:
        report["network"] = "ip sockets denied"
    elif report["landlock_abi"] >= 4:
        report["network"] = "tcp denied"
    if not tool:
        _drop_capabilities(report)


def _drop_capabilities(report: dict[str, Any]) -> None:
    try:
        confine.drop_capabilities()
        report["capabilities"] = "dropped"
    except OSError as exc:
        report["errors"]["capabilities"] = str(exc)


def _missing(report: dict[str, Any]) -> list[str]:
    """What this sandbox lacks, and what that leaves open."""
    if not report["enabled"]:
        return ["everything (FLASHTUNE_SANDBOX=0)"]
    missing = []
    abi = report["landlock_abi"]
    if not abi:
        missing.append(
            "Landlock: the file system, ptrace and signals are not restricted (same user)"
        )
    elif report["signals"] != "scoped":
        missing.append(f"Landlock scopes (ABI {abi} < 6): signals to the harness not blocked")
    if not report["userns"]:
        missing.append("user namespace: caches are cold (no overlays)")
    if not report["netns"]:
        missing.append(f"network namespace: network {report['network']}")
    if not report["seccomp"]:
        missing.append("seccomp: unix sockets (the fork servers') can be connected to")
    if report["capabilities"] != "dropped":
        missing.append("capabilities not dropped")
    return missing


def isolated(report: dict[str, Any] | None) -> bool:
    """Whether the report shows every layer."""
    return bool(report and report.get("enabled", False) and not report.get("missing"))


def weaker(report: Any, expected: dict[str, Any]) -> list[str]:
    """How `report` (a sandbox's) falls short of `expected` (the worker's probe): the fields
    that differ, as 'name: got X, expected Y'."""
    if not isinstance(report, dict):
        return [f"no report ({type(report).__name__})"]
    return [
        f"{k}: got {report.get(k)!r}, expected {expected.get(k)!r}"
        for k in _COMPARED
        if report.get(k) != expected.get(k)
    ]


def describe(report: dict[str, Any] | None) -> str:
    """One line for `flashtune run`'s summary: the isolation level, loud where it is short."""
    if not report:
        return "sandbox: UNKNOWN (the worker reported nothing about its isolation)"
    if not report.get("enabled", True):
        return (
            "sandbox: DISABLED by FLASHTUNE_SANDBOX=0 (debugging only): solutions run as this "
            "user with its file system, network and processes"
        )
    has = []
    abi = report.get("landlock_abi") or 0
    if abi:
        has.append(f"Landlock ABI {abi}")
    spaces = [n for n in ("user", "net", "mount") if report.get(f"{n}ns")]
    if spaces:
        has.append("/".join(spaces) + " namespaces")
    if report.get("seccomp"):
        has.append("seccomp")
    if report.get("capabilities") == "dropped":
        has.append("no capabilities")
    if not abi:
        lacks = ["no Landlock"] + ([] if report.get("userns") else ["no user namespaces"])
        text = (
            f"sandbox: NOT ISOLATED ({', '.join(lacks)}): solutions run as this user with its "
            "file system"
        )
        return text + (f" (has: {' + '.join(has)})" if has else "")
    text = "sandbox: " + " + ".join(has)
    missing = report.get("missing") or []
    if missing:
        text += "; PARTIAL, missing: " + "; ".join(missing)
    elif report.get("tool_namespaces"):
        text += (
            " (writes: own scratch; reads: allow-list; no signals, sockets; network: the"
            " namespaces' loopback, shared with the CUDA tool only)"
        )
    else:
        text += " (writes: own scratch; reads: allow-list; no network, signals, sockets)"
    return text


if os.environ.pop(FORKSERVER_MARK, None) == "1":  # a fork server importing its preloads
    harden_harness()
    with contextlib.suppress(OSError):
        _etc_rules()  # once here rather than in every sandbox it forks

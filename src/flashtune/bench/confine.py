"""Linux's primitives for confining a process, through libc (ctypes; Python 3.10 has no
os.unshare): prctl, namespaces, mounts, Landlock, seccomp, capabilities, resource limits.

Mechanism only: which folders a sandbox may read or write, and what its report says, is
bench/isolation.py's policy. Every function raises OSError (with the kernel's errno) where
the kernel refuses, and does nothing else: the caller decides what a missing layer means.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import signal
import stat
import struct
from collections.abc import Sequence
from typing import Any

__all__ = [
    "FS_EXECUTE",
    "FS_READ_FILE",
    "FS_READ_DIR",
    "FS_READ",
    "prctl",
    "set_dumpable",
    "set_subreaper",
    "set_no_new_privs",
    "set_parent_death_signal",
    "enter_user_namespace",
    "enter_network_namespace",
    "bring_loopback_up",
    "mount_overlay",
    "bind_mount",
    "landlock_abi",
    "landlock_rights",
    "landlock_restrict",
    "seccomp_program",
    "install_seccomp",
    "drop_capabilities",
    "limit_file_size",
]

# prctl options
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP = 22
_PR_CAPBSET_DROP = 24
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SECCOMP_MODE_FILTER = 2

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_MS_BIND = 4096
_MS_REC = 16384

# Landlock (include/uapi/linux/landlock.h); its syscalls have the same numbers everywhere.
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
_FS_ABI1 = (1 << 13) - 1  # execute ... make_sym
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
# The rights a rule on a file (not a folder) may hold.
_FS_FILE_ONLY = FS_EXECUTE | _FS_WRITE_FILE | FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1

_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _arg(value: Any) -> Any:
    if value is None or isinstance(value, (bytes, ctypes.Array, ctypes._SimpleCData)):
        return value
    return ctypes.c_long(value)


def _call(name: str, *args: Any) -> int:
    """libc's `name`(*args); OSError with the errno when it returns -1 (ENOSYS where this
    libc has no such function: not Linux)."""
    try:
        function = getattr(_libc(), name)
    except AttributeError:
        raise OSError(errno.ENOSYS, f"{name}: not on this platform") from None
    result = int(function(*(_arg(a) for a in args)))
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")
    return result


def _syscall(number: int, *args: Any) -> int:
    return _call("syscall", number, *args)


def prctl(option: int, arg: Any = 0) -> int:
    return _call("prctl", option, arg, 0, 0, 0)


def set_dumpable(dumpable: bool) -> None:
    """A non-dumpable process can be neither ptraced nor read or written through
    /proc/<pid>/mem by another process of its user (without CAP_SYS_PTRACE)."""
    prctl(_PR_SET_DUMPABLE, int(dumpable))


def set_subreaper() -> None:
    """Orphans of this process's descendants become its children."""
    prctl(_PR_SET_CHILD_SUBREAPER, 1)


def set_no_new_privs() -> None:
    """No execve gains a privilege any more (set-uid, file capabilities); Landlock and
    seccomp need it."""
    prctl(_PR_SET_NO_NEW_PRIVS, 1)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    prctl(_PR_SET_PDEATHSIG, sig)


def enter_user_namespace() -> None:
    """A new user namespace mapping this process's own uid and gid (so it keeps them), with a
    network namespace (only a down loopback: no network) and a mount namespace in it."""
    uid, gid = os.geteuid(), os.getegid()
    _call("unshare", _CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWNS)
    # Unprivileged, a process maps only its own ids, and its gid only without setgroups.
    with contextlib.suppress(FileNotFoundError):
        _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")


def enter_network_namespace() -> None:
    """A network namespace alone (needs CAP_SYS_ADMIN: a privileged root)."""
    _call("unshare", _CLONE_NEWNET)


_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def bring_loopback_up() -> None:
    """Set this network namespace's "lo" up (SIOCSIFFLAGS through a datagram socket; needs
    CAP_NET_ADMIN over the namespace: its owner right after unshare). A fresh namespace's
    loopback is down: nothing, not even 127.0.0.1, is reachable until then."""
    import fcntl
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request))[1]
        if not flags & _IFF_UP:
            fcntl.ioctl(
                sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | _IFF_UP)
            )


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def mount_overlay(target: str, upper: str, work: str) -> None:
    """Show `target` as an overlay of itself (read-only below) and `upper` (where writes go),
    in this process's mount namespace. `userxattr`: what a user namespace may mount."""
    options = f"lowerdir={target},upperdir={upper},workdir={work},userxattr"
    _call("mount", b"overlay", target.encode(), b"overlay", 0, options.encode())


def bind_mount(source: str, target: str) -> None:
    _call("mount", source.encode(), target.encode(), None, _MS_BIND | _MS_REC, None)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock (or with it disabled)."""
    try:
        return _syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    except (OSError, AttributeError):
        return 0


def landlock_rights(abi: int) -> int:
    """Every file-system right Landlock `abi` knows: a rule holding them all allows all."""
    rights = _FS_ABI1
    if abi >= 2:
        rights |= _FS_REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


def landlock_restrict(abi: int, rules: Sequence[tuple[str, int]], tcp: bool = True) -> bool:
    """Restrict this thread (and what it starts) to `rules` (path, rights beneath it): every
    right of `landlock_rights(abi)` is denied elsewhere; with `tcp`, TCP bind and connect are
    denied everywhere (ABI >= 4); signals and abstract unix sockets cannot leave the domain
    (ABI >= 6). A path that cannot be opened gets no rule. -> whether scoping applied."""
    fs = landlock_rights(abi)
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if tcp else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
    # The attribute is as long as this kernel's version of it (a longer one is E2BIG).
    fields = [fs] + ([net] if abi >= 4 else []) + ([scoped] if abi >= 6 else [])
    attr = struct.pack(f"={len(fields)}Q", *fields)
    ruleset = _syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, len(attr), 0)
    try:
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # gone, or not ours to open: nothing to allow
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    access &= _FS_FILE_ONLY
                rule = struct.pack("=Qi", access & fs, fd)
                _syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, rule, 0)
            finally:
                os.close(fd)
        _syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)
    return abi >= 6


# Seccomp (classic BPF): per architecture, its audit number and the numbers of socket(),
# connect() and io_uring_setup().
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 42, 425), "aarch64": (0xC00000B7, 198, 203, 425)}
_AF_INET, _AF_INET6, _AF_PACKET = 2, 10, 17
# seccomp(2)'s number per architecture, for SECCOMP_FILTER_FLAG_TSYNC (prctl has no flags).
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine: str, deny_ip: bool) -> list[tuple[int, int, int, int]] | None:
    """The filter's instructions (code, jt, jf, k):
    - connect() fails with ENOENT, whatever the address: no unix socket can be reached (the
      fork servers', docker's, dbus'), as if none existed. Not socket() itself: CUDA's
      initialisation makes a unix socket (to look for an MPS server; measured on an H100, a
      refused socket() fails it with error 304, a refused connect() does not);
    - io_uring_setup() fails (io_uring connects without connect());
    - with `deny_ip`, socket() of the IP and packet families fails (EPERM);
    - any call of another architecture (a 32-bit or x32 syscall from a 64-bit process) fails;
    - everything else goes through.
    None on an architecture this does not know."""
    if machine not in _SECCOMP_ARCH:
        return None
    arch, nr_socket, nr_connect, nr_uring = _SECCOMP_ARCH[machine]
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, errno_ = 0x7FFF0000, 0x00050000
    families = [_AF_INET, _AF_INET6, _AF_PACKET] if deny_ip else []
    # Instructions with symbolic jump targets (a label, or None: the next one).
    code: list[tuple[int, str | None, str | None, int]] = [
        (load, None, None, 4),  # seccomp_data.arch
        (jeq, None, "deny", arch),
        (load, None, None, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        code.append((jge, "deny", None, 0x40000000))  # the x32 ABI
    code += [(jeq, "deny", None, nr_uring), (jeq, "absent", None, nr_connect)]
    if families:
        code.append((jeq, None, "allow", nr_socket))
        code.append((load, None, None, 16))  # args[0], low half (little-endian): the family
        code += [(jeq, "deny", None, family) for family in families]
    code.append((ret, None, None, allow))
    labels = {"allow": len(code) - 1, "absent": len(code), "deny": len(code) + 1}
    code.append((ret, None, None, errno_ | errno.ENOENT))
    code.append((ret, None, None, errno_ | errno.EPERM))
    program = []
    for index, (op, jt, jf, k) in enumerate(code):
        to = [0 if t is None else labels[t] - index - 1 for t in (jt, jf)]
        program.append((op, to[0], to[1], k))
    return program


def install_seccomp(machine: str, deny_ip: bool, all_threads: bool = False) -> bool:
    """Install `seccomp_program` on this thread (and what it starts; no_new_privs first);
    with `all_threads`, on every thread of the process too (SECCOMP_FILTER_FLAG_TSYNC: for a
    process that already has threads, e.g. CUDA's). False on an architecture it does not
    know."""
    program = seccomp_program(machine, deny_ip)
    if program is None:
        return False
    filters = (_SockFilter * len(program))(*(_SockFilter(*i) for i in program))
    fprog = _SockFprog(len(program), filters)
    pointer = ctypes.c_void_p(ctypes.addressof(fprog))
    if not all_threads:
        _call("prctl", _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, pointer, 0, 0)
        return True
    number = _SYS_SECCOMP[machine]
    failed = _syscall(number, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, pointer)
    if failed:  # TSYNC's answer: the id of a thread it could not synchronize
        raise OSError(errno.ESRCH, f"seccomp: thread {failed} could not be synchronized")
    return True


def drop_capabilities() -> None:
    """Every capability, bounding and ambient sets included: root in a user namespace, or a
    root runner's sandbox where there is none, keeps only what any user has (no module
    loading, no raw I/O, no TIOCSTI into a terminal, no ptrace of others)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 40
    with contextlib.suppress(OSError):
        prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    for cap in range(last + 1):  # needs CAP_SETPCAP: a process without it has none to drop
        with contextlib.suppress(OSError):
            prctl(_PR_CAPBSET_DROP, cap)
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # effective, permitted, inheritable: 0, for capabilities 0-31 and 32-63
    _call("capset", header, data)


def limit_file_size(limit: int) -> None:
    """No file written larger than `limit` bytes (soft and hard limit: nothing raises it
    again without CAP_SYS_RESOURCE); a write past it fails with EFBIG instead of killing the
    process; and no core dump."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY:
        limit = min(hard, limit)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

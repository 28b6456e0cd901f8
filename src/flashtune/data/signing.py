"""This user's secret keys, and the MACs that make flashtune's own records unforgeable.

A dataset is a folder anyone may have written: a solution being benchmarked, the stranger
who published it, a hand editing a JSONL file. A record that flashtune itself wrote carries
an HMAC-SHA256 made with a secret only this user's flashtune holds, so whatever else wrote
the folder, it cannot produce a record that verifies:

- traces: `flashtune run` (the runner, the trusted parent process: never a worker nor a
  sandbox) signs every trace it writes (`sign_trace`); apply admits only traces that verify
  (`trace_signature_problem`), and `--resume` skips only triples whose trace verifies. A
  trace measured elsewhere is imported deliberately with `flashtune traces trust`
  (`trust_trace_file`), which re-signs it after the user has seen what is being trusted;
- apply's saved table (`flashtune.apply.table`): signed the same way, rebuilt when it does
  not verify.

Keys: one per purpose, `$FLASHTUNE_CACHE_DIR/keys/<purpose>.key` (64 hex characters), in a
folder of mode 0700, each file 0600 whatever the umask, created atomically (written to a
temporary file, then hard-linked into place: of two processes creating it at once, both use
the first). A record names its key by `key_id`, a hash of the key, never the key.

The MAC of a trace covers its canonical JSON (sorted keys, no spaces, NaN as
FlashInfer-Bench's strings) without its own `signature` field, prefixed by the purpose, so
a MAC made for one kind of record never verifies as another. The signature is a top-level
field that FlashInfer-Bench ignores when it reads the trace:

    "signature": {"alg": "hmac-sha256", "key_id": "<16 hex>", "mac": "<64 hex>"}
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashtune import env
from flashtune.data.io import (
    DatasetFileError,
    atomic_write_bytes,
    make_temp_file,
    parse_json,
    parse_model,
)
from flashtune.data.models import Trace

__all__ = [
    "ALGORITHM",
    "ChangedFileError",
    "KEY_DIR",
    "SIGNATURE_FIELD",
    "TRACES",
    "SigningKeyError",
    "TrustedFile",
    "canonical_json",
    "document_mac",
    "key_dir",
    "key_id",
    "sign_trace",
    "trace_mac",
    "trace_signature_problem",
    "trust_trace_file",
    "user_key",
]

log = logging.getLogger("flashtune.data")

KEY_DIR = "keys"
TRACES = "traces"  # the purpose (and key file) of trace signatures
SIGNATURE_FIELD = "signature"
ALGORITHM = "hmac-sha256"
_KEY_HEX = 64  # 32 random bytes, hex
_KEYS: dict[Path, bytes] = {}
_KEYS_LOCK = threading.Lock()


class SigningKeyError(OSError):
    """This user's key cannot be read or created (the cache folder is unusable)."""


def key_dir() -> Path:
    """Where this user's keys live: $FLASHTUNE_CACHE_DIR/keys (a sandbox must not read it)."""
    return Path(env.CACHE_DIR.get()) / KEY_DIR


def _create_key(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)  # (mkdir's mode is masked by the umask; an old folder)
    fd, tmp = make_temp_file(path)
    try:
        os.fchmod(fd, 0o600)  # a secret: private whatever the umask
        os.write(fd, secrets.token_hex(_KEY_HEX // 2).encode())
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:  # link, not replace: a key another process made first is kept
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)


def _read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SigningKeyError(f"{path} is not a regular file")
        if info.st_mode & 0o077:
            log.warning(
                "%s can be read by others (mode %o): a key that is not secret proves "
                "nothing; chmod 600 it, or remove it and a new one is made",
                path,
                info.st_mode & 0o777,
            )
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(data) < 32:
        raise SigningKeyError(f"{path} holds no key (too short)")
    return data


def user_key(purpose: str = TRACES) -> bytes:
    """This user's secret for `purpose` (created on first use); SigningKeyError when the
    cache folder cannot hold it (records are then neither signed nor trusted)."""
    path = key_dir() / f"{purpose}.key"
    with _KEYS_LOCK:
        key = _KEYS.get(path)
        if key is not None:
            return key
        try:
            try:
                key = _read_key(path)
            except FileNotFoundError:
                _create_key(path)
                key = _read_key(path)
        except SigningKeyError:
            raise
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.errno == errno.ELOOP:
                why = "it is a symbolic link"
            raise SigningKeyError(f"no key at {path}: {why}") from None
        _KEYS[path] = key
        return key


def key_id(key: bytes) -> str:
    """A name for `key` that reveals nothing of it (16 hex characters of a hash)."""
    return hashlib.sha256(b"flashtune key id\0" + key).hexdigest()[:16]


def canonical_json(document: Any) -> bytes:
    """`document` as the bytes a MAC covers: sorted keys, no spaces, ASCII, no bare NaN."""
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def document_mac(
    key: bytes, purpose: str, document: Mapping[str, Any], exclude: Iterable[str] = ()
) -> str:
    """HMAC-SHA256 (hex) of `document` without the `exclude` keys, for `purpose`."""
    skip = set(exclude)
    payload = canonical_json({k: v for k, v in document.items() if k not in skip})
    return hmac.new(key, purpose.encode() + b"\0" + payload, hashlib.sha256).hexdigest()


def trace_mac(trace: Trace, key: bytes) -> str:
    """The MAC of `trace` as it would be written, its signature left out."""
    return document_mac(key, TRACES, trace.to_dict(), exclude=(SIGNATURE_FIELD,))


def sign_trace(trace: Trace, key: bytes | None = None) -> Trace:
    """Sign `trace` in place with this user's key (or `key`), after its last change; returns
    it. SigningKeyError when there is no key."""
    key = key if key is not None else user_key(TRACES)
    mac = trace_mac(trace, key)
    trace.signature = {"alg": ALGORITHM, "key_id": key_id(key), "mac": mac}
    return trace


def trace_signature_problem(trace: Trace, key: bytes | None) -> str | None:
    """Why `trace` is not proven to have been written by this user's flashtune (unsigned,
    signed with another key, or changed since it was signed), or None. `key`: this user's
    trace key (None: there is none, and nothing verifies)."""
    signature = trace.signature
    trust = "`flashtune traces trust` imports traces you trust"
    if signature is None:
        return f"not signed: not written by `flashtune run` here ({trust})"
    if key is None:
        return "no key to verify signatures with (the cache folder is unusable)"
    mac, kid, alg = (signature.get(k) for k in ("mac", "key_id", "alg"))
    if alg != ALGORITHM or not isinstance(mac, str):
        return f"signature is malformed (expected {ALGORITHM} with a mac)"
    if kid != key_id(key):
        return f"signed with another key (key id {kid!r}, not this user's {key_id(key)}; {trust})"
    if not hmac.compare_digest(mac, trace_mac(trace, key)):
        return "signature does not verify: the trace was changed after it was signed"
    return None


# --------------------------------------------------------------------------- trust


@dataclass
class TrustedFile:
    """What `trust_trace_file` found (and, unless a dry run, signed) in one trace file."""

    path: Path
    digest: str = ""  # sha256 of the bytes read (what the user was shown)
    signed: list[Trace] = field(default_factory=list)  # newly signed (or to be signed)
    already: int = 0  # lines that already verify under this user's key: left unchanged
    unreadable: list[str] = field(default_factory=list)  # lines left as they are, with why
    previously: dict[str, int] = field(default_factory=dict)  # why each was not trusted


class ChangedFileError(RuntimeError):
    """A trace file changed between being listed to the user and being signed."""


def trust_trace_file(
    path: Path, root: Path, key: bytes, write: bool = True, expect_digest: str | None = None
) -> TrustedFile:
    """Sign every trace of the JSONL file `path` that does not verify under `key` (with
    `write`: rewrite the file atomically, confined to `root`; each line that already
    verifies and each line that cannot be read is kept byte for byte). The caller has shown
    the user what is being trusted (a first call without `write`): passing that call's
    `digest` as `expect_digest` makes sure nothing else is signed (ChangedFileError if the
    file changed since). This vouches for the traces as if `flashtune run` had measured
    them here."""
    raw = path.read_bytes()
    result = TrustedFile(path, digest=hashlib.sha256(raw).hexdigest())
    if expect_digest is not None and expect_digest != result.digest:
        raise ChangedFileError(f"{path} changed since it was listed: nothing in it was signed")
    out: list[bytes] = []
    for lineno, data in enumerate(raw.split(b"\n"), start=1):
        if not data.strip():
            out.append(data)
            continue
        try:
            parsed = parse_json(data.decode("utf-8"), path)
            trace = parse_model(Trace, parsed, path, line=lineno)
        except UnicodeDecodeError:
            result.unreadable.append(f"line {lineno}: not UTF-8 text")
            out.append(data)
            continue
        except DatasetFileError as exc:
            why = "; ".join(e.message for e in exc.errors)
            result.unreadable.append(f"line {lineno}: {why}"[:300])
            out.append(data)
            continue
        problem = trace_signature_problem(trace, key)
        if problem is None:
            result.already += 1
            out.append(data)
            continue
        reason = problem.split(" (")[0].split(":")[0]
        result.previously[reason] = result.previously.get(reason, 0) + 1
        sign_trace(trace, key)
        result.signed.append(trace)
        out.append(trace.to_json().encode("utf-8"))
    if write and result.signed:
        atomic_write_bytes(path, b"\n".join(out), root=root)
    return result

"""The autotune config file: reading, checking, merging and writing it.

Format (FlashInfer's): a JSON dict whose keys are ``str((op_name, runner_class_name,
optimization_profile))`` and whose values are ``[runner_class_name, tactic]``; compound
tactics are nested lists, restored to tuples on load. ``_metadata`` records the environment
the file was made in (compared on load, ``"*"`` matches anything) and ``_last_updated_by``
the environment of the last writer (informational).

Tactics that are frozen dataclasses of flashtune's ops (``RMSNormTactic``,
``SamplingTactic``, ...) are written as a JSON object tagged with their class,
``{"__tactic__": "flashtune.ops.norm.config:RMSNormTactic", "block": 1024, ...}``, and
matched on load against the tactics the runner offers (a file never imports code).

```json
{
  "_metadata": {"flashtune_version": "0.1.0", "torch_version": "2.13.0", "triton_version": "3.6.0",
                "cuda_version": "12.8", "gpu_name": "NVIDIA H100 80GB HBM3"},
  "('gemm', 'TritonGemmRunner', ((128, 4096), (4096, 4096)))": ["TritonGemmRunner", [64, 128, 64, 4, 3]]
}
```
"""

from __future__ import annotations

import ast
import dataclasses
import datetime as _dt
import functools
import json
import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from flashtune.data.io import atomic_write_text
from flashtune.tune.runner import Tactic

__all__ = [
    "CacheKey",
    "Entry",
    "FileRead",
    "METADATA_KEY",
    "METADATA_FIELDS",
    "DEVICE_FIELDS",
    "OPTIONAL_FIELDS",
    "metadata_differences",
    "current_metadata",
    "metadata_mismatch",
    "merge_files",
    "matches_stored",
    "read_cache_file",
    "write_cache_file",
    "backup_file",
    "corrupt_entries",
    "encode_key",
    "decode_key",
]

logger = logging.getLogger("flashtune.tune")

METADATA_KEY = "_metadata"
LAST_UPDATED_KEY = "_last_updated_by"
WILDCARD = "*"
METADATA_FIELDS = (
    "flashtune_version",
    "torch_version",
    "triton_version",
    "cuda_version",
    "gpu_name",
    "device_capability",
    "driver_version",
)
# Fields added after files were first written (and bundled): a file without them is not
# rejected for it (gpu_name already pins the device); a file that has them must agree.
OPTIONAL_FIELDS = frozenset({"device_capability", "driver_version"})
# The fields that say which device a file was measured on. A difference in them means the
# file is another GPU's: skipped. A difference in the others (library and driver versions)
# makes its picks stale: `autotune(True, cache=...)` re-validates them (tune/store.py).
DEVICE_FIELDS = frozenset({"gpu_name", "device_capability"})

CacheKey = tuple[str, str, Any]  # (op_name, runner_class_name, profile)
Entry = tuple[str, Tactic]  # (runner_class_name, tactic)


@functools.lru_cache(maxsize=1)
def current_metadata() -> dict[str, Any]:
    """The environment tuned configs are valid for (touches CUDA only if a GPU exists)."""
    import torch

    from flashtune import __version__, platform

    snap_gpu = platform.device_name()
    capability = platform.compute_capability()
    return {
        "flashtune_version": __version__,
        "torch_version": torch.__version__,
        "triton_version": platform.triton_version(),
        "cuda_version": torch.version.cuda,
        "gpu_name": snap_gpu,
        # "9.0": tiles and pipelines depend on the architecture, not only the marketing name.
        "device_capability": None if capability is None else f"{capability[0]}.{capability[1]}",
        # Graph replay and launch costs move with the driver; None without a GPU (no probe).
        "driver_version": platform.driver_version() if capability is not None else None,
    }


def metadata_mismatch(
    found: Mapping[str, Any], expected: Mapping[str, Any]
) -> tuple[str, Any, Any] | None:
    """The first field where `found` (from a file) disagrees with `expected`, as
    (field, found, expected); None when all agree. "*" on either side matches anything."""
    for name, want in expected.items():
        if name not in found:
            if name in OPTIONAL_FIELDS:
                continue
            return name, "<missing>", want
        have = found[name]
        if have == WILDCARD or want == WILDCARD or have == want:
            continue
        return name, have, want
    return None


def metadata_differences(
    found: Mapping[str, Any], expected: Mapping[str, Any]
) -> list[tuple[str, Any, Any]]:
    """Every field where `found` disagrees with `expected` (same rules as
    `metadata_mismatch`), so a caller can tell a device change from a version change."""
    out = []
    for name, want in expected.items():
        one = metadata_mismatch({name: found[name]} if name in found else {}, {name: want})
        if one is not None:
            out.append(one)
    return out


TACTIC_TYPE_KEY = "__tactic__"


@dataclass(frozen=True)
class StoredTactic:
    """A dataclass tactic as a file holds it: its class's name and its fields. Reading a file
    never imports code; the tuner swaps a stored tactic for the runner's own tactic of the
    same class and fields (`stored_form`), or ignores it as stale."""

    type_name: str
    fields: tuple[tuple[str, Any], ...]


def stored_form(tactic: Any) -> Any:
    """A tactic as it compares with what a file holds: dataclasses as StoredTactic."""
    if isinstance(tactic, StoredTactic):
        return tactic
    if dataclasses.is_dataclass(tactic) and not isinstance(tactic, type):
        cls = type(tactic)
        return StoredTactic(
            f"{cls.__module__}:{cls.__qualname__}",
            tuple(
                (f.name, stored_form(getattr(tactic, f.name))) for f in dataclasses.fields(tactic)
            ),
        )
    if isinstance(tactic, tuple):
        return tuple(stored_form(v) for v in tactic)
    return tactic


def matches_stored(candidate: Any, stored: Any) -> bool:
    """Whether a runner's own tactic is the one a file holds in its stored form. A dataclass
    tactic also matches an entry written before its class gained fields, when those fields
    keep their defaults (MLATactic gained dv_split and fused_merge in session 20: a file
    tuned before still names the same kernels); a field the file has and the class lost
    never matches."""
    form = stored_form(candidate)
    if form == stored:
        return True
    if not (isinstance(form, StoredTactic) and isinstance(stored, StoredTactic)):
        return False
    if form.type_name != stored.type_name:
        return False
    held, own = dict(stored.fields), dict(form.fields)
    if not held.keys() <= own.keys():
        return False
    defaults = {
        f.name: stored_form(f.default)
        for f in dataclasses.fields(candidate)
        if f.default is not dataclasses.MISSING
    }
    return all(
        held[name] == value if name in held else defaults.get(name, _NO_DEFAULT) == value
        for name, value in own.items()
    )


_NO_DEFAULT = object()


# Tactic classes whose module moved when the op families became packages (issue 32): a file
# written before names the old module; read it under the new one, so no tuned entry is lost.
MOVED_TACTIC_MODULES = {
    "flashtune.ops.norm_config": "flashtune.ops.norm.config",
    "flashtune.ops.activation_config": "flashtune.ops.activation.config",
    "flashtune.ops.rope_config": "flashtune.ops.rope.config",
    "flashtune.ops.gemm_config": "flashtune.ops.gemm.config",
    "flashtune.ops.sampling_config": "flashtune.ops.sampling.config",
    "flashtune.ops.attention.decode_config": "flashtune.ops.attention.decode.config",
    "flashtune.ops.attention.prefill_config": "flashtune.ops.attention.prefill.config",
}


def _current_type_name(name: str) -> str:
    module, sep, qualname = name.partition(":")
    return f"{MOVED_TACTIC_MODULES.get(module, module)}{sep}{qualname}"


def _to_tuple(value: Any) -> Any:
    """Nested JSON lists -> nested tuples (tactics and profiles must be hashable), and tagged
    objects -> StoredTactic."""
    if isinstance(value, list | tuple):
        return tuple(_to_tuple(v) for v in value)
    if isinstance(value, dict) and TACTIC_TYPE_KEY in value:
        name = value[TACTIC_TYPE_KEY]
        if not isinstance(name, str):
            raise ValueError(f"tactic type {name!r} is not a class name")
        fields = tuple((k, _to_tuple(v)) for k, v in value.items() if k != TACTIC_TYPE_KEY)
        return StoredTactic(_current_type_name(name), fields)
    return value


def encode_tactic(tactic: Any) -> Any:
    """A tactic as JSON data: dataclasses (and stored ones) as tagged objects, tuples as
    lists."""
    tactic = stored_form(tactic)
    if isinstance(tactic, StoredTactic):
        doc: dict[str, Any] = {TACTIC_TYPE_KEY: tactic.type_name}
        doc.update((k, encode_tactic(v)) for k, v in tactic.fields)
        return doc
    if isinstance(tactic, list | tuple):
        return [encode_tactic(v) for v in tactic]
    return tactic


def encode_key(key: CacheKey) -> str:
    return str(key)


def decode_key(text: str) -> CacheKey:
    """Parse ``str((op, runner, profile))`` back; ValueError when it is not one."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise ValueError(f"key {text!r} is not a Python literal: {exc}") from None
    if not (
        isinstance(value, tuple)
        and len(value) == 3
        and isinstance(value[0], str)
        and isinstance(value[1], str)
    ):
        raise ValueError(f"key {text!r} is not (op_name, runner_class_name, profile)")
    return value[0], value[1], _to_tuple(value[2])


@dataclass
class FileRead:
    """What reading a config file found. status:
    absent: no file; ok: entries loaded; mismatch: environment differs (entries empty);
    corrupt: not a valid config file (entries empty). `io_error`: corrupt because the path
    could not be read at all (a directory, no permission, a path under a regular file), so
    its contents are unknown and it must not be overwritten. `dropped`: why each entry that
    is not a valid config was left out of an otherwise valid file."""

    path: Path
    status: Literal["absent", "ok", "mismatch", "corrupt"]
    entries: dict[CacheKey, Entry] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None
    reason: str = ""
    dropped: list[str] = field(default_factory=list)
    io_error: bool = False


def _decode_entry(key_text: str, value: Any) -> tuple[CacheKey, Entry]:
    """One config entry; ValueError saying why it is not one."""
    key = decode_key(key_text)
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)):
        raise ValueError(f"value of {key_text!r} is not [runner_class_name, tactic]")
    if value[0] != key[1]:
        raise ValueError(f"value of {key_text!r} names runner {value[0]!r}")
    entry = (value[0], _to_tuple(value[1]))
    try:  # profiles and tactics are dict keys and set members: a JSON object is neither
        hash((key, entry))
    except TypeError:
        raise ValueError(f"entry {key_text!r} holds an unhashable profile or tactic") from None
    return key, entry


def read_cache_file(
    path: str | os.PathLike[str], expected: Mapping[str, Any] | None = None
) -> FileRead:
    """Read and check a config file. Never raises for a bad file: the status says why."""
    path = Path(path)
    expected = current_metadata() if expected is None else expected
    try:
        text = path.read_text()
    except FileNotFoundError:
        return FileRead(path, "absent")
    except OSError as exc:
        return FileRead(path, "corrupt", reason=f"cannot read it: {exc}", io_error=True)
    except ValueError as exc:  # not UTF-8 text
        return FileRead(path, "corrupt", reason=f"not text: {exc}")
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        return FileRead(path, "corrupt", reason=f"invalid JSON ({exc})")
    if not isinstance(raw, dict):
        return FileRead(
            path, "corrupt", reason=f"expected a JSON object, found {type(raw).__name__}"
        )
    metadata = raw.get(METADATA_KEY)
    if metadata is not None and not isinstance(metadata, dict):
        return FileRead(path, "corrupt", reason=f"{METADATA_KEY} is not an object")
    entries: dict[CacheKey, Entry] = {}
    dropped: list[str] = []
    for key_text, value in raw.items():
        if key_text.startswith("_"):
            continue
        # One bad entry (a hand edit, a newer format) costs that entry, not the file's others.
        try:
            key, entry = _decode_entry(key_text, value)
        except ValueError as exc:
            dropped.append(str(exc))
            continue
        entries[key] = entry
    if metadata is not None:
        bad = metadata_mismatch(metadata, expected)
        if bad is not None:
            name, have, want = bad
            return FileRead(
                path,
                "mismatch",
                metadata=metadata,
                reason=f"_metadata.{name} is {have!r} but this environment has {want!r}",
                dropped=dropped,
            )
    return FileRead(path, "ok", entries, metadata, dropped=dropped)


def backup_file(path: Path) -> Path:
    """Copy a file aside (``<name>.<UTC time>.<pid>.bak``) before it is overwritten."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    backup = path.with_name(f"{path.name}.{stamp}.{os.getpid()}.bak")
    shutil.copy2(path, backup)
    return backup


def write_cache_file(
    path: str | os.PathLike[str],
    entries: Mapping[CacheKey, Entry],
    metadata: Mapping[str, Any],
    last_updated_by: Mapping[str, Any] | None = None,
) -> None:
    """Write a config file atomically (temporary file in the same folder + os.replace), so a
    reader or a killed writer never sees half a file."""
    path = Path(path)
    doc: dict[str, Any] = {METADATA_KEY: dict(metadata)}
    if last_updated_by is not None:
        doc[LAST_UPDATED_KEY] = dict(last_updated_by)
    for key_text, (runner, tactic) in sorted((encode_key(k), v) for k, v in entries.items()):
        doc[key_text] = [runner, encode_tactic(tactic)]
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")


def merge_files(paths: list[Path]) -> tuple[dict[CacheKey, Entry], dict[str, Any], int]:
    """Merge config files (later files win on conflicts). Returns (entries, metadata,
    conflicts); ValueError naming the file and field when they are not all from one
    environment, or when a file is missing or corrupt."""
    entries: dict[CacheKey, Entry] = {}
    metadata: dict[str, Any] | None = None
    conflicts = 0
    for path in paths:
        # Each file must parse; agreement is checked between the files below, not against
        # this machine (merging happens anywhere).
        found = read_cache_file(path, expected={})
        if found.status == "absent":
            raise ValueError(f"{path}: no such file")
        if found.status == "corrupt":
            raise ValueError(f"{path}: corrupt ({found.reason})")
        meta = found.metadata or {}
        if metadata is None:
            metadata = dict(meta)
        else:
            bad = metadata_mismatch(meta, metadata)
            if bad is not None:
                name, have, want = bad
                raise ValueError(
                    f"{path}: _metadata.{name} is {have!r} but {paths[0]} has {want!r}; files "
                    "from different environments cannot be merged"
                )
            # Keep the concrete value where the first file had a wildcard, or no value (a
            # field added since it was written: OPTIONAL_FIELDS).
            for k, v in meta.items():
                if (k not in metadata or metadata[k] == WILDCARD) and v != WILDCARD:
                    metadata[k] = v
        for key, entry in found.entries.items():
            if key in entries and entries[key] != entry:
                conflicts += 1
            entries[key] = entry
    return entries, metadata or {}, conflicts


def corrupt_entries(found: FileRead) -> str:
    """'2 corrupt entries (why; why)', for warnings about a file's bad entries."""
    n = len(found.dropped)
    shown = "; ".join(found.dropped[:3]) + ("; ..." if n > 3 else "")
    return f"{n} corrupt entr{'y' if n == 1 else 'ies'} ({shown})"

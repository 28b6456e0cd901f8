"""The tuner's config store: the configs read from files (user-loaded ones, lookup's
priority 2, and the bundled ones under flashtune/tune/configs/, priority 3) and saving tuned
results into a file. The file format itself is tune/cache_file.py.

The store takes no lock of its own: `AutoTuner` calls it under the tuner's lock."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from flashtune.data.io import atomic_write_text
from flashtune.tune.cache_file import (
    DEVICE_FIELDS,
    CacheKey,
    Entry,
    FileRead,
    backup_file,
    corrupt_entries,
    current_metadata,
    encode_tactic,
    metadata_differences,
    read_cache_file,
    write_cache_file,
)
from flashtune.tune.notices import AutotuneWarning, Notices
from flashtune.tune.selection import Decision

__all__ = ["BUNDLED_DIR", "ConfigStore", "decisions_path", "merge_decisions", "write_decisions"]

logger = logging.getLogger("flashtune.tune")

BUNDLED_DIR = Path(__file__).resolve().parent / "configs"


class ConfigStore:
    """File configs in memory, and the reading and merging of config files.

    Warnings are attributed to the caller of `AutoTuner.load_configs` / `save_configs`, one
    frame above the store."""

    def __init__(self, notices: Notices) -> None:
        self.notices = notices
        self.file_configs: dict[CacheKey, Entry] = {}
        # Picks of files made under other library/driver versions on this same device:
        # never used as they are, only re-validated when tuning (lookup.tune_bucket).
        self.stale_configs: dict[CacheKey, Entry] = {}
        # Files whose stale picks are being re-validated: rewritten on save with this
        # environment's metadata (a backup of the old file is kept).
        self.revalidating: set[Path] = set()
        # Picks of files made on another device, loaded while tuning: never used as picks
        # (another GPU), only as priors for the search (a good tile there is a candidate
        # worth timing first here).
        self.foreign_configs: dict[CacheKey, Entry] = {}
        self.file_lock_timeout_s = 120.0
        self._bundled: dict[CacheKey, Entry] | None = None

    def clear(self) -> None:
        self.file_configs.clear()
        self.stale_configs.clear()
        self.revalidating.clear()
        self.foreign_configs.clear()
        self._bundled = None

    def bundled_configs(self) -> dict[CacheKey, Entry]:
        """The bundled configs whose metadata matches this machine (read once)."""
        if self._bundled is None:
            bundled: dict[CacheKey, Entry] = {}
            for path in sorted(BUNDLED_DIR.glob("*.json")):
                found = read_cache_file(path)
                if found.status == "ok":
                    bundled.update(found.entries)
                    if found.dropped:
                        self.notices.warn_once(
                            ("bundled-entries", str(path)),
                            f"autotune: bundled config {path} has {corrupt_entries(found)}; "
                            "the others are used",
                        )
                elif found.status == "corrupt":
                    self.notices.warn_once(
                        ("bundled", str(path)),
                        f"autotune: bundled config {path} is corrupt ({found.reason}); skipped",
                    )
                else:  # configs of other GPUs and versions are expected not to match
                    logger.debug("autotune: bundled config %s skipped: %s", path, found.reason)
            self._bundled = bundled
        return self._bundled

    def load(
        self, path: str | os.PathLike[str], *, missing_ok: bool, revalidate: bool = False
    ) -> FileRead:
        """Read a config file and add its entries to the file configs (status "ok" only).
        revalidate: a file from this device under other library/driver versions has its
        picks kept as stale, to be re-validated (tuning) rather than skipped."""
        found = read_cache_file(path)
        if found.status == "mismatch" and revalidate and _versions_only(found):
            stale = read_cache_file(path, expected={})
            self.stale_configs.update(stale.entries)
            self.revalidating.add(found.path.resolve())
            warnings.warn(
                f"autotune config file {found.path} was made under other versions: "
                f"{found.reason}; its {len(stale.entries)} picks are re-validated against the "
                "default tactics as their shapes are seen, and the file is rewritten for this "
                "environment on exit (a backup is kept)",
                AutotuneWarning,
                stacklevel=4,
            )
            return found
        if found.status == "absent":
            if missing_ok:
                return found
            raise FileNotFoundError(f"autotune config file {found.path} does not exist")
        if found.status == "corrupt" and found.io_error:
            self.notices.warn_path_once(
                found.path,
                f"autotune: cannot use config file {found.path}: {found.reason}; tuned "
                "results are kept in memory for this process and not saved there",
                stacklevel=4,
            )
        elif found.status == "corrupt":
            warnings.warn(
                f"autotune config file {found.path} is corrupt: {found.reason}; treating it as "
                "absent (a backup is kept before it is ever overwritten)",
                AutotuneWarning,
                stacklevel=4,
            )
        elif found.status == "mismatch":
            if revalidate:  # tuning: the other device's picks seed the search as priors
                self.foreign_configs.update(read_cache_file(path, expected={}).entries)
            warnings.warn(
                f"autotune config file {found.path} was made in another environment: "
                f"{found.reason}; nothing loaded and the file will not be overwritten. Use "
                "another cache path for this environment (e.g. one per GPU type), or set the "
                'field to "*" in the file to accept any value',
                AutotuneWarning,
                stacklevel=4,
            )
        else:
            if found.dropped:
                warnings.warn(
                    f"autotune config file {found.path}: ignoring {corrupt_entries(found)}; "
                    f"its {len(found.entries)} other entries are loaded",
                    AutotuneWarning,
                    stacklevel=4,
                )
            self.file_configs.update(found.entries)
            logger.info("autotune: loaded %d configs from %s", len(found.entries), found.path)
        return found

    def save(
        self,
        path: str | os.PathLike[str],
        tuned: Mapping[CacheKey, Entry],
        base: Mapping[CacheKey, Entry] | None = None,
        decisions: Mapping[tuple[str, Any], Decision] | None = None,
    ) -> bool:
        """Merge `tuned` into `path` (see `AutoTuner.save_configs`): False when not saved."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(path) + ".lock", timeout=self.file_lock_timeout_s):
                saved = self._merge_into(path, tuned, base, decisions)
        except Timeout:
            warnings.warn(
                f"autotune: could not lock {path}.lock within {self.file_lock_timeout_s:.0f} s; "
                "results not saved",
                AutotuneWarning,
                stacklevel=4,
            )
            return False
        except OSError as exc:
            self.notices.warn_path_once(
                path,
                f"autotune: cannot save to {path}: {exc}; tuned results are kept in memory "
                "for this process",
                stacklevel=4,
            )
            return False
        if saved is not None:
            logger.info("autotune: saved %d configs to %s", saved, path)
        return saved is not None

    def _merge_into(
        self,
        path: Path,
        tuned: Mapping[CacheKey, Entry],
        base: Mapping[CacheKey, Entry] | None,
        decisions: Mapping[tuple[str, Any], Decision] | None = None,
    ) -> int | None:
        """save under the file lock: how many configs were written (None: none)."""
        on_disk = read_cache_file(path)
        if on_disk.status == "corrupt" and on_disk.io_error:
            # Unknown contents (unreadable, or not a file): never overwrite them.
            self.notices.warn_path_once(
                path,
                f"autotune: not saving to {path}: {on_disk.reason}; tuned results are kept in "
                "memory for this process",
                stacklevel=5,
            )
            return None
        renew = on_disk.status == "mismatch" and path.resolve() in self.revalidating
        if renew and not tuned:
            # Nothing re-validated or tuned: rewriting would only drop the stale picks.
            logger.info("autotune: %s not rewritten: no pick re-validated yet", path)
            return None
        if renew and _versions_only(on_disk):
            backup = backup_file(path)
            logger.info("autotune: %s re-validated for this environment (old: %s)", path, backup)
            # Only what was tuned or re-validated here: the old picks were not measured
            # under this environment (they stay in the backup).
            on_disk = FileRead(path, "ok")
            base = {}
        elif on_disk.status == "mismatch":
            warnings.warn(
                f"autotune: not saving to {path}: {on_disk.reason}; the file belongs to another "
                "environment, use another cache path",
                AutotuneWarning,
                stacklevel=5,
            )
            return None
        if on_disk.status == "corrupt":
            backup = backup_file(path)
            warnings.warn(
                f"autotune: {path} is corrupt ({on_disk.reason}); kept a copy at {backup} and "
                "writing a fresh file",
                AutotuneWarning,
                stacklevel=5,
            )
        elif on_disk.dropped:
            # Rewriting drops the bad entries for good: keep the file as it was first.
            backup = backup_file(path)
            warnings.warn(
                f"autotune: {path} has {corrupt_entries(on_disk)}; kept a copy at {backup} and "
                "writing the file without them",
                AutotuneWarning,
                stacklevel=5,
            )
        merged = dict(on_disk.entries)
        merged.update(base or {})
        merged.update(tuned)
        metadata = on_disk.metadata if on_disk.metadata else current_metadata()
        write_cache_file(path, merged, metadata, last_updated_by=current_metadata())
        if decisions:
            write_decisions(path, decisions)
        return len(merged)


def decisions_path(cache: Path) -> Path:
    """Where the why of a cache file's picks is kept: beside it, so that the cache itself
    stays in FlashInfer's documented format (FlashInfer parses every key but its metadata
    as an (op, runner, profile) tuple)."""
    return cache.with_name(cache.name + ".decisions.json")


def write_decisions(cache: Path, decisions: Mapping[tuple[str, Any], Decision]) -> None:
    """Merge `decisions` into the cache's decision record (newest wins), atomically."""
    target = decisions_path(cache)
    doc: dict[str, Any] = {}
    try:
        loaded = json.loads(target.read_text())
        if isinstance(loaded, dict):
            doc = loaded
    except (OSError, ValueError):
        pass  # absent or damaged: it is a record, rebuilt from what this process knows
    for (op_name, profile), d in decisions.items():
        record = dataclasses.asdict(d)
        record["profile"] = repr(profile)
        record["tactic"] = encode_tactic(d.tactic)
        doc[repr((op_name, profile))] = record
    atomic_write_text(target, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def merge_decisions(caches: list[Path], output: Path) -> int:
    """Merge the decision records beside `caches` (later ones win) into the one beside
    `output`; how many records it holds (0: none existed, nothing written)."""
    doc: dict[str, Any] = {}
    for cache in caches:
        try:
            loaded = json.loads(decisions_path(Path(cache)).read_text())
        except (OSError, ValueError):
            continue  # no record beside this cache (or a damaged one): it is informational
        if isinstance(loaded, dict):
            doc.update(loaded)
    if doc:
        atomic_write_text(decisions_path(output), json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return len(doc)


def _versions_only(found: FileRead) -> bool:
    """Whether a mismatched file differs from this environment in versions only (the same
    device), so its picks can be re-validated instead of skipped."""
    diffs = metadata_differences(found.metadata or {}, current_metadata())
    return bool(diffs) and not any(name in DEVICE_FIELDS for name, _, _ in diffs)

"""The tuner's config store: the configs read from files (user-loaded ones, lookup's
priority 2, and the bundled ones under flashtune/tune/configs/, priority 3) and saving tuned
results into a file. The file format itself is tune/cache_file.py.

The store takes no lock of its own: `AutoTuner` calls it under the tuner's lock."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from filelock import FileLock, Timeout

from flashtune.tune.cache_file import (
    CacheKey,
    Entry,
    FileRead,
    backup_file,
    corrupt_entries,
    current_metadata,
    read_cache_file,
    write_cache_file,
)
from flashtune.tune.notices import AutotuneWarning, Notices

__all__ = ["BUNDLED_DIR", "ConfigStore"]

logger = logging.getLogger("flashtune.tune")

BUNDLED_DIR = Path(__file__).resolve().parent / "configs"


class ConfigStore:
    """File configs in memory, and the reading and merging of config files.

    Warnings are attributed to the caller of `AutoTuner.load_configs` / `save_configs`, one
    frame above the store."""

    def __init__(self, notices: Notices) -> None:
        self.notices = notices
        self.file_configs: dict[CacheKey, Entry] = {}
        self.file_lock_timeout_s = 120.0
        self._bundled: dict[CacheKey, Entry] | None = None

    def clear(self) -> None:
        self.file_configs.clear()
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

    def load(self, path: str | os.PathLike[str], *, missing_ok: bool) -> FileRead:
        """Read a config file and add its entries to the file configs (status "ok" only)."""
        found = read_cache_file(path)
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
    ) -> bool:
        """Merge `tuned` into `path` (see `AutoTuner.save_configs`): False when not saved."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(path) + ".lock", timeout=self.file_lock_timeout_s):
                saved = self._merge_into(path, tuned, base)
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
        if on_disk.status == "mismatch":
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
        return len(merged)

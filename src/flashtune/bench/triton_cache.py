"""Triton's cache inside a sandbox: read the shared cache, write only to the sandbox's own.

A sandbox (bench/isolation.py) sets TRITON_CACHE_MANAGER to this module's
`LayeredCacheManager`, TRITON_CACHE_DIR to its scratch and `isolation.TRITON_SHARED_ENV` to
the shared cache (Landlock lets it read there, not write). A kernel already compiled in the
shared cache (by the worker, or by a trusted run) loads from there: warm kernels stay warm;
what the sandbox compiles goes to its scratch and dies with it, so no solution can plant a
binary (a launcher .so, a cubin) that another solution would load.

Imported by Triton only, inside a sandbox (it imports Triton).
"""

from __future__ import annotations

import json
import os
from typing import Any

from triton.runtime.cache import FileCacheManager

from flashtune.bench.isolation import TRITON_SHARED_ENV

__all__ = ["LayeredCacheManager"]


class LayeredCacheManager(FileCacheManager):
    """Triton's file cache over the sandbox's scratch, falling back to the shared cache (read
    only) for what the scratch lacks. Dump and override folders are the scratch's alone."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override=override, dump=dump)
        shared = os.environ.get(TRITON_SHARED_ENV)
        self.shared_dir: str | None = None
        if shared and not (override or dump):
            self.shared_dir = os.path.realpath(os.path.join(shared, key))

    def _shared(self, filename: str) -> str | None:
        if self.shared_dir is None:
            return None
        path = os.path.join(self.shared_dir, filename)
        return path if self._inside(path) and os.path.exists(path) else None

    def _inside(self, path: str) -> bool:
        assert self.shared_dir is not None
        return os.path.realpath(path).startswith(self.shared_dir + os.sep)

    def get_file(self, filename: str) -> str | None:
        own: str | None = super().get_file(filename)
        return own if own is not None else self._shared(filename)

    def get_group(self, filename: str) -> dict[str, str] | None:
        own: dict[str, str] | None = super().get_group(filename)
        if own is not None:
            return own
        group = self._shared(f"__grp__{filename}")
        if group is None:
            return None
        try:
            with open(group) as f:
                data: Any = json.load(f)
        except (OSError, ValueError):
            return None
        children = data.get("child_paths") if isinstance(data, dict) else None
        if not isinstance(children, dict):
            return None
        # A group names its files by absolute path: only those inside this key's shared
        # folder are taken (the group could name any file).
        result = {}
        for name, path in children.items():
            if isinstance(path, str) and self._inside(path) and os.path.exists(path):
                result[name] = path
        return result if len(result) == len(children) else None

"""The apply table: for each definition and bucket of var-axes values, the fastest solution
whose Traces PASSED within tolerance, plus a default winner for shapes no bucket covers.

Built from a Dataset's traces, persisted at <dataset root>/apply_table.json, and rebuilt when
the trace files' contents (or the table's config) change.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flashtune.data.dataset import Dataset
from flashtune.data.io import atomic_write_text
from flashtune.data.models import Definition, EvaluationStatus, Trace

__all__ = [
    "DEFAULT_TOLERANCES",
    "TABLE_FILE",
    "ApplyConfig",
    "ApplyTable",
    "DefinitionTable",
    "Winner",
    "bucket",
    "bucket_key",
]

log = logging.getLogger("flashtune.apply")

TABLE_FILE = "apply_table.json"
_FORMAT = 1

# (max_atol, max_rtol) by the least precise output dtype. A trace passes when its max error
# meets either bound (an allclose-like OR: relative error explodes near zero outputs, absolute
# error on large ones). Loose enough for the benchmark's own PASSED, tight enough to refuse a
# solution that only passed a much looser check.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-6, 1e-6),
    "float32": (1e-3, 1e-3),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
    "float8_e4m3fn": (2.5e-1, 2.5e-1),
    "float8_e5m2": (5e-1, 5e-1),
}
_PRECISION_ORDER = list(DEFAULT_TOLERANCES)  # most to least precise


def bucket(value: int) -> int:
    """The power-of-two bucket of an axis value (smallest power of two >= value)."""
    if value <= 1:
        return max(int(value), 0)
    return 1 << (int(value) - 1).bit_length()


def bucket_key(axes: Sequence[str], values: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(bucket(values[a]) for a in axes)


def _log2(value: int) -> float:
    return -1.0 if value <= 0 else math.log2(value)


@dataclass(frozen=True)
class ApplyConfig:
    """How the table picks winners and answers lookups.

    max_atol/max_rtol: override the dtype-aware DEFAULT_TOLERANCES. nearest: an unseen bucket
    maps to the nearest benchmarked one (distance: sum of |log2| differences per axis), if
    within max_distance (None: any). use_default: otherwise use the definition's default
    winner; when False, such shapes fall back to the op's own implementation."""

    max_atol: float | None = None
    max_rtol: float | None = None
    nearest: bool = True
    max_distance: float | None = None
    use_default: bool = True

    def tolerance(self, definition: Definition | None) -> tuple[float, float]:
        atol, rtol = math.inf, math.inf
        if definition is not None:
            dtypes = [s.dtype for s in definition.outputs.values() if s.dtype in DEFAULT_TOLERANCES]
            if dtypes:
                worst = max(dtypes, key=_PRECISION_ORDER.index)
                atol, rtol = DEFAULT_TOLERANCES[worst]
        return (
            self.max_atol if self.max_atol is not None else atol,
            self.max_rtol if self.max_rtol is not None else rtol,
        )


@dataclass
class Winner:
    """The solution chosen for a bucket and what it measured there."""

    solution: str
    latency_ms: float  # geometric mean over the bucket's workloads
    score: float  # geometric mean of latency / best latency per workload (1.0 = always best)
    workloads: int
    runners_up: list[str] = field(default_factory=list)


@dataclass
class DefinitionTable:
    """Winners of one definition by bucketed var-axes key."""

    axes: list[str]
    buckets: dict[tuple[int, ...], Winner]
    default: str | None
    _memo: dict[tuple[int, ...], str | None] = field(default_factory=dict, repr=False)

    def lookup(self, values: Mapping[str, int], config: ApplyConfig) -> str | None:
        """The winner for these var-axes values, or None (fall back)."""
        try:
            key = bucket_key(self.axes, values)
        except KeyError:
            return self.default if config.use_default else None
        try:
            return self._memo[key]
        except KeyError:
            pass
        winner = self.buckets.get(key)
        name = winner.solution if winner is not None else None
        if name is None and config.nearest and self.buckets:
            dist, near = min(
                (sum(abs(_log2(a) - _log2(b)) for a, b in zip(key, k, strict=True)), k)
                for k in self.buckets
            )
            if config.max_distance is None or dist <= config.max_distance:
                name = self.buckets[near].solution
        if name is None and config.use_default:
            name = self.default
        self._memo[key] = name
        return name

    def to_json(self) -> dict[str, Any]:
        return {
            "axes": self.axes,
            "default": self.default,
            "buckets": [{"key": list(k), **asdict(w)} for k, w in sorted(self.buckets.items())],
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DefinitionTable:
        buckets = {}
        for item in raw["buckets"]:
            item = dict(item)
            key = tuple(item.pop("key"))
            buckets[key] = Winner(**item)
        return cls(list(raw["axes"]), buckets, raw.get("default"))


# --------------------------------------------------------------------------- building


def _passes(trace: Trace, tol: tuple[float, float]) -> bool:
    ev = trace.evaluation
    if ev is None or ev.status != EvaluationStatus.PASSED or ev.performance is None:
        return False
    c = ev.correctness
    if c is None:
        return True
    atol, rtol = tol
    abs_ok = c.max_absolute_error is None or c.max_absolute_error <= atol
    rel_ok = c.max_relative_error is None or c.max_relative_error <= rtol
    if c.max_absolute_error is None and c.max_relative_error is None:
        return True
    return (c.max_absolute_error is not None and abs_ok) or (
        c.max_relative_error is not None and rel_ok
    )


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-12)) for v in values) / len(values))


def build_definition_table(
    name: str, traces: Sequence[Trace], definition: Definition | None, config: ApplyConfig
) -> DefinitionTable | None:
    """Pick the winners of one definition from its traces (None: nothing passed)."""
    tol = config.tolerance(definition)
    # Latest result per (workload, solution): a re-run replaces an older measurement.
    latest: dict[tuple[str, str], tuple[str, bool, float]] = {}
    workload_axes: dict[str, dict[str, int]] = {}
    for t in traces:
        ev = t.evaluation
        if t.solution is None or ev is None or ev.status == EvaluationStatus.SKIPPED:
            continue
        ok = _passes(t, tol)
        latency = ev.performance.latency_ms if ok and ev.performance else math.inf
        key = (t.workload.uuid, t.solution)
        if key not in latest or ev.timestamp >= latest[key][0]:
            latest[key] = (ev.timestamp, ok, latency)
        workload_axes[t.workload.uuid] = dict(t.workload.axes)
    if not latest:
        return None
    axes = (
        list(definition.var_axes)
        if definition is not None
        else sorted({a for v in workload_axes.values() for a in v})
    )
    by_bucket: dict[tuple[int, ...], list[str]] = {}
    for uid, values in workload_axes.items():
        try:
            by_bucket.setdefault(bucket_key(axes, values), []).append(uid)
        except KeyError:
            log.warning("apply: workload %s of %s lacks var axes %s", uid, name, axes)
    solutions = sorted({s for _, s in latest})
    failed_anywhere = {s for (_, s), (_, ok, _) in latest.items() if not ok}
    buckets: dict[tuple[int, ...], Winner] = {}
    for key, uids in by_bucket.items():
        best = {
            u: min((lat for (w, _), (_, ok, lat) in latest.items() if w == u and ok), default=None)
            for u in uids
        }
        ranked = []
        for sol in solutions:
            results = [latest[(u, sol)] for u in uids if (u, sol) in latest]
            if not results or not all(ok for _, ok, _ in results):
                continue  # a solution that failed any workload of a bucket never wins it
            ratios = [latest[(u, sol)][2] / best[u] for u in uids if (u, sol) in latest]
            lats = [lat for _, _, lat in results]
            ranked.append((_geomean(ratios), -len(results), sol, _geomean(lats), len(results)))
        if not ranked:
            continue
        ranked.sort()
        score, _, sol, lat, n = ranked[0]
        buckets[key] = Winner(sol, lat, score, n, [r[2] for r in ranked[1:4]])
    if not buckets:
        return None
    wins: dict[str, list[float]] = {}
    for w in buckets.values():
        wins.setdefault(w.solution, []).append(w.score)
    candidates = [s for s in wins if s not in failed_anywhere]
    default = (
        min(candidates, key=lambda s: (-len(wins[s]), _geomean(wins[s]), s)) if candidates else None
    )
    return DefinitionTable(axes, buckets, default)


# --------------------------------------------------------------------------- the table


def _trace_files(dataset: Dataset) -> list[tuple[Path, Path]]:
    files = []
    for root in dataset.roots:
        files.extend((root, p) for p in sorted((root / "traces").glob("*/*/*.jsonl")))
    return files


def _stat_signature(files: Sequence[tuple[Path, Path]]) -> list[list[Any]]:
    out = []
    for root, path in files:
        st = path.stat()
        out.append([str(path.relative_to(root)), st.st_size, st.st_mtime_ns])
    return out


def _content_hash(files: Sequence[tuple[Path, Path]], config: ApplyConfig) -> str:
    h = hashlib.sha256(json.dumps(asdict(config), sort_keys=True).encode())
    for root, path in files:
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class ApplyTable:
    """Winners for every definition with passing traces (see the module docstring)."""

    definitions: dict[str, DefinitionTable]
    config: ApplyConfig = field(default_factory=ApplyConfig)
    content_hash: str = ""

    def lookup(self, definition: str, var_axes: Mapping[str, int]) -> str | None:
        table = self.definitions.get(definition)
        if table is None:
            return None
        return table.lookup(var_axes, self.config)

    # ----------------------------------------------------------------- build / persist
    @classmethod
    def build(cls, dataset: Dataset, config: ApplyConfig | None = None) -> ApplyTable:
        """Build from every trace of `dataset` (no cache)."""
        config = config or ApplyConfig()
        dataset.refresh()  # see the trace files as they are now
        definitions = dataset.definitions
        by_def: dict[str, list[Trace]] = {}
        for t in dataset.all_traces():
            by_def.setdefault(t.definition, []).append(t)
        tables = {}
        for name, traces in sorted(by_def.items()):
            table = build_definition_table(name, traces, definitions.get(name), config)
            if table is not None:
                tables[name] = table
        files = _trace_files(dataset)
        return cls(tables, config, _content_hash(files, config))

    @staticmethod
    def path_for(dataset: Dataset) -> Path:
        return dataset.root / TABLE_FILE

    @classmethod
    def load(
        cls, dataset: Dataset, config: ApplyConfig | None = None, persist: bool = True
    ) -> ApplyTable:
        """The persisted table if the traces are unchanged, else a rebuilt (and saved) one.

        A cheap stat signature (path, size, mtime) is checked first; when it differs the
        contents are hashed, so a touched but unchanged file does not force a rebuild."""
        config = config or ApplyConfig()
        path = cls.path_for(dataset)
        files = _trace_files(dataset)
        stat = _stat_signature(files)
        saved = _read_saved(path)
        if saved is not None and saved.get("config") == asdict(config):
            if saved.get("stat") == stat:
                return cls._from_saved(saved, config)
            digest = _content_hash(files, config)
            if saved.get("hash") == digest:
                table = cls._from_saved(saved, config)
                if persist:
                    table.save(path, stat)
                return table
        table = cls.build(dataset, config)
        if persist:
            try:
                table.save(path, _stat_signature(_trace_files(dataset)))
            except OSError as exc:  # a read-only dataset: the table still works in memory
                log.warning("apply: could not save %s: %s", path, exc)
        return table

    @classmethod
    def _from_saved(cls, saved: Mapping[str, Any], config: ApplyConfig) -> ApplyTable:
        tables = {n: DefinitionTable.from_json(t) for n, t in saved["definitions"].items()}
        return cls(tables, config, saved["hash"])

    def to_json(self, stat: list[list[Any]] | None = None) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "hash": self.content_hash,
            "stat": stat or [],
            "config": asdict(self.config),
            "definitions": {n: t.to_json() for n, t in sorted(self.definitions.items())},
        }

    def save(self, path: Path, stat: list[list[Any]] | None = None) -> None:
        atomic_write_text(path, json.dumps(self.to_json(stat), indent=1) + "\n")


def _read_saved(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("apply: ignoring unreadable %s: %s", path, exc)
        return None
    if not isinstance(raw, dict) or raw.get("format") != _FORMAT:
        return None
    return raw

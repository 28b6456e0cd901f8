"""The apply table: for each definition and bucket of var-axes values, the fastest solution
whose Traces PASSED within tolerance, plus a default winner for shapes no bucket covers.

Datasets come from strangers, so a trace is evidence only when (see `trust_problem`):
- its signature verifies under this user's key (`flashtune.data.signing`): `flashtune run`
  signed it here, or the user imported it with `flashtune traces trust`; a trace appended
  or edited by anything else (a solution under benchmark, a hand) is not used;
- its `evaluation.solution_hash` is the content hash of the solution as it is now (a forged
  trace, or one of a solution edited since it was benchmarked, proves nothing about it);
- its environment matches this process (hardware it has, same torch/triton/cuda; "*" in
  the trace matches anything);
- its timestamp is an ISO 8601 time not in the future (it would otherwise win "the latest
  result" forever; the latest is chosen by parsed time, `flashtune.data.timestamps`);
and a PASSED trace counts as passed only within the definition's tolerances, which a
looser bench may not have applied (see `correctness_problem`): by the bench's own
element-wise rule when the trace records the element-wise atol/rtol it was judged with and
those are no looser than the definition's, else by its max errors against apply's
dtype-aware DEFAULT_TOLERANCES. Traces left out are listed, with why, in
`ApplyTable.rejected`.

Built from a Dataset's traces, persisted at <dataset root>/apply_table.json, and rebuilt when
the trace, solution or definition files' contents, the table's config or the environment
change. The runtime checks a winner's hash again when it loads it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from flashtune import platform
from flashtune.apply.recheck import Bounds, correctness_problem
from flashtune.apply.solutions import runs_the_op_itself
from flashtune.bench.build import solution_hash
from flashtune.bench.correctness import is_stochastic, tolerance_for
from flashtune.data.dataset import Dataset
from flashtune.data.io import atomic_write_text
from flashtune.data.models import Definition, EvaluationStatus, Solution, Trace
from flashtune.data.signing import (
    TRACES,
    SigningKeyError,
    document_mac,
    key_id,
    trace_signature_problem,
    user_key,
)
from flashtune.data.timestamps import recency, timestamp_problem

__all__ = [
    "DEFAULT_TOLERANCES",
    "TABLE_FILE",
    "ApplyConfig",
    "ApplyTable",
    "Bounds",
    "DefinitionTable",
    "Rejection",
    "Winner",
    "bucket",
    "bucket_key",
    "correctness_bounds",
    "correctness_problem",
    "current_environment",
    "environment_problem",
    "trust_problem",
]

log = logging.getLogger("flashtune.apply")

TABLE_FILE = "apply_table.json"
# 2: winners carry the content hash their traces were verified against, and the table the
# environment it was built for (a table of format 1 was built without the trust checks).
# 3: traces that record their element-wise tolerance are judged by the bench's rule (a
# table of format 2 refused honest bf16 GEMMs with K >= 4096 that pass it).
_FORMAT = 3

# (max_atol, max_rtol) by the least precise output dtype, for traces that do not record the
# element-wise tolerance they were judged with (older benches, other tools): such a trace
# passes when its max error meets either bound (an allclose-like OR: relative error explodes
# near zero outputs, absolute error on large ones). Loose enough for most of the benchmark's
# own PASSED, tight enough to refuse a solution that only passed a much looser check; too
# tight for large bf16 outputs (a GEMM with K >= 4096 errs by ~1 where |C| ~ 100, its bf16
# spacing), which pass by the element-wise rule when their trace records its tolerance.
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

    max_atol/max_rtol: override the dtype-aware DEFAULT_TOLERANCES of the max-error rule,
    and cap the element-wise atol/rtol a trace may record for the bench's rule (only ever
    tightening that rule: a looser element-wise tolerance is the definition's to set, by
    its tol: tags, which the bench then applies too; see `correctness_bounds`).
    nearest: an unseen bucket maps to the nearest benchmarked one (distance: sum of |log2|
    differences per axis), if within max_distance (None: any). use_default: otherwise use
    the definition's default winner; when False, such shapes fall back to the op's own
    implementation.
    own_margin: a bucket's fastest solution replaces flashtune's own op for the definition
    (a solution that runs the op itself: apply.solutions.runs_the_op_itself) only when the
    own op's score is more than (1 + own_margin) times its: a difference within the
    measurement's noise proves nothing, and routing a call away from the op costs host time
    and the op's own plan (0: the fastest always wins)."""

    max_atol: float | None = None
    max_rtol: float | None = None
    nearest: bool = True
    max_distance: float | None = None
    use_default: bool = True
    own_margin: float = 0.05

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
    """Winners of one definition by bucketed var-axes key; `hashes`: the content hash each
    solution's traces were verified against (the runtime loads only that content)."""

    axes: list[str]
    buckets: dict[tuple[int, ...], Winner]
    default: str | None
    hashes: dict[str, str] = field(default_factory=dict)
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
            "hashes": dict(sorted(self.hashes.items())),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DefinitionTable:
        buckets = {}
        for item in raw["buckets"]:
            item = dict(item)
            key = tuple(item.pop("key"))
            buckets[key] = Winner(**item)
        return cls(list(raw["axes"]), buckets, raw.get("default"), dict(raw.get("hashes", {})))


# --------------------------------------------------------------------------- trust

# What must match between a trace's environment and this process. Traces of flashtune store
# them at the top level (platform.snapshot), FlashInfer-Bench's under "libs".
_ENV_LIBS = ("torch", "triton", "cuda")
WILDCARD = "*"


def current_environment() -> dict[str, Any]:
    """What a trace's environment is compared with: the hardware this process can run
    solutions on ("cpu" and the name of each GPU) and its torch/triton/cuda versions."""
    hardware = ["cpu"]
    if platform.has_cuda():
        names = {platform.device_name(f"cuda:{i}") for i in range(torch.cuda.device_count())}
        hardware += sorted(names)
    return {"hardware": hardware, **platform.library_versions()}


def _recorded(environment: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    if key in environment:
        return True, environment[key]
    libs = environment.get("libs")
    if isinstance(libs, Mapping) and key in libs:
        return True, libs[key]
    return False, None


def environment_problem(recorded: Any, current: Mapping[str, Any]) -> str | None:
    """Why a trace's environment does not match `current` (current_environment()), or None."""
    if not isinstance(recorded, Mapping):
        return "evaluation.environment is not an object"
    for key in ("hardware", *_ENV_LIBS):
        found, value = _recorded(recorded, key)
        if not found:
            return f"evaluation.environment has no {key!r}"
        if value == WILDCARD:
            continue
        want = current[key]
        if key == "hardware" and value not in want:
            return f"measured on {value!r}; this process has {', '.join(want)}"
        if key != "hardware" and value != want:
            return f"measured with {key} {value!r}; this process has {want!r}"
    return None


def correctness_bounds(definition: Definition | None, config: ApplyConfig) -> Bounds:
    """The definition's tolerances (bench.correctness.tolerance_for: dtype, op_type and the
    definition's tags) of its least precise output.

    The bench's rule (elementwise_atol/rtol, matched_ratio, max_rel_norm, max_abs) is the
    bench's own tolerance without command-line overrides: a trace judged with a looser one
    records it and is refused that rule. ApplyConfig.max_atol/max_rtol can only tighten
    elementwise_atol/rtol: a user who asks for less error than the bench allows gets it,
    and one who asks for more loosens the max-error rule alone (a looser element-wise
    tolerance is the definition's to set, by tags, so that the bench applies it too).

    The max-error rule (atol/rtol): never tighter than apply's dtype-aware defaults (the
    element-wise check lets a max error reach atol + rtol * |reference|);
    ApplyConfig.max_atol/max_rtol replace them. Outputs recorded as a checked distribution
    (stochastic ops) have neither element-wise bounds nor the bench's rule."""
    atol, rtol = config.tolerance(definition)
    if definition is None or is_stochastic(definition):
        return Bounds(atol, rtol)
    # The trace records the worst figure over all outputs, so each bound is the loosest of
    # the outputs' (an output without a bound leaves the figure unbounded).
    ratios: list[float] = []
    norms: list[float] = []
    caps: list[float] = []
    elementwise: list[tuple[float, float]] = []
    for spec in definition.outputs.values():
        tol = tolerance_for(definition, spec.dtype)
        ratios.append(tol.matched_ratio)
        # Bounds not every version of the tolerances has: absent means none.
        norms.append(float(getattr(tol, "max_rel_norm", math.inf)))
        caps.append(float(getattr(tol, "max_abs", math.inf)))
        elementwise.append((float(tol.atol), float(tol.rtol)))
        if spec.dtype in DEFAULT_TOLERANCES:
            if config.max_atol is None:
                atol = max(atol, tol.atol)
            if config.max_rtol is None:
                rtol = max(rtol, tol.rtol)
    ew_atol = ew_rtol = None
    if elementwise:
        # The bench records the loosest element-wise tolerance over the outputs.
        ew_atol = max(a for a, _ in elementwise)
        ew_rtol = max(r for _, r in elementwise)
        if config.max_atol is not None:
            ew_atol = min(ew_atol, config.max_atol)
        if config.max_rtol is not None:
            ew_rtol = min(ew_rtol, config.max_rtol)
    return Bounds(
        atol,
        rtol,
        min(ratios) if ratios else None,
        max(norms) if norms else None,
        max(caps) if caps else None,
        ew_atol,
        ew_rtol,
    )


def trust_problem(
    trace: Trace,
    current_hashes: Mapping[str, Solution],
    environment: Mapping[str, Any],
    now: datetime,
    key: bytes | None = None,
) -> str | None:
    """Why `trace` is no evidence about its solution as it is now, or None.

    current_hashes: content hash -> solution, of the dataset's solutions with the trace's
    definition and name (empty: no such solution). key: this user's trace key
    (`flashtune.data.signing.user_key`; None: there is none, and no trace is trusted).

    The signature is checked last, so that the reason given for a trace that fails
    several checks is the one that importing it with `flashtune traces trust` would not
    cure (another GPU, an edited solution)."""
    problem = _evidence_problem(trace, current_hashes, environment, now)
    if problem is not None:
        return problem
    return trace_signature_problem(trace, key)


def _evidence_problem(
    trace: Trace,
    current_hashes: Mapping[str, Solution],
    environment: Mapping[str, Any],
    now: datetime,
) -> str | None:
    ev = trace.evaluation
    assert ev is not None
    if not current_hashes:
        return f"solution {trace.solution!r} is not in the dataset"
    if not ev.solution_hash:
        return "no solution_hash recorded: what was measured is unknown"
    if ev.solution_hash not in current_hashes:
        return (
            f"solution_hash {ev.solution_hash} is not the content hash of solution "
            f"{trace.solution!r} (edited since it was measured, or a forged trace)"
        )
    problem = environment_problem(ev.environment, environment)
    if problem is not None:
        return problem
    return timestamp_problem(ev.timestamp, now)


@dataclass(frozen=True)
class Rejection:
    """A trace the table did not use (or counted as failed), and why. `trace` is set on a
    freshly built table, None on one read back from its file."""

    definition: str
    solution: str | None
    workload: str
    reason: str
    trace: Trace | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, trace: Trace, reason: str) -> Rejection:
        return cls(trace.definition, trace.solution, trace.workload.uuid, reason, trace)

    def to_json(self) -> dict[str, Any]:
        return {
            "definition": self.definition,
            "solution": self.solution,
            "workload": self.workload,
            "reason": self.reason,
        }


# --------------------------------------------------------------------------- building


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-12)) for v in values) / len(values))


def build_definition_table(
    name: str,
    traces: Sequence[Trace],
    definition: Definition | None,
    config: ApplyConfig,
    rejected: list[Rejection] | None = None,
    own: frozenset[str] = frozenset(),
) -> DefinitionTable | None:
    """Pick the winners of one definition from its (trusted: see ApplyTable.build) traces
    (None: nothing passed). PASSED traces outside the tolerances count as failures and are
    added to `rejected` with why. `own`: the solutions that run flashtune's own op, kept
    within ApplyConfig.own_margin of the fastest."""
    bounds = correctness_bounds(definition, config)
    # Latest result per (workload, solution): a re-run replaces an older measurement.
    # Compared as parsed times (flashtune.data.timestamps.recency), never as strings; a tie
    # goes to the trace recorded later.
    now = datetime.now(timezone.utc)
    latest: dict[tuple[str, str], tuple[datetime, bool, float]] = {}
    hashes: dict[str, tuple[datetime, str]] = {}  # solution -> (time, hash) of its latest trace
    workload_axes: dict[str, dict[str, int]] = {}
    for t in traces:
        ev = t.evaluation
        if t.solution is None or ev is None or ev.status == EvaluationStatus.SKIPPED:
            continue
        ok = ev.status == EvaluationStatus.PASSED
        if ok:
            problem = correctness_problem(t, bounds)
            if problem is not None:
                ok = False
                if rejected is not None:
                    rejected.append(Rejection.of(t, problem))
        latency = ev.performance.latency_ms if ok and ev.performance else math.inf
        key = (t.workload.uuid, t.solution)
        when = recency(ev.timestamp, now)
        if key not in latest or when >= latest[key][0]:
            latest[key] = (when, ok, latency)
        if ev.solution_hash and (t.solution not in hashes or when >= hashes[t.solution][0]):
            hashes[t.solution] = (when, ev.solution_hash)
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
    for bucket, uids in by_bucket.items():
        # The best passing latency per workload (inf: none passed; such a workload is never
        # divided by: a solution is ranked only where it passed).
        best = {
            u: min(
                (lat for (w, _), (_, ok, lat) in latest.items() if w == u and ok),
                default=math.inf,
            )
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
        incumbent = next((r for r in ranked if r[2] in own), None)
        if incumbent is not None and incumbent[0] <= ranked[0][0] * (1 + config.own_margin):
            ranked.remove(incumbent)
            ranked.insert(0, incumbent)
        score, _, sol, lat, n = ranked[0]
        buckets[bucket] = Winner(sol, lat, score, n, [r[2] for r in ranked[1:4]])
    if not buckets:
        return None
    wins: dict[str, list[float]] = {}
    for w in buckets.values():
        wins.setdefault(w.solution, []).append(w.score)
    candidates = [s for s in wins if s not in failed_anywhere]
    default = (
        min(candidates, key=lambda s: (-len(wins[s]), _geomean(wins[s]), s)) if candidates else None
    )
    return DefinitionTable(axes, buckets, default, {s: h for s, (_, h) in hashes.items()})


# --------------------------------------------------------------------------- the table


def _input_files(dataset: Dataset) -> list[tuple[Path, Path]]:
    """The files a table is built from: traces, and the solutions and definitions their
    hashes and tolerances are checked against."""
    files: list[tuple[Path, Path]] = []
    for root in dataset.roots:
        files.extend((root, p) for p in sorted((root / "traces").glob("*/*/*.jsonl")))
        for folder in ("solutions", "definitions"):
            files.extend((root, p) for p in sorted((root / folder).rglob("*.json")))
    for root in dataset.solution_sources:  # attached solutions are checked against theirs too
        for folder in ("solutions", "definitions"):
            files.extend((root, p) for p in sorted((root / folder).rglob("*.json")))
    return files


def _stat_signature(files: Sequence[tuple[Path, Path]]) -> list[list[Any]]:
    out = []
    for root, path in files:
        st = path.stat()
        out.append([str(path.relative_to(root)), st.st_size, st.st_mtime_ns])
    return out


def _content_hash(
    files: Sequence[tuple[Path, Path]], config: ApplyConfig, environment: Mapping[str, Any]
) -> str:
    h = hashlib.sha256(json.dumps(asdict(config), sort_keys=True).encode())
    h.update(json.dumps(environment, sort_keys=True).encode())
    for root, path in files:
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _own_solutions(traces: Sequence[Trace], hashes: _Hashes) -> frozenset[str]:
    """The traced solutions whose measured content runs flashtune's own op."""
    seen: dict[tuple[str, str], bool] = {}  # (solution, content hash) -> runs the op
    for t in traces:
        ev = t.evaluation
        if t.solution is None or ev is None or not ev.solution_hash:
            continue
        key = (t.solution, ev.solution_hash)
        if key not in seen:
            solution = hashes(t.definition, t.solution).get(ev.solution_hash)
            seen[key] = solution is not None and runs_the_op_itself(solution)
    return frozenset(name for (name, _), own in seen.items() if own)


class _Hashes:
    """Content hash -> solution, per (definition, solution name), computed once per build."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._cache: dict[tuple[str, str], dict[str, Solution]] = {}

    def __call__(self, definition: str, name: str) -> dict[str, Solution]:
        key = (definition, name)
        found = self._cache.get(key)
        if found is None:
            found = {}
            # Exact names: Dataset.solutions_for matches a glob, and a trace's solution name
            # is not to be read as a pattern.
            for sol in self.dataset.solutions.get(definition, []):
                if sol.name != name:
                    continue
                try:
                    found[solution_hash(sol)] = sol
                except Exception as exc:  # noqa: BLE001 - an unhashable solution is unverifiable
                    log.warning("apply: cannot hash solution %s of %s: %s", name, definition, exc)
            self._cache[key] = found
        return found


@dataclass
class ApplyTable:
    """Winners for every definition with passing traces (see the module docstring).
    `rejected`: the traces left out or counted as failed by the trust checks, with why."""

    definitions: dict[str, DefinitionTable]
    config: ApplyConfig = field(default_factory=ApplyConfig)
    content_hash: str = ""
    rejected: list[Rejection] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)

    def lookup(self, definition: str, var_axes: Mapping[str, int]) -> str | None:
        table = self.definitions.get(definition)
        if table is None:
            return None
        return table.lookup(var_axes, self.config)

    def solution_hash(self, definition: str, solution: str) -> str | None:
        """The content hash `solution`'s traces were verified against (None: unknown)."""
        table = self.definitions.get(definition)
        return table.hashes.get(solution) if table is not None else None

    # ----------------------------------------------------------------- build / persist
    @classmethod
    def build(cls, dataset: Dataset, config: ApplyConfig | None = None) -> ApplyTable:
        """Build from every trusted trace of `dataset` (no cache); see the module docstring."""
        config = config or ApplyConfig()
        dataset.refresh()  # see the files as they are now
        environment = current_environment()
        now = datetime.now(timezone.utc)
        hashes = _Hashes(dataset)
        definitions = dataset.definitions
        rejected: list[Rejection] = []
        by_def: dict[str, list[Trace]] = {}
        key = _trace_key()
        for t in dataset.all_traces():
            ev = t.evaluation
            if t.solution is None or ev is None or ev.status == EvaluationStatus.SKIPPED:
                continue  # workloads and skips are no evidence either way
            problem = trust_problem(t, hashes(t.definition, t.solution), environment, now, key)
            if problem is not None:
                rejected.append(Rejection.of(t, problem))
                continue
            by_def.setdefault(t.definition, []).append(t)
        tables = {}
        for name, traces in sorted(by_def.items()):
            table = build_definition_table(
                name,
                traces,
                definitions.get(name),
                config,
                rejected=rejected,
                own=_own_solutions(traces, hashes),
            )
            if table is not None:
                tables[name] = table
        _log_rejections(rejected)
        files = _input_files(dataset)
        return cls(tables, config, _content_hash(files, config, environment), rejected, environment)

    @staticmethod
    def path_for(dataset: Dataset) -> Path:
        return dataset.root / TABLE_FILE

    @classmethod
    def load(
        cls, dataset: Dataset, config: ApplyConfig | None = None, persist: bool = True
    ) -> ApplyTable:
        """The persisted table if its inputs are unchanged, else a rebuilt (and saved) one.

        A cheap stat signature (path, size, mtime) is checked first; when it differs the
        contents are hashed, so a touched but unchanged file does not force a rebuild. A
        table saved in another environment (another GPU, other library versions) is rebuilt."""
        config = config or ApplyConfig()
        path = cls.path_for(dataset)
        files = _input_files(dataset)
        stat = _stat_signature(files)
        environment = current_environment()
        saved = _read_saved(path)
        if (
            saved is not None
            and saved.get("config") == asdict(config)
            and saved.get("environment") == environment
            and saved.get("trace_key") == _trace_key_id()  # what its traces were verified by
        ):
            if saved.get("stat") == stat:
                return cls._from_saved(saved, config)
            digest = _content_hash(files, config, environment)
            if saved.get("hash") == digest:
                table = cls._from_saved(saved, config)
                if persist:
                    table._save_quietly(path, stat)
                return table
        table = cls.build(dataset, config)
        if persist:
            table._save_quietly(path, _stat_signature(_input_files(dataset)))
        return table

    @classmethod
    def _from_saved(cls, saved: Mapping[str, Any], config: ApplyConfig) -> ApplyTable:
        tables = {n: DefinitionTable.from_json(t) for n, t in saved["definitions"].items()}
        rejected = [Rejection(**r) for r in saved.get("rejected", [])]
        return cls(tables, config, saved["hash"], rejected, dict(saved.get("environment", {})))

    def to_json(self, stat: list[list[Any]] | None = None) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "hash": self.content_hash,
            "stat": stat or [],
            "config": asdict(self.config),
            "environment": self.environment,
            "trace_key": _trace_key_id(),
            "definitions": {n: t.to_json() for n, t in sorted(self.definitions.items())},
            "rejected": [r.to_json() for r in self.rejected],
        }

    def save(self, path: Path, stat: list[list[Any]] | None = None) -> None:
        doc = self.to_json(stat)
        key = _table_key()
        if key is not None:  # unsigned, it is never read back (see _read_saved)
            doc["signature"] = _signature(doc, key)
        atomic_write_text(path, json.dumps(doc, indent=1) + "\n")

    def _save_quietly(self, path: Path, stat: list[list[Any]]) -> None:
        try:
            self.save(path, stat)
        except OSError as exc:  # a read-only dataset: the table still works in memory
            log.warning("apply: could not save %s: %s", path, exc)


def _log_rejections(rejected: Sequence[Rejection]) -> None:
    # One line per build, not one per trace: a dataset measured on other GPUs rejects all.
    if not rejected:
        return
    first = rejected[0]
    log.warning(
        "apply: %d traces not used or counted as failed (e.g. %s/%s on workload %s: %s); "
        "`flashtune apply show` lists them",
        len(rejected),
        first.definition,
        first.solution,
        first.workload,
        first.reason,
    )


# --------------------------------------------------------------------------- signing

# The saved table sits in the dataset, which may come from a stranger: a table file shipped
# with it (its stat signature forged to match) would skip every trust check. Tables are
# therefore signed with a secret of this user (flashtune.data.signing, purpose "table"); a
# table without a valid signature is rebuilt from the traces.
_TABLE = "table"


def _table_key() -> bytes | None:
    """This user's secret for signing saved tables (None: the cache folder is unusable, and
    saved tables are then never trusted)."""
    try:
        return user_key(_TABLE)
    except SigningKeyError as exc:
        log.info("apply: no key to sign saved tables with (%s); tables are rebuilt", exc)
        return None


def _trace_key() -> bytes | None:
    """This user's key that `flashtune run` signs traces with (None: there is none, and no
    trace is trusted: each is rejected with why)."""
    try:
        return user_key(TRACES)
    except SigningKeyError as exc:
        log.warning("apply: no key to verify traces with (%s); no trace is trusted", exc)
        return None


def _trace_key_id() -> str | None:
    key = _trace_key()
    return key_id(key) if key is not None else None


def _signature(doc: Mapping[str, Any], key: bytes) -> str:
    return document_mac(key, _TABLE, doc, exclude=("signature",))


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
    key = _table_key()
    signature = raw.get("signature")
    if key is None or not isinstance(signature, str):
        return None
    if not hmac.compare_digest(signature, _signature(raw, key)):
        log.info("apply: %s was not saved by this user; rebuilding it from the traces", path)
        return None
    return raw

"""A Dataset: Definitions, Solutions, Workloads and Traces on disk, in the FlashInfer Trace layout.

    <root>/definitions/<op_type>/<name>.json
    <root>/solutions/<author>/<op_type>/<definition>/<name>.json
    <root>/workloads/<op_type>/<definition>.jsonl
    <root>/traces/<author>/<op_type>/<definition>.jsonl
    <root>/skipped/<author>/<op_type>/<definition>.jsonl   (flashtune: SKIPPED evaluations)
    <root>/blob/...                      (safetensors referenced by workloads)

These are the paths flashtune writes. It reads what FlashInfer-Bench reads: any `*.json`
under definitions/ and solutions/, and any `<definition>.jsonl` at any depth under
workloads/ and traces/ (FlashInfer-Bench's example sets keep them flat, its `add_traces`
writes traces/<op_type>/<definition>.jsonl). A SKIPPED evaluation (flashtune's status for a
triple it could not run here) is not a FlashInfer-Bench status, so it goes to skipped/, where
FlashInfer-Bench does not look; flashtune reads it back with the traces.

Several roots can be combined: reads see all of them (the first root wins on a name clash),
writes go to the first. `solution_sources` are datasets read for their solutions only (the
bundled dataset, for a dataset written by capture, which has definitions and workloads but no
solutions): a source's solutions of a definition attach when the source's definition of that
name has the same contract as this dataset's (`Definition.contract`: name, axes, inputs and
outputs, reference, tolerances; not descriptions or `model:` tags). A definition whose
contract differs gets none of them, and `unattached` says which and why: a solution written
for another dtype, another eps or another layout must not pass for this one's. A source
contributes no definitions, workloads or traces. Files are loaded lazily and once; a bad file or line is recorded in
`errors` (file, line, field, problem) and the rest of the dataset still loads.

Every name that becomes a path component above (author, op_type, definition, solution name)
is checked by the models and again here, where the path is built: a dataset from a stranger
must not make flashtune write outside its root. Nor may a symbolic link it holds: every write
(definitions, solutions, workload and trace lines) is confined to the write root
(`flashtune.data.io`: a link leading outside is refused with UnsafePathError, and the folders
and file are opened without following links).

A hostile file (too large, too deeply nested, not UTF-8, malformed) is one error in `errors`,
never an exception: `flashtune validate` lists it and `flashtune run` skips it.
"""

from __future__ import annotations

import fnmatch
import glob
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from flashtune.data.io import (
    DatasetFileError,
    LoadError,
    append_line,
    atomic_write_text,
    iter_jsonl_lines,
    links_leading_outside,
    parse_json,
    parse_model,
    read_text,
)
from flashtune.data.models import (
    Definition,
    EvaluationStatus,
    SafetensorsInput,
    Solution,
    TensorSpec,
    Trace,
    Workload,
    check_path_component,
)
from flashtune.data.synth import listed_inputs

M = TypeVar("M", Definition, Solution)

__all__ = ["Dataset", "LoadError", "SKIPPED_DIR", "UnattachedSolutions", "bundled_root"]

# Where SKIPPED evaluations are kept, beside traces/ (which FlashInfer-Bench reads).
SKIPPED_DIR = "skipped"


def bundled_root() -> Path:
    """The dataset shipped inside the package (flashtune/dataset/: data only): the default
    benchmark, and the default source of solutions for a captured dataset."""
    return Path(__file__).resolve().parents[1] / "dataset"


@dataclass(frozen=True)
class UnattachedSolutions:
    """A solution source's solutions of a definition that did not attach: the source's
    definition of that name has another contract than the dataset's."""

    definition: str
    source: Path
    solutions: tuple[str, ...]
    differences: tuple[str, ...]  # Definition.contract_differences, the dataset's first

    def message(self) -> str:
        count = len(self.solutions)
        return (
            f"{self.definition}: the {count} solution{'s' if count != 1 else ''} of {self.source} "
            f"({', '.join(self.solutions)}) do not attach: its {self.definition!r} is another "
            f"contract (yours vs its: {'; '.join(self.differences)}), and a solution runs "
            "only on the definition it was written for"
        )


# safetensors' dtype codes, by the FlashInfer Trace dtype names they store.
_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def _is_path_component(name: str) -> bool:
    try:
        check_path_component(name)
    except ValueError:
        return False
    return True


def _blob_problem(path: Path, key: str, spec: TensorSpec, axes: dict[str, int]) -> str | None:
    """What is wrong with one workload input's blob, read from its header only (no tensor
    data is loaded); None if it holds `key` with the shape and dtype the axes give."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            if key not in f.keys():
                return f"blob {path} has no tensor {key!r} (has {sorted(f.keys())})"
            tensor = f.get_slice(key)
            shape, dtype = tuple(tensor.get_shape()), tensor.get_dtype()
    except (SafetensorError, OSError) as exc:
        return f"blob {path} is not a readable safetensors file: {exc}"
    names = spec.shape or []
    expected = tuple(axes[a] for a in names)
    if shape != expected:
        wrong = ""
        if len(shape) == len(expected):
            axis, want, got = next(
                t for t in zip(names, expected, shape, strict=True) if t[1] != t[2]
            )
            wrong = f"axis {axis!r} is {got}, expected {want}; "
        return (
            f"blob {path} tensor {key!r}: {wrong}shape {list(shape)}, expected {list(expected)} "
            f"(axes {names})"
        )
    if _SAFETENSORS_DTYPES.get(dtype, dtype) != spec.dtype:
        return f"blob {path} tensor {key!r} has dtype {dtype}, expected {spec.dtype}"
    return None


def _read_model(model: type[M], path: Path) -> M:
    """A model read from a JSON file, remembering its text (see `_Model.file_text`)."""
    text = read_text(path)
    raw = parse_json(text, path)
    parsed = parse_model(model, raw, path)
    parsed.remember_source(text, raw)
    return parsed


def _jsonl_files(folder: Path, definition: str | None = None) -> list[Path]:
    """The `<definition>.jsonl` files (any definition if None) at any depth under `folder`."""
    name = "*" if definition is None else glob.escape(definition)
    return sorted(folder.rglob(f"{name}.jsonl"))


class Dataset:
    """Lazy, indexed view over one or more dataset roots."""

    def __init__(
        self,
        roots: str | Path | Sequence[str | Path],
        solution_sources: Sequence[str | Path] = (),
    ) -> None:
        if isinstance(roots, (str, Path)):
            roots = [roots]
        if not roots:
            raise ValueError("Dataset needs at least one root folder")
        self.roots: list[Path] = [Path(r).expanduser().resolve() for r in roots]
        # Read for their solutions only (see the module docstring); a root is read whole.
        self.solution_sources: list[Path] = []
        for source in solution_sources:
            path = Path(source).expanduser().resolve()
            if path not in self.roots and path not in self.solution_sources:
                self.solution_sources.append(path)
        self._attached: dict[tuple[str, str], Path] = {}
        self._unattached: list[UnattachedSolutions] = []
        self._lock = threading.RLock()
        self._definitions: dict[str, Definition] | None = None
        self._definition_paths: dict[str, Path] = {}
        self._solutions: dict[str, list[Solution]] | None = None
        self._workloads: dict[str, list[Trace]] = {}
        self._traces: dict[str, list[Trace]] = {}
        self._errors: dict[Path, list[LoadError]] = {}

    @property
    def root(self) -> Path:
        """Where writes go."""
        return self.roots[0]

    def __repr__(self) -> str:
        return f"Dataset({', '.join(str(r) for r in self.roots)})"

    # ----------------------------------------------------------------- errors
    @property
    def errors(self) -> list[LoadError]:
        """Every problem met so far (load everything first with `load_all()`)."""
        return [e for errs in self._errors.values() for e in errs]

    def _record(self, path: Path, errors: list[LoadError]) -> None:
        self._errors.setdefault(path, []).extend(errors)

    # ----------------------------------------------------------------- definitions
    @property
    def definitions(self) -> dict[str, Definition]:
        with self._lock:
            if self._definitions is None:
                self._definitions = {}
                for root in self.roots:
                    for path in sorted((root / "definitions").rglob("*.json")):
                        self._load_definition(path)
            return self._definitions

    def _load_definition(self, path: Path) -> None:
        assert self._definitions is not None
        try:
            definition = _read_model(Definition, path)
        except DatasetFileError as exc:
            self._record(path, exc.errors)
            return
        if definition.name in self._definitions:
            first = self._definition_paths[definition.name]
            if first.parent.parent.parent == path.parent.parent.parent:  # same root: a real clash
                self._record(
                    path,
                    [
                        LoadError(
                            path, f"duplicate definition name {definition.name!r} (also in {first})"
                        )
                    ],
                )
            return
        if path.stem != definition.name:
            self._record(
                path,
                [
                    LoadError(
                        path,
                        f"file name does not match definition name {definition.name!r}",
                        field="name",
                    )
                ],
            )
        self._definitions[definition.name] = definition
        self._definition_paths[definition.name] = path

    def definition(self, name: str) -> Definition:
        try:
            return self.definitions[name]
        except KeyError:
            raise KeyError(f"no definition named {name!r} in {self}") from None

    def find_definitions(
        self, op_type: str | None = None, name: str | None = None
    ) -> list[Definition]:
        """Definitions filtered by op_type and a name glob, sorted by name."""
        return [
            d
            for n, d in sorted(self.definitions.items())
            if (op_type is None or d.op_type == op_type)
            and (name is None or fnmatch.fnmatchcase(n, name))
        ]

    # ----------------------------------------------------------------- solutions
    @property
    def solutions(self) -> dict[str, list[Solution]]:
        """Solutions by definition name."""
        with self._lock:
            if self._solutions is None:
                self._solutions = {}
                seen: set[tuple[str, str]] = set()
                for root in self.roots:
                    for path in sorted((root / "solutions").rglob("*.json")):
                        try:
                            sol = _read_model(Solution, path)
                        except DatasetFileError as exc:
                            self._record(path, exc.errors)
                            continue
                        if (sol.definition, sol.name) in seen:
                            continue
                        seen.add((sol.definition, sol.name))
                        self._solutions.setdefault(sol.definition, []).append(sol)
                for source in self.solution_sources:
                    self._attach(Dataset(source), seen)
            return self._solutions

    def _attach(self, source: Dataset, seen: set[tuple[str, str]]) -> None:
        """Add `source`'s solutions of the definitions whose contract equals ours (a
        solution of the same name already here wins, as the first root does)."""
        assert self._solutions is not None
        for name, solutions in sorted(source.solutions.items()):
            mine, theirs = self.definitions.get(name), source.definitions.get(name)
            if mine is None or theirs is None:
                continue  # nothing to run them on here, or nothing to compare with
            differences = mine.contract_differences(theirs)
            if differences:
                names = tuple(s.name for s in solutions)
                self._unattached.append(
                    UnattachedSolutions(name, source.root, names, tuple(differences))
                )
                continue
            for sol in solutions:
                if (name, sol.name) in seen:
                    continue
                seen.add((name, sol.name))
                self._solutions.setdefault(name, []).append(sol)
                self._attached[(name, sol.name)] = source.root
        for path, errors in source._errors.items():
            self._record(path, errors)

    def attached_from(self, definition: str, solution: str) -> Path | None:
        """The solution source `solution` of `definition` was attached from (None: it is a
        root's own, or there is no such solution)."""
        self.solutions  # noqa: B018 - loads them
        return self._attached.get((definition, solution))

    @property
    def unattached(self) -> list[UnattachedSolutions]:
        """The solution sources' solutions left out because their definition's contract
        differs from this dataset's definition of the same name (see the module docstring)."""
        self.solutions  # noqa: B018 - loads them
        return list(self._unattached)

    def solutions_for(self, definition: str, name: str | None = None) -> list[Solution]:
        sols = self.solutions.get(definition, [])
        return [s for s in sols if name is None or fnmatch.fnmatchcase(s.name, name)]

    def all_solutions(self) -> list[Solution]:
        return [s for sols in self.solutions.values() for s in sols]

    # ----------------------------------------------------------------- workloads and traces
    def workloads_for(self, definition: str) -> list[Trace]:
        """The workload records (Traces without solution) of a definition."""
        check_path_component(definition, "definition")
        with self._lock:
            if definition not in self._workloads:
                records = []
                for root in self.roots:
                    for path in _jsonl_files(root / "workloads", definition):
                        records.extend(self._read_traces(path))
                self._workloads[definition] = records
            return self._workloads[definition]

    def traces_for(self, definition: str) -> list[Trace]:
        check_path_component(definition, "definition")
        with self._lock:
            if definition not in self._traces:
                records = []
                for root in self.roots:
                    for folder in ("traces", SKIPPED_DIR):
                        for path in _jsonl_files(root / folder, definition):
                            records.extend(self._read_traces(path))
                self._traces[definition] = records
            return self._traces[definition]

    def all_traces(self) -> list[Trace]:
        names = set(self.definitions)
        for root in self.roots:
            for folder in ("traces", SKIPPED_DIR):
                names |= {p.stem for p in _jsonl_files(root / folder)}
        # A stray file such as `...jsonl` (stem "..") names no definition.
        return [t for n in sorted(names) if _is_path_component(n) for t in self.traces_for(n)]

    def _read_traces(self, path: Path) -> list[Trace]:
        records = []
        for lineno, text, raw in iter_jsonl_lines(path):
            if isinstance(raw, DatasetFileError):
                self._record(path, raw.errors)
                continue
            try:
                record = parse_model(Trace, raw, path, line=lineno)
            except DatasetFileError as exc:
                self._record(path, exc.errors)
                continue
            record.remember_source(text, raw)
            records.append(record)
        return records

    # ----------------------------------------------------------------- blobs
    def blob_path(self, relative: str) -> Path:
        """Resolve a workload's blob path; it may not escape its dataset root."""
        for root in self.roots:
            candidate = (root / relative).resolve()
            if not candidate.is_relative_to(root):
                raise ValueError(f"blob path {relative!r} escapes the dataset root {root}")
            if candidate.exists():
                return candidate
        return (self.root / relative).resolve()

    # ----------------------------------------------------------------- validation
    def load_all(self) -> list[LoadError]:
        """Load every file of every kind, cross-check them, and return all problems."""
        definitions = self.definitions
        self.solutions  # noqa: B018 - loads them
        names = set(definitions)
        for root in self.roots:
            names |= {p.stem for p in _jsonl_files(root / "workloads")}
        for name in sorted(n for n in names if _is_path_component(n)):
            for record in self.workloads_for(name):
                self._check_workload(name, record)
        self.all_traces()
        for sol in self.all_solutions():
            if sol.definition not in definitions:
                self._record(
                    self.root / "solutions",
                    [
                        LoadError(
                            self.root / "solutions",
                            f"solution {sol.name!r} names unknown definition {sol.definition!r}",
                        )
                    ],
                )
        return self.errors

    def _check_workload(self, file_stem: str, record: Trace) -> None:
        path = self._workload_path_hint(file_stem)
        definition = self.definitions.get(record.definition)
        if definition is None:
            self._record(
                path,
                [
                    LoadError(
                        path,
                        f"workload {record.workload.uuid} names unknown definition {record.definition!r}",
                    )
                ],
            )
            return
        uuid = record.workload.uuid
        try:
            record.workload.check_against(definition)
            blobs = {
                name: (self.blob_path(spec.path), spec.tensor_key)
                for name, spec in record.workload.inputs.items()
                if isinstance(spec, SafetensorsInput)
            }
        except ValueError as exc:
            self._record(path, [LoadError(path, str(exc), field=f"workload.{uuid}")])
            return
        # A blob's header is checked here, so that `validate` (not a benchmark run) reports a
        # garbage file or a tensor whose shape disagrees with the workload's axes.
        axes = {**definition.const_axes, **record.workload.axes}
        for name, (blob, tensor_key) in blobs.items():
            spec = definition.inputs[name]
            if spec.shape is None or not blob.exists():  # scalars; a missing blob is synthesized
                continue
            problem = _blob_problem(blob, tensor_key, spec, axes)
            if problem is not None:
                self._record(
                    path,
                    [LoadError(path, problem, field=f"workload.{uuid}.inputs.{name}")],
                )

    def _workload_path_hint(self, definition: str) -> Path:
        for root in self.roots:
            for path in _jsonl_files(root / "workloads", definition):
                return path
        return self.root / "workloads" / f"{definition}.jsonl"

    def counts(self) -> dict[str, int]:
        self.load_all()
        return {
            "definitions": len(self.definitions),
            "solutions": len(self.all_solutions()),
            "workloads": sum(len(v) for v in self._workloads.values()),
            "traces": sum(len(v) for v in self._traces.values()),
        }

    # ----------------------------------------------------------------- writes (first root)
    def add_definition(self, definition: Definition, overwrite: bool = False) -> Path:
        check_path_component(definition.op_type, "definition.op_type")
        check_path_component(definition.name, "definition.name")
        path = self.root / "definitions" / definition.op_type / f"{definition.name}.json"
        with self._lock:
            if path.exists() and not overwrite:
                raise FileExistsError(f"definition {definition.name!r} already exists at {path}")
            atomic_write_text(path, definition.file_text(indent=2), root=self.root)
            if self._definitions is not None:
                self._definitions[definition.name] = definition
                self._definition_paths[definition.name] = path
        return path

    def add_solution(self, solution: Solution, overwrite: bool = False) -> Path:
        op_type = (
            self.definition(solution.definition).op_type
            if solution.definition in self.definitions
            else "unknown"
        )
        # Checked again here: a model built with model_construct() skips its validators.
        check_path_component(solution.author, "solution.author")
        check_path_component(op_type, "definition.op_type")
        check_path_component(solution.definition, "solution.definition")
        check_path_component(solution.name, "solution.name")
        path = (
            self.root
            / "solutions"
            / solution.author
            / op_type
            / solution.definition
            / f"{solution.name}.json"
        )
        with self._lock:
            if path.exists() and not overwrite:
                raise FileExistsError(f"solution {solution.name!r} already exists at {path}")
            atomic_write_text(path, solution.file_text(indent=2), root=self.root)
            if self._solutions is not None:
                sols = self._solutions.setdefault(solution.definition, [])
                sols[:] = [s for s in sols if s.name != solution.name] + [solution]
        return path

    def add_workloads(self, definition: Definition, workloads: Iterable[Workload | Trace]) -> Path:
        """Append workloads, or workload records read from another dataset (written back
        as they were read)."""
        check_path_component(definition.op_type, "definition.op_type")
        check_path_component(definition.name, "definition.name")
        path = self.root / "workloads" / definition.op_type / f"{definition.name}.jsonl"
        with self._lock:
            for workload in workloads:
                record = (
                    workload
                    if isinstance(workload, Trace)
                    else Trace(  # in the field order, as FlashInfer-Bench writes it
                        definition=definition.name,
                        # Every input listed: FlashInfer-Bench's validate refuses one left out.
                        workload=listed_inputs(definition, workload),
                        solution=None,
                        evaluation=None,
                    )
                )
                append_line(path, record.file_text(indent=None, end=""), root=self.root)
                if definition.name in self._workloads:
                    self._workloads[definition.name].append(record)
        return path

    def trace_path(self, trace: Trace, author: str, op_type: str) -> Path:
        """traces/<author>/<op_type>/<definition>.jsonl (skipped/... for a SKIPPED
        evaluation); ValueError if a name is not a single path component (an author of
        `../../tmp/x` would write outside the dataset)."""
        check_path_component(author, "solution.author")
        check_path_component(op_type, "definition.op_type")
        check_path_component(trace.definition, "trace.definition")
        skipped = trace.evaluation is not None and trace.evaluation.status == (
            EvaluationStatus.SKIPPED
        )
        folder = SKIPPED_DIR if skipped else "traces"
        return self.root / folder / author / op_type / f"{trace.definition}.jsonl"

    def append_trace(self, trace: Trace, author: str = "unknown") -> Path:
        """Append one Trace as a whole, flushed line (UnsafePathError if its file, or a
        folder on the way, is a symbolic link leading outside the dataset)."""
        definition = self.definitions.get(trace.definition)
        op_type = definition.op_type if definition else "unknown"
        path = self.trace_path(trace, author, op_type)
        with self._lock:
            append_line(path, trace.file_text(indent=None, end=""), root=self.root)
            if trace.definition in self._traces:
                self._traces[trace.definition].append(trace)
        return path

    def links_leading_outside(self, folders: Sequence[str] = ("traces", SKIPPED_DIR)) -> list[str]:
        """The symbolic links under the write root's `folders` that lead outside it, one
        message each: every write refuses them (UnsafePathError); a run checks first."""
        return links_leading_outside(self.root, tuple(folders))

    def refresh(self) -> None:
        """Forget everything loaded, so the next access re-reads the files."""
        with self._lock:
            self._definitions = None
            self._definition_paths = {}
            self._solutions = None
            self._attached = {}
            self._unattached = []
            self._workloads = {}
            self._traces = {}
            self._errors = {}

"""Solutions for any dataset's definitions, from the op schemas and the families' entries.

The bundled dataset's solutions (`solutions_for`) are written for the bundled definitions. A
FlashInfer-Trace dataset has the same ops at other constants (head counts, widths, page
sizes, eps) and in a few layouts of its own. Here a definition gets flashtune's, FlashInfer's
and torch's solutions when:

1. an op schema matches it by name and contract: a schema whose name prefix starts its name,
   whose Definition at the definition's constants (`schema_definition_at`) has the same name,
   op type, axes, inputs and outputs (shapes and dtypes, in order) — the references are
   compared by the constants they fix (`reference_constants`: eps, is_neox), since a
   FlashInfer-Trace reference is FlashInfer's source, not flashtune's; and
2. a family's bundle declares entries for that schema's ops (`bundled_op_for`; for a schema
   an op made for the definition, `schema_for_definition`, the bundled op under the same
   template whose entries take its inputs), and each entry can take the constants the
   definition fixes (those its reference reveals and those a schema made for it carries,
   `definition_constants`: a keyword of the entry function, or the value it has built in).
   An op may also say why a definition of its kind gets none (a ValueError: fp4 MoE).

Layout variants the FlashInfer-Trace dataset uses are matched as adapters, not as other ops
(`LAYOUTS`): the solution's source maps the definition's inputs onto the entry's.

A definition lacking a constraint of the schema still matches (its solutions run); the
missing constraints are reported (`SchemaMatch.missing_constraints`), since flashtune's
input synthesis needs them to draw valid index tensors where no blob holds them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flashtune.data import Definition, Solution
from flashtune.data.models import ConstAxis
from flashtune.ops.bundle import (
    ENTRY_FILE,
    ENTRY_MODULE,
    BundledOp,
    Entry,
    bundled_op_for,
    bundled_ops,
    entry_solution,
    solution_name,
)
from flashtune.schema import REGISTRY, BoundCall, OpSchema, reference_constants

__all__ = [
    "KINDS",
    "LAYOUTS",
    "Layout",
    "SchemaMatch",
    "Supply",
    "definition_schemas",
    "match_schema",
    "reference_solution",
    "schema_definition_at",
    "schema_names",
    "schemas_by_prefix",
    "supply",
    "supply_all",
]

# The solution kinds `--with` names: an entry's kind is "flashtune", "torch", "flashinfer"
# or "flashinfer_<backend>" (a forced backend beside FlashInfer's own pick).
KINDS = ("flashtune", "flashinfer", "torch")


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    """A way a dataset's definition lays out an input the schema declares otherwise.

    name: what the solution's source says about it; input: the schema's input it concerns;
    applies: (schema's definition, dataset's definition) -> whether this layout is the
    difference between them; fill: how the source makes the schema's input from the
    definition's (an expression over the inputs, by name, written into the source)."""

    name: str
    input: str
    applies: Callable[[Definition, Definition], bool]
    fill: str


def _page_size_one_without_last_page_len(ours: Definition, theirs: Definition) -> bool:
    # Every page of a page-size-1 cache is full: the last page holds one token.
    return (
        "kv_last_page_len" in ours.inputs
        and "kv_last_page_len" not in theirs.inputs
        and theirs.const_axes.get("page_size") == 1
    )


def _last_page_len_per_indptr_entry(ours: Definition, theirs: Definition) -> bool:
    spec = theirs.inputs.get("kv_last_page_len")
    return (
        spec is not None
        and "kv_last_page_len" in ours.inputs
        and spec.shape == ["len_indptr"]
        and ours.inputs["kv_last_page_len"].shape != ["len_indptr"]
    )


LAYOUTS: tuple[Layout, ...] = (
    Layout(
        "page size 1 without kv_last_page_len (every page holds one token)",
        "kv_last_page_len",
        _page_size_one_without_last_page_len,
        "torch.ones(kv_indptr.shape[0] - 1, dtype=torch.int32, device=kv_indptr.device)",
    ),
    Layout(
        "kv_last_page_len of len_indptr entries (its first batch_size are the sequences')",
        "kv_last_page_len",
        _last_page_len_per_indptr_entry,
        "kv_last_page_len[: kv_indptr.shape[0] - 1]",
    ),
)


# --------------------------------------------------------------------------- matching


def schemas_by_prefix() -> dict[str, list[OpSchema]]:
    """Every registered op's schemas by name prefix (the op modules must be loaded:
    `flashtune.ops.load_all()`), each schema once."""
    out: dict[str, list[OpSchema]] = {}
    for op in REGISTRY.values():
        for schema in op.schemas:
            listed = out.setdefault(schema.name_prefix, [])
            if all(schema is not s for s in listed):
                listed.append(schema)
    return out


def schema_definition_at(schema: OpSchema, definition: Definition) -> Definition:
    """The schema's Definition at `definition`'s constants and input dtypes, the bound
    constants its reference reveals (none: the schema's defaults). No call is made: the
    call is described by the definition itself."""
    const = {n: a.value for n, a in definition.axes.items() if isinstance(a, ConstAxis)}
    dtypes = {n: s.dtype for n, s in definition.inputs.items()}
    bound: dict[str, Any] = _definition_constants(schema, definition)
    # A dtype_from naming a parameter the definition has under its input name (param=).
    for name in schema.inputs:
        param = schema.param_of(name)
        if name in dtypes:
            dtypes.setdefault(param, dtypes[name])
    call = BoundCall(
        schema,
        axes=const,
        inputs={n: None for n in definition.inputs if n in schema.inputs},
        dtypes=dtypes,
        bound=bound,
    )
    return schema.build_definition(call)


def schema_names(definition: Definition, schemas: dict[str, list[OpSchema]] | None = None) -> bool:
    """Whether an op schema emits `definition`'s name at its constants: flashtune has the
    op (a kernel for it), whether or not the contracts agree in every detail."""
    schemas = schemas_by_prefix() if schemas is None else schemas
    const = {n: a.value for n, a in definition.axes.items() if isinstance(a, ConstAxis)}
    for prefix, listed in schemas.items():
        if not definition.name.startswith(f"{prefix}_"):
            continue
        for schema in listed:
            try:
                if schema.name_for(const) == definition.name:
                    return True
            except KeyError:  # a const axis of the schema this definition does not have
                continue
    return any(s.name_for(const) == definition.name for s in definition_schemas(definition))


def definition_schemas(definition: Definition, reasons: list[str] | None = None) -> list[OpSchema]:
    """The schemas ops make for this definition themselves: an op whose registered schemas
    are templates (made per call key, as the fused MoE's are per routing) may answer
    `schema_for_definition(definition) -> OpSchema | None`, so a dataset's definition at
    other keys is matched too. None: not one of the op's definitions; a ValueError: one of
    its kind that it has no schema for, the message saying why (appended to `reasons`, once
    each). None of the ops answering: []."""
    found: list[OpSchema] = []
    for op in REGISTRY.values():
        make = getattr(op, "schema_for_definition", None)
        if not callable(make):
            continue
        try:
            schema = make(definition)
        except ValueError as exc:  # its kind, without a schema: the op says why
            if reasons is not None and str(exc) not in reasons:
                reasons.append(str(exc))
            continue
        except (KeyError, TypeError):  # not one of its definitions
            continue
        if isinstance(schema, OpSchema) and all(schema is not s for s in found):
            found.append(schema)
    return found


def _definition_constants(schema: OpSchema, definition: Definition) -> dict[str, Any]:
    """The bound constants `definition` fixes for `schema`: those a schema made for it carries
    (`definition_constants`: a template's key, as the fused MoE's routing constants, which
    its names carry and no input or shape does), then those its reference reveals."""
    made = dict(getattr(schema, "definition_constants", None) or {})
    return {**made, **reference_constants(definition.reference, schema.bound)}


@dataclass(frozen=True)
class SchemaMatch:
    """A definition matched to an op schema: the schema's definition at its constants, the
    constants its reference fixes, the layouts that bridge them, the constraints it lacks."""

    definition: Definition
    schema: OpSchema
    ours: Definition
    constants: dict[str, Any]  # those the definition's reference reveals
    layouts: tuple[Layout, ...] = ()
    missing_constraints: tuple[str, ...] = ()


def _specs(d: Definition, kind: str) -> list[tuple[str, Any, str]]:
    return [(n, s.shape, s.dtype) for n, s in getattr(d, kind).items()]


def _compare(ours: Definition, theirs: Definition) -> tuple[list[str], list[Layout]]:
    """The differences between the schema's definition and the dataset's that no layout
    explains, and the layouts that explain the rest."""
    problems: list[str] = []
    if ours.name != theirs.name:
        problems.append(f"name {ours.name} at these constants")
    if ours.op_type != theirs.op_type:
        problems.append(f"op_type {ours.op_type} vs {theirs.op_type}")
    layouts = [
        layout for layout in LAYOUTS if layout.applies(ours, theirs) and layout.input in ours.inputs
    ]
    bridged = {layout.input for layout in layouts}
    # An axis only a bridged input of ours has (batch_size of kv_last_page_len) may be absent.
    shown = {
        a
        for n, s in [*ours.inputs.items(), *ours.outputs.items()]
        if n not in bridged
        for a in s.shape or ()
    }
    mine = {
        n: (a.type, getattr(a, "value", None))
        for n, a in ours.axes.items()
        if n in shown or n in theirs.axes
    }
    yours = {n: (a.type, getattr(a, "value", None)) for n, a in theirs.axes.items()}
    if mine != yours:
        problems.append(f"axes {mine} vs {yours}")
    mine_in = [s for s in _specs(ours, "inputs") if s[0] not in bridged]
    yours_in = [s for s in _specs(theirs, "inputs") if s[0] not in bridged]
    if mine_in != yours_in:
        problems.append(f"inputs {mine_in} vs {yours_in}")
    if _specs(ours, "outputs") != _specs(theirs, "outputs"):
        problems.append(f"outputs {_specs(ours, 'outputs')} vs {_specs(theirs, 'outputs')}")
    return problems, layouts


def match_schema(
    definition: Definition, schemas: dict[str, list[OpSchema]] | None = None
) -> SchemaMatch | str:
    """The op schema whose contract `definition` has (see the module docstring), or why
    none has: a sentence naming the closest schema's differences."""
    schemas = schemas_by_prefix() if schemas is None else schemas
    prefixes = sorted(
        (p for p in schemas if definition.name.startswith(f"{p}_")), key=len, reverse=True
    )
    candidates = [(p, schema) for p in prefixes for schema in schemas[p]]
    said: list[str] = []  # what ops answering schema_for_definition say of it
    candidates += [(s.name_prefix, s) for s in definition_schemas(definition, said)]
    if not candidates:
        if said:
            return "; ".join(said)
        return f"{definition.name}: no op schema has a name prefix of it"
    reasons: list[str] = list(said)
    for prefix, schema in candidates:
        try:
            ours = schema_definition_at(schema, definition)
        except (ValueError, KeyError, TypeError) as exc:
            reasons.append(f"{prefix}: {exc}")
            continue
        problems, layouts = _compare(ours, definition)
        if problems:
            reasons.append(f"{prefix}: {'; '.join(problems)}")
            continue
        missing = tuple(c for c in ours.constraints if c not in definition.constraints)
        constants = _definition_constants(schema, definition)
        return SchemaMatch(definition, schema, ours, constants, tuple(layouts), missing)
    return f"{definition.name}: no schema's contract matches ({' | '.join(reasons)})"


# --------------------------------------------------------------------------- solutions


def _entry_constants(
    entry: Entry, constants: dict[str, Any], defaults: dict[str, Any], shapes: dict[str, int]
) -> dict[str, Any] | str:
    """The keywords to call the entry with for the constants the definition's reference
    fixes, or why it cannot take them. An entry takes a constant as a keyword parameter of
    that name (left out where it equals the parameter's default, so the source stays the
    bundled one); an entry without the parameter computes the value it declares in
    `bound_constants`, else the schema's default (`defaults`). A constant equal to the const
    axis of its name (`shapes`: those an input's shape names) is what the inputs' shapes say,
    and entries read it there; one no shape names (the MoE's top_k) is passed."""
    fn = entry.function
    parameters = inspect.signature(fn).parameters
    keywords: dict[str, Any] = {}
    built_in: dict[str, Any] = {**defaults, **getattr(fn, "bound_constants", {})}
    for name, value in constants.items():
        if shapes.get(name) == value:  # the shapes say it (rope's head_size): entries read them
            continue
        if name in parameters:
            if parameters[name].default != value:
                keywords[name] = value
        elif built_in.get(name) != value:
            return (
                f"{fn.__name__} computes {name}={built_in.get(name)!r}, the definition's "
                f"reference {name}={value!r}"
            )
    return keywords


def _source(entry: Entry, match: SchemaMatch, keywords: dict[str, Any]) -> str:
    theirs = list(match.definition.inputs)
    fills = {layout.input: layout.fill for layout in match.layouts}
    # The entry's parameters in the schema's order; a bridged one made from the definition's.
    arguments = [fills.get(name, name) for name in match.ours.inputs]
    arguments += [f"{k}={v!r}" for k, v in keywords.items()]
    function = entry.function.__name__
    lines = [
        f"# Runs {ENTRY_MODULE}.{function} (the flashtune package must be installed) on",
        f"# {match.definition.name}, whose contract is op schema {match.schema.name_prefix}'s"
        " at its constants.",
        *(f"# Layout: {layout.name}." for layout in match.layouts),
        "# Value-returning: run(*inputs) returns the outputs.",
        "import torch",
        "",
        f"from {ENTRY_MODULE} import adapted, entry",
        "",
        "",
        f"def _call(fn, {', '.join(theirs)}):",
        f"    return fn({', '.join(arguments)})",
        "",
        "",
        f'run = adapted(entry("{function}"), _call)',
        "",
        '__all__ = ["run"]',
        "",
    ]
    return "\n".join(lines)


def _plain(match: SchemaMatch, keywords: dict[str, Any]) -> bool:
    """Whether the entry takes the definition's inputs as they are (the bundled form)."""
    return not match.layouts and not keywords


def _solution(entry: Entry, match: SchemaMatch, keywords: dict[str, Any]) -> Solution:
    source = None if _plain(match, keywords) else _source(entry, match, keywords)
    return entry_solution(match.definition, entry, source)


def _wanted(entry: Entry, kinds: Sequence[str]) -> bool:
    return any(entry.kind == k or entry.kind.startswith(f"{k}_") for k in kinds)


@dataclass
class Supply:
    """What `supply` found for one definition: its solutions, or why it has none (the
    schema match's reason, or entries that cannot take its constants)."""

    definition: Definition
    match: SchemaMatch | None
    solutions: list[Solution] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def supplied(self) -> bool:
        return bool(self.solutions)


def supply(
    definition: Definition,
    kinds: Sequence[str] = KINDS,
    schemas: dict[str, list[OpSchema]] | None = None,
) -> Supply:
    """flashtune's, FlashInfer's and torch's solutions (those of `kinds`) for `definition`."""
    schemas = schemas_by_prefix() if schemas is None else schemas
    matched = match_schema(definition, schemas)
    if isinstance(matched, str):
        return Supply(definition, None, problems=[matched])
    op = bundled_op_for(definition.name) or _template_op(matched, schemas)
    if op is None:
        return Supply(
            definition,
            matched,
            problems=[f"{definition.name}: no family's bundle.py declares entries for it"],
        )
    out = Supply(definition, matched)
    # A constant is what the inputs' shapes say (entries read it there) where one names it.
    shown = {a for spec in definition.inputs.values() for a in spec.shape or ()}
    shapes = {n: v for n, v in definition.const_axes.items() if n in shown}
    for entry in op.entries_for(definition):
        if not _wanted(entry, kinds):
            continue
        defaults = matched.schema.constants_of({})
        keywords = _entry_constants(entry, matched.constants, defaults, shapes)
        if isinstance(keywords, str):
            out.problems.append(f"{definition.name}: {keywords}")
            continue
        out.solutions.append(_solution(entry, matched, keywords))
    return out


def _takes_inputs(entry: Entry, inputs: Iterable[str]) -> bool:
    """Whether the entry's parameters start with `inputs`, by name and in order (a parameter
    after them has a default)."""
    parameters = list(inspect.signature(entry.function).parameters.values())
    names = list(inputs)
    head = [p.name for p in parameters[: len(names)]]
    rest = parameters[len(names) :]
    return head == names and all(p.default is not inspect.Parameter.empty for p in rest)


def _template_op(match: SchemaMatch, schemas: dict[str, list[OpSchema]]) -> BundledOp | None:
    """The bundled op of a definition matched through a schema made for it (an op's
    `schema_for_definition`: named at constants no bundled op's prefix has, the fused MoE's
    topk10 or ng1_kg1): the bundled op under the same template, the longest registered
    schema prefix of its name, whose entries take its inputs (by name, in order); they are
    told the constants it differs in (`_entry_constants`). None if there is none or several."""
    name = match.definition.name
    templates = sorted((p for p in schemas if name.startswith(f"{p}_")), key=len, reverse=True)
    if not templates:
        return None
    under = [op for op in bundled_ops() if op.prefix.startswith(f"{templates[0]}_")]
    fitting = [
        op
        for op in under
        if op.entries and all(_takes_inputs(e, match.ours.inputs) for e in op.entries)
    ]
    return fitting[0] if len(fitting) == 1 else None


def supply_all(definitions: Iterable[Definition], kinds: Sequence[str] = KINDS) -> list[Supply]:
    """`supply` for each definition, reading the schemas once."""
    schemas = schemas_by_prefix()
    return [supply(d, kinds, schemas) for d in definitions]


def reference_solution(definition: Definition) -> Solution:
    """The definition's own reference as a solution (`flashtune run --reference-only`):
    checked against itself, so a run proves the reference runs on every workload and gives
    outputs of the declared shapes and dtypes, and times it."""
    return Solution.model_validate(
        {
            "name": solution_name("reference", definition),
            "definition": definition.name,
            "author": "baseline",  # FlashInfer-Bench's baseline author (its summary needs one)
            "description": "The definition's reference implementation, as written in it.",
            "spec": {
                "language": "python",
                "target_hardware": ["cpu", "cuda"],
                "entry_point": f"{ENTRY_FILE}::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": ENTRY_FILE, "content": definition.reference}],
        }
    )

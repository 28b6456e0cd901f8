"""Input synthesis: build a definition's inputs for a workload, seeded and reproducible.

- floats: drawn from the op type's value family (flashtune.data.families: entries normal,
  uniform or Laplace, per-row scales over decades, outlier channels; never zeros), chosen
  per input set by the seed; attention values (`v`, `v_cache`, ...) have mean
  ATTENTION_VALUE_MEAN, so outputs are about 0.5 in size and an all-zero output cannot
  match; probability and logit rows of the sampling op types, and their top_k / top_p /
  min_p, come from flashtune.data.sampling_inputs (rows of several shapes, filters at their
  edges); other probability inputs (`*probs`) are rows of a softmax;
- scalars: the workload's value, or a sensible default (`sm_scale` = 1/sqrt(head_dim));
- safetensors blobs: loaded when present (paths may not escape the dataset root);
- index tensors (int inputs that are "random", or whose blob is missing) are synthesized to
  satisfy the axes and constraints: `*indptr` non-decreasing from 0 and ending at the total a
  constraint names (`num_kv_indices == kv_indptr[-1].item()`), `*indices` within the page
  count, `*last_page_len` in 1..page_size, positions within the cos/sin cache, query
  segments no longer than their KV segments (causal prefill), a routed MoE's packed
  `topk_ids` valid routings (distinct experts, positive weights: families.packed_topk_ids).
Constraints are then evaluated on the result (by flashtune.data.constraints, never by
`eval`); a failure names the constraint and values. A loaded blob whose shape or dtype
disagrees with the workload's axes raises InputError naming the blob, input and axis.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from flashtune.data.constraints import (
    CONSTRAINT_FUNCTIONS,
    ConstraintNotAllowed,
    evaluate_constraint,
    holds,
)
from flashtune.data.families import (
    ATTENTION_OP_TYPES,
    ATTENTION_VALUE_MEAN,
    MOE_PACKED_IDS,
    Draws,
    ValueFamily,
    packed_topk_ids,
)
from flashtune.data.models import (
    Definition,
    RandomInput,
    ScalarInput,
    TensorSpec,
    Workload,
)
from flashtune.data.sampling_inputs import (
    SAMPLING_OP_TYPES,
    RowPlan,
    min_p_values,
    plan_rows,
    sampling_logits,
    top_k_values,
    top_p_values,
)

__all__ = [
    "ATTENTION_OP_TYPES",
    "ATTENTION_VALUE_MEAN",
    "TORCH_DTYPES",
    "torch_dtype",
    "resolve_axes",
    "synthesize_inputs",
    "check_constraints",
    "small_workload",
    "listed_inputs",
    "ConstraintError",
    "InputError",
]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


class ConstraintError(ValueError):
    """The synthesized (or loaded) inputs do not satisfy a definition's constraints."""


class InputError(ValueError):
    """A workload's stored input (a safetensors blob) is unreadable or does not match the
    shape and dtype that the definition's axes give for that workload."""


def torch_dtype(name: str) -> torch.dtype:
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(TORCH_DTYPES)}") from None


def resolve_axes(definition: Definition, workload: Workload) -> dict[str, int]:
    """Every axis value: the definition's consts and the workload's vars."""
    workload.check_against(definition)
    axes = dict(definition.const_axes)
    axes.update(workload.axes)
    return axes


def _shape(spec: TensorSpec, axes: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(axes[a] for a in spec.shape or ())


# ------------------------------------------------------------------------- constraints


def _totals_from_constraints(definition: Definition) -> dict[str, str]:
    """{input name: axis} for constraints of the form `axis == input[-1].item()` (either side)."""
    totals: dict[str, str] = {}
    for expr in definition.constraints:
        tree = ast.parse(expr, mode="eval").body
        if not (
            isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Eq)
        ):
            continue
        sides = [tree.left, tree.comparators[0]]
        for a, b in (sides, sides[::-1]):
            tensor = _last_element_of(b)
            if isinstance(a, ast.Name) and a.id in definition.axes and tensor in definition.inputs:
                totals[tensor] = a.id
    return totals


def _last_element_of(node: ast.AST) -> str | None:
    """`x[-1].item()`, `x[-1]` or `int(x[-1])` -> "x"."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "item"
    ):
        node = node.func.value
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "int"
        and node.args
    ):
        node = node.args[0]
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        index = node.slice
        if (
            isinstance(index, ast.UnaryOp)
            and isinstance(index.op, ast.USub)
            and getattr(index.operand, "value", None) == 1
        ):
            return node.value.id
    return None


def check_constraints(
    definition: Definition, axes: Mapping[str, int], inputs: Mapping[str, Any]
) -> None:
    """Evaluate every constraint; raise ConstraintError naming the first one that fails.

    Constraints are checked against a whitelist and interpreted (flashtune.data.constraints):
    a dataset's constraint cannot run code.
    """
    names: dict[str, Any] = {**axes, **inputs}
    for expr in definition.constraints:
        try:
            ok = holds(evaluate_constraint(expr, names))
        except ConstraintNotAllowed as exc:
            raise ConstraintError(f"{definition.name}: {exc}") from None
        except Exception as exc:  # an input missing, a value of the wrong kind
            raise ConstraintError(
                f"{definition.name}: constraint {expr!r} could not be evaluated: {exc}"
            ) from None
        if not ok:
            values = {n: axes[n] for n in axes if n in expr}
            raise ConstraintError(
                f"{definition.name}: constraint {expr!r} does not hold (axes {values})"
            )


# ------------------------------------------------------------------------- synthesis


def _split(
    total: int, parts: int, gen: torch.Generator, minimum: list[int] | None = None
) -> list[int]:
    """Random non-negative integers summing to `total`, each >= minimum[i] when possible."""
    if parts <= 0:
        return []
    base = list(minimum) if minimum and sum(minimum) <= total else [0] * parts
    rest = total - sum(base)
    if rest > 0:
        cuts = sorted(torch.randint(0, rest + 1, (parts - 1,), generator=gen).tolist())
        bounds = [0, *cuts, rest]
        base = [b + bounds[i + 1] - bounds[i] for i, b in enumerate(base)]
    return base


class _Synth:
    def __init__(
        self,
        definition: Definition,
        axes: Mapping[str, int],
        gen: torch.Generator,
        device: torch.device | None = None,
    ) -> None:
        self.d = definition
        self.axes = axes
        self.gen = gen
        self.device = device
        self.totals = _totals_from_constraints(definition)
        self.page_size = axes.get("page_size", 1)
        self.lengths: dict[str, list[int]] = {}  # indptr name -> segment lengths
        self.draws = Draws(gen, device)
        # The input set's value family (entry kind, outliers) is drawn first, from the seed.
        self.family = ValueFamily(definition.op_type, self.draws)
        self.scores = _scores_input(definition)  # a sampling op's probs/logits input, if any
        self._plan: RowPlan | None = None

    def tensor(self, name: str, spec: TensorSpec, done: dict[str, Any]) -> torch.Tensor:
        shape = _shape(spec, self.axes)
        dtype = torch_dtype(spec.dtype)
        lname = name.lower()
        if dtype.is_floating_point:
            return self._float(name, spec, shape, dtype, done)
        if dtype == torch.bool:
            return torch.rand(shape, generator=self.gen) < 0.5
        if len(shape) == 1 and (lname.endswith("indptr") or name in self.totals):
            # Cumulative lengths, whatever their name (`cu_seqlens`): from 0, non-decreasing,
            # ending at the total a constraint names.
            return self._indptr(name, shape[0], dtype, done)
        if lname.endswith("last_page_len"):
            return self._last_page_len(shape, dtype, done)
        if lname == "state_batch_indices" and len(shape) == 1 and "state_cache_size" in self.axes:
            return self._cache_slots(shape[0], dtype)
        if lname.endswith("indices") and len(shape) == 1:
            return self._indices(shape[0], dtype)
        if lname in {"positions", "pos_ids", "offsets"}:
            limit = self.axes.get("max_seq_len", max(shape[0] if shape else 1, 1))
            return torch.randint(0, max(limit, 1), shape, generator=self.gen, dtype=torch.int64).to(
                dtype
            )
        if lname == "top_k":
            plan = self.plan(shape)
            if plan is not None:
                return top_k_values(plan).to(dtype)
            vocab = self._vocab_size()
            return torch.randint(
                1, min(vocab, 128) + 1, shape, generator=self.gen, dtype=torch.int64
            ).to(dtype)
        if self.d.op_type == "moe" and lname in MOE_PACKED_IDS and len(shape) == 2:
            return packed_topk_ids(shape, self.axes["num_experts"], self.gen).to(dtype)
        if lname.endswith("index_cache_fp8") and len(shape) == 4 and shape[2] == 1:
            return _packed_fp8_keys(shape, self.gen)
        if lname == "sparse_indices" and len(shape) == 2:
            return self._sparse_indices(shape, dtype)
        high = max(min(self.axes.values(), default=16), 2)
        return torch.randint(0, high, shape, generator=self.gen, dtype=torch.int64).to(dtype)

    def _sparse_indices(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """DSA's per-token cache slots [tokens, topk] in [0, num_pages * page_size), -1 padding
        at the end of a row: half the rows full (a request longer than topk), the others a
        random count of at least one (a shorter one)."""
        rows, topk = shape
        slots = max(self.axes.get("num_pages", 1) * self.page_size, 1)
        out = torch.randint(0, slots, shape, generator=self.gen, dtype=torch.int64)
        count = torch.randint(1, max(topk, 1) + 1, (rows,), generator=self.gen)
        full = torch.rand(rows, generator=self.gen) < 0.5
        count = torch.where(full, topk, count)
        out[torch.arange(topk)[None, :] >= count[:, None]] = -1
        return out.to(dtype)

    def _vocab_size(self) -> int:
        """The last axis of the probabilities/logits input: what top-k counts within."""
        for name, spec in self.d.inputs.items():
            if name.lower().endswith(("probs", "logits")) and spec.shape:
                return self.axes[spec.shape[-1]]
        return self.axes.get("vocab_size", 64)

    def plan(self, shape: tuple[int, ...]) -> RowPlan | None:
        """The sampling rows' plan (flashtune.data.sampling_inputs), drawn at its first use,
        for a per-row input of `shape` ([rows]); None when the definition is no sampling op
        with a [rows, vocab] probs/logits input, or `shape` is not per row."""
        if self.scores is None:
            return None
        rows, vocab = _shape(self.d.inputs[self.scores], self.axes)
        if tuple(shape) not in ((rows,), (rows, vocab)):
            return None
        if self._plan is None:
            names = set(self.d.inputs)
            tight = "top_k" in names and "top_p" in names
            self._plan = plan_rows(rows, vocab, self.gen, tight)
        return self._plan

    def _float(
        self,
        name: str,
        spec: TensorSpec,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        done: dict[str, Any],
    ) -> torch.Tensor:
        lname = name.lower()
        if name == self.scores:
            plan = self.plan(shape)
            assert plan is not None  # the scores input's own shape
            logits = sampling_logits(plan, shape[-1], self.draws)
            if lname.endswith("logits"):
                return logits.to(dtype)
            return torch.softmax(logits, dim=-1).to(dtype)
        if lname in ("top_p", "min_p"):
            return self._filter_value(lname, shape, done).to(dtype)
        if lname.endswith("probs"):
            return torch.softmax(self.draws.randn(shape) * 3, dim=-1).to(dtype)
        if lname == "cos_sin_cache":
            # Real caches hold cos/sin values, in [-1, 1].
            return (torch.rand(shape, generator=self.gen) * 2 - 1).to(dtype)
        # Activations: inputs whose first axis is a var axis (tokens, batch); weights: the rest.
        activation = bool(spec.shape and spec.shape[0] in self.d.var_axes)
        return self.family.values(lname, shape, dtype, activation)

    def _filter_value(
        self, lname: str, shape: tuple[int, ...], done: dict[str, Any]
    ) -> torch.Tensor:
        """top_p / min_p at the edge of each row's boundary rank (sampling_inputs), once the
        rows exist (drawn here or read from a blob); else a random value (top_p in
        [0.5, 1), min_p in [0.05, 0.5))."""
        plan = self.plan(shape)
        scores = done.get(self.scores) if self.scores is not None else None
        if plan is not None and isinstance(scores, torch.Tensor):
            weights = scores
            if self.scores is not None and self.scores.lower().endswith("logits"):
                weights = torch.softmax(scores.float(), dim=-1)
            if lname == "min_p":
                return min_p_values(weights, plan).float()
            return top_p_values(weights, plan, self.gen, "top_k" in self.d.inputs).float()
        u = torch.rand(shape, generator=self.gen)
        return 0.5 + 0.5 * u if lname == "top_p" else 0.05 + 0.45 * u

    def _indptr(
        self, name: str, length: int, dtype: torch.dtype, done: dict[str, Any]
    ) -> torch.Tensor:
        batch = max(length - 1, 0)
        total_axis = self.totals.get(name)
        if total_axis is not None:
            total = self.axes[total_axis]
        else:  # no constraint: one segment per batch entry of a random small size
            total = batch * 4
        minimum = self._min_lengths(name, batch)
        lengths = _split(total, batch, self.gen, minimum)
        self.lengths[name] = lengths
        ptr = [0]
        for n in lengths:
            ptr.append(ptr[-1] + n)
        return torch.tensor(ptr, dtype=dtype)

    def _min_lengths(self, name: str, batch: int) -> list[int] | None:
        # Causal prefill needs qo_len <= kv_len per request: query segments are drawn first
        # (see _input_order) and each KV segment gets at least the pages its queries need.
        if "qo" in name.lower() or name.lower().startswith("q"):
            return None
        qo = next((v for k, v in self.lengths.items() if "qo" in k.lower()), None)
        if qo is None or len(qo) != batch:
            return None
        return [math.ceil(n / self.page_size) for n in qo]

    def _last_page_len(
        self, shape: tuple[int, ...], dtype: torch.dtype, done: dict[str, Any]
    ) -> torch.Tensor:
        out = torch.randint(1, self.page_size + 1, shape, generator=self.gen, dtype=torch.int64)
        # For causal prefill, a request's KV tokens must cover its queries: fill last pages.
        qo = next((v for k, v in self.lengths.items() if "qo" in k.lower()), None)
        kv = next((v for k, v in self.lengths.items() if "kv" in k.lower()), None)
        if qo is not None and kv is not None:
            for i, (q, pages) in enumerate(zip(qo, kv, strict=False)):
                if i < out.numel() and pages > 0 and (pages - 1) * self.page_size + int(out[i]) < q:
                    out[i] = self.page_size
        return out.to(dtype)

    def _indices(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        pages = self.axes.get("num_pages", n)
        if pages <= 0:
            if n:
                raise ConstraintError(f"{self.d.name}: {n} page indices but num_pages={pages}")
            return torch.zeros(0, dtype=dtype)
        if n <= pages:  # distinct pages, shuffled: as a real allocator hands them out
            return torch.randperm(pages, generator=self.gen)[:n].to(dtype)
        return torch.randint(0, pages, (n,), generator=self.gen, dtype=torch.int64).to(dtype)

    def _cache_slots(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """A state cache's slots, one per batch row (Mamba's state_batch_indices): distinct,
        drawn from the whole cache (state_cache_size), and one row in eight padded with -1
        (PAD_SLOT_ID: a CUDA-graph batch padded to its captured size), as a serving engine
        hands them out."""
        slots = self.axes["state_cache_size"]
        if n > slots:
            raise ConstraintError(f"{self.d.name}: {n} rows but state_cache_size={slots}")
        out = torch.randperm(slots, generator=self.gen)[:n]
        out[torch.randperm(n, generator=self.gen)[: n // 8]] = -1
        return out.to(dtype)


def _packed_fp8_keys(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A DSA indexer's key cache in deep_gemm's packed layout, int8 [num_pages, page_size, 1,
    D + 4], of random keys: per page, its page_size * D fp8 e4m3 values, then its page_size
    float32 scales (each token's amax / 448). Random bytes would hold NaN fp8 values and
    scales of any magnitude."""
    pages, page_size, _, width = shape
    keys = torch.randn(pages, page_size, width - 4, generator=gen)
    scale = keys.abs().amax(-1).clamp_min(1e-4) / 448.0
    values = (keys / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    packed = torch.cat(
        [values.reshape(pages, -1), scale.contiguous().view(torch.uint8).reshape(pages, -1)], 1
    )
    return packed.view(torch.int8).reshape(shape)


def _scores_input(definition: Definition) -> str | None:
    """A sampling op's `probs` or `logits` input of shape [rows, vocab], if it has one."""
    if definition.op_type not in SAMPLING_OP_TYPES:
        return None
    for name, spec in definition.inputs.items():
        if name.lower() in ("probs", "logits") and spec.shape and len(spec.shape) == 2:
            return name
    return None


def _scalar_default(name: str, spec: TensorSpec, axes: Mapping[str, int]) -> Any:
    if "scale" in name.lower():
        head_dim = axes.get("head_dim", axes.get("head_size"))
        return 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    if spec.dtype.startswith("float") or spec.dtype == "bfloat16":
        return 1.0
    if spec.dtype == "bool":
        return False
    if name.lower().endswith("offset"):  # an origin (a MoE rank's local_expert_offset): rank 0
        return 0
    return 1


def listed_inputs(definition: Definition, workload: Workload) -> Workload:
    """The workload with every input of the definition listed, as FlashInfer-Bench's current
    validate requires: a tensor it leaves out as `{"type": "random"}` (what flashtune draws
    for it either way), a scalar as `{"type": "scalar", "value": ...}` with the value flashtune
    would use (sm_scale: 1/sqrt(head_dim)), so the workload means what it meant."""
    missing = [name for name in definition.inputs if name not in workload.inputs]
    if not missing:
        return workload
    axes = {**definition.const_axes, **workload.axes}
    listed: dict[str, Any] = dict(workload.inputs)
    for name in missing:
        spec = definition.inputs[name]
        if spec.shape is None:
            listed[name] = ScalarInput(type="scalar", value=_scalar_default(name, spec, axes))
        else:
            listed[name] = RandomInput(type="random")
    # In the definition's order, as FlashInfer-Bench writes them.
    ordered = {n: listed[n] for n in definition.inputs}
    ordered.update({n: v for n, v in listed.items() if n not in ordered})
    return workload.model_copy(update={"inputs": ordered})


def _input_order(definition: Definition) -> list[str]:
    # Query index tensors before KV ones, so each KV segment can be drawn long enough to
    # cover its queries (causal prefill needs qo_len <= kv_len).
    names = list(definition.inputs)
    return sorted(
        names,
        key=lambda n: (0 if "qo" in n.lower() else 1 if "kv" in n.lower() else 2, names.index(n)),
    )


def synthesize_inputs(
    definition: Definition,
    workload: Workload,
    *,
    device: torch.device | str = "cpu",
    seed: int = 0,
    blob_root: Path | Any = None,
    fixed: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Inputs for `definition` at `workload`, keyed by input name, in definition order.

    blob_root: a Dataset or a folder that the workload's safetensors paths are relative to.
    fixed: inputs taken as they are, not drawn (the evaluator's fixed weights); the others
    are drawn from a generator stream that skips them.
    """
    axes = resolve_axes(definition, workload)
    gen = torch.Generator().manual_seed(seed)
    synth = _Synth(definition, axes, gen, torch.device(device))
    values: dict[str, Any] = {}
    for name in _input_order(definition):
        spec = definition.inputs[name]
        if fixed is not None and name in fixed:
            values[name] = fixed[name]
            continue
        given = workload.inputs.get(name)
        if spec.shape is None:
            values[name] = (
                given.value if isinstance(given, ScalarInput) else _scalar_default(name, spec, axes)
            )
            continue
        if isinstance(given, ScalarInput):
            values[name] = torch.full(
                _shape(spec, axes), given.value, dtype=torch_dtype(spec.dtype)
            )
            continue
        loaded = (
            _load_blob(given, blob_root, name)
            if given is not None and given.type == "safetensors"
            else None
        )
        if loaded is None:
            tensor = synth.tensor(name, spec, values)
        else:
            path, tensor = loaded
            _check_blob_tensor(definition, workload, name, spec, axes, path, tensor)
        values[name] = tensor
    ordered = {name: values[name] for name in definition.inputs}
    check_constraints(definition, axes, ordered)
    dev = torch.device(device)
    return {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in ordered.items()}


def _check_blob_tensor(
    definition: Definition,
    workload: Workload,
    name: str,
    spec: TensorSpec,
    axes: Mapping[str, int],
    path: Path,
    tensor: torch.Tensor,
) -> None:
    """A blob must hold exactly what the workload's axes say: 3 rows under batch_size=1
    would otherwise be benchmarked (and labelled) as batch 1."""
    where = f"{definition.name} workload {workload.uuid}: blob {path}, input {name!r}"
    expected = _shape(spec, axes)
    actual = tuple(tensor.shape)
    axis_names = spec.shape or []
    if len(actual) != len(expected):
        raise InputError(
            f"{where}: {len(actual)} dimensions {list(actual)}, expected {len(expected)} "
            f"(axes {axis_names} = {list(expected)})"
        )
    for axis, want, got in zip(axis_names, expected, actual, strict=True):
        if want != got:
            raise InputError(
                f"{where}: axis {axis!r} (dimension {axis_names.index(axis)}) has size {got}, "
                f"expected {want} (shape {list(actual)}, expected {list(expected)})"
            )
    if tensor.dtype != torch_dtype(spec.dtype):
        raise InputError(f"{where}: dtype {tensor.dtype}, expected {spec.dtype}")


def _load_blob(spec: Any, blob_root: Any, name: str) -> tuple[Path, torch.Tensor] | None:
    if blob_root is None:
        return None
    if hasattr(blob_root, "blob_path"):
        path = blob_root.blob_path(spec.path)
    else:
        root = Path(blob_root).resolve()
        path = (root / spec.path).resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"blob path {spec.path!r} escapes the dataset root {root}")
    if not path.exists():
        return None  # missing blob: synthesize valid data instead
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:  # a garbage header, unreadable
        raise InputError(
            f"{path}: not a readable safetensors file for input {name!r}: {exc}"
        ) from None
    if spec.tensor_key not in tensors:
        raise InputError(
            f"{path}: no tensor {spec.tensor_key!r} for input {name!r} (has {sorted(tensors)})"
        )
    return path, tensors[spec.tensor_key]


def small_workload(definition: Definition, size: int = 4) -> Workload:
    """A small workload that satisfies the definition's constraints on axes: every var axis
    set to `size` (page/pool axes a little larger), then each `axis == <expression of axes>`
    applied, and an inequality that fails (`topk <= max_num_pages * page_size`) repaired by
    growing or shrinking a var axis it names. Constraints on inputs (`total ==
    indptr[-1].item()`) hold by synthesis (synthesize_inputs)."""
    axes: dict[str, int] = {}
    for name in definition.var_axes:
        lname = name.lower()
        if "pages" in lname or "max_seq" in lname:
            axes[name] = size * 4
        elif "heads" in lname:
            axes[name] = 2
        elif lname.startswith("total_kv") or "indices" in lname:
            axes[name] = size * 2
        elif lname.startswith("len_") and ("indptr" in lname or "cu_seqlens" in lname):
            # offsets of `size` segments: one entry more (a length of 1 would hold none)
            axes[name] = size + 1
        else:
            axes[name] = size
    # GQA: the query head count must be a multiple of the KV head count.
    if "num_qo_heads" in axes and "num_kv_heads" in axes:
        axes["num_qo_heads"] = axes["num_kv_heads"] * 2
    # An indptr has one entry per request and one more (CSR). Four FlashInfer-Trace paged
    # prefill definitions (kv_last_page_len of batch_size entries) do not say so; their
    # workloads do, and so must a synthesized one, or the index inputs disagree.
    if "len_indptr" in axes and "batch_size" in axes:
        if not any("len_indptr" in c and "batch_size" in c for c in definition.constraints):
            axes["len_indptr"] = axes["batch_size"] + 1
    _satisfy_axis_constraints(definition, axes)
    return Workload(uuid="small", axes=axes, inputs={})


def _names_in(expr: str) -> set[str]:
    tree = ast.parse(expr, mode="eval")
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(CONSTRAINT_FUNCTIONS)


def _axis_equalities(definition: Definition, axes: Mapping[str, int]) -> list[tuple[str, str]]:
    """(axis, expression) for each `axis == <expression of axes>` (either side)."""
    known = set(axes) | set(definition.const_axes)
    found = []
    for expr in definition.constraints:
        tree = ast.parse(expr, mode="eval").body
        if not (
            isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Eq)
        ):
            continue
        left, right = tree.left, tree.comparators[0]
        for target, source in ((left, right), (right, left)):
            if isinstance(target, ast.Name) and target.id in axes:
                used = _names_in(ast.unparse(source))
                if used and used <= known:
                    found.append((target.id, ast.unparse(source)))
                    break
    return found


def _holds(expr: str, values: Mapping[str, int]) -> bool:
    try:
        return holds(evaluate_constraint(expr, values))
    except Exception:  # noqa: BLE001 - a division by zero, say: not satisfied
        return False


# How far a repair may move one axis: factors of 2 up (a pool large enough for topk) or down.
_REPAIR_STEPS = 16


def _satisfy_axis_constraints(definition: Definition, axes: dict[str, int]) -> None:
    """Adjust `axes` (var axes only) until every constraint naming only axes holds, where a
    few doublings or halvings of one axis get there; what cannot be satisfied is left for
    check_constraints to report."""
    const = definition.const_axes
    equalities = _axis_equalities(definition, axes)
    derived = {target for target, _ in equalities}
    on_axes = [e for e in definition.constraints if _names_in(e) <= set(axes) | set(const)]

    def failing() -> list[str]:
        values = {**const, **axes}
        return [e for e in on_axes if not _holds(e, values)]

    def apply_equalities() -> None:
        for target, source in equalities:
            try:
                axes[target] = int(evaluate_constraint(source, {**const, **axes}))
            except Exception:  # noqa: BLE001 - reported by check_constraints later
                continue

    apply_equalities()
    for _ in range(len(on_axes) + 1):
        broken = failing()
        if not broken:
            return
        expr = broken[0]
        for name in sorted(_names_in(expr) & (set(axes) - derived)):
            start = axes[name]
            candidates = [start * 2**k for k in range(1, _REPAIR_STEPS + 1) if start] or [1]
            candidates += [start // 2**k for k in range(1, _REPAIR_STEPS + 1) if start // 2**k]
            for value in candidates:
                axes[name] = value
                apply_equalities()
                if _holds(expr, {**const, **axes}) and len(failing()) < len(broken):
                    break
            else:
                axes[name] = start
                apply_equalities()
                continue
            break

"""Regenerate the bundled dataset (src/flashtune/dataset/): definitions, workloads, solutions.

    python scripts/build_bundled_dataset.py

Definitions are the op schemas' own (flashtune.schema): the ops' example calls at the per-GPU
shapes of Llama-3.1-8B, Llama-3.1-70B (tensor parallel 8) and Qwen3-8B
(flashtune.model_shapes), for the ops listed in BUNDLED_OPS; each reference is the source of
the op's reference function. Nothing about an op's contract is written here. Workloads sweep
realistic var-axis values (batch 1..256, sequence/KV lengths 128..32k); attention page
tables are stored as small safetensors blobs with per-request lengths drawn around the
nominal length (never an empty request); block-sparse attention's BSR patterns likewise, at
densities 0.2..1.0 (see BLOCK_SPARSE_TOKENS). Solutions: flashtune's kernels, torch eager
baselines, FlashInfer baselines (for decode, `flashinfer` runs the backend FlashInfer's own
rule picks and the other backend is listed under its own name), named `<kind>@<definition>`.
Each runs an entry point of flashtune.bench.entry_points (the FlashInfer attention adapters
and both block-sparse wrappers plan once in a setup phase outside the timed region) through
a small source file binding `run` to it, so FlashInfer-Bench loads them too. Each
description says how it is run.

    python scripts/build_bundled_dataset.py --root /tmp/ds   # elsewhere, e.g. to compare
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

from flashtune.data import Dataset, Definition, Solution, Workload
from flashtune.model_shapes import ModelConfig
from flashtune.ops import load_all
from flashtune.ops.attention.sparse import bsr_pattern
from flashtune.schema.dump import Example, model_definitions, model_examples

ROOT = Path(__file__).resolve().parents[1] / "src" / "flashtune" / "dataset"
MODEL_NAMES = ("llama-3.1-8b", "llama-3.1-70b-tp8", "qwen3-8b")
# The ops benchmarked by default (schema name prefixes), and the const axes the bundle fixes
# where an op's examples cover several (the serving default page size; the corpus also has 1).
BUNDLED_OPS = (
    "rmsnorm",
    "fused_add_rmsnorm",
    "silu_and_mul",
    "gemm",
    "rope_with_cos_sin_cache_neox_style",
    "gqa_paged_decode",
    "gqa_paged_prefill_causal",
    "gqa_ragged_prefill_causal",
    "top_k_sampling_from_probs",
    "top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_probs",
    "block_sparse_attention",
)
# Sampling at Llama-3's vocabulary only: the corpus's first size, and one row costs the CPU
# run's sort-based baseline the most of any op.
BUNDLED_CONSTS = {"page_size": 16, "vocab_size": 128256}
# Per op, const axes fixed on top of BUNDLED_CONSTS: block-sparse attention at the heads of
# Llama-3.1-8B and Qwen3-8B only (its index blobs are the bundle's largest; see below).
BUNDLED_OP_CONSTS = {"block_sparse_attention": {"num_qo_heads": 32, "num_kv_heads": 8}}
PAGE_SIZE = BUNDLED_CONSTS["page_size"]
TOKENS = [1, 16, 64, 256, 2048]  # rows of norm / activation / rope, M of GEMM
DECODE = [(1, 128), (1, 32768), (16, 4096), (64, 2048), (256, 1024)]  # (batch, kv_len)
PREFILL = [(1, 128), (4, 256), (1, 2048), (8, 1024), (1, 8192)]  # (batch, qo_len = kv_len)
ROPE = [(1, 32, 8), (64, 32, 8), (256, 32, 8), (2048, 32, 8), (256, 8, 1)]  # tokens, Hq, Hk
ROPE_MAX_SEQ = 8192
SAMPLING_BATCH = [1, 4, 16, 64, 256]  # rows sampled a step (the decode batch)
# Block-sparse attention (not causal, M = N tokens), per block shape (R, C): the densities
# of issue 18 (1.0: the format's own cost against the dense prefill) at the long M; its
# indices hold density * (M / R) * (N / C) int32s, so smaller blocks get fewer tokens: 8192
# at 64 x 64 (0.2 MB of blobs for the four densities), 4096 at 16 x 16 (0.7 MB), 2048 at
# 1 x 16 (2.9 MB). First, two short prefills (densities 0.2 and 0.9) at the short M: a CPU
# run takes the two smallest workloads of a definition, where the torch baseline costs the
# dense attention and the reference loops over block rows (128 of them at 1 x 16).
BLOCK_SPARSE_DENSITY = [0.2, 0.7, 0.9, 1.0]
BLOCK_SPARSE_SHORT_DENSITY = [0.2, 0.9]
BLOCK_SPARSE_TOKENS = {
    (64, 64): (512, 8192),
    (16, 16): (256, 4096),
    (4, 4): (128, 2048),
    (1, 16): (128, 2048),
}

_NS = uuid.UUID("6b3c1b9e-5a55-4d7c-8f0e-1f2a3b4c5d6e")


def _uuid(*parts: object) -> str:
    # Stable ids: regenerating the dataset keeps workload uuids (and so --resume) intact.
    return str(uuid.uuid5(_NS, "/".join(map(str, parts))))


# --------------------------------------------------------------------------- definitions


def _bundled(example: Example) -> bool:
    op, args, kwargs = example
    call = op.bind(*args, **kwargs)
    prefix = call.schema.name_prefix
    consts = {**BUNDLED_CONSTS, **BUNDLED_OP_CONSTS.get(prefix, {})}
    fixed = all(call.axes.get(axis, value) == value for axis, value in consts.items())
    return prefix in BUNDLED_OPS and fixed


def _bundled_examples(model: ModelConfig) -> list[Example]:
    return [example for example in model_examples(model) if _bundled(example)]


def definitions() -> list[Definition]:
    """The bundled ops' Definitions, from their schemas, tagged with the models they serve."""
    load_all()  # the op modules register their schemas and example calls
    examples: list[Callable[[ModelConfig], list[Example]]] = [_bundled_examples]
    generated = model_definitions(list(MODEL_NAMES), examples)
    missing = set(BUNDLED_OPS) - {
        op for op in BUNDLED_OPS for name in generated if name.startswith(f"{op}_")
    }
    if missing:
        raise SystemExit(f"no example call of {sorted(missing)} in the op modules")
    return list(generated.values())


# --------------------------------------------------------------------------- workloads


def _lengths(batch: int, nominal: int, gen: torch.Generator) -> list[int]:
    """Per-request lengths around `nominal` (0.5x..1.5x), never empty; exact for batch 1."""
    if batch == 1:
        return [nominal]
    lo, hi = max(1, nominal // 2), max(1, nominal + nominal // 2)
    return torch.randint(lo, hi + 1, (batch,), generator=gen).tolist()


def _indptr(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _blob(ds_root: Path, definition: Definition, wid: str, tensors: dict[str, torch.Tensor]):
    from safetensors.torch import save_file

    rel = f"blob/workloads/{definition.op_type}/{definition.name}/{wid}.safetensors"
    path = ds_root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return {k: {"type": "safetensors", "path": rel, "tensor_key": k} for k in tensors}


def _solve(definition: Definition, axes: dict[str, int]) -> dict[str, int]:
    """Fill var axes fixed by `axis == <expression of other axes>` constraints."""
    import ast

    known = {**definition.const_axes, **axes}
    for expr in definition.constraints:
        tree = ast.parse(expr, mode="eval").body
        if isinstance(tree, ast.Compare) and isinstance(tree.left, ast.Name):
            target = tree.left.id
            if target in definition.var_axes and target not in axes:
                code = compile(ast.Expression(tree.comparators[0]), "<axis>", "eval")
                axes[target] = int(eval(code, {"__builtins__": {}}, known))  # noqa: S307
                known[target] = axes[target]
    return axes


def workloads_for(definition: Definition, root: Path) -> list[Workload]:
    name, gen = definition.name, torch.Generator().manual_seed(0)
    out = []
    if definition.op_type in ("rmsnorm", "activation", "gemm"):
        axis = definition.var_axes[0]
        for n in TOKENS:
            axes = _solve(definition, {axis: n})
            out.append(Workload(uuid=_uuid(name, n), axes=axes, inputs={}))
    elif definition.op_type == "rope":
        for t, hq, hk in ROPE:
            axes = {
                "num_tokens": t,
                "num_qo_heads": hq,
                "num_kv_heads": hk,
                "max_seq_len": ROPE_MAX_SEQ,
            }
            out.append(Workload(uuid=_uuid(name, t, hq, hk), axes=axes, inputs={}))
    elif name.startswith("gqa_paged_decode"):
        for batch, kv in DECODE:
            wid = _uuid(name, batch, kv)
            lens = _lengths(batch, kv, gen)
            pages = [-(-n // PAGE_SIZE) for n in lens]
            last = [n - (p - 1) * PAGE_SIZE for n, p in zip(lens, pages, strict=False)]
            inputs = _blob(
                root,
                definition,
                wid,
                {
                    "kv_indptr": _indptr(pages),
                    "kv_last_page_len": torch.tensor(last, dtype=torch.int32),
                },
            )
            axes = {
                "batch_size": batch,
                "len_indptr": batch + 1,
                "num_kv_indices": sum(pages),
                "num_pages": sum(pages) + 64,
            }
            out.append(Workload(uuid=wid, axes=axes, inputs=inputs))
    elif name.startswith("gqa_paged_prefill"):
        for batch, n in PREFILL:
            wid = _uuid(name, batch, n)
            lens = _lengths(batch, n, gen)
            pages = [-(-x // PAGE_SIZE) for x in lens]
            last = [x - (p - 1) * PAGE_SIZE for x, p in zip(lens, pages, strict=False)]
            inputs = _blob(
                root,
                definition,
                wid,
                {
                    "qo_indptr": _indptr(lens),
                    "kv_indptr": _indptr(pages),
                    "kv_last_page_len": torch.tensor(last, dtype=torch.int32),
                },
            )
            axes = {
                "total_q": sum(lens),
                "batch_size": batch,
                "len_indptr": batch + 1,
                "num_kv_indices": sum(pages),
                "num_pages": sum(pages) + 64,
            }
            out.append(Workload(uuid=wid, axes=axes, inputs=inputs))
    elif name.startswith("gqa_ragged_prefill"):
        for batch, n in PREFILL:
            wid = _uuid(name, batch, n)
            lens = _lengths(batch, n, gen)
            inputs = _blob(
                root,
                definition,
                wid,
                {
                    "qo_indptr": _indptr(lens),
                    "kv_indptr": _indptr(lens),
                },
            )
            axes = {"total_q": sum(lens), "total_kv": sum(lens), "len_indptr": batch + 1}
            out.append(Workload(uuid=wid, axes=axes, inputs=inputs))
    elif definition.op_type == "sampling":
        for n in SAMPLING_BATCH:
            out.append(Workload(uuid=_uuid(name, n), axes={"batch_size": n}, inputs={}))
    elif definition.op_type == "block_sparse":
        rows, cols = definition.const_axes["block_rows"], definition.const_axes["block_cols"]
        short, long = BLOCK_SPARSE_TOKENS[rows, cols]
        sizes = [(short, d) for d in BLOCK_SPARSE_SHORT_DENSITY]
        sizes += [(long, d) for d in BLOCK_SPARSE_DENSITY]
        for n, density in sizes:
            wid = _uuid(name, n, density)
            indptr, indices = bsr_pattern(n // rows, n // cols, rows, cols, density, gen)
            inputs = _blob(root, definition, wid, {"indptr": indptr, "indices": indices})
            axes = {
                "num_rows": n,
                "len_indptr": n // rows + 1,
                "num_indices": indices.numel(),
                "num_pages": n // cols,
            }
            out.append(Workload(uuid=wid, axes=axes, inputs=inputs))
    else:
        raise ValueError(f"no workloads for {name}")
    return out


# --------------------------------------------------------------------------- solutions

_FAMILY = {  # definition name prefix -> entry point suffix
    "rmsnorm_": "rmsnorm",
    "fused_add_rmsnorm_": "fused_add_rmsnorm",
    "silu_and_mul_i": "silu_and_mul",
    "gemm_": "gemm",
    "rope_": "rope",
    "gqa_paged_decode_": "gqa_paged_decode",
    "gqa_paged_prefill_": "gqa_paged_prefill",
    "gqa_ragged_prefill_": "gqa_ragged_prefill",
    "top_k_sampling_from_probs_": "top_k_sampling",
    "top_p_sampling_from_probs_": "top_p_sampling",
    "top_k_top_p_sampling_from_probs_": "top_k_top_p_sampling",
    "block_sparse_attention_": "block_sparse_attention",
}
_NO_FLASHINFER = {"gemm"}  # FlashInfer 0.2 has no plain bf16 GEMM

# How each solution is run, said plainly: the harness times `entry` itself unless the entry
# has a setup phase (`entry.setup`, run once per input set outside the timed region).
_DISPATCH = (
    "the autotuner's dispatch picks the tactic per shape bucket from a loaded cache file or "
    "bundled configs matching this GPU, else the default tactic (it profiles only under "
    "`flashtune run --autotune`)"
)
_NO_SETUP = "No setup phase: each timed call is the whole call."
_PLAN_FREE = (
    "the work is found on the device from the index inputs, so there is no plan and no setup "
    "phase: each timed call is the whole call. Its tactic follows from the shapes (the "
    "autotuner is not consulted)."
)
_CLONES = "on clones of hidden_states and residual (the op updates them in place)"


_SAMPLES_INT64 = ", sorting-free, samples cast to the Definition's int64"


def _tuned_api(call: str, note: str = "") -> str:
    return (
        f"flashtune's Triton kernel through its public API ({call}){note}; {_DISPATCH}. {_NO_SETUP}"
    )


_FLASHTUNE = {
    "rmsnorm": _tuned_api("ops.norm.rmsnorm"),
    "fused_add_rmsnorm": _tuned_api(
        "ops.norm.fused_add_rmsnorm", f" {_CLONES}, as FlashInfer's is"
    ),
    "silu_and_mul": _tuned_api("ops.activation.silu_and_mul"),
    "rope": _tuned_api("ops.rope.apply_rope_with_cos_sin_cache"),
    "gemm": "flashtune's public mm (ops.gemm.mm): per M bucket the autotuner's dispatch picks "
    "cuBLAS (through torch) or one of flashtune's Triton GEMMs from a loaded cache file or "
    "bundled configs matching this GPU, else cuBLAS (it profiles only under `flashtune run "
    f"--autotune`), so this is not a Triton-only figure. {_NO_SETUP}",
    "gqa_paged_decode": "flashtune's plan-free Triton paged decode "
    f"(ops.attention.planless.paged_decode): {_PLAN_FREE}",
    "gqa_paged_prefill": "flashtune's plan-free Triton causal paged prefill "
    f"(ops.attention.planless_prefill.paged_prefill): {_PLAN_FREE}",
    "gqa_ragged_prefill": "flashtune's plan-free Triton causal ragged prefill "
    f"(ops.attention.planless_prefill.ragged_prefill): {_PLAN_FREE}",
    "top_k_sampling": _tuned_api("ops.sampling.top_k_sampling_from_probs", _SAMPLES_INT64),
    "top_p_sampling": _tuned_api("ops.sampling.top_p_sampling_from_probs", _SAMPLES_INT64),
    "top_k_top_p_sampling": _tuned_api(
        "ops.sampling.top_k_top_p_sampling_from_probs", _SAMPLES_INT64
    ),
    "block_sparse_attention": "flashtune's BlockSparseAttentionWrapper "
    "(ops.attention.sparse: its Triton paged prefill with a block row as a request and a column "
    "block as a page): plan() runs once per input set in the setup phase, outside the timed "
    "region, as FlashInfer's is; the timed call is run() only (input sets with identical index "
    "tensors share one plan).",
}
_SORTED = "the op's reference in ops.sampling.reference: sort, cumulative sum, inverse CDF. "
_TORCH = {  # baselines other than plain eager code
    "top_k_sampling": "PyTorch eager baseline, sort-based (torch.topk, inverse CDF). ",
    "top_p_sampling": f"PyTorch eager baseline, {_SORTED}",
    "top_k_top_p_sampling": f"PyTorch eager baseline, {_SORTED}",
    "block_sparse_attention": "PyTorch eager baseline, dense masked attention: the blocks "
    "expanded to a mask on the device, every query row against all N keys in fp32 (query "
    "chunks of at most 256 MB of logits), so it costs the dense attention at every density. ",
}
_FLASHINFER_CALL = {
    "rmsnorm": "flashinfer.norm.rmsnorm",
    "fused_add_rmsnorm": f"flashinfer.norm.fused_add_rmsnorm {_CLONES}, as flashtune's is",
    "silu_and_mul": "flashinfer.activation.silu_and_mul",
    "rope": "flashinfer.rope.apply_rope_with_cos_sin_cache",
    "top_k_sampling": "flashinfer.sampling.top_k_sampling_from_probs (samples cast to int64)",
    "top_p_sampling": "flashinfer.sampling.top_p_sampling_from_probs (samples cast to int64)",
    "top_k_top_p_sampling": "flashinfer.sampling.top_k_top_p_sampling_from_probs (its "
    "default order, top_k_first; samples cast to int64)",
}
_PLANNED = (
    "plan() runs once per input set in the setup phase, outside the timed region; the timed "
    "call is run() only (FlashInfer's float workspace: one 128 MB buffer per device, shared; "
    "input sets with identical index tensors share one plan). Runs where the flashinfer "
    "package is installed."
)


def _decode_backend(tensor_cores: bool) -> str:
    if tensor_cores:
        return "tensor cores (use_tensor_cores=True: its prefill kernel)"
    return "CUDA cores (use_tensor_cores=False: its decode kernel)"


def _flashinfer_solutions(definition: Definition, family: str) -> list[tuple[str, str, str]]:
    """FlashInfer's solutions of one definition: (name, entry function, description)."""
    fn = f"flashinfer_{family}"
    if family in _FLASHINFER_CALL:
        desc = f"FlashInfer's {_FLASHINFER_CALL[family]}, called directly. {_NO_SETUP} "
        return [("flashinfer", fn, desc + "Runs where the flashinfer package is installed.")]
    if family == "gqa_paged_prefill":
        desc = "FlashInfer's BatchPrefillWithPagedKVCacheWrapper (causal, backend 'auto')"
        return [("flashinfer", fn, f"{desc}: {_PLANNED}")]
    if family == "gqa_ragged_prefill":
        desc = "FlashInfer's BatchPrefillWithRaggedKVCacheWrapper (causal, backend 'auto')"
        return [("flashinfer", fn, f"{desc}: {_PLANNED}")]
    if family == "block_sparse_attention":
        desc = (
            "FlashInfer's flashinfer.sparse.BlockSparseAttentionWrapper (backend 'auto'; its "
            "tensor-core prefill kernels where block_rows x GQA group size >= 4, else its "
            "decode kernels)"
        )
        return [("flashinfer", fn, f"{desc}: {_PLANNED}")]
    # Decode: `flashinfer` follows FlashInfer's own backend rule; the other backend is listed
    # beside it under its own name.
    from flashtune.bench.entry_points import flashinfer_decode_uses_tensor_cores

    hq, hk = definition.const_axes["num_qo_heads"], definition.const_axes["num_kv_heads"]
    tc = flashinfer_decode_uses_tensor_cores(
        hq, hk, getattr(torch, definition.inputs["k_cache"].dtype)
    )
    wrapper = "FlashInfer's BatchDecodeWithPagedKVCacheWrapper"
    rule = f"FlashInfer's rule picks for GQA group size {hq // hk} (tensor cores from 4, or fp8 KV)"
    other = "cuda_cores" if tc else "tensor_cores"
    return [
        ("flashinfer", fn, f"{wrapper} on {_decode_backend(tc)}, the backend {rule}: {_PLANNED}"),
        (
            f"flashinfer_{other}",
            f"{fn}_{other}",
            f"{wrapper} forced to {_decode_backend(not tc)}, not the backend {rule}: {_PLANNED}",
        ),
    ]


# FlashInfer-Bench's form: sources carrying the code, a "file.py::function" entry point, one of
# its languages, target hardware, names unique across definitions. The code is a small file
# binding `run` to the entry point in flashtune.bench.entry_points (the object itself, so an
# entry's setup phase comes with it); flashtune builds it like any source solution.
ENTRY_FILE = "main.py"
ENTRY_MODULE = "flashtune.bench.entry_points"


def solution_name(kind: str, definition: Definition) -> str:
    """`<kind>@<definition>`: FlashInfer-Bench wants solution names unique in a dataset, and
    the kind stays first, so `flashtune@*` / `torch*` / `flashinfer@*` select by kind."""
    return f"{kind}@{definition.name}"


def _entry_source(function: str) -> str:
    return (
        f"# Runs {ENTRY_MODULE}.{function} (the flashtune package must be installed).\n"
        "# Value-returning: run(*inputs) returns the outputs.\n"
        f"from {ENTRY_MODULE} import {function} as run\n"
        "\n"
        '__all__ = ["run"]\n'
    )


def _solution(
    definition: Definition,
    kind: str,
    author: str,
    function: str,
    description: str,
    language: str,
    hardware: list[str],
    dependencies: tuple[str, ...] = (),
) -> Solution:
    name = solution_name(kind, definition)
    spec: dict[str, object] = {
        "language": language,
        "target_hardware": hardware,
        "entry_point": f"{ENTRY_FILE}::run",
    }
    if dependencies:
        spec["dependencies"] = list(dependencies)
    spec["destination_passing_style"] = False
    return Solution.model_validate(
        {
            "name": name,
            "definition": definition.name,
            "author": author,
            "description": description,
            "spec": spec,
            "sources": [{"path": ENTRY_FILE, "content": _entry_source(function)}],
        }
    )


def solutions_for(definition: Definition) -> list[Solution]:
    family = next(v for k, v in _FAMILY.items() if definition.name.startswith(k))
    sols = [
        _solution(
            definition,
            "flashtune",
            "flashtune",
            f"flashtune_{family}",
            _FLASHTUNE[family],
            language="triton",
            hardware=["cuda"],
        ),
        _solution(
            definition,
            "torch",
            "torch",
            f"torch_{family}",
            _TORCH.get(family, "PyTorch eager baseline. ") + _NO_SETUP,
            language="python",
            hardware=["cpu", "cuda"],
        ),
    ]
    if family not in _NO_FLASHINFER:
        for kind, function, description in _flashinfer_solutions(definition, family):
            # Python calling FlashInfer's own (CUDA) kernels: FlashInfer-Bench's "cuda" means
            # CUDA sources it compiles.
            sols.append(
                _solution(
                    definition,
                    kind,
                    "flashinfer",
                    function,
                    description,
                    language="python",
                    hardware=["cuda"],
                    dependencies=("flashinfer",),
                )
            )
    return sols


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help=f"dataset folder (default {ROOT})")
    root = parser.parse_args(argv).root
    for sub in ("definitions", "solutions", "workloads", "blob"):
        shutil.rmtree(root / sub, ignore_errors=True)
    ds = Dataset(root)
    for definition in definitions():
        ds.add_definition(definition)
        ds.add_workloads(definition, workloads_for(definition, root))
        for sol in solutions_for(definition):
            ds.add_solution(sol)
    errors = Dataset(root).load_all()
    for e in errors:
        print(e)
    counts = Dataset(root).counts()
    print(f"{root}: {counts}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

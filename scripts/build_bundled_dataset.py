"""Regenerate the bundled dataset (src/flashtune/dataset/): definitions, workloads, solutions.

    python scripts/build_bundled_dataset.py

Definitions cover the ops flashtune ships at the per-GPU shapes of Llama-3.1-8B,
Llama-3.1-70B (tensor parallel 8) and Qwen3-8B (flashtune.models), in the FlashInfer Trace
format. When an op has a schema (flashtune.schema), its Definition comes from
`op.definition(...)` on meta tensors; otherwise it is written here by hand, with a
self-contained reference. Workloads sweep realistic var-axis values (batch 1..256,
sequence/KV lengths 128..32k); attention page tables are stored as small safetensors blobs
with per-request lengths drawn around the nominal length (never an empty request).
Solutions: flashtune's kernels, torch eager baselines, FlashInfer baselines (for decode,
`flashinfer` runs the backend FlashInfer's own rule picks and the other backend is listed
under its own name); all importable entry points in flashtune.dataset.entry_points, whose
FlashInfer attention adapters plan once in a setup phase outside the timed region. Each
description says how its solution is run.

    python scripts/build_bundled_dataset.py --root /tmp/ds   # elsewhere, e.g. to compare
"""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path

import torch

from flashtune.data import Dataset, Definition, Solution, Workload
from flashtune.models import MODELS

ROOT = Path(__file__).resolve().parents[1] / "src" / "flashtune" / "dataset"
MODEL_NAMES = ("llama-3.1-8b", "llama-3.1-70b-tp8", "qwen3-8b")
PAGE_SIZE = 16
EPS = 1e-5
TOKENS = [1, 16, 64, 256, 2048]  # rows of norm / activation / rope, M of GEMM
DECODE = [(1, 128), (1, 32768), (16, 4096), (64, 2048), (256, 1024)]  # (batch, kv_len)
PREFILL = [(1, 128), (4, 256), (1, 2048), (8, 1024), (1, 8192)]  # (batch, qo_len = kv_len)
ROPE = [(1, 32, 8), (64, 32, 8), (256, 32, 8), (2048, 32, 8), (256, 8, 1)]  # tokens, Hq, Hk
ROPE_MAX_SEQ = 8192

_NS = uuid.UUID("6b3c1b9e-5a55-4d7c-8f0e-1f2a3b4c5d6e")


def _uuid(*parts: object) -> str:
    # Stable ids: regenerating the dataset keeps workload uuids (and so --resume) intact.
    return str(uuid.uuid5(_NS, "/".join(map(str, parts))))


def _models(pred) -> list[str]:
    return [f"model:{m}" for m in MODEL_NAMES if pred(MODELS[m])]


# --------------------------------------------------------------------------- references

RMSNORM_REF = """import torch


@torch.no_grad()
def run(hidden_states, weight):
    EPS = {eps}
    x = hidden_states.to(torch.float32)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return ((x * inv_rms) * weight.to(torch.float32)).to(hidden_states.dtype)
"""

FUSED_ADD_RMSNORM_REF = """import torch


@torch.no_grad()
def run(hidden_states, residual, weight):
    EPS = {eps}
    x = hidden_states.to(torch.float32) + residual.to(torch.float32)
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return ((x * inv_rms) * weight.to(torch.float32)).to(hidden_states.dtype)
"""

SILU_AND_MUL_REF = """import torch


@torch.no_grad()
def run(input):
    d = input.shape[-1] // 2
    x = input.to(torch.float32)
    return (torch.nn.functional.silu(x[..., :d]) * x[..., d:]).to(input.dtype)
"""

GEMM_REF = """import torch


@torch.no_grad()
def run(A, B):
    # bf16 inputs, fp32 accumulation inside the matmul (cuBLAS and CPU alike), bf16 result.
    return torch.matmul(A, B.T)
"""

ROPE_REF = """import torch


@torch.no_grad()
def run(q, k, cos_sin_cache, positions):
    rotary_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache[positions.to(torch.long)].chunk(2, dim=-1)  # [T, rd / 2]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rotate(x):
        xf = x.to(torch.float32)
        x1, x2 = xf[..., : rotary_dim // 2], xf[..., rotary_dim // 2 : rotary_dim]
        rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return torch.cat((rot, xf[..., rotary_dim:]), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)
"""

_ATTEND = '''import math

import torch


def attend(q, k, v, sm_scale, causal):
    """q [Lq, Hq, D], k/v [Lk, Hk, D] -> out [Lq, Hq, D] (fp32), lse2 [Lq, Hq]. Causal:
    query i sees keys j <= i + (Lk - Lq). Chunked over queries to bound memory."""
    lq, hq, d = q.shape
    lk, hk, _ = k.shape
    group = hq // hk
    out = torch.zeros((lq, hq, d), dtype=torch.float32, device=q.device)
    lse = torch.full((lq, hq), -float("inf"), dtype=torch.float32, device=q.device)
    if lk == 0:
        return out, lse
    kf = k.to(torch.float32).repeat_interleave(group, dim=1)
    vf = v.to(torch.float32).repeat_interleave(group, dim=1)
    kv_pos = torch.arange(lk, device=q.device)
    for s in range(0, lq, 512):
        e = min(s + 512, lq)
        logits = torch.einsum("qhd,khd->hqk", q[s:e].to(torch.float32), kf) * sm_scale
        if causal:
            q_pos = torch.arange(s, e, device=q.device)[:, None] + (lk - lq)
            logits = logits.masked_fill((kv_pos[None, :] > q_pos)[None], float("-inf"))
        lse[s:e] = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).T
        out[s:e] = torch.einsum("hqk,khd->qhd", torch.softmax(logits, dim=-1), vf)
    return out, lse


def paged_tokens(cache, kv_indptr, kv_indices, kv_last_page_len, b):
    start, end = int(kv_indptr[b]), int(kv_indptr[b + 1])
    if end == start:
        return cache[:0, 0]
    pages = kv_indices[start:end].to(torch.long)
    n = (end - start - 1) * cache.shape[1] + int(kv_last_page_len[b])
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]
'''

DECODE_REF = (
    _ATTEND
    + """

@torch.no_grad()
def run(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    assert q.shape[1:] == ({hq}, {d}) and k_cache.shape[1:] == ({ps}, {hk}, {d})
    output = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        k = paged_tokens(k_cache, kv_indptr, kv_indices, kv_last_page_len, b)
        v = paged_tokens(v_cache, kv_indptr, kv_indices, kv_last_page_len, b)
        o, s = attend(q[b : b + 1], k, v, sm_scale, causal=False)
        output[b], lse[b] = o[0].to(q.dtype), s[0]
    return output, lse
"""
)

PREFILL_PAGED_REF = (
    _ATTEND
    + """

@torch.no_grad()
def run(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
    assert q.shape[1:] == ({hq}, {d}) and k_cache.shape[1:] == ({ps}, {hk}, {d})
    output = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], -float("inf"), dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k = paged_tokens(k_cache, kv_indptr, kv_indices, kv_last_page_len, b)
        v = paged_tokens(v_cache, kv_indptr, kv_indices, kv_last_page_len, b)
        o, s = attend(q[qs:qe], k, v, sm_scale, causal=True)
        output[qs:qe], lse[qs:qe] = o.to(q.dtype), s
    return output, lse
"""
)

PREFILL_RAGGED_REF = (
    _ATTEND
    + """

@torch.no_grad()
def run(q, k, v, qo_indptr, kv_indptr, sm_scale):
    assert q.shape[1:] == ({hq}, {d}) and k.shape[1:] == ({hk}, {d})
    output = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], -float("inf"), dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.shape[0] - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        ks, ke = int(kv_indptr[b]), int(kv_indptr[b + 1])
        o, s = attend(q[qs:qe], k[ks:ke], v[ks:ke], sm_scale, causal=True)
        output[qs:qe], lse[qs:qe] = o.to(q.dtype), s
    return output, lse
"""
)


def _t(shape, dtype="bfloat16", description=None):
    spec = {"shape": shape, "dtype": dtype}
    if description:
        spec["description"] = description
    return spec


def _var(description):
    return {"type": "var", "description": description}


def _const(value, description=None):
    spec = {"type": "const", "value": value}
    if description:
        spec["description"] = description
    return spec


# --------------------------------------------------------------------------- definitions


def norm_definitions() -> list[Definition]:
    out = []
    for hidden in sorted({MODELS[m].hidden_size for m in MODEL_NAMES}):
        models = _models(lambda c, h=hidden: c.hidden_size == h)
        axes = {"batch_size": _var("rows (tokens)"), "hidden_size": _const(hidden)}
        out.append(Definition.model_validate({
            "name": f"rmsnorm_h{hidden}", "op_type": "rmsnorm",
            "description": f"RMSNorm over hidden_size={hidden}, eps={EPS}.",
            "tags": [*models, "fi_api:flashinfer.norm.rmsnorm"],
            "axes": axes,
            "inputs": {"hidden_states": _t(["batch_size", "hidden_size"]),
                       "weight": _t(["hidden_size"])},
            "outputs": {"output": _t(["batch_size", "hidden_size"])},
            "reference": RMSNORM_REF.format(eps=EPS),
        }))  # fmt: skip
        out.append(Definition.model_validate({
            "name": f"fused_add_rmsnorm_h{hidden}", "op_type": "rmsnorm",
            "description": f"RMSNorm of hidden_states + residual, hidden_size={hidden}, eps={EPS}.",
            "tags": [*models, "fused", "fi_api:flashinfer.norm.fused_add_rmsnorm"],
            "axes": axes,
            "inputs": {"hidden_states": _t(["batch_size", "hidden_size"]),
                       "residual": _t(["batch_size", "hidden_size"]),
                       "weight": _t(["hidden_size"])},
            "outputs": {"output": _t(["batch_size", "hidden_size"])},
            "reference": FUSED_ADD_RMSNORM_REF.format(eps=EPS),
        }))  # fmt: skip
    return out


def activation_definitions() -> list[Definition]:
    out = []
    for inter in sorted({MODELS[m].intermediate_size for m in MODEL_NAMES}):
        out.append(Definition.model_validate({
            "name": f"silu_and_mul_i{2 * inter}", "op_type": "activation",
            "description": f"SwiGLU gate silu(x[:, :d]) * x[:, d:] with d={inter}.",
            "tags": [*_models(lambda c, i=inter: c.intermediate_size == i),
                     "fi_api:flashinfer.activation.silu_and_mul"],
            "axes": {"num_tokens": _var("rows (tokens)"),
                     "input_size": _const(2 * inter, "2 * d: the gate half then the up half"),
                     "hidden_size": _var("d = input_size / 2, the output width")},
            "constraints": ["hidden_size == input_size // 2"],
            "inputs": {"input": _t(["num_tokens", "input_size"])},
            "outputs": {"output": _t(["num_tokens", "hidden_size"])},
            "reference": SILU_AND_MUL_REF,
        }))  # fmt: skip
    return out


def gemm_definitions() -> list[Definition]:
    nk: dict[tuple[int, int], list[str]] = {}
    for m in MODEL_NAMES:
        for shape in MODELS[m].gemm_nk():
            nk.setdefault(shape, [])
            if f"model:{m}" not in nk[shape]:
                nk[shape].append(f"model:{m}")
    return [
        Definition.model_validate(
            {
                "name": f"gemm_n{n}_k{k}",
                "op_type": "gemm",
                "description": "C = A @ B.T in bfloat16 with fp32 accumulation (a linear layer).",
                "tags": tags,
                "axes": {"M": _var("rows (tokens)"), "N": _const(n), "K": _const(k)},
                "inputs": {"A": _t(["M", "K"]), "B": _t(["N", "K"])},
                "outputs": {"C": _t(["M", "N"])},
                "reference": GEMM_REF,
            }
        )  # fmt: skip
        for (n, k), tags in sorted(nk.items())
    ]


def rope_definitions() -> list[Definition]:
    d = 128
    return [Definition.model_validate({
        "name": f"rope_with_cos_sin_cache_neox_style_d{d}_rd{d}", "op_type": "rope",
        "description": "NeoX-style RoPE from a cos/sin cache (cos first half, sin second), full "
                       "rotary dimension.",
        "tags": [*_models(lambda c: c.head_dim == d),
                 "fi_api:flashinfer.rope.apply_rope_with_cos_sin_cache"],
        "axes": {"num_tokens": _var("tokens"), "num_qo_heads": _var("query heads"),
                 "num_kv_heads": _var("KV heads"), "head_size": _const(d),
                 "rotary_dim": _const(d), "max_seq_len": _var("rows of the cos/sin cache")},
        "inputs": {"q": _t(["num_tokens", "num_qo_heads", "head_size"]),
                   "k": _t(["num_tokens", "num_kv_heads", "head_size"]),
                   "cos_sin_cache": _t(["max_seq_len", "rotary_dim"], "float32"),
                   "positions": _t(["num_tokens"], "int64")},
        "outputs": {"q_out": _t(["num_tokens", "num_qo_heads", "head_size"]),
                    "k_out": _t(["num_tokens", "num_kv_heads", "head_size"])},
        "reference": ROPE_REF,
    })]  # fmt: skip


def _heads() -> list[tuple[int, int, list[str]]]:
    out: dict[tuple[int, int], list[str]] = {}
    for m in MODEL_NAMES:
        c = MODELS[m]
        out.setdefault((c.num_qo_heads, c.num_kv_heads), []).append(f"model:{m}")
    return [(hq, hk, tags) for (hq, hk), tags in sorted(out.items(), reverse=True)]


_HEAD_AXES = lambda hq, hk, d: {  # noqa: E731
    "num_qo_heads": _const(hq), "num_kv_heads": _const(hk), "head_dim": _const(d),
}  # fmt: skip


def attention_definitions() -> list[Definition]:
    d, ps = 128, PAGE_SIZE
    out = []
    for hq, hk, tags in _heads():
        cache = ["num_pages", "page_size", "num_kv_heads", "head_dim"]
        dict(hq=hq, hk=hk, d=d, ps=ps)
        lse_desc = "base-2 log-sum-exp of the attention logits"
        out.append(Definition.model_validate({
            "name": f"gqa_paged_decode_h{hq}_kv{hk}_d{d}_ps{ps}", "op_type": "gqa_paged",
            "description": "Batched GQA decode over a paged KV cache (NHD pages).",
            "tags": ["stage:decode", *tags,
                     "fi_api:flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper"],
            "axes": {"batch_size": _var("requests (one query token each)"),
                     **_HEAD_AXES(hq, hk, d), "page_size": _const(ps),
                     "num_pages": _var("pages in the cache"),
                     "len_indptr": _var("batch_size + 1"),
                     "num_kv_indices": _var("pages used by the batch")},
            "constraints": ["len_indptr == batch_size + 1",
                            "num_kv_indices == kv_indptr[-1].item()"],
            "inputs": {"q": _t(["batch_size", "num_qo_heads", "head_dim"]),
                       "k_cache": _t(cache), "v_cache": _t(cache),
                       "kv_indptr": _t(["len_indptr"], "int32"),
                       "kv_indices": _t(["num_kv_indices"], "int32"),
                       "kv_last_page_len": _t(["batch_size"], "int32"),
                       "sm_scale": _t(None, "float32")},
            "outputs": {"output": _t(["batch_size", "num_qo_heads", "head_dim"]),
                        "lse": _t(["batch_size", "num_qo_heads"], "float32", lse_desc)},
            "reference": DECODE_REF.replace("{hq}", str(hq)).replace("{hk}", str(hk))
                         .replace("{d}", str(d)).replace("{ps}", str(ps)),
        }))  # fmt: skip
        out.append(Definition.model_validate({
            "name": f"gqa_paged_prefill_causal_h{hq}_kv{hk}_d{d}_ps{ps}", "op_type": "gqa_paged",
            "description": "Batched causal GQA prefill over a paged KV cache (NHD pages).",
            "tags": ["stage:prefill", *tags,
                     "fi_api:flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper"],
            "axes": {"total_q": _var("query tokens of the batch"), **_HEAD_AXES(hq, hk, d),
                     "page_size": _const(ps), "num_pages": _var("pages in the cache"),
                     "len_indptr": _var("batch size + 1"), "batch_size": _var("requests"),
                     "num_kv_indices": _var("pages used by the batch")},
            "constraints": ["len_indptr == batch_size + 1",
                            "total_q == qo_indptr[-1].item()",
                            "num_kv_indices == kv_indptr[-1].item()"],
            "inputs": {"q": _t(["total_q", "num_qo_heads", "head_dim"]),
                       "k_cache": _t(cache), "v_cache": _t(cache),
                       "qo_indptr": _t(["len_indptr"], "int32"),
                       "kv_indptr": _t(["len_indptr"], "int32"),
                       "kv_indices": _t(["num_kv_indices"], "int32"),
                       "kv_last_page_len": _t(["batch_size"], "int32"),
                       "sm_scale": _t(None, "float32")},
            "outputs": {"output": _t(["total_q", "num_qo_heads", "head_dim"]),
                        "lse": _t(["total_q", "num_qo_heads"], "float32", lse_desc)},
            "reference": PREFILL_PAGED_REF.replace("{hq}", str(hq)).replace("{hk}", str(hk))
                         .replace("{d}", str(d)).replace("{ps}", str(ps)),
        }))  # fmt: skip
        out.append(Definition.model_validate({
            "name": f"gqa_ragged_prefill_causal_h{hq}_kv{hk}_d{d}", "op_type": "gqa_ragged",
            "description": "Batched causal GQA prefill over ragged (concatenated) K/V.",
            "tags": ["stage:prefill", *tags,
                     "fi_api:flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper"],
            "axes": {"total_q": _var("query tokens"), "total_kv": _var("key/value tokens"),
                     **_HEAD_AXES(hq, hk, d), "len_indptr": _var("batch size + 1")},
            "constraints": ["total_q == qo_indptr[-1].item()",
                            "total_kv == kv_indptr[-1].item()"],
            "inputs": {"q": _t(["total_q", "num_qo_heads", "head_dim"]),
                       "k": _t(["total_kv", "num_kv_heads", "head_dim"]),
                       "v": _t(["total_kv", "num_kv_heads", "head_dim"]),
                       "qo_indptr": _t(["len_indptr"], "int32"),
                       "kv_indptr": _t(["len_indptr"], "int32"),
                       "sm_scale": _t(None, "float32")},
            "outputs": {"output": _t(["total_q", "num_qo_heads", "head_dim"]),
                        "lse": _t(["total_q", "num_qo_heads"], "float32", lse_desc)},
            "reference": PREFILL_RAGGED_REF.replace("{hq}", str(hq)).replace("{hk}", str(hk))
                         .replace("{d}", str(d)),
        }))  # fmt: skip
    return out


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
            axes = {"num_tokens": t, "num_qo_heads": hq, "num_kv_heads": hk,
                    "max_seq_len": ROPE_MAX_SEQ}  # fmt: skip
            out.append(Workload(uuid=_uuid(name, t, hq, hk), axes=axes, inputs={}))
    elif name.startswith("gqa_paged_decode"):
        for batch, kv in DECODE:
            wid = _uuid(name, batch, kv)
            lens = _lengths(batch, kv, gen)
            pages = [-(-n // PAGE_SIZE) for n in lens]
            last = [n - (p - 1) * PAGE_SIZE for n, p in zip(lens, pages, strict=False)]
            inputs = _blob(root, definition, wid, {
                "kv_indptr": _indptr(pages), "kv_last_page_len": torch.tensor(last, dtype=torch.int32),
            })  # fmt: skip
            axes = {"batch_size": batch, "len_indptr": batch + 1, "num_kv_indices": sum(pages),
                    "num_pages": sum(pages) + 64}  # fmt: skip
            out.append(Workload(uuid=wid, axes=axes, inputs=inputs))
    elif name.startswith("gqa_paged_prefill"):
        for batch, n in PREFILL:
            wid = _uuid(name, batch, n)
            lens = _lengths(batch, n, gen)
            pages = [-(-x // PAGE_SIZE) for x in lens]
            last = [x - (p - 1) * PAGE_SIZE for x, p in zip(lens, pages, strict=False)]
            inputs = _blob(root, definition, wid, {
                "qo_indptr": _indptr(lens), "kv_indptr": _indptr(pages),
                "kv_last_page_len": torch.tensor(last, dtype=torch.int32),
            })  # fmt: skip
            axes = {"total_q": sum(lens), "batch_size": batch, "len_indptr": batch + 1,
                    "num_kv_indices": sum(pages), "num_pages": sum(pages) + 64}  # fmt: skip
            out.append(Workload(uuid=wid, axes=axes, inputs=inputs))
    elif name.startswith("gqa_ragged_prefill"):
        for batch, n in PREFILL:
            wid = _uuid(name, batch, n)
            lens = _lengths(batch, n, gen)
            inputs = _blob(root, definition, wid, {
                "qo_indptr": _indptr(lens), "kv_indptr": _indptr(lens),
            })  # fmt: skip
            axes = {"total_q": sum(lens), "total_kv": sum(lens), "len_indptr": batch + 1}
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
}
_FLASHINFER_CALL = {
    "rmsnorm": "flashinfer.norm.rmsnorm",
    "fused_add_rmsnorm": f"flashinfer.norm.fused_add_rmsnorm {_CLONES}, as flashtune's is",
    "silu_and_mul": "flashinfer.activation.silu_and_mul",
    "rope": "flashinfer.rope.apply_rope_with_cos_sin_cache",
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
    # Decode: `flashinfer` follows FlashInfer's own backend rule; the other backend is listed
    # beside it under its own name.
    from flashtune.dataset.entry_points import flashinfer_decode_uses_tensor_cores

    hq, hk = definition.const_axes["num_qo_heads"], definition.const_axes["num_kv_heads"]
    tc = flashinfer_decode_uses_tensor_cores(
        hq, hk, getattr(torch, definition.inputs["k_cache"].dtype)
    )
    wrapper = "FlashInfer's BatchDecodeWithPagedKVCacheWrapper"
    rule = f"FlashInfer's rule picks for GQA group size {hq // hk} (tensor cores from 4, or fp8 KV)"
    other = "cuda_cores" if tc else "tensor_cores"
    return [
        ("flashinfer", fn, f"{wrapper} on {_decode_backend(tc)}, the backend {rule}: {_PLANNED}"),
        (f"flashinfer_{other}", f"{fn}_{other}",
         f"{wrapper} forced to {_decode_backend(not tc)}, not the backend {rule}: {_PLANNED}"),
    ]  # fmt: skip


def solutions_for(definition: Definition) -> list[Solution]:
    family = next(v for k, v in _FAMILY.items() if definition.name.startswith(k))
    ep = "flashtune.dataset.entry_points:{}"
    sols = [
        Solution.model_validate({
            "name": "flashtune", "definition": definition.name, "author": "flashtune",
            "description": _FLASHTUNE[family],
            "spec": {"language": "triton", "target_hardware": ["cuda"],
                     "entry_point": ep.format(f"flashtune_{family}")},
        }),
        Solution.model_validate({
            "name": "torch", "definition": definition.name, "author": "torch",
            "description": "PyTorch eager baseline. " + _NO_SETUP,
            "spec": {"language": "torch", "entry_point": ep.format(f"torch_{family}")},
        }),
    ]  # fmt: skip
    if family not in _NO_FLASHINFER:
        for name, fn, description in _flashinfer_solutions(definition, family):
            sols.append(Solution.model_validate({
                "name": name, "definition": definition.name, "author": "flashinfer",
                "description": description,
                "spec": {"language": "cuda", "target_hardware": ["cuda"],
                         "dependencies": ["flashinfer"], "entry_point": ep.format(fn)},
            }))  # fmt: skip
    return sols


def schema_definitions() -> dict[str, Definition]:
    """Definitions generated from op schemas, when the ops have them (else empty)."""
    try:
        from flashtune.schema.dump import model_definitions

        return model_definitions(list(MODEL_NAMES))
    except Exception as exc:  # noqa: BLE001 - schemas are optional here: fall back to ours
        print(f"note: op schemas unavailable ({exc}); using hand-written definitions")
        return {}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help=f"dataset folder (default {ROOT})")
    root = parser.parse_args(argv).root
    for sub in ("definitions", "solutions", "workloads", "blob"):
        shutil.rmtree(root / sub, ignore_errors=True)
    ds = Dataset(root)
    generated = schema_definitions()
    definitions = (
        norm_definitions() + activation_definitions() + gemm_definitions()
        + rope_definitions() + attention_definitions()
    )  # fmt: skip
    for definition in definitions:
        schema_def = generated.get(definition.name)
        if schema_def is not None and set(schema_def.inputs) == set(definition.inputs):
            definition = schema_def  # the op's own contract wins when it has one
            print(f"{definition.name}: from the op schema")
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

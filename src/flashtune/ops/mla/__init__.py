"""Multi-head Latent Attention (DeepSeek-V2/V3/R1, Kimi K2) over a paged latent cache, in
FlashInfer's API (`flashinfer.mla.BatchMLAPagedAttentionWrapper`), plus plan-free calls.

The absorbed form: a token's cache entry is a compressed latent `ckv` (kv_lora_rank, 512)
and a RoPE part `kpe` (64), one "head" shared by all query heads; a query head brings
`q_nope` [512] (absorbed into the latent space) and `q_pe` [64]. Logit = sm_scale *
(q_nope . ckv + q_pe . kpe), output = softmax-weighted sum of ckv [512], LSE base 2. Caches:
ckv_cache [num_pages, page_size, 512], kpe_cache [num_pages, page_size, 64]; a request's
pages are kv_indices[kv_indptr[b]:kv_indptr[b+1]] and its length kv_len_arr[b]. Several
query tokens per request (MTP verification, prefill over a cached prefix) are the request's
last qo_len tokens; causal lets query i see keys up to kv_len - qo_len + i.

Layout: reference.py (the contract in PyTorch), schema.py (the Definitions), kernels.py
(Triton), config.py (tactics and launch policy), plan.py (the host plan), launch.py
(launching, the autotuner's runner, the plan-free launch). docs/mla.md: semantics, API,
measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flashtune import env
from flashtune.model_shapes import ModelConfig
from flashtune.ops.attention.staging import host_int64
from flashtune.ops.mla.config import MLALaunch, MLATactic
from flashtune.ops.mla.launch import (
    KVScales,
    MLAInputs,
    PlanlessOptions,
    PlanlessTable,
    launch_planless,
    run_plan,
)
from flashtune.ops.mla.page import append_paged_mla_kv_cache
from flashtune.ops.mla.plan import (
    MLAParams,
    MLAPlan,
    MLAPlanner,
    MLATables,
    SplitPolicy,
    validate_tables,
)
from flashtune.ops.mla.ragged import mla_ragged_prefill as _ragged_prefill
from flashtune.ops.mla.reference import mla_paged_ref
from flashtune.ops.mla.schema import (
    MLA_SCHEMAS,
    RAGGED_SCHEMAS,
    WRAPPER_SCHEMAS,
    DefinitionInputs,
    definition_inputs,
    ragged_schema_key,
    schema_key,
)
from flashtune.schema import REGISTRY, ApiOp, OpSchema
from flashtune.schema.dump import Example, meta_tensor, register_examples

__all__ = [
    "BatchMLAPagedAttentionWrapper",
    "mla_paged_decode",
    "mla_paged_prefill",
    "mla_ragged_prefill",
    "append_paged_mla_kv_cache",
    "mla_paged_ref",
    "MLAOptions",
    "KVScales",
    "MLALaunch",
    "MLATactic",
    "MLA_OPS",
    "mla_examples",
]

_BACKENDS = ("auto", "fa2", "fa3")


def _as_dtype(name: str, x: Any) -> torch.dtype:
    if isinstance(x, torch.dtype):
        return x
    if isinstance(x, str) and isinstance(getattr(torch, x, None), torch.dtype):
        return getattr(torch, x)
    raise TypeError(f"{name} must be a torch.dtype or its name, got {x!r}")


def _check_tensor(name: str, t: Any, dims: int, dtype: torch.dtype, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")


def _check_cache(ckv_cache: Any, kpe_cache: Any, params: MLAParams, device: torch.device) -> None:
    _check_tensor("ckv_cache", ckv_cache, 3, params.kv_dtype, device)
    _check_tensor("kpe_cache", kpe_cache, 3, params.kv_dtype, device)
    want = (params.page_size, params.head_dim_ckv)
    if tuple(ckv_cache.shape[1:]) != want:
        raise ValueError(
            f"ckv_cache must be [num_pages, page_size, head_dim_ckv] with (page_size, "
            f"head_dim_ckv) = {want}, got {tuple(ckv_cache.shape)}"
        )
    pe_shape = (ckv_cache.shape[0], params.page_size, params.head_dim_kpe)
    if tuple(kpe_cache.shape) != pe_shape:
        raise ValueError(
            f"kpe_cache must have shape {pe_shape} (ckv_cache's pages, head_dim_kpe), got "
            f"{tuple(kpe_cache.shape)}"
        )


def _kv_scales(
    kv_dtype: torch.dtype,
    ckv_cache: torch.Tensor,
    ckv_scale: float | None,
    ckv_scale_arr: torch.Tensor | None,
    kpe_scale: float | None,
) -> KVScales:
    """FlashInfer's fp8 scale arguments checked (later FlashInfer's run: real = stored *
    scale; only for an fp8 cache). Unlike FlashInfer, missing scales of an fp8 cache are 1."""
    given = ckv_scale is not None or ckv_scale_arr is not None or kpe_scale is not None
    if kv_dtype.itemsize != 1:
        if given:
            raise ValueError(
                "ckv_scale / ckv_scale_arr / kpe_scale are only valid when kv_data_type is FP8"
            )
        return KVScales()
    if ckv_scale is not None and ckv_scale_arr is not None:
        raise ValueError("give at most one of ckv_scale and ckv_scale_arr")
    for name, value in (("ckv_scale", ckv_scale), ("kpe_scale", kpe_scale)):
        if value is not None and not (math.isfinite(float(value)) and float(value) > 0):
            raise ValueError(f"{name} must be a finite positive value, got {value}")
    if ckv_scale_arr is not None:
        d = ckv_cache.shape[-1]
        if d % 128:
            raise ValueError(f"ckv_scale_arr needs head_dim_ckv a multiple of 128, got {d}")
        want = (*ckv_cache.shape[:-1], d // 128)
        if (
            not isinstance(ckv_scale_arr, torch.Tensor)
            or tuple(ckv_scale_arr.shape) != want
            or ckv_scale_arr.dtype != torch.float32
            or ckv_scale_arr.device != ckv_cache.device
            or not ckv_scale_arr.is_contiguous()
        ):
            raise ValueError(
                f"ckv_scale_arr must be a contiguous float32 tensor of shape {want} on "
                f"{ckv_cache.device}"
            )
    return KVScales(
        ckv=1.0 if ckv_scale is None else float(ckv_scale),
        kpe=1.0 if kpe_scale is None else float(kpe_scale),
        ckv_arr=ckv_scale_arr,
    )


def _output(
    name: str, given: Any, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    if given is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if (
        not isinstance(given, torch.Tensor)
        or tuple(given.shape) != shape
        or given.dtype != dtype
        or given.device != device
    ):
        raise ValueError(
            f"{name} must be a {dtype} tensor of shape {shape} on {device}, got "
            f"{getattr(given, 'dtype', type(given).__name__)} "
            f"{tuple(getattr(given, 'shape', ()))} on {getattr(given, 'device', None)}"
        )
    if name == "lse" and not given.is_contiguous():
        raise ValueError("lse must be contiguous")
    if given.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")
    return given


# --------------------------------------------------------------------------- schema'd ops


class _WrapperRunOp(ApiOp):
    """The schema's view of the wrapper's run: the planned page table as its Definitions
    see it (`definition_inputs`), the plan's causal flag; calls no Definition describes
    (fp8 scales other than 1, per-group scales, a natural-log LSE, CUDA-graph padding rows)
    raise ValueError, so capture, apply and the definition dump leave them to the op."""

    def schema_for(self, *args: Any, **kwargs: Any) -> OpSchema:
        wrapper = args[0] if args else kwargs["self"]
        plan = wrapper._planner.plan
        if plan is None:
            raise ValueError("run() before plan(): no Definition to describe")
        p = plan.params
        decode = bool((np.diff(plan.tables.qo_indptr) == 1).all())
        return WRAPPER_SCHEMAS[schema_key(decode, p.causal, p.page_size, p.num_heads)]

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        plan = arguments["self"]._planner.plan
        if plan is None:
            raise ValueError("run() before plan(): no Definition to describe")
        _refuse_unlisted(arguments)
        if arguments["return_lse_base_on_e"]:
            raise ValueError("a natural-log LSE: the Definitions' LSE is base 2")
        q = arguments["q_nope"]
        if isinstance(q, torch.Tensor) and q.shape[0] != plan.total_qo:
            raise ValueError("q rows past the plan (CUDA-graph padding): not a Definition's call")
        arguments["causal"] = plan.params.causal
        return arguments


def _refuse_unlisted(arguments: dict[str, Any]) -> None:
    """ValueError for fp8 scales no Definition lists (they would be baked in per call)."""
    if arguments.get("ckv_scale_arr") is not None:
        raise ValueError("per-group ckv scales: no Definition describes them")
    for name in ("ckv_scale", "kpe_scale"):
        value = arguments.get(name)
        if value is not None and float(value) != 1.0:
            raise ValueError(f"{name}={value}: no Definition describes scaled fp8 caches")


class _PlanFreeOp(ApiOp):
    """The schema's view of the plan-free calls (their arguments are the Definition's)."""

    def __init__(self, fn: Any, decode: bool) -> None:
        mine = [s for key, s in MLA_SCHEMAS.items() if (key[0] == "decode") == decode]
        super().__init__(fn, self.schema_for, mine)
        self.decode = decode

    def schema_for(self, *args: Any, **kwargs: Any) -> OpSchema:
        a = super().arguments(args, kwargs)
        ckv, q = a["ckv_cache"], a["q_nope"]
        causal = bool(a.get("causal", True))
        return MLA_SCHEMAS[schema_key(self.decode, causal, ckv.shape[1], q.shape[1])]

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        options = arguments.get("options")
        if options is not None and options.scales is not None:
            s = options.scales
            _refuse_unlisted({"ckv_scale": s.ckv, "kpe_scale": s.kpe, "ckv_scale_arr": s.ckv_arr})
        if arguments["sm_scale"] is not None:
            arguments["sm_scale"] = float(arguments["sm_scale"])
        return arguments


class _RaggedOp(ApiOp):
    """The schema's view of the non-absorbed ragged prefill (its arguments are the
    mla_ragged Definitions'; calls with buffers or a tactic are the op's own business)."""

    def __init__(self, fn: Any) -> None:
        super().__init__(fn, self.schema_for, list(RAGGED_SCHEMAS.values()))

    def schema_for(self, *args: Any, **kwargs: Any) -> OpSchema:
        a = super().arguments(args, kwargs)
        return RAGGED_SCHEMAS[ragged_schema_key(bool(a["causal"]), a["q"].shape[1])]

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = super().arguments(args, kwargs)
        if arguments["sm_scale"] is None:  # the default FlashInfer takes: 1/sqrt(head_dim_qk)
            arguments["sm_scale"] = 1.0 / math.sqrt(arguments["q"].shape[-1])
        arguments["sm_scale"] = float(arguments["sm_scale"])
        return arguments


def _wrapper_run(fn: Any) -> _WrapperRunOp:
    return _WrapperRunOp(fn, _no_selector, list(WRAPPER_SCHEMAS.values()))


def _no_selector(*args: Any, **kwargs: Any) -> OpSchema:
    raise AssertionError("the MLA ops choose their schema in schema_for")


# --------------------------------------------------------------------------- the wrapper


class BatchMLAPagedAttentionWrapper:
    """MLA over a paged latent cache (FlashInfer's wrapper of the same name, its fa2/fa3
    backends' semantics): `plan` once per step on the host, `run` per layer.

    With use_cuda_graph=True pass the qo_indptr, kv_indptr, kv_indices and kv_len_arr
    buffers: their sizes fix the batch and the most pages; the first plan fixes the most
    query tokens, the rows per tile and the tactic; `run` can be captured once and replayed
    after each plan (plan rewrites the work list in place; the grid never changes).

    Extra plan keywords: disable_split_kv, fixed_split_size (KV chunk in tokens), launch
    (an `MLALaunch`: tactic, rows per program, CTAs per SM, SM count).
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        use_cuda_graph: bool = False,
        qo_indptr: torch.Tensor | None = None,
        kv_indptr: torch.Tensor | None = None,
        kv_indices: torch.Tensor | None = None,
        kv_len_arr: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise TypeError("float_workspace_buffer must be a tensor")
        if not float_workspace_buffer.is_contiguous():
            raise ValueError("float_workspace_buffer must be contiguous")
        if backend == "cutlass":
            raise NotImplementedError(
                "backend='cutlass' (SM100 CUTLASS MLA, run(kv_len=, page_table=)) is not "
                "implemented; use 'auto'"
            )
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} or 'cutlass', got {backend!r}")
        self.device = float_workspace_buffer.device
        self._use_cuda_graph = use_cuda_graph
        self._bufs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        max_batch = None
        if use_cuda_graph:
            bufs = {
                "qo_indptr": qo_indptr,
                "kv_indptr": kv_indptr,
                "kv_indices": kv_indices,
                "kv_len_arr": kv_len_arr,
            }
            for name, b in bufs.items():
                if not isinstance(b, torch.Tensor):
                    raise ValueError(f"use_cuda_graph=True needs the {name} buffer")
                if b.dtype != torch.int32 or b.device != self.device or b.dim() != 1:
                    raise ValueError(f"{name} buffer must be 1-D int32 on {self.device}")
            assert qo_indptr is not None and kv_indptr is not None and kv_len_arr is not None
            max_batch = kv_len_arr.numel()
            if qo_indptr.numel() != max_batch + 1 or kv_indptr.numel() != max_batch + 1:
                raise ValueError(
                    f"qo_indptr and kv_indptr buffers must hold batch_size + 1 = "
                    f"{max_batch + 1} entries (kv_len_arr holds {max_batch})"
                )
            self._bufs = (qo_indptr, kv_indptr, kv_len_arr)
        self._planner = MLAPlanner(
            float_workspace_buffer,
            use_cuda_graph,
            kv_indices if use_cuda_graph else None,
            max_batch,
        )
        self._definition: DefinitionInputs | None = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @property
    def definition_inputs(self) -> DefinitionInputs | None:
        """The planned page table and scale as the Definitions see them (None before plan)."""
        plan = self._planner.plan
        if plan is None:
            return None
        if self._definition is None:
            self._definition = definition_inputs(
                plan.tables,
                plan.kv_indices,
                plan.params.page_size,
                plan.params.sm_scale,
            )
        return self._definition

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_len_arr: torch.Tensor,
        num_heads: int,
        head_dim_ckv: int,
        head_dim_kpe: int,
        page_size: int,
        causal: bool,
        sm_scale: float,
        q_data_type: torch.dtype | str,
        kv_data_type: torch.dtype | str,
        use_profiler: bool = False,
        *,
        disable_split_kv: bool = False,
        fixed_split_size: int | None = None,
        launch: MLALaunch | None = None,
    ) -> None:
        """Schedule one step: qo_indptr [B+1] (decode: 0..B), kv_indptr [B+1] into
        kv_indices (page ids; more may follow), kv_len_arr [B] (each request's KV tokens),
        int32 as FlashInfer requires. One device-to-host copy of the three small arrays."""
        for name, t in (
            ("kv_len_arr", kv_len_arr),
            ("kv_indptr", kv_indptr),
            ("qo_indptr", qo_indptr),
            ("kv_indices", kv_indices),
        ):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
            if t.dtype != torch.int32:  # as FlashInfer's plan
                raise ValueError(f"Expected {name}.dtype == torch.int32, got {t.dtype}")
            if t.dim() != 1:
                raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        if use_profiler:
            raise NotImplementedError("use_profiler=True: flashtune has no intra-kernel profiler")
        if kv_indptr.numel() > kv_len_arr.numel() + 1:
            # FlashInfer reads request b's first page at kv_indptr[b] for b < batch_size
            # (kv_len_arr's entries) and ignores what follows (FlashInfer's
            # test_batch_mla_varlen_page_attention passes more).
            kv_indptr = kv_indptr[: kv_len_arr.numel() + 1]
        qo_h, kv_h, len_h = host_int64(qo_indptr, kv_indptr, kv_len_arr)
        tables = MLATables(qo_h, kv_h, len_h, kv_indices.numel())
        params = MLAParams(
            num_heads=num_heads,
            head_dim_ckv=head_dim_ckv,
            head_dim_kpe=head_dim_kpe,
            page_size=page_size,
            causal=bool(causal),
            sm_scale=float(sm_scale),
            q_dtype=_as_dtype("q_data_type", q_data_type),
            kv_dtype=_as_dtype("kv_data_type", kv_data_type),
        )
        split = SplitPolicy(disable_split_kv, fixed_split_size)
        self._planner.make(tables, kv_indices, params, split, launch)
        self._definition = None
        if self._bufs is not None:
            # Keep the caller-visible buffers in sync, as FlashInfer's graph mode does.
            for buf, src in zip(self._bufs, (qo_indptr, kv_indptr, kv_len_arr), strict=True):
                if src.data_ptr() != buf.data_ptr():
                    buf.copy_(src, non_blocking=True)

    def _check_run(self, q_nope: Any, q_pe: Any, ckv: Any, kpe: Any) -> MLAPlan:
        plan = self._planner.plan
        if plan is None:
            raise RuntimeError("run() called before plan(): call plan() once per step first")
        p = plan.params
        _check_tensor("q_nope", q_nope, 3, p.q_dtype, self.device)
        _check_tensor("q_pe", q_pe, 3, p.q_dtype, self.device)
        rows = q_nope.shape[0]
        want = (p.num_heads, p.head_dim_ckv)
        if tuple(q_nope.shape[1:]) != want:
            raise ValueError(
                f"q_nope must be [tokens, num_heads, head_dim_ckv] with {want} as planned, "
                f"got {tuple(q_nope.shape)}"
            )
        if tuple(q_pe.shape) != (rows, p.num_heads, p.head_dim_kpe):
            raise ValueError(
                f"q_pe must have shape {(rows, p.num_heads, p.head_dim_kpe)}, got "
                f"{tuple(q_pe.shape)}"
            )
        if rows != plan.total_qo and not (self._use_cuda_graph and rows >= plan.total_qo):
            raise ValueError(f"q_nope has {rows} tokens but the plan has {plan.total_qo}")
        _check_cache(ckv, kpe, p, self.device)
        if plan.index_range is None and plan.kv_indices.device.type == "cpu" and plan.nnz_pages:
            head = plan.kv_indices[: plan.nnz_pages]
            plan.index_range = (int(head.min()), int(head.max()))
        if plan.index_range is not None:
            lo, hi = plan.index_range
            if lo < 0 or hi >= ckv.shape[0]:
                raise ValueError(
                    f"kv_indices hold page ids in [{lo}, {hi}] but the cache has "
                    f"{ckv.shape[0]} pages"
                )
        return plan

    @_wrapper_run
    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        profiler_buffer: torch.Tensor | None = None,
        kv_len: torch.Tensor | None = None,
        page_table: torch.Tensor | None = None,
        return_lse_base_on_e: bool = False,
        o_scale: float | None = None,
        *,
        ckv_scale: float | None = None,
        ckv_scale_arr: torch.Tensor | None = None,
        kpe_scale: float | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """MLA for q_nope [tokens, H, head_dim_ckv], q_pe [tokens, H, head_dim_kpe] over
        ckv_cache [pages, page_size, head_dim_ckv], kpe_cache [pages, page_size,
        head_dim_kpe]. Returns out (q's dtype) and, with return_lse, the LSE [tokens, H]
        float32, base 2 (natural with return_lse_base_on_e). A given `lse` is written even
        without return_lse, as FlashInfer does. profiler_buffer, kv_len and page_table are
        for FlashInfer backends flashtune does not have, and are ignored, as FlashInfer's
        fa2/fa3 backends ignore the last two. fp8 (e4m3) cache: ckv_scale or ckv_scale_arr
        [pages, page_size, head_dim_ckv // 128] and kpe_scale (default 1)."""
        if o_scale is not None:
            raise ValueError("o_scale is only supported with the cutlass backend for now.")
        plan = self._check_run(q_nope, q_pe, ckv_cache, kpe_cache)
        scales = _kv_scales(plan.params.kv_dtype, ckv_cache, ckv_scale, ckv_scale_arr, kpe_scale)
        rows, h = q_nope.shape[:2]
        out = _output("out", out, tuple(q_nope.shape), q_nope.dtype, self.device)
        if lse is not None or return_lse:
            lse = _output("lse", lse, (rows, h), torch.float32, self.device)
        lse_t = run_plan(plan, MLAInputs(q_nope, q_pe, ckv_cache, kpe_cache), out, lse, scales)
        if return_lse_base_on_e and lse is not None:
            lse.mul_(math.log(2.0))
        return (out, lse_t) if return_lse else out


# --------------------------------------------------------------------------- plan-free


@dataclass(frozen=True)
class MLAOptions:
    """Options of the plan-free calls: out (preallocated output), scales (fp8 cache),
    launch (fixed tactic / rows per program / SM count)."""

    out: torch.Tensor | None = None
    scales: KVScales | None = None
    launch: MLALaunch | None = None


def _plan_free_table(
    q_nope: Any,
    ckv_cache: Any,
    qo_indptr: Any,
    kv_indptr: Any,
    kv_indices: Any,
    kv_last_page_len: Any,
) -> PlanlessTable:
    dev = q_nope.device
    tabs: dict[str, torch.Tensor | None] = {}
    for name, t in (
        ("qo_indptr", qo_indptr),
        ("kv_indptr", kv_indptr),
        ("kv_indices", kv_indices),
        ("kv_last_page_len", kv_last_page_len),
    ):
        if t is None:
            tabs[name] = None
            continue
        _check_tensor(name, t, 1, torch.int32, dev)
        tabs[name] = t.contiguous()
    kv_ip = tabs["kv_indptr"]
    assert kv_ip is not None and tabs["kv_indices"] is not None
    batch = kv_ip.numel() - 1
    last = tabs["kv_last_page_len"]
    if last is not None and last.numel() != batch:
        raise ValueError(f"kv_last_page_len has {last.numel()} entries; kv_indptr implies {batch}")
    qo = tabs["qo_indptr"]
    if qo is None and q_nope.shape[0] != batch:
        raise ValueError(
            f"q_nope has {q_nope.shape[0]} rows; decode needs one per request ({batch})"
        )
    if qo is not None and qo.numel() != batch + 1:
        raise ValueError(f"qo_indptr has {qo.numel()} entries; kv_indptr has {batch + 1}")
    if env.DEBUG_CHECKS.get() or dev.type == "cpu":
        # Contents: a sync on a GPU (debug only); on the CPU they are host memory already.
        ip = kv_ip.cpu().numpy().astype(np.int64)
        pages = np.diff(ip)
        ps = ckv_cache.shape[1]
        if last is None:
            lens = pages * ps
        else:
            lens = np.where(pages > 0, (pages - 1) * ps + last.cpu().numpy(), 0)
        qo_h = np.arange(batch + 1) if qo is None else qo.cpu().numpy().astype(np.int64)
        validate_tables(MLATables(qo_h, ip, lens, tabs["kv_indices"].numel()), ps)
        if qo is not None and int(qo_h[-1]) != q_nope.shape[0]:
            raise ValueError(
                f"qo_indptr[-1] = {int(qo_h[-1])} but q_nope has {q_nope.shape[0]} rows"
            )
        nnz = int(ip[-1])
        head = tabs["kv_indices"][:nnz]
        if nnz and (int(head.min()) < 0 or int(head.max()) >= ckv_cache.shape[0]):
            raise ValueError(
                f"kv_indices hold page ids outside the cache's {ckv_cache.shape[0]} pages"
            )
    return PlanlessTable(qo, kv_ip, tabs["kv_indices"], last)


def _plan_free(
    q_nope: Any,
    q_pe: Any,
    ckv_cache: Any,
    kpe_cache: Any,
    table_args: tuple[Any, Any, Any, Any],
    sm_scale: float,
    causal: bool,
    return_lse: bool,
    options: MLAOptions | None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(q_nope, torch.Tensor) or q_nope.dim() != 3:
        raise ValueError("q_nope must be a [tokens, num_heads, head_dim_ckv] tensor")
    if not isinstance(ckv_cache, torch.Tensor) or ckv_cache.dim() != 3:
        raise ValueError("ckv_cache must be a [num_pages, page_size, head_dim_ckv] tensor")
    if not isinstance(kpe_cache, torch.Tensor) or kpe_cache.dim() != 3:
        raise ValueError("kpe_cache must be a [num_pages, page_size, head_dim_kpe] tensor")
    opts = options if options is not None else MLAOptions()
    params = MLAParams(
        num_heads=q_nope.shape[1],
        head_dim_ckv=q_nope.shape[2],
        head_dim_kpe=kpe_cache.shape[2],
        page_size=ckv_cache.shape[1],
        causal=causal,
        sm_scale=float(sm_scale),
        q_dtype=q_nope.dtype,
        kv_dtype=ckv_cache.dtype,
    )
    params.check()
    dev = q_nope.device
    _check_tensor("q_nope", q_nope, 3, params.q_dtype, dev)
    _check_tensor("q_pe", q_pe, 3, params.q_dtype, dev)
    if tuple(q_pe.shape) != (*q_nope.shape[:2], params.head_dim_kpe):
        raise ValueError(
            f"q_pe must have shape {(*q_nope.shape[:2], params.head_dim_kpe)}, got "
            f"{tuple(q_pe.shape)}"
        )
    _check_cache(ckv_cache, kpe_cache, params, dev)
    table = _plan_free_table(q_nope, ckv_cache, *table_args)
    s = opts.scales if opts.scales is not None else KVScales()
    scales = _kv_scales(
        params.kv_dtype,
        ckv_cache,
        s.ckv if s.ckv_arr is None and s.ckv != 1.0 else None,
        s.ckv_arr,
        s.kpe if s.kpe != 1.0 else None,
    )
    out = _output("out", opts.out, tuple(q_nope.shape), q_nope.dtype, dev)
    lse = torch.empty(q_nope.shape[:2], dtype=torch.float32, device=dev)
    launch_planless(
        MLAInputs(q_nope, q_pe, ckv_cache, kpe_cache),
        table,
        out,
        lse,
        scales,
        PlanlessOptions(float(sm_scale), causal, opts.launch),
    )
    return (out, lse) if return_lse else out


def mla_paged_decode(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    kv_last_page_len: torch.Tensor | None = None,
    *,
    return_lse: bool = False,
    options: MLAOptions | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """MLA decode (one query per request) in one call, with no host sync: the
    mla_paged_decode Definition's signature. q_nope [B, H, Dc], q_pe [B, H, Dp]; request b's
    pages kv_indices[kv_indptr[b]:kv_indptr[b+1]], all full but the last, which holds
    kv_last_page_len[b] tokens (None: full, as page size 1). Long requests are split in
    chunks chosen from shapes alone and merged. Returns out and, with return_lse, the base-2
    LSE [B, H]."""
    table_args = (None, kv_indptr, kv_indices, kv_last_page_len)
    return _plan_free(
        q_nope, q_pe, ckv_cache, kpe_cache, table_args, sm_scale, False, return_lse, options
    )


def mla_paged_prefill(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    kv_last_page_len: torch.Tensor | None = None,
    *,
    causal: bool = True,
    return_lse: bool = False,
    options: MLAOptions | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """MLA with several query tokens per request (qo_indptr [B+1]) in one call, with no host
    sync: the mla_paged_prefill Definitions' signature. The queries are each request's last
    qo_len tokens (causal: query i sees keys up to kv_len - qo_len + i). One program per
    query tile reads its (causally trimmed) KV whole: no KV split, so a few long requests
    leave SMs idle (the planned wrapper splits them)."""
    table_args = (qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return _plan_free(
        q_nope, q_pe, ckv_cache, kpe_cache, table_args, sm_scale, causal, return_lse, options
    )


mla_paged_decode = _PlanFreeOp(mla_paged_decode, decode=True)
mla_paged_prefill = _PlanFreeOp(mla_paged_prefill, decode=False)
mla_ragged_prefill = _RaggedOp(_ragged_prefill)
mla_ragged_prefill.qualname = f"{__name__}.mla_ragged_prefill"  # the public name, not ragged's

# The schema'd ops of the family, registered by their qualname in flashtune.schema.REGISTRY
# (the definition dump, apply's mirror and capture list them from there).
MLA_OPS: tuple[ApiOp, ...] = (
    BatchMLAPagedAttentionWrapper.run,
    mla_paged_decode,
    mla_paged_prefill,
    mla_ragged_prefill,
)
for _op in MLA_OPS:
    REGISTRY[_op.qualname] = _op


# --------------------------------------------------------------------------- model examples

EXAMPLE_KV_LENS = (37, 100, 16)


def mla_examples(
    num_heads: int, head_dim_ckv: int = 512, head_dim_kpe: int = 64, page_size: int = 1
) -> list[Example]:
    """Example calls at an MLA model's per-GPU shapes (DeepSeek-V3 at TP 8: 16 heads, 512 +
    64), bf16 on the meta device: the wrapper's decode and its causal prefill over a cached
    prefix (planned on a small CPU page table), and the two plan-free calls. For a
    `model_examples` (below) at each page size."""
    lens = np.array(EXAMPLE_KV_LENS)
    pages = -(-lens // page_size)
    kv_indptr = torch.zeros(lens.size + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.from_numpy(np.cumsum(pages)).to(torch.int32)
    num_pages = int(pages.sum())
    kv_indices = torch.arange(num_pages, dtype=torch.int32)
    kv_len = torch.from_numpy(lens).to(torch.int32)
    last = torch.from_numpy((lens - 1) % page_size + 1).to(torch.int32)
    batch = lens.size
    qo_lens = np.array([4, 16, 1])
    qo_indptr = torch.zeros(batch + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.from_numpy(np.cumsum(qo_lens)).to(torch.int32)
    scale = 1.0 / math.sqrt(128 + 64)
    examples: list[Example] = []
    ckv = meta_tensor(num_pages, page_size, head_dim_ckv)
    kpe = meta_tensor(num_pages, page_size, head_dim_kpe)
    for qo in (torch.arange(batch + 1, dtype=torch.int32), qo_indptr):
        w = BatchMLAPagedAttentionWrapper(torch.empty(1 << 22, dtype=torch.uint8))
        w.plan(qo, kv_indptr, kv_indices, kv_len, num_heads, head_dim_ckv, head_dim_kpe,
               page_size, True, scale, torch.bfloat16, torch.bfloat16)  # fmt: skip
        rows = int(qo[-1])
        q_nope = meta_tensor(rows, num_heads, head_dim_ckv)
        q_pe = meta_tensor(rows, num_heads, head_dim_kpe)
        examples.append((w.run, (q_nope, q_pe, ckv, kpe), {}))
    last_arg = last if page_size > 1 else None
    q_nope = meta_tensor(batch, num_heads, head_dim_ckv)
    q_pe = meta_tensor(batch, num_heads, head_dim_kpe)
    examples.append(
        (mla_paged_decode, (q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, scale, last_arg), {})
    )
    rows = int(qo_indptr[-1])
    q_nope = meta_tensor(rows, num_heads, head_dim_ckv)
    q_pe = meta_tensor(rows, num_heads, head_dim_kpe)
    args = (q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, scale, last_arg)
    examples.append((mla_paged_prefill, args, {}))
    return examples


EXAMPLE_PAGE_SIZES = (1, 64)  # the corpus's: DeepSeek's serving engines use both


@register_examples(attention="mla")
def model_examples(model: ModelConfig) -> list[Example]:
    """The MLA calls of an MLA model's layer at its per-GPU shapes: `mla_examples` at page
    sizes 1 and 64, and the non-absorbed ragged prefill of a long prompt (QK 128 + 64, V 128);
    each prefill also without the causal mask (flashtune's own Definitions)."""
    assert model.mla is not None  # registered for MLA models only
    m, heads = model.mla, model.num_qo_heads
    examples = [
        example
        for page_size in EXAMPLE_PAGE_SIZES
        for example in mla_examples(heads, m.kv_lora_rank, m.qk_rope_head_dim, page_size)
    ]
    indptr = torch.tensor([0, 37, 137], dtype=torch.int32)
    q = meta_tensor(137, heads, m.qk_nope_head_dim + m.qk_rope_head_dim)
    v = meta_tensor(137, heads, m.v_head_dim)
    scale = 1.0 / math.sqrt(m.qk_nope_head_dim + m.qk_rope_head_dim)
    examples.append((mla_ragged_prefill, (q, q, v, indptr, indptr, True, scale), {}))
    examples.append((mla_ragged_prefill, (q, q, v, indptr, indptr, False, scale), {}))
    noncausal = [
        (op, args, {"causal": False}) for op, args, _ in examples if op is mla_paged_prefill
    ]
    return examples + noncausal

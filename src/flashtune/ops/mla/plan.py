"""The host plan of paged MLA attention: validate the page table, cut the batch into work
items dealt to persistent CTAs (`flashtune.ops.attention.scheduler.plan_work`, with every
query head of a request packed into the rows of one tile: MLA is MQA whose one KV head is
the latent cache) and lay the result out in device buffers.

`MLAPlanner.make` runs on the CPU (one device-to-host copy of qo_indptr, kv_indptr and
kv_len_arr, as FlashInfer's plan does) and returns an `MLAPlan`: everything `launch.run_plan`
needs. With use_cuda_graph every buffer the kernels read lives at a fixed place and the grid
is fixed, so a `run` captured once replays correctly after the next plan.

Causal requests longer than one tile are planned as sub-requests of one tile's worth of
query tokens each, with the KV length their last query sees: the scheduler then splits and
balances each tile by the keys it really reads (a prefill tile near the start of a long
prompt reads few), and bottom-right alignment is kept (sub-request j's queries sit at
kv_len_j - qo_len_j + i, the positions they have in the request).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flashtune import env, platform
from flashtune.ops.attention.decode.plan import partial_capacity
from flashtune.ops.attention.merge import ArrivalCounters
from flashtune.ops.attention.scheduler import (
    NUM_WORK_FIELDS,
    SplitRules,
    WorkPlan,
    max_work_items,
    plan_work,
)
from flashtune.ops.attention.staging import host_staging
from flashtune.ops.mla import hopper
from flashtune.ops.mla.config import (
    DEFAULT_LAUNCH,
    WORK_COST,
    MLALaunch,
    MLATactic,
    block_m_for,
    chunk_align,
    ctas_per_sm,
    default_tactic,
    min_chunk,
    plan_sm_count,
    smem_bytes,
)

__all__ = [
    "MLAParams",
    "MLATables",
    "SplitPolicy",
    "MLAPlan",
    "MLAPlanner",
    "validate_tables",
    "causal_subrequests",
    "Q_DTYPES",
    "KV_DTYPES",
]

Q_DTYPES = (torch.float16, torch.bfloat16)
# FlashInfer's MLA plan accepts e4m3 as its only fp8 cache type.
KV_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)


@dataclass(frozen=True)
class MLAParams:
    """What plan() fixes besides the page table (FlashInfer's plan arguments)."""

    num_heads: int
    head_dim_ckv: int
    head_dim_kpe: int
    page_size: int
    causal: bool
    sm_scale: float
    q_dtype: torch.dtype
    kv_dtype: torch.dtype

    def check(self) -> None:
        """ValueError / TypeError naming the argument that is out of range."""
        for name, value, low, high in (
            ("num_heads", self.num_heads, 1, 1 << 16),
            ("head_dim_ckv", self.head_dim_ckv, 16, 512),
            ("head_dim_kpe", self.head_dim_kpe, 0, 128),
            ("page_size", self.page_size, 1, 1 << 20),
        ):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if not low <= value <= high:
                raise ValueError(f"{name} must be in {low}..{high}, got {value}")
        # The kernel tiles each head dimension whole (tl.arange needs a power of two).
        if self.head_dim_ckv & (self.head_dim_ckv - 1):
            raise ValueError(f"head_dim_ckv must be a power of two, got {self.head_dim_ckv}")
        kpe = self.head_dim_kpe
        if kpe and (kpe < 16 or kpe & (kpe - 1)):
            raise ValueError(f"head_dim_kpe must be 0 or a power of two >= 16, got {kpe}")
        if self.q_dtype not in Q_DTYPES:
            raise TypeError(f"q_data_type must be float16 or bfloat16, got {self.q_dtype}")
        if self.kv_dtype not in KV_DTYPES:
            raise TypeError(
                f"kv_data_type must be float16, bfloat16 or float8_e4m3fn, got {self.kv_dtype}"
            )
        if self.kv_dtype.itemsize == 2 and self.kv_dtype != self.q_dtype:
            raise TypeError(
                f"kv_data_type {self.kv_dtype} with q_data_type {self.q_dtype}: a 16-bit cache "
                "must have q's dtype"
            )
        if not math.isfinite(self.sm_scale):
            raise ValueError(f"sm_scale must be finite, got {self.sm_scale}")


@dataclass(frozen=True)
class MLATables:
    """The page table as plan() reads it on the host (int64)."""

    qo_indptr: np.ndarray  # [B + 1]
    kv_indptr: np.ndarray  # [B + 1]
    kv_len: np.ndarray  # [B]
    num_indices: int  # len(kv_indices)


@dataclass(frozen=True)
class SplitPolicy:
    """plan()'s split-KV options: disable_split_kv keeps each tile in one item;
    fixed_split_size splits KV into chunks of that many tokens."""

    disable_split_kv: bool = False
    fixed_split_size: int | None = None


def validate_tables(tables: MLATables, page_size: int) -> None:
    """ValueError naming the array whose contents are invalid: indptrs 1-D non-decreasing
    with batch_size + 1 entries, kv_indptr within kv_indices, 0 <= kv_len <= pages *
    page_size of its request."""
    qo, kv, lens = tables.qo_indptr, tables.kv_indptr, tables.kv_len
    batch = lens.shape[0]
    if qo.shape != (batch + 1,) or kv.shape != (batch + 1,):
        raise ValueError(
            f"qo_indptr and kv_indptr must have batch_size + 1 = {batch + 1} entries "
            f"(kv_len_arr has {batch}), got {qo.shape[0]} and {kv.shape[0]}"
        )
    for name, ip in (("qo_indptr", qo), ("kv_indptr", kv)):
        if ip[0] < 0 or (np.diff(ip) < 0).any():
            raise ValueError(f"{name} must be non-negative and non-decreasing, got {ip.tolist()}")
    if kv[-1] > tables.num_indices:
        raise ValueError(
            f"kv_indptr[-1] = {int(kv[-1])} but kv_indices has {tables.num_indices} entries"
        )
    pages = np.diff(kv)
    bad = (lens < 0) | (lens > pages * page_size)
    if bad.any():
        b = int(np.argmax(bad))
        raise ValueError(
            f"kv_len_arr[{b}] = {int(lens[b])} but request {b} has {int(pages[b])} pages of "
            f"{page_size} tokens (kv_len must be in 0..pages * page_size)"
        )


def causal_subrequests(
    tables: MLATables, num_heads: int, block_m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(qo_indptr, kv_lens, page_starts) of the planned requests: causal requests of more
    rows than one tile become sub-requests of max(1, block_m // num_heads) query tokens, each
    with the KV length its last query sees (clipped to [0, kv_len]); page_starts [n + 1]
    holds each planned request's first page (the last entry is unused)."""
    qo = tables.qo_indptr
    qo_lens = np.diff(qo)
    per = max(1, block_m // num_heads)
    pieces = np.where(qo_lens * num_heads > block_m, -(-qo_lens // per), 1)
    if (pieces == 1).all():
        return qo, tables.kv_len, tables.kv_indptr
    req = np.repeat(np.arange(qo_lens.size), pieces)
    j = np.arange(req.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    start = qo[:-1][req] + np.where(pieces[req] > 1, j * per, 0)
    end = np.where(pieces[req] > 1, np.minimum(start + per, qo[1:][req]), qo[1:][req])
    sub_qo = np.append(start, qo[-1])
    # Queries of a request end at its kv_len; sub-request j ends (qo_end - end) queries early.
    sub_kv = np.clip(tables.kv_len[req] - (qo[1:][req] - end), 0, tables.kv_len[req])
    return sub_qo, sub_kv, np.append(tables.kv_indptr[:-1][req], tables.kv_indptr[-1])


@dataclass
class MLAPlan:
    """Everything `run` needs: parameters, the host plan and device views of its arrays."""

    params: MLAParams
    batch: int
    total_qo: int
    block_m: int
    host: WorkPlan
    grid_ctas: int
    work_indptr: torch.Tensor  # [grid_ctas + 1] int32 (device)
    work: torch.Tensor  # [W, 8] int32 (device)
    merge_info: torch.Tensor  # [merge rows, 3] int32 (device)
    partial_o: torch.Tensor  # [P, H, D_CKV] fp32
    partial_lse: torch.Tensor  # [P, H] fp32
    lse_scratch: torch.Tensor  # [max_qo, H] fp32, used when no lse is requested
    kv_indices: torch.Tensor  # [>= nnz] int32 (device)
    nnz_pages: int
    index_range: tuple[int, int] | None  # (min, max) of kv_indices[:nnz] once known
    always_merge: bool  # graph mode: the merge kernel runs even when nothing was split
    sm_count: int
    tables: MLATables
    default_tactic: MLATactic  # what sized the grid and the chunks (tactic -1)
    launch: MLALaunch | None = None
    # Arrival counters of the fused merge (MLATactic.fused_merge): one per (partial row,
    # head, output part), zero between launches (the kernel resets what it counts).
    counters: torch.Tensor | None = None
    # MLATactic.p_scratch's tiles: [grid_ctas, block_m * MAX_P_SCRATCH_N] in q's dtype and
    # [grid_ctas, block_m] fp32, the planner's (a captured graph keeps their addresses).
    p_scratch: torch.Tensor | None = None
    a_scratch: torch.Tensor | None = None
    # The Gluon sm_90 prefill's work list and the cache rows it stages (mla/hopper.work_items,
    # mla/hopper.staged_rows), built by plan() on an sm_90 GPU (hopper.plan_tables), else at
    # the Gluon runner's first run.
    hopper_work: torch.Tensor | None = None
    hopper_rows: torch.Tensor | None = None
    # Its split-KV form (mla/hopper_split.py): (work list, merge_info) on the device, built at
    # the first run that asks for it.
    hopper_split: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def kv_align(self) -> int:
        """Every work item's kv_start is a multiple of this (`config.chunk_align` of the
        default tactic, which sized the chunks). A tactic whose block_n divides it and the
        page size has each KV tile inside one page (kernels.mla_item's TILE_IN_PAGE). Fixed
        for a graph wrapper, whose default tactic is."""
        return chunk_align(self.default_tactic)


# The widest KV tile (MLATactic.block_n) MLATactic.p_scratch's buffers hold.
MAX_P_SCRATCH_N = 128


@dataclass(frozen=True)
class _Layout:
    """Sizes of the plan's integer arrays (a planner-owned buffer) and of its float scratch
    (the workspace): fixed by the first plan in CUDA-graph mode."""

    max_ctas: int
    max_work: int
    max_qo: int
    max_partial: int
    num_heads: int
    head_dim: int

    @property
    def work_offset(self) -> int:
        # 16-byte aligned for every grid: Triton specializes kernels on pointer alignment.
        return -(-(self.max_ctas + 1) // 4) * 4

    @property
    def ints(self) -> int:
        return self.work_offset + self.max_work * NUM_WORK_FIELDS + self.max_qo * 3

    def carve(self, workspace: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of the float workspace: [lse scratch | partial LSEs | partial outputs]."""
        raw = workspace.view(torch.uint8).reshape(-1)
        h, d = self.num_heads, self.head_dim
        off_plse = -(-(self.max_qo * h * 4) // 256) * 256
        off_po = off_plse + -(-(self.max_partial * h * 4) // 256) * 256
        end = off_po + self.max_partial * h * d * 4
        if raw.numel() < end:  # partial_capacity sized max_partial to fit: a bug if reached
            raise ValueError(f"workspace holds {raw.numel()} bytes, the plan needs {end}")
        f32 = torch.float32
        return {
            "lse_scratch": raw[: self.max_qo * h * 4].view(f32).view(self.max_qo, h),
            "partial_lse": raw[off_plse : off_plse + self.max_partial * h * 4]
            .view(f32)
            .view(self.max_partial, h),
            "partial_o": raw[off_po:end].view(f32).view(self.max_partial, h, d),
        }


def _graph_fixed(params: MLAParams) -> tuple[Any, ...]:
    # What a captured launch bakes in: dims, mask, scale and dtypes.
    return (
        params.num_heads,
        params.head_dim_ckv,
        params.head_dim_kpe,
        params.page_size,
        params.causal,
        params.sm_scale,
        params.q_dtype,
        params.kv_dtype,
    )


class MLAPlanner:
    """The plan machinery of `BatchMLAPagedAttentionWrapper`; its plans run through
    `launch.run_plan`."""

    def __init__(
        self,
        workspace: torch.Tensor,
        use_cuda_graph: bool = False,
        indices_buffer: torch.Tensor | None = None,
        max_batch: int | None = None,
    ) -> None:
        self.workspace = workspace
        self.device = workspace.device
        self.use_cuda_graph = use_cuda_graph
        self.indices_buffer = indices_buffer
        self.max_batch = max_batch
        self.plan: MLAPlan | None = None
        # Graph mode: the first plan's layout, block_m, grid and baked-in parameters.
        self._graph: tuple[_Layout, int, MLATactic, tuple[Any, ...]] | None = None
        # The plan's integer arrays live in a buffer of this planner, not in the (possibly
        # shared) workspace, so one wrapper's plan never overwrites another's work list.
        self._ints_buf: torch.Tensor | None = None
        self._counters = ArrivalCounters(self.device)
        self._p_scratch: tuple[torch.Tensor, torch.Tensor] | None = None

    def make(
        self,
        tables: MLATables,
        kv_indices: torch.Tensor,
        params: MLAParams,
        split: SplitPolicy = SplitPolicy(),
        launch: MLALaunch | None = None,
    ) -> MLAPlan:
        params.check()
        validate_tables(tables, params.page_size)
        batch = tables.kv_len.shape[0]
        if self.max_batch is not None and batch != self.max_batch:
            raise ValueError(
                f"CUDA-graph wrapper was built for batch_size {self.max_batch} (from its "
                f"buffers), but plan got {batch}"
            )
        total_qo = int(tables.qo_indptr[-1] - tables.qo_indptr[0])
        if tables.qo_indptr[0] != 0:
            raise ValueError("qo_indptr must start at 0")
        h = params.num_heads
        qo_lens = np.diff(tables.qo_indptr)
        max_rows = int(qo_lens.max()) * h if batch else h
        limits = platform.device_limits(self.device)
        sm_count = plan_sm_count(limits, launch)
        itemsize = params.kv_dtype.itemsize
        how = launch if launch is not None else DEFAULT_LAUNCH
        if self._graph is not None:
            layout, block_m, tactic, fixed = self._graph
            if fixed != _graph_fixed(params):
                raise ValueError(
                    "CUDA-graph wrapper re-planned with other heads, head dims, page size, "
                    "causal, sm_scale or dtypes: the captured launch bakes them in; build a "
                    "new wrapper"
                )
        else:
            block_m = block_m_for(max_rows, launch)
            dims = (params.head_dim_ckv, params.head_dim_kpe)
            smem = limits.shared_memory_per_block
            long_queries = max_rows > block_m
            tactic = how.tactic or default_tactic(
                block_m, itemsize, dims, smem, long_queries=long_queries
            )
            need = smem_bytes(tactic, block_m, *dims, itemsize)
            if how.tactic is not None and not limits.stand_in and need > smem:
                # Triton would fail at the first launch, with no word of the tactic.
                raise ValueError(
                    f"launch.tactic {tactic} needs {need // 1024} KB of shared memory at "
                    f"{block_m} rows a program; {limits.name} gives a program "
                    f"{smem // 1024} KB: fewer stages or a smaller block_n (MLATactic.space "
                    "lists the tactics that fit)"
                )
        per_sm = ctas_per_sm(
            tactic,
            block_m,
            params.head_dim_ckv,
            params.head_dim_kpe,
            itemsize,
            limits.shared_memory_per_block,
            how.max_ctas_per_sm,
        )
        num_ctas = self._graph[0].max_ctas if self._graph is not None else sm_count * per_sm
        sub_qo, sub_kv, sub_pages = (
            causal_subrequests(tables, h, block_m)
            if params.causal
            else (tables.qo_indptr, tables.kv_len, tables.kv_indptr)
        )
        num_tiles = int(np.sum(-(-np.diff(sub_qo) * h // block_m)))

        ws_bytes = self.workspace.numel() * self.workspace.element_size()
        if self._graph is not None:
            layout = self._graph[0]
            if total_qo > layout.max_qo:
                raise ValueError(
                    f"plan has {total_qo} query tokens; the CUDA-graph wrapper's first plan "
                    f"fixed at most {layout.max_qo}"
                )
        else:
            max_qo = max(total_qo, 1)
            # Graph mode: room for any later plan of at most max_qo tokens (sub-requests and
            # tiles of at most one partial tile each, plus one per request).
            max_tiles = 2 * -(-max_qo * h // block_m) + batch if self.use_cuda_graph else 0
            capacity = partial_capacity(ws_bytes, max_qo, h, params.head_dim_ckv)
            if capacity < 0:
                raise ValueError(
                    f"workspace_buffer holds {ws_bytes} bytes, less than the {max_qo * h * 4} "
                    "of the LSE scratch; allocate a larger workspace (FlashInfer recommends "
                    "128 MB)"
                )
            layout = _Layout(
                num_ctas,
                max_work_items(num_ctas, max_tiles) if self.use_cuda_graph else 0,
                max_qo,
                capacity,
                h,
                params.head_dim_ckv,
            )
        fixed_split = split.fixed_split_size
        host = plan_work(
            sub_qo,
            sub_kv,
            sub_pages,
            num_ctas,
            group_size=h,
            block_m=block_m,
            rules=SplitRules(
                split_kv=not split.disable_split_kv,
                kv_chunk_size=fixed_split if fixed_split is not None and fixed_split > 0 else None,
                chunk_align=chunk_align(tactic),
                min_chunk=min_chunk(num_tiles, sm_count),
                max_work=layout.max_work if self.use_cuda_graph else None,
                max_partial_rows=layout.max_partial,
            ),
            cost=WORK_COST,
        )
        if not self.use_cuda_graph:
            layout = _Layout(
                num_ctas,
                max(host.num_work, 1),
                max(total_qo, 1),
                layout.max_partial,
                h,
                layout.head_dim,
            )
        elif self._graph is None:
            self._graph = (layout, block_m, tactic, _graph_fixed(params))
        ints = self._write_ints(layout, host)
        floats = layout.carve(self.workspace)
        dev_indices = self._device_indices(kv_indices)
        nnz = int(tables.kv_indptr[-1])
        index_range = None
        if kv_indices.is_cuda and env.DEBUG_CHECKS.get() and nnz:
            head = kv_indices[:nnz]
            index_range = (int(head.min()), int(head.max()))
        c, w = layout.work_offset, layout.max_work * NUM_WORK_FIELDS
        merge_rows = layout.max_qo if self.use_cuda_graph else total_qo
        plan = MLAPlan(
            params=params,
            batch=batch,
            total_qo=total_qo,
            block_m=block_m,
            host=host,
            # LPT fills CTAs in index order: without a graph the empty tail is not launched.
            grid_ctas=layout.max_ctas
            if self.use_cuda_graph
            else max(1, min(host.num_ctas, host.num_work)),
            work_indptr=ints[: layout.max_ctas + 1],
            work=ints[c : c + w].view(layout.max_work, NUM_WORK_FIELDS),
            merge_info=ints[c + w : c + w + merge_rows * 3].view(merge_rows, 3),
            partial_o=floats["partial_o"],
            partial_lse=floats["partial_lse"],
            lse_scratch=floats["lse_scratch"],
            kv_indices=dev_indices,
            nnz_pages=nnz,
            index_range=index_range,
            always_merge=self.use_cuda_graph,
            sm_count=sm_count,
            tables=tables,
            default_tactic=tactic,
            launch=launch,
            counters=self._counters.at_least(layout.max_partial * h * 2),
            **self._scratch_for(layout.max_ctas, block_m, params.q_dtype),
        )
        if not self.use_cuda_graph:
            gluon = hopper.plan_tables(
                tables.qo_indptr, tables.kv_indptr, dev_indices, tables.kv_len, h,
                params.page_size, params.causal, dev_indices.device,
                platform.device_limits(dev_indices.device).sm_count,
            )  # fmt: skip
            if gluon is not None:
                plan.hopper_work, plan.hopper_rows = gluon
        self.plan = plan
        return plan

    def _scratch_for(self, ctas: int, block_m: int, dtype: torch.dtype) -> dict[str, Any]:
        """MLATactic.p_scratch's buffers for `ctas` programs of `block_m` rows, grown (never
        shrunk) with the plans; none under 32 rows (no such tactic there)."""
        if block_m < 32:
            return {}
        p_n, a_n = ctas * block_m * MAX_P_SCRATCH_N, ctas * block_m
        cur = self._p_scratch
        if cur is None or cur[0].dtype != dtype or cur[0].numel() < p_n or cur[1].numel() < a_n:
            cur = (
                torch.empty(p_n, dtype=dtype, device=self.device),
                torch.empty(a_n, dtype=torch.float32, device=self.device),
            )
            self._p_scratch = cur
        return {"p_scratch": cur[0], "a_scratch": cur[1]}

    def _write_ints(self, layout: _Layout, host: WorkPlan) -> torch.Tensor:
        """Upload the work list and merge info into this planner's integer buffer: one
        asynchronous copy from a pinned buffer on a GPU, written in place on the CPU."""
        buf = self._ints_buf
        if buf is None or buf.numel() < layout.ints:
            buf = torch.empty(layout.ints, dtype=torch.int32, device=self.device)
            self._ints_buf = buf
        ints = buf[: layout.ints]
        staging = host_staging(self.device) if self.device.type == "cuda" else None
        arr = staging.host_buffer(layout.ints) if staging else ints.numpy()
        c, w = layout.work_offset, layout.max_work * NUM_WORK_FIELDS
        arr[: host.num_ctas + 1] = host.work_indptr
        arr[host.num_ctas + 1 : c] = host.work_indptr[-1]  # idle CTAs (and padding) run nothing
        arr[c : c + host.work.size] = host.work.reshape(-1)
        m = host.merge_info.reshape(-1)
        arr[c + w : c + w + m.size] = m
        arr[c + w + m.size : c + w + layout.max_qo * 3] = 0  # rows past the plan: nothing to merge
        if staging:
            staging.upload(ints, layout.ints)
        return ints

    def _device_indices(self, kv_indices: torch.Tensor) -> torch.Tensor:
        if self.indices_buffer is not None:
            buf = self.indices_buffer
            if kv_indices.numel() > buf.numel():
                raise ValueError(
                    f"kv_indices has {kv_indices.numel()} entries but the CUDA-graph "
                    f"wrapper's kv_indices buffer holds {buf.numel()}"
                )
            if kv_indices.data_ptr() != buf.data_ptr():
                buf[: kv_indices.numel()].copy_(kv_indices, non_blocking=True)
            return buf
        if kv_indices.dtype == torch.int32 and kv_indices.device == self.device:
            return kv_indices
        return kv_indices.to(device=self.device, dtype=torch.int32, non_blocking=True)

"""The host plan of paged decode: validate a page table, schedule its work items over the
persistent CTAs (ops/attention/scheduler.py) and lay the result out in device buffers, for
`BatchDecodeWithPagedKVCacheWrapper` and `MultiLevelCascadeAttentionWrapper`.

`Planner.make` runs on the CPU (one device-to-host copy of indptr and last_page_len, as
FlashInfer's plan does) and returns a `DevicePlan`: everything `decode.launch.run_plan` needs,
with every array the kernels read in the planner's integer buffer or the float workspace.
In CUDA-graph mode every buffer lives at a fixed place and the grid is fixed, so a graph
captured once replays correctly after the next plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flashtune import env, platform
from flashtune.ops.attention.decode.config import (
    DEFAULT_LAUNCH,
    WORK_COST,
    DecodeLaunch,
    DecodeTactic,
    block_m_for,
    latency_regime,
    launch_shape,
    min_chunk,
    plan_sm_count,
    short_requests,
)
from flashtune.ops.attention.merge import ArrivalCounters
from flashtune.ops.attention.page import check_kv_dtype, validate_page_table
from flashtune.ops.attention.rotary import rope_table
from flashtune.ops.attention.scheduler import (
    NUM_WORK_FIELDS,
    SplitRules,
    WorkPlan,
    max_work_items,
    plan_work,
)
from flashtune.ops.attention.staging import host_staging

__all__ = [
    "DecodeSpec",
    "DevicePlan",
    "Planner",
    "as_int_tensor",
    "as_dtype",
    "partial_capacity",
]


def _align256(n: int) -> int:
    return -(-n // 256) * 256


@dataclass
class DevicePlan:
    """Everything `run` needs: scalar parameters and device views of the plan arrays."""

    batch: int
    total_qo: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    group: int
    block_m: int
    sm_scale: float
    logits_soft_cap: float | None
    window_left: int
    causal: bool
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    host: WorkPlan
    grid_ctas: int
    work_indptr: torch.Tensor  # [grid_ctas + 1] int32 (device)
    work: torch.Tensor  # [W, 8] int32 (device)
    merge_info: torch.Tensor  # [total_qo, 3] int32 (device)
    partial_o: torch.Tensor  # [P, H_qo, D] fp32
    partial_lse: torch.Tensor  # [P, H_qo] fp32
    lse_scratch: torch.Tensor  # [total_qo, H_qo] fp32, used when no lse is requested
    kv_indices: torch.Tensor  # [>= nnz] int32 (device)
    nnz_pages: int
    index_range: tuple[int, int] | None  # (min, max) of kv_indices[:nnz] when known cheaply
    always_merge: bool  # graph mode: launch the merge kernel even when nothing was split
    mask_window: bool  # mask by window in the kernel (else the plan trimmed the KV range)
    sm_count: int
    qo_indptr_host: np.ndarray  # [B+1] int64
    indptr_host: np.ndarray  # [B+1] int64
    last_host: np.ndarray  # [B] int64
    # Tactic -1 of this plan (decode.config.default_tactic of its variant): what sized it.
    default_tactic: DecodeTactic
    launch: DecodeLaunch | None = None  # the caller's fixed launch (tactic), if any
    rope: tuple[float, float] | None = None  # ROPE_LLAMA's (rope_scale, rope_theta)
    # With rope: rotary.rope_table in q's dtype (K's rotation in a block) and in fp32 (q's).
    rope_tables: tuple[torch.Tensor, torch.Tensor] | None = None
    # Arrival counters of the fused merge (DecodeTactic.fused_merge): one per (partial row,
    # query head), zero between launches (the kernel resets what it counts).
    counters: torch.Tensor | None = None


@dataclass(frozen=True)
class _Layout:
    """Sizes of the plan's integer arrays (a planner-owned buffer) and byte offsets of its
    float scratch regions in the workspace buffer."""

    max_ctas: int
    max_work: int
    max_qo: int
    max_partial: int
    num_qo_heads: int
    head_dim: int

    @property
    def work_offset(self) -> int:
        """Where the work list starts in the integer buffer: after work_indptr, rounded up
        to 16 bytes, so the work list and merge_info pointers are 16-byte aligned for every
        grid size (Triton specializes a kernel on pointer alignment: an offset that is
        aligned for some grids and not others would compile two variants)."""
        return -(-(self.max_ctas + 1) // 4) * 4

    @property
    def ints(self) -> int:
        """int32 elements of [work_indptr | padding | work | merge_info]."""
        return self.work_offset + self.max_work * NUM_WORK_FIELDS + self.max_qo * 3

    @property
    def off_plse(self) -> int:
        return 0

    @property
    def off_lse(self) -> int:
        return self.off_plse + _align256(self.max_partial * self.num_qo_heads * 4)

    @property
    def off_po(self) -> int:
        return self.off_lse + _align256(self.max_qo * self.num_qo_heads * 4)

    @property
    def nbytes(self) -> int:
        return self.off_po + self.max_partial * self.num_qo_heads * self.head_dim * 4


def _workspace_too_small(have: int, need: int) -> ValueError:
    return ValueError(
        f"workspace_buffer holds {have} bytes but this plan needs {need} even without KV "
        "splits; allocate a larger workspace (FlashInfer's recommendation, 128 MB, is always "
        "enough for decode)"
    )


def partial_capacity(workspace_bytes: int, max_qo: int, num_qo_heads: int, head_dim: int) -> int:
    """The most partial rows (an fp32 output and LSE per head) a workspace of
    `workspace_bytes` holds next to the LSE scratch of `max_qo` rows, as `_Layout` lays
    them out; -1 when not even the scratch fits."""
    scratch = _align256(max_qo * num_qo_heads * 4)
    if workspace_bytes < scratch:
        return -1
    # 255: the partial LSE region is padded to 256 bytes.
    return max(0, (workspace_bytes - scratch - 255) // (num_qo_heads * (head_dim + 1) * 4))


def _carve(workspace: torch.Tensor, layout: _Layout) -> dict[str, torch.Tensor]:
    have = workspace.numel() * workspace.element_size()
    if have < layout.nbytes:  # the planner sized the layout to fit: only a bug gets here
        raise _workspace_too_small(have, layout.nbytes)
    raw = workspace.view(torch.uint8).reshape(-1)
    h, d = layout.num_qo_heads, layout.head_dim
    return {
        "partial_lse": raw[layout.off_plse : layout.off_plse + layout.max_partial * h * 4]
        .view(torch.float32)
        .view(layout.max_partial, h),
        "lse_scratch": raw[layout.off_lse : layout.off_lse + layout.max_qo * h * 4]
        .view(torch.float32)
        .view(layout.max_qo, h),
        "partial_o": raw[layout.off_po : layout.off_po + layout.max_partial * h * d * 4]
        .view(torch.float32)
        .view(layout.max_partial, h, d),
    }


def as_int_tensor(name: str, x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        if x.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {x.dtype}")
        return x
    try:
        return torch.as_tensor(np.asarray(x, dtype=np.int64))
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an integer tensor, got {type(x).__name__}") from None


def as_dtype(name: str, x: Any, default: torch.dtype) -> torch.dtype:
    if x is None:
        return default
    if isinstance(x, torch.dtype):
        return x
    if isinstance(x, str):
        d = getattr(torch, x, None)
        if isinstance(d, torch.dtype):
            return d
    raise TypeError(f"{name} must be a torch.dtype or its name, got {x!r}")


def _index_range(indices: torch.Tensor, nnz: int) -> tuple[int, int] | None:
    """(min, max) of indices[:nnz]: a pass over every page id, so only when asked for."""
    if nnz == 0:
        return None
    head = indices[:nnz]
    return int(head.min()), int(head.max())


_CARVED: dict[tuple[Any, ...], dict[str, torch.Tensor]] = {}


def _carve_cached(workspace: torch.Tensor, layout: _Layout) -> dict[str, torch.Tensor]:
    """`_carve`, memoized per (workspace memory, layout): the views cost ~1 us each, and a
    wrapper built per call (the bundled benchmark's adapters) would otherwise redo them.
    At most 4 entries: the views keep their workspace alive until they are replaced."""
    key = (
        workspace.device,
        workspace.data_ptr(),
        workspace.numel() * workspace.element_size(),
        layout,
    )
    regions = _CARVED.get(key)
    if regions is None:
        regions = _carve(workspace, layout)
        if len(_CARVED) >= 4:
            _CARVED.pop(next(iter(_CARVED)))
        _CARVED[key] = regions
    return regions


def _head(t: torch.Tensor, n: int) -> torch.Tensor:
    """t[:n]; t itself when that is all of it (the cached view: no new view per plan)."""
    return t if t.shape[0] == n else t[:n]


@dataclass(frozen=True)
class DecodeSpec:
    """The attention a decode plan computes, fixed at plan time: heads, head_dim, page size,
    the dtypes q and the cache will have, and the variant: causal (bottom-right aligned),
    window_left (-1: none), logits_soft_cap (None or 0: none), sm_scale (None: 1/sqrt(D)),
    rope (ROPE_LLAMA's (rope_scale, rope_theta), or None)."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    causal: bool = False
    window_left: int = -1
    logits_soft_cap: float | None = None
    sm_scale: float | None = None
    rope: tuple[float, float] | None = None


@dataclass
class _Table:
    """A plan's page table on the host, validated: qo_indptr [B+1], indptr [B+1] and last
    [B] int64, kv_lens [B]; the page ids as given (a tensor); max_rows, the most packed rows
    (query tokens x group) of a request; single, every request has at most one query."""

    qo_indptr: np.ndarray
    indptr: np.ndarray
    last: np.ndarray
    kv_lens: np.ndarray
    indices: torch.Tensor
    batch: int
    total_qo: int
    max_rows: int
    single: bool


@dataclass
class _LaunchShape:
    """The launch a plan chose: tile height, SMs planned for, persistent CTAs, the chunk
    alignment and the default tactic that sized them."""

    block_m: int
    sm_count: int
    num_ctas: int
    align: int
    tactic: DecodeTactic


def _validate(spec: DecodeSpec) -> None:
    for name, val in (
        ("num_qo_heads", spec.num_qo_heads),
        ("num_kv_heads", spec.num_kv_heads),
        ("head_dim", spec.head_dim),
        ("page_size", spec.page_size),
    ):
        if not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val!r}")
    if spec.num_qo_heads % spec.num_kv_heads:
        raise ValueError(
            f"num_qo_heads ({spec.num_qo_heads}) must be a multiple of num_kv_heads "
            f"({spec.num_kv_heads})"
        )
    if spec.head_dim < 16 or spec.head_dim > 256:
        raise ValueError(f"head_dim must be in 16..256, got {spec.head_dim}")
    if spec.q_dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"q_data_type must be float16 or bfloat16, got {spec.q_dtype}")
    check_kv_dtype(spec.q_dtype, spec.kv_dtype)


def _read_table(
    qo_indptr: np.ndarray | None,
    indptr: Any,
    indices: Any,
    last_page_len: Any,
    spec: DecodeSpec,
) -> _Table:
    """The page table on the host (one device-to-host copy), validated."""
    indptr_t = as_int_tensor("indptr", indptr)
    indices_t = as_int_tensor("indices", indices)
    last_t = as_int_tensor("last_page_len", last_page_len)
    ip, lp, kv_lens = validate_page_table(indptr_t, indices_t, last_t, spec.page_size)
    batch = ip.shape[0] - 1
    group = spec.num_qo_heads // spec.num_kv_heads
    if qo_indptr is None:
        # Decode: one query per request, nothing to check (saves ~10 us of numpy calls).
        qo_indptr = np.arange(batch + 1, dtype=np.int64)
        total_qo, max_rows, single = batch, group, True
    else:
        total_qo = int(qo_indptr[-1])
        if qo_indptr.shape[0] != batch + 1:
            raise ValueError(
                f"qo_indptr has {qo_indptr.shape[0]} entries but indptr has {batch + 1}"
            )
        qo_lens = np.diff(qo_indptr)
        if (qo_lens < 0).any():
            raise ValueError("qo_indptr must be non-decreasing")
        # Causal with qo_len > kv_len: FlashInfer's bottom-right alignment, the first
        # qo_len - kv_len queries see no key (output 0, LSE -inf; the kernel masks them).
        max_rows = int(qo_lens.max()) * group if batch else group
        # With a single query per request, a window only trims the KV range: no masking.
        single = bool((qo_lens <= 1).all())
    return _Table(qo_indptr, ip, lp, kv_lens, indices_t, batch, total_qo, max_rows, single)


class Planner:
    """Shared plan machinery of the decode and cascade wrappers (one level each); the plans
    it makes run through `decode.launch.run_plan`."""

    def __init__(
        self,
        workspace: torch.Tensor,
        use_cuda_graph: bool,
        indices_buffer: torch.Tensor | None,
        max_batch: int | None,
        max_qo: int | None,
    ) -> None:
        self.workspace = workspace
        self.device = workspace.device
        self.use_cuda_graph = use_cuda_graph
        self.indices_buffer = indices_buffer
        self.max_batch = max_batch
        self.max_qo = max_qo
        self._graph_layout: _Layout | None = None
        self.plan: DevicePlan | None = None
        # The plan's integer arrays live in a buffer of this planner, not in the shared
        # workspace (FlashInfer's int workspace does the same): wrappers that share one
        # float workspace, as serving engines do, run only scratch through it, so one
        # wrapper's plan() never overwrites another's work list.
        self._ints_buf: torch.Tensor | None = None
        self._int_views: tuple[_Layout, dict[str, torch.Tensor]] | None = None
        self._counters = ArrivalCounters(self.device)

    def make(
        self,
        qo_indptr: np.ndarray | None,
        indptr: Any,
        indices: Any,
        last_page_len: Any,
        spec: DecodeSpec,
        *,
        disable_split_kv: bool = False,
        fixed_split_size: int | None = None,
        launch: DecodeLaunch | None = None,
    ) -> DevicePlan:
        """The plan of one page table (qo_indptr: host [B+1] query offsets, None for decode's
        one query per request), in steps: validate the spec, read the page table (one
        device-to-host copy), choose the launch, lay out the buffers, schedule the work
        items, upload them (one host-to-device copy)."""
        _validate(spec)
        table = _read_table(qo_indptr, indptr, indices, last_page_len, spec)
        shape = self._choose_launch(table, spec, launch)
        layout, max_work, max_partial = self._lay_out(table, spec, shape)
        kv_starts = None
        if spec.window_left >= 0 and table.single:
            kv_starts = np.maximum(table.kv_lens - 1 - spec.window_left, 0)
        host = plan_work(
            table.qo_indptr,
            table.kv_lens,
            table.indptr,
            shape.num_ctas,
            group_size=spec.num_qo_heads // spec.num_kv_heads,
            block_m=shape.block_m,
            kv_starts=kv_starts,
            rules=SplitRules(
                split_kv=not disable_split_kv,
                kv_chunk_size=fixed_split_size
                if fixed_split_size and fixed_split_size > 0
                else None,
                chunk_align=shape.align,
                min_chunk=min_chunk(table.batch, spec.num_kv_heads, shape.sm_count),
                max_work=max_work,
                max_partial_rows=max_partial,
            ),
            cost=WORK_COST,
        )
        if layout is None:
            layout = _Layout(
                shape.num_ctas,
                max(host.num_work, 1),
                max(table.total_qo, 1),
                max(host.num_partial_rows, min(1, max_partial)),
                spec.num_qo_heads,
                spec.head_dim,
            )
        regions = self._upload(host, layout)
        plan = self._device_plan(table, spec, shape, host, layout, regions, launch)
        self.plan = plan
        return plan

    def _choose_launch(
        self, table: _Table, spec: DecodeSpec, launch: DecodeLaunch | None
    ) -> _LaunchShape:
        """The tile height, the persistent grid, the chunk alignment and the default tactic,
        from the device's limits and the kernel variant."""
        block_m = block_m_for(table.max_rows)
        limits = platform.device_limits(self.device)
        sm_count = plan_sm_count(limits, launch)
        batch, num_kv_heads = table.batch, spec.num_kv_heads
        # The kernel variant picks the default tactic, which sizes the grid and the chunks.
        variant = dict(
            kv_itemsize=spec.kv_dtype.itemsize,
            rope=spec.rope is not None,
            latency=latency_regime(batch, num_kv_heads, sm_count),
            short=spec.rope is not None
            and batch > 0
            and short_requests(batch, num_kv_heads, sm_count, float(table.kv_lens.mean())),
        )
        num_ctas, align = launch_shape(
            sm_count,
            limits.shared_memory_per_block,
            spec.head_dim,
            spec.page_size,
            block_m,
            num_kv_heads,
            launch,
            **variant,
        )
        tactic = (launch or DEFAULT_LAUNCH).tactic_for(
            spec.head_dim, spec.page_size, block_m, **variant
        )
        return _LaunchShape(block_m, sm_count, num_ctas, align, tactic)

    def _lay_out(
        self, table: _Table, spec: DecodeSpec, shape: _LaunchShape
    ) -> tuple[_Layout | None, int | None, int]:
        """(layout, max_work, max_partial): in graph mode the fixed layout of every plan of
        this wrapper (checked against the first), else no layout yet (the schedule sizes it)
        and the partial rows the workspace holds."""
        ws_bytes = self.workspace.numel() * self.workspace.element_size()
        batch, total_qo = table.batch, table.total_qo
        num_qo_heads, head_dim = spec.num_qo_heads, spec.head_dim
        if not self.use_cuda_graph:
            max_partial = partial_capacity(ws_bytes, max(total_qo, 1), num_qo_heads, head_dim)
            if max_partial < 0:
                raise _workspace_too_small(ws_bytes, _align256(total_qo * num_qo_heads * 4))
            return None, None, max_partial
        if self.max_batch is not None and batch != self.max_batch:
            raise ValueError(
                f"CUDA-graph wrapper was built for batch_size {self.max_batch} (from the "
                f"indptr buffer), but plan got {batch}"
            )
        max_qo = self.max_qo if self.max_qo is not None else total_qo
        if total_qo > max_qo:
            raise ValueError(f"plan has {total_qo} query tokens; the wrapper holds {max_qo}")
        max_tiles = batch * max(1, -(-table.max_rows // shape.block_m))
        max_work = max_work_items(shape.num_ctas, max_tiles)
        capacity = partial_capacity(ws_bytes, max_qo, num_qo_heads, head_dim)
        if capacity < 0:
            raise _workspace_too_small(ws_bytes, _align256(max_qo * num_qo_heads * 4))
        # Partial rows: as many as the largest plan could use, or as the workspace holds
        # (plan_work then splits no further than that, for every plan of this wrapper).
        max_partial = min(max_work * max(1, max_qo // max(batch, 1)), capacity)
        layout = _Layout(shape.num_ctas, max_work, max_qo, max_partial, num_qo_heads, head_dim)
        if self._graph_layout is not None and self._graph_layout != layout:
            raise ValueError(
                "CUDA-graph wrapper re-planned with different heads/head_dim/batch: the "
                "captured graph's buffers would move; build a new wrapper"
            )
        self._graph_layout = layout
        return layout, max_work, layout.max_partial

    def _upload(self, host: WorkPlan, layout: _Layout) -> dict[str, torch.Tensor]:
        """The buffers' regions for `layout`, with the integer plan arrays written to them in
        one host-to-device copy: packed in a reused pinned buffer on a GPU (async copy),
        written in place when the workspace is on the CPU."""
        regions = {**_carve_cached(self.workspace, layout), **self._int_regions(layout)}
        cuda = self.device.type == "cuda"
        staging = host_staging(self.device) if cuda else None
        ints = staging.host_buffer(layout.ints) if staging else regions["ints"].numpy()
        c, w = layout.work_offset, layout.max_work * NUM_WORK_FIELDS
        ints[: host.num_ctas + 1] = host.work_indptr
        if c > host.num_ctas + 1:  # graph mode's idle CTAs run nothing (and the padding)
            ints[host.num_ctas + 1 : c] = host.work_indptr[-1]
        ints[c : c + host.work.size] = host.work.reshape(-1)
        ints[c + w : c + w + host.merge_info.size] = host.merge_info.reshape(-1)
        if staging:
            staging.upload(regions["ints"], layout.ints)
        return regions

    def _device_indices(self, indices_t: torch.Tensor) -> torch.Tensor:
        """The page ids as the kernel reads them: in the graph's indices buffer, or int32 on
        the device."""
        if self.indices_buffer is not None:
            if indices_t.numel() > self.indices_buffer.numel():
                raise ValueError(
                    f"indices has {indices_t.numel()} entries but paged_kv_indices_buffer holds "
                    f"{self.indices_buffer.numel()}"
                )
            if indices_t.data_ptr() != self.indices_buffer.data_ptr():
                self.indices_buffer[: indices_t.numel()].copy_(indices_t)
            return self.indices_buffer
        if indices_t.dtype == torch.int32 and indices_t.device == self.device:
            return indices_t  # what .to() returns, without its ~2 us of dispatch
        return indices_t.to(device=self.device, dtype=torch.int32)

    def _device_plan(
        self,
        table: _Table,
        spec: DecodeSpec,
        shape: _LaunchShape,
        host: WorkPlan,
        layout: _Layout,
        regions: dict[str, torch.Tensor],
        launch: DecodeLaunch | None,
    ) -> DevicePlan:
        nnz = int(table.indptr[-1])
        indices_t = table.indices
        dev_indices = self._device_indices(indices_t)
        # Page-id bounds: a pass over every id (and a sync on a GPU), so on a GPU only under
        # DEBUG_CHECKS; on the CPU check_run computes them on first use (the interpreter
        # would read out of bounds; the CPU path's cost is the reference anyway).
        index_range = (
            _index_range(indices_t, nnz) if indices_t.is_cuda and env.DEBUG_CHECKS.get() else None
        )
        total_qo, head_dim, rope = table.total_qo, spec.head_dim, spec.rope
        return DevicePlan(
            batch=table.batch,
            total_qo=total_qo,
            num_qo_heads=spec.num_qo_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim=head_dim,
            page_size=spec.page_size,
            group=spec.num_qo_heads // spec.num_kv_heads,
            block_m=shape.block_m,
            sm_scale=float(spec.sm_scale)
            if spec.sm_scale is not None
            else 1.0 / math.sqrt(head_dim),
            logits_soft_cap=spec.logits_soft_cap if spec.logits_soft_cap else None,
            window_left=spec.window_left,
            causal=spec.causal,
            q_dtype=spec.q_dtype,
            kv_dtype=spec.kv_dtype,
            host=host,
            # LPT fills CTAs in index order, so without a graph the empty tail is not launched.
            grid_ctas=layout.max_ctas
            if self.use_cuda_graph
            else max(1, min(host.num_ctas, host.num_work)),
            work_indptr=regions["work_indptr"],
            work=regions["work"],
            merge_info=_head(regions["merge_info"], total_qo),
            partial_o=regions["partial_o"],
            partial_lse=regions["partial_lse"],
            lse_scratch=_head(regions["lse_scratch"], total_qo),
            kv_indices=dev_indices,
            nnz_pages=nnz,
            index_range=index_range,
            always_merge=self.use_cuda_graph,
            mask_window=spec.window_left >= 0 and not table.single,
            sm_count=shape.sm_count,
            qo_indptr_host=table.qo_indptr,
            indptr_host=table.indptr,
            last_host=table.last,
            launch=launch,
            rope=rope,
            # Made here, not at run: a run may be captured in a CUDA graph.
            rope_tables=None
            if rope is None
            else (
                rope_table(head_dim, rope, self.device, spec.q_dtype),
                rope_table(head_dim, rope, self.device),
            ),
            default_tactic=shape.tactic,
            counters=self._counters.at_least(layout.max_partial * spec.num_qo_heads),
        )

    def _int_regions(self, layout: _Layout) -> dict[str, torch.Tensor]:
        """Views of this planner's integer buffer for `layout` (grown when too small; in
        graph mode the layout, so the buffer, never changes after the first plan)."""
        if self._int_views is not None and self._int_views[0] == layout:
            return self._int_views[1]
        buf = self._ints_buf
        if buf is None or buf.numel() < layout.ints:
            buf = torch.empty(layout.ints, dtype=torch.int32, device=self.device)
            self._ints_buf = buf
        ints = buf[: layout.ints]
        c, w = layout.work_offset, layout.max_work * NUM_WORK_FIELDS
        views = {
            "ints": ints,
            "work_indptr": ints[: layout.max_ctas + 1],
            "work": ints[c : c + w].view(layout.max_work, NUM_WORK_FIELDS),
            "merge_info": ints[c + w : c + w + layout.max_qo * 3].view(layout.max_qo, 3),
        }
        self._int_views = (layout, views)
        return views

    def check_run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor | None,
        lse: torch.Tensor | None,
        q_shape: tuple[int, ...],
    ) -> DevicePlan:
        plan = self.plan
        if plan is None:
            raise RuntimeError("run() called before plan(): call plan() once per step first")
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"q must be a tensor, got {type(q).__name__}")
        if tuple(q.shape) != q_shape:
            raise ValueError(
                f"q must have shape {q_shape} (tokens, num_qo_heads, head_dim as planned), got "
                f"{tuple(q.shape)}"
            )
        if q.dtype != plan.q_dtype:
            raise TypeError(
                f"q dtype {q.dtype} differs from the planned q_data_type {plan.q_dtype}"
            )
        if q.device != self.device:
            raise ValueError(f"q is on {q.device} but the workspace buffer is on {self.device}")
        if q.stride(-1) != 1:
            raise ValueError("q must be contiguous in its last dimension")
        expect = (plan.page_size, plan.num_kv_heads, plan.head_dim)
        for name, t in (("k", k), ("v", v)):
            if tuple(t.shape[1:]) != expect:
                raise ValueError(
                    f"paged_kv_cache {name}: expected pages of (page_size, num_kv_heads, "
                    f"head_dim) = {expect} as planned, got {tuple(t.shape[1:])}"
                )
            if t.dtype != plan.kv_dtype:
                raise TypeError(
                    f"paged_kv_cache dtype {t.dtype} differs from the planned kv_data_type "
                    f"{plan.kv_dtype}"
                )
            if t.device != self.device:
                raise ValueError(f"paged_kv_cache is on {t.device}, expected {self.device}")
            if t.stride(-1) != 1:
                raise ValueError("paged_kv_cache must be contiguous in head_dim")
        if plan.index_range is None and plan.kv_indices.device.type == "cpu" and plan.nnz_pages:
            plan.index_range = _index_range(plan.kv_indices, plan.nnz_pages)
        if plan.index_range is not None:
            lo, hi = plan.index_range
            if lo < 0 or hi >= k.shape[0]:
                raise ValueError(
                    f"indices hold page ids in [{lo}, {hi}] but the cache has {k.shape[0]} pages"
                )
        if out is not None:
            if tuple(out.shape) != q_shape or out.dtype != q.dtype or out.device != q.device:
                raise ValueError(
                    f"out must be a {q.dtype} tensor of shape {q_shape} on {q.device}, got "
                    f"{out.dtype} {tuple(out.shape)} on {out.device}"
                )
            if out.stride(-1) != 1:
                raise ValueError("out must be contiguous in its last dimension")
        if lse is not None:
            want = q_shape[:2]
            if (
                tuple(lse.shape) != want
                or lse.dtype != torch.float32
                or lse.device != q.device
                or not lse.is_contiguous()
            ):
                raise ValueError(
                    f"lse must be a contiguous float32 tensor of shape {want} on {q.device}, got "
                    f"{lse.dtype} {tuple(lse.shape)} on {lse.device}"
                )
        return plan

"""Host cost of the attention wrappers' plan() (and of run()'s host path), on the CPU.

The bundled benchmark times attention as plan() + run() per call, as the Definition has no
separate planning step, so the Python planner is part of what is measured. This script
times, per shape:
- plan_us: `wrapper.plan(...)` on a wrapper that is reused (a serving engine's pattern);
- call_us: a fresh wrapper + plan() on a cached workspace, the adapter pattern of
  flashtune/bench/entry_points.py;
- run_host_us: run() with the kernel launch stubbed out (validation, dispatch, views), as
  if a kernel could run (on the CPU it would otherwise compute the reference);
- cycle_us: a fresh wrapper + plan() + run() (launch stubbed): the host time the bundled
  benchmark pays per timed call (prefill builds its work list lazily in the old code).

Index tensors live on the CPU, and additionally on CUDA when a GPU is present (there the
one device-to-host copy of indptr is part of the plan). Shapes: decode h32/kv8/d128 at
batch 1..256, KV 512..32k, page size 16 and 1; prefill (paged ps16 and ragged) at batch
1..16, L 512..8192. KV lengths are drawn in [KV/2, KV] with a fixed seed.

    python benchmarks/bench_plan.py [--quick] [--profile decode|prefill] [--label NAME]
        [--only decode|prefill_paged|prefill_ragged]

Rows go to benchmarks/results/plan.jsonl (solution "flashtune", gpu = this machine).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import math
import pstats
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter  # noqa: E402

from flashtune import platform  # noqa: E402
from flashtune.ops.attention import decode, prefill  # noqa: E402
from flashtune.timing import measure  # noqa: E402

HQ, HKV, D = 32, 8, 128
WORKSPACE_BYTES = 128 * 2**20
_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def _workspace(device: torch.device) -> torch.Tensor:
    if device not in _WORKSPACES:
        _WORKSPACES[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _WORKSPACES[device]


def _lens(batch: int, max_len: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(max(1, max_len // 2), max_len + 1, (batch,), generator=g)


def _indptr(counts: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(counts.numel() + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(counts, 0)
    return out


def _page_table(kv_lens: torch.Tensor, page_size: int, device: torch.device):
    pages = (kv_lens + page_size - 1) // page_size
    indptr = _indptr(pages)
    nnz = int(indptr[-1])
    # Pages in a shuffled order, as a paged allocator hands them out.
    indices = torch.randperm(nnz, generator=torch.Generator().manual_seed(0)).to(torch.int32)
    last = (kv_lens - (pages - 1) * page_size).to(torch.int32)
    return indptr.to(device), indices.to(device), last.to(device)


def _us(fn: Callable[[], Any], reps: int) -> float:
    t = measure(fn, [], warmup=max(3, reps // 10), repetitions=reps, max_seconds=3.0)
    return t.median_ms * 1e3


@contextlib.contextmanager
def _stub_launch() -> Iterator[None]:
    """run() as on a GPU, minus the kernels: the host path alone."""
    saved = (decode.launch.launch_kernels, prefill.launch.launch, platform.kernels_available)

    def prefill_launch(plan, q, k, v, out, lse, tactic) -> None:  # noqa: ANN001
        # The work list is host work of run (built lazily before flashtune's plan built it).
        plan.work_list(tactic.tokens_per_tile(plan.group_size), tactic.block_n)

    decode.launch.launch_kernels = lambda *a, **k: None  # type: ignore[assignment]
    prefill.launch.launch = prefill_launch  # type: ignore[assignment]
    platform.kernels_available = lambda device: True  # type: ignore[assignment]
    try:
        yield
    finally:
        decode.launch.launch_kernels, prefill.launch.launch, platform.kernels_available = saved


# --------------------------------------------------------------------------- cases


def decode_case(batch: int, kv: int, page_size: int, device: torch.device):
    indptr, indices, last = _page_table(_lens(batch, kv, batch * 7 + kv), page_size, device)
    ws = _workspace(device)
    args = (indptr, indices, last, HQ, HKV, D, page_size)
    kw = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=D**-0.5)
    wrapper = decode.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")

    def plan() -> None:
        wrapper.plan(*args, **kw)

    def call() -> None:
        decode.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD").plan(*args, **kw)

    q = torch.empty(batch, HQ, D, dtype=torch.bfloat16, device=device)
    k = torch.empty(int(indices.max()) + 1, page_size, HKV, D, dtype=torch.bfloat16, device=device)

    def run() -> None:
        wrapper.run(q, (k, k), return_lse=True)

    def cycle() -> None:
        w = decode.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(*args, **kw)
        w.run(q, (k, k), return_lse=True)

    return plan, call, run, cycle


def prefill_case(batch: int, length: int, paged: bool, device: torch.device):
    lens = _lens(batch, length, batch * 13 + length)
    qo_indptr = _indptr(lens).to(device)
    ws = _workspace(device)
    kw = dict(
        causal=True, sm_scale=D**-0.5, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16
    )
    q = torch.empty(int(lens.sum()), HQ, D, dtype=torch.bfloat16, device=device)
    if paged:
        indptr, indices, last = _page_table(lens, 16, device)
        args = (qo_indptr, indptr, indices, last, HQ, HKV, D, 16)
        cls: Any = prefill.BatchPrefillWithPagedKVCacheWrapper
        k = torch.empty(int(indices.max()) + 1, 16, HKV, D, dtype=torch.bfloat16, device=device)
        run_args: tuple = (q, (k, k))
    else:
        args = (qo_indptr, qo_indptr, HQ, HKV, D)
        cls = prefill.BatchPrefillWithRaggedKVCacheWrapper
        k = torch.empty(int(lens.sum()), HKV, D, dtype=torch.bfloat16, device=device)
        run_args = (q, k, k)
    wrapper = cls(ws, "NHD")

    def plan() -> None:
        wrapper.plan(*args, **kw)

    def call() -> None:
        cls(ws, "NHD").plan(*args, **kw)

    def run() -> None:
        wrapper.run(*run_args, return_lse=True)

    def cycle() -> None:
        w = cls(ws, "NHD")
        w.plan(*args, **kw)
        w.run(*run_args, return_lse=True)

    return plan, call, run, cycle


def cases(quick: bool) -> Iterator[tuple[str, dict[str, Any], Callable[[torch.device], Any]]]:
    batches = (1, 16, 64, 256)
    kvs = (512, 2048, 32768) if quick else (512, 2048, 8192, 32768)
    for ps in (16, 1):
        for b in batches:
            for kv in kvs:
                shape = dict(batch=b, kv=kv, page_size=ps, h=HQ, kv_heads=HKV, d=D)
                yield "decode", shape, lambda dev, b=b, kv=kv, ps=ps: decode_case(b, kv, ps, dev)
    for paged in (True, False):
        for b in (1, 4, 16):
            for length in (512, 8192) if quick else (512, 2048, 8192):
                op = "prefill_paged" if paged else "prefill_ragged"
                shape = dict(batch=b, L=length, h=HQ, kv_heads=HKV, d=D)
                if paged:
                    shape["page_size"] = 16
                yield op, shape, lambda dev, b=b, n=length, p=paged: prefill_case(b, n, p, dev)


# --------------------------------------------------------------------------- main


def profile(op: str, device: torch.device) -> None:
    """cProfile of 200 plans at the largest shape of `op`."""
    plan, _, _, _ = (
        decode_case(256, 32768, 16, device)
        if op == "decode"
        else prefill_case(16, 8192, op == "prefill_paged", device)
    )
    plan()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        plan()
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--profile", choices=["decode", "prefill_paged", "prefill_ragged"])
    ap.add_argument("--label", default="", help="stored in each row (e.g. before/after)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument(
        "--only", choices=["decode", "prefill_paged", "prefill_ragged"], help="time one op only"
    )
    ap.add_argument(
        "--sm-count",
        type=int,
        default=132,
        help="SMs the CPU plan assumes (H100/H200: 132), for a GPU's CTA count",
    )
    a = ap.parse_args()
    if not torch.cuda.is_available():
        # The CPU plan otherwise assumes 2 SMs (enough for the interpreter), which would
        # time a much smaller scheduling problem than a GPU's.
        decode.plan.plan_sm_count = lambda *_: a.sm_count  # type: ignore[assignment]
        # Likewise prefill's tactic -1 on Hopper (64x64 tiles), not the interpreter's 32x16.
        hopper = prefill.config.PrefillTactic(64, 64, True, 4, 3, tma=True)
        prefill.plan.pick_default = lambda plan, device: hopper  # type: ignore[assignment]
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    if a.profile:
        profile(a.profile, devices[-1])
        return
    writer = None if a.no_write else RowWriter("plan")
    table = []
    for device in devices:
        for op, shape, make in cases(a.quick):
            if a.only and op != a.only:
                continue
            plan, call, run, cycle = make(device)
            plan_us = _us(plan, a.reps)
            call_us = _us(call, a.reps)
            plan()
            with _stub_launch():
                run_us = _us(run, a.reps)
                cycle_us = _us(cycle, a.reps)
            table.append((device.type, op, shape, plan_us, call_us, run_us, cycle_us))
            if writer is not None:
                writer.write(
                    f"{op}.plan",
                    {**shape, "index_device": device.type},
                    "flashtune",
                    plan_us / 1e3,
                    call_ms=call_us / 1e3,
                    run_host_ms=run_us / 1e3,
                    cycle_ms=cycle_us / 1e3,
                    label=a.label,
                )
    print(
        f"{'idx':4} {'op':15} {'shape':30} {'plan_us':>8} {'call_us':>8} {'run_us':>7} "
        f"{'cycle_us':>8}"
    )
    for dev, op, shape, p, c, r, y in table:
        s = " ".join(f"{k}{v}" for k, v in shape.items() if k in ("batch", "kv", "L", "page_size"))
        print(f"{dev:4} {op:15} {s:30} {p:8.1f} {c:8.1f} {r:7.1f} {y:8.1f}")
    for col, name in ((3, "plan_us"), (6, "cycle_us")):
        geo = math.exp(sum(math.log(row[col]) for row in table) / len(table))
        print(f"geomean {name} {geo:.1f}")


if __name__ == "__main__":
    main()

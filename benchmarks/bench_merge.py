"""The split-KV merge kernel (`flashtune.ops.attention.merge.merge_partials`): its tiles
(`merge_tiles`) against the former fixed tiling and the best of a sweep (GPU).

    python benchmarks/bench_merge.py

Shapes: rows t x heads h x head_dim d with n partials a row, as decode leaves them: MLA (16
and 128 heads x 512) and GQA (32 and 8 heads x 128), t 1-512, 2-64 partials. Each tiling is
timed as 200 calls back to back in one CUDA graph, the best of 5 replays divided by 200: the
merge runs right after the attention kernel wrote the partials, so they are warm in L2 here
too, and a ~3 us kernel is below what a cold-L2 timer resolves. Rows go to
benchmarks/results/merge.jsonl: "merge_tiles" (what merge_partials runs), "former" (32
partials a step, the whole head_dim or 32-wide slices under as many (row, head) pairs as
SMs, 4 warps), and the best and second best of the sweep (BLOCK_S 4-32, BLOCK_D 64 to the
whole head_dim, 2 or 4 warps), each with its tiling.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter  # noqa: E402

from flashtune.ops.attention.merge import merge_partials, merge_tiles  # noqa: E402

SHAPES = [  # (t, h, d, partials a row)
    (64, 16, 512, 2),
    (16, 16, 512, 8),
    (128, 16, 512, 2),
    (1, 16, 512, 64),
    (256, 16, 512, 2),
    (64, 128, 512, 2),
    (32, 32, 128, 4),
    (1, 32, 128, 32),
    (256, 32, 128, 2),
    (512, 8, 128, 4),
]
CALLS = 200


def _case(t: int, h: int, d: int, n: int) -> tuple[torch.Tensor, ...]:
    po = torch.randn(t * n, h, d, device="cuda")
    plse = torch.randn(t * n, h, device="cuda") * 4
    info = torch.stack(
        [torch.arange(t) * n, torch.full((t,), n), torch.ones(t, dtype=torch.long)], 1
    )
    out = torch.empty(t, h, d, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(t, h, device="cuda")
    return po, plse, info.int().cuda(), out, lse


def _launch(args: tuple[torch.Tensor, ...], tiles: tuple[int, int, int]) -> None:
    merge_partials(*args, tiles=tiles)


def _back_to_back_us(fn: Callable[[], None]) -> float:
    for _ in range(3):
        fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / CALLS)
    return best


def _time_tiles(args: tuple[torch.Tensor, ...], tiles: tuple[int, int, int]) -> float:
    return _back_to_back_us(lambda: _launch(args, tiles))


def _former(t: int, h: int, d: int, sms: int) -> tuple[int, int, int]:
    full = triton.next_power_of_2(d)
    return 32, (min(full, 32) if t * h < sms else full), 4


def main() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    writer = RowWriter("merge")
    for t, h, d, n in SHAPES:
        args = _case(t, h, d, n)
        shape = {"rows": t, "heads": h, "head_dim": d, "partials": n}
        _launch(args, _former(t, h, d, sms))
        expect = args[3].float().clone()
        full = triton.next_power_of_2(d)
        sweep = [
            c
            for c in itertools.product((4, 8, 16, 32), (64, 128, 256, 512), (2, 4))
            if c[1] <= full
        ]
        timed = []
        for tiles in sweep:
            _launch(args, tiles)
            err = (args[3].float() - expect).abs().max().item()
            if err > 1e-2:
                raise SystemExit(f"tiles {tiles} disagree with the former tiling: {err}")
            timed.append((_time_tiles(args, tiles), tiles))
        timed.sort()
        ours = merge_tiles(t, h, d, sms)
        former = _former(t, h, d, sms)
        line = []
        for label, us, tiles in (
            ("merge_tiles", _time_tiles(args, ours), ours),
            ("former", _time_tiles(args, former), former),
            ("sweep_best", *timed[0]),
            ("sweep_second", *timed[1]),
        ):
            writer.write("merge_partials", shape, label, us / 1e3, tiles=list(tiles))
            line.append(f"{label} {tiles} {us:.2f}")
        print(f"t{t} h{h} d{d} n{n} (us): " + "  ".join(line), flush=True)


if __name__ == "__main__":
    main()

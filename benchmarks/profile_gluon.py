"""One call of each Gluon sm_90 kernel, and of the peer on the same inputs, for Nsight Compute
(where the per-block time goes: tensor-pipe use, stall reasons, L2 and shared-memory traffic).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section WarpStateStats python benchmarks/profile_gluon.py [--cases mla,gqa]

Each case is planned and run (compiled, warmed) first; only the profiled call runs between
torch.cuda.profiler.start() and stop(), so ncu (with --profile-from-start off) sees that call's
kernels and nothing else. Cases:
- mla: MLA prefill, 4 requests of 1024 queries over 4096 cached tokens, 16 heads, page 64,
  causal, through flashtune's wrapper (the Gluon kernel, and its staging copies) and
  FlashInfer's (`backend="auto"`, FA3 on Hopper) where it imports;
- gqa: ragged causal prefill, 1 request of 8192 tokens, 32 / 8 heads, d128, through
  flashtune's wrapper and FlashInfer's FA3;
- mla-decode: MLA decode (16 heads, page 64) at b64 x 1k and b16 x 4k, the Triton kernel
  and its merge, and FlashInfer's.
Without ncu it prints each call's time (CUDA events, warm): a check that the cases run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _flashinfer() -> Any:
    try:
        import flashinfer

        return flashinfer
    except Exception as exc:  # the peer is optional here
        print(f"FlashInfer unavailable ({exc!r}): profiling flashtune alone")
        return None


def _mla_pair(
    fi: Any, name: str, batch: int, kv_len: int, qo_len: int
) -> list[tuple[str, Callable[[], Any]]]:
    """flashtune's MLA wrapper and FlashInfer's (`backend="auto"`, where it imports) planned
    on the same causal batch (page 64): bench_mla's inputs."""
    from bench_mla import _case, _plan

    from flashtune.ops.mla import BatchMLAPagedAttentionWrapper

    table, args = _case(batch, kv_len, qo_len, 64)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    w = _plan(BatchMLAPagedAttentionWrapper(ws), table, 64, True)
    calls = [(f"flashtune {name}", lambda: w.run(*args))]
    if fi is not None:
        fws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        fw = _plan(fi.mla.BatchMLAPagedAttentionWrapper(fws, backend="auto"), table, 64, True)
        calls.append((f"flashinfer {name}", lambda: fw.run(*args)))
    return calls


def mla_calls(fi: Any) -> list[tuple[str, Callable[[], Any]]]:
    return _mla_pair(fi, "mla prefill", 4, 4096, 1024)


def gqa_calls(fi: Any) -> list[tuple[str, Callable[[], Any]]]:
    from bench_prefill import flashinfer_prefill, make_batch, ours

    x = make_batch(1, 8192)
    fn, args = ours("ragged", x)
    calls = [("flashtune gqa ragged 1x8k", lambda: fn(*args))]
    if fi is not None:
        ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        pf, pa, _ = flashinfer_prefill(fi, "ragged", x, ws, "fa3")
        calls.append(("flashinfer gqa ragged 1x8k", lambda: pf(*pa)))
    return calls


def mla_decode_calls(fi: Any) -> list[tuple[str, Callable[[], Any]]]:
    """MLA decode at 16 heads, page 64, where flashtune trails FlashInfer on H200 (bench_mla
    decode): 64 requests over 1024 tokens and 16 over 4096 (the Triton kernel, the merge)."""
    return [
        call
        for batch, kv_len in ((64, 1024), (16, 4096))
        for call in _mla_pair(fi, f"mla decode b{batch}x{kv_len}", batch, kv_len, 1)
    ]


CASES = {"mla": mla_calls, "gqa": gqa_calls, "mla-decode": mla_decode_calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="mla,gqa", help=f"of {', '.join(CASES)}")
    opts = parser.parse_args()
    fi = _flashinfer()
    for case in opts.cases.split(","):
        for name, call in CASES[case](fi):
            for _ in range(3):  # compile, plan caches, warm
                call()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.profiler.start()
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"{name}: {start.elapsed_time(end) * 1e3:.1f} us (warm, one call)", flush=True)


if __name__ == "__main__":
    main()

"""Block-sparse attention (issue 18): flashtune's BlockSparseAttentionWrapper vs FlashInfer's,
and at density 1.0 vs flashtune's dense prefill of the same shape (the format's cost).

The bundled dataset's shapes: 32 query / 8 KV heads, head_dim 128, bf16, R x C blocks
64x64 (M = N = 8192), 16x16 (4096), 4x4 (2048) and 1x16 (2048); BSR patterns from
`flashtune.ops.attention.sparse.bsr_pattern` (first and diagonal block of every row kept) at
densities 0.2, 0.7, 0.9 and 1.0. Both wrappers are planned once, outside the timed region,
as their users run them; every solution is checked against the op's reference first, then timed with flashtune.timing.measure (cold L2, a CUDA graph of 20 calls).
A ratio is taken only between two results timed the same way. FLOPs: 4 * Hq * D * (kept
query-key pairs). Rows: benchmarks/results/block_sparse.jsonl.

    python benchmarks/bench_block_sparse.py              # the grid (GPU)
    python benchmarks/bench_block_sparse.py --quick      # 2 block sizes, densities 0.7 / 1.0
    python benchmarks/bench_block_sparse.py --device cpu --quick   # the code path, tiny
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RowWriter  # noqa: E402

from flashtune.ops.attention.prefill import BatchPrefillWithRaggedKVCacheWrapper  # noqa: E402
from flashtune.ops.attention.sparse import BlockSparseAttentionWrapper, bsr_pattern  # noqa: E402
from flashtune.ops.attention.sparse.schema import block_sparse_attention_ref  # noqa: E402
from flashtune.timing import measure  # noqa: E402

HQ, HKV, D = 32, 8, 128
SHAPES = [(64, 64, 8192), (16, 16, 4096), (4, 4, 2048), (1, 16, 2048)]  # R, C, M = N
DENSITIES = [0.2, 0.7, 0.9, 1.0]


def _flashinfer() -> Any:
    try:
        import flashinfer.sparse

        return flashinfer
    except Exception:  # noqa: BLE001 - the peer is optional: its rows are left out
        return None


def solutions(x: dict[str, Any], fi: Any) -> dict[str, Callable[..., torch.Tensor]]:
    """name -> a call on (q, k, v); each planned here, once."""
    dev, R, C, M, N = x["device"], x["R"], x["C"], x["M"], x["N"]
    out: dict[str, Callable[..., torch.Tensor]] = {}
    ws = torch.empty(128 << 20 if dev.type == "cuda" else 1 << 20, dtype=torch.uint8, device=dev)
    ft = BlockSparseAttentionWrapper(ws)
    types = dict(q_data_type=x["dtype"], kv_data_type=x["dtype"], o_data_type=x["dtype"])
    ft.plan(x["indptr"], x["indices"], M, N, R, C, HQ, HKV, D, **types)
    out["flashtune"] = ft.run
    if fi is not None:
        fws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
        w = fi.sparse.BlockSparseAttentionWrapper(fws)
        w.plan(
            x["indptr"].to(dev), x["indices"].to(dev), M, N, R, C, HQ, HKV, D, **types
        )  # fmt: skip
        out["flashinfer"] = w.run
    if x["density"] == 1.0:
        dense = BatchPrefillWithRaggedKVCacheWrapper(ws)
        dense.plan(
            torch.tensor([0, M], dtype=torch.int32),
            torch.tensor([0, N], dtype=torch.int32),
            HQ,
            HKV,
            D,
            q_data_type=x["dtype"],
        )
        out["flashtune_dense"] = dense.run
    return out


def make_inputs(R: int, C: int, n: int, density: float, device: torch.device) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    indptr, indices = bsr_pattern(n // R, n // C, R, C, density, gen)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    q, k, v = (torch.randn(n, h, D, generator=gen).to(device, dtype) for h in (HQ, HKV, HKV))
    v = v + 0.5  # a mean away from 0: an all-zero output cannot pass the check
    return dict(
        R=R, C=C, M=n, N=n, density=density, indptr=indptr, indices=indices,
        q=q, k=k, v=v, device=device, dtype=dtype,
    )  # fmt: skip


def expected(x: dict[str, Any]) -> torch.Tensor:
    """The op's reference (k/v as [N / C, C, Hkv, D] column blocks, as its Definition has)."""
    k, v = (t.unflatten(0, (x["N"] // x["C"], x["C"])) for t in (x["k"], x["v"]))
    idx = (x["indptr"].to(x["device"]), x["indices"].to(x["device"]))
    out, _ = block_sparse_attention_ref(x["q"], k, v, *idx, 1 / math.sqrt(D))
    return out.float()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 block sizes, densities 0.7 and 1.0")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    opts = ap.parse_args(argv)
    device = torch.device(opts.device)
    shapes, densities = SHAPES, DENSITIES
    if opts.quick:
        shapes, densities = [SHAPES[1], SHAPES[3]], [0.7, 1.0]
    if device.type == "cpu":  # the interpreter: the code path at a tiny size
        shapes = [(R, C, 32) for R, C, _ in shapes]
    fi = _flashinfer() if device.type == "cuda" else None
    writer = RowWriter("block_sparse")
    vs_fi: list[float] = []
    vs_dense: list[float] = []
    for R, C, n in shapes:
        for density in densities:
            x = make_inputs(R, C, n, density, device)
            ref = expected(x) if n * n <= 4096 * 4096 else None
            pairs = int(x["indptr"][-1]) * R * C
            shape = {"R": R, "C": C, "M": n, "N": n, "density": density, "nnz": pairs // (R * C)}
            got: dict[str, tuple[float, str]] = {}
            for name, fn in solutions(x, fi).items():
                args = [x["q"], x["k"], x["v"]]
                out = fn(*args)
                if ref is not None:
                    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
                t = measure(
                    fn, args, warmup=3, repetitions=10 if device.type == "cuda" else 1,
                    cold_l2=device.type == "cuda", use_cuda_graph=device.type == "cuda",
                )  # fmt: skip
                got[name] = (t.median_ms, t.method)
                tflops = 4.0 * HQ * D * pairs / (t.median_ms * 1e-3) / 1e12
                writer.write(
                    "block_sparse", shape, name, t.median_ms, timing=t.method, tflops=tflops
                )
            ft = got["flashtune"]
            line = "  ".join(f"{k} {ms * 1e3:9.1f} us" for k, (ms, _) in got.items())
            print(f"R={R:2d} C={C:2d} M=N={n:5d} density={density:.1f}  {line}", flush=True)
            if "flashinfer" in got and got["flashinfer"][1] == ft[1] and density < 1.0:
                vs_fi.append(got["flashinfer"][0] / ft[0])
            if "flashtune_dense" in got and got["flashtune_dense"][1] == ft[1]:
                vs_dense.append(got["flashtune_dense"][0] / ft[0])
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")  # noqa: E731
    summary = {
        "flashtune_vs_flashinfer": ("vs FlashInfer (densities < 1, timed alike)", vs_fi),
        "flashtune_vs_dense": ("block-sparse at density 1.0 vs its dense prefill", vs_dense),
    }
    print()
    for label, (text, ratios) in summary.items():
        print(f"flashtune {text}: {geo(ratios):.2f}x over {len(ratios)}")
        shape_note = {"shapes": len(shapes)}
        writer.write("summary", shape_note, label, None, geomean=geo(ratios), n=len(ratios))


if __name__ == "__main__":
    main()

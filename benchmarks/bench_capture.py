"""Capture overhead.

CPU (per op call, microseconds, median of 2,000-call loops):
- capture off: a schema'd op vs its undecorated function (target < 1 us);
- capture on, dump_none: shape_only in steady state (every shape already seen: the fast
  path), and keep_all (every call becomes a queued record; the queue is kept from filling).
GPU (when CUDA is available): one eager decode step of a small model built from flashtune's
schema'd ops (rmsnorm, gemm, silu_and_mul where they carry schemas; toy torch ops otherwise),
off vs capture on with dump_none (target < 5% slower).

    python benchmarks/bench_capture.py
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "capture"))

from _capture_toys import TOY_GEMM, toy_gemm, toy_norm  # noqa: E402
from common import RowWriter  # noqa: E402

from flashtune.capture import CaptureConfig, capture  # noqa: E402
from flashtune.schema import ApiOp, api  # noqa: E402
from flashtune.timing import measure  # noqa: E402

LOOP = 2000


def per_call_us(fn, *args) -> float:
    def loop(*a):
        for _ in range(LOOP):
            fn(*a)

    t = measure(loop, list(args), warmup=3, repetitions=15, cold_l2=False)
    return t.median_ms * 1e3 / LOOP


def _noop_gemm(A, B):
    return None


# The same schema on a function that does nothing: the wrapper's own cost is then not buried
# in the noise of a real op's few microseconds.
noop_gemm = api(schema=TOY_GEMM)(_noop_gemm)


def cpu_rows(writer: RowWriter) -> list[tuple[str, float, float]]:
    torch.set_num_threads(1)
    a, b = torch.randn(4, 8), torch.randn(8, 8)
    # Interleaved, best of 5: other processes share this CPU.
    raw_noop = min(per_call_us(_noop_gemm, a, b) for _ in range(5))
    off_noop = min(per_call_us(noop_gemm, a, b) for _ in range(5))
    off = min(per_call_us(toy_gemm, a, b) for _ in range(3))
    root = Path(tempfile.mkdtemp(prefix="bench-capture-"))
    with capture(dataset=root, default=CaptureConfig("dump_none", "shape_only")):
        toy_gemm(a, b)
        steady = per_call_us(toy_gemm, a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with capture(
            dataset=root / "all",
            default=CaptureConfig("dump_none", "keep_all"),
            max_records=1 << 20,
        ) as cap:
            keep_all = per_call_us(toy_gemm, a, b)
        dropped = cap.stats["dropped"]
    rows = [
        ("capture off: no-op schema'd op vs bare function", off_noop, off_noop - raw_noop),
        ("capture on, dump_none, shape_only (steady)", steady, steady - off),
        (f"capture on, dump_none, keep_all (dropped {dropped})", keep_all, keep_all - off),
    ]
    for label, total, overhead in rows:
        writer.write(
            "capture_per_call",
            {"M": 4, "N": 8, "K": 8},
            label,
            total / 1e3,
            overhead_us=round(overhead, 3),
            device="cpu",
        )
    return rows


# --------------------------------------------------------------------------- GPU decode step


def _ops():
    """(rmsnorm, gemm, silu_and_mul, names): flashtune's schema'd ops where they exist."""
    names = []
    try:
        from flashtune.ops.norm import rmsnorm
    except Exception:  # noqa: BLE001
        rmsnorm = None
    if not isinstance(rmsnorm, ApiOp):
        rmsnorm = lambda x, w: toy_norm(x, w)  # noqa: E731
        names.append("rmsnorm:toy")
    try:
        from flashtune.ops.gemm import gemm
    except Exception:  # noqa: BLE001
        gemm = None
    if not isinstance(gemm, ApiOp):
        gemm = toy_gemm
        names.append("gemm:toy")
    try:
        from flashtune.ops.activation import silu_and_mul
    except Exception:  # noqa: BLE001
        silu_and_mul = None
    if not isinstance(silu_and_mul, ApiOp):
        silu_and_mul = None  # plain torch below: not schema'd, not captured
        names.append("silu:torch")
    return rmsnorm, gemm, silu_and_mul, names


def gpu_rows(writer: RowWriter) -> list[tuple[str, float, float]]:
    rmsnorm, gemm, silu_and_mul, substitutes = _ops()
    hidden, inter, layers, batch = 2048, 5632, 8, 1  # TinyLlama-1.1B-sized layers
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, device=dev, generator=g) * shape[-1] ** -0.5).to(dt)

    weights = [
        dict(
            n1=torch.ones(hidden, device=dev, dtype=dt),
            qkv=rnd(3 * hidden, hidden),
            o=rnd(hidden, hidden),
            n2=torch.ones(hidden, device=dev, dtype=dt),
            gu=rnd(2 * inter, hidden),
            down=rnd(hidden, inter),
        )
        for _ in range(layers)
    ]

    def step(x):
        nonlocal rmsnorm, gemm, silu_and_mul
        for w in weights:
            h = rmsnorm(x, w["n1"])
            qkv = gemm(h, w["qkv"])
            x = x + gemm(qkv[:, :hidden].contiguous(), w["o"])  # attention elided
            h = rmsnorm(x, w["n2"])
            gu = gemm(h, w["gu"])
            if silu_and_mul is not None:
                a = silu_and_mul(gu)
            else:
                a = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
            x = x + gemm(a, w["down"])
        return x

    x = rnd(batch, hidden)
    try:
        step(x)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a broken op must not hide the capture numbers
        print(f"flashtune ops failed ({exc!r}); timing toy schema'd ops instead")
        rmsnorm, gemm, silu_and_mul = toy_norm, toy_gemm, None
        substitutes = ["rmsnorm:toy", "gemm:toy", "silu:torch", "reason:op-failure"]
    calls_per_step = layers * (6 if silu_and_mul is None else 7)
    off = measure(step, [x], warmup=20, repetitions=100, cold_l2=False).median_ms
    root = Path(tempfile.mkdtemp(prefix="bench-capture-gpu-"))
    with capture(dataset=root, default=CaptureConfig("dump_none", "shape_only")) as cap:
        on = measure(step, [x], warmup=20, repetitions=100, cold_l2=False).median_ms
    captured = cap.stats["written"]
    off2 = measure(step, [x], warmup=5, repetitions=100, cold_l2=False).median_ms
    base = min(off, off2)
    rows = [
        ("decode step, capture off", base, 0.0),
        ("decode step, capture on (dump_none, shape_only)", on, (on / base - 1) * 100),
    ]
    shape = {"hidden": hidden, "intermediate": inter, "layers": layers, "batch": batch}
    for label, ms, pct in rows:
        writer.write(
            "capture_decode_step",
            shape,
            label,
            ms,
            slowdown_pct=round(pct, 2),
            target_pct=5.0,
            op_calls_per_step=calls_per_step,
            workloads_written=captured,
            substitutes=substitutes,
        )
    return rows


def main() -> None:
    writer = RowWriter("capture")
    print(f"{'CPU, per op call':55s} {'us':>8s} {'overhead us':>12s}")
    for label, total, overhead in cpu_rows(writer):
        print(f"{label:55s} {total:8.2f} {overhead:12.2f}")
    if torch.cuda.is_available():
        print(
            f"\n{'GPU (' + torch.cuda.get_device_name() + ')':55s} {'ms':>8s} {'slowdown %':>12s}"
        )
        for label, ms, pct in gpu_rows(writer):
            print(f"{label:55s} {ms:8.4f} {pct:12.2f}")


if __name__ == "__main__":
    main()

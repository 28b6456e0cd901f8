"""Cost-model arithmetic for pruning tile tactics before anything is compiled or timed.

A runner's `estimate_cost(inputs, profile, tactic)` (tune/runner.py) returns a predicted
relative cost; the tuner times its tactics best-estimate first and drops those estimated
more than `TuningConfig.prune_slack` above the runner's best (tune/profiling.py,
`order_candidates`). These helpers give the two effects that dominate a tiled kernel's time
at a given shape and that no measurement is needed to see:

- padding: a tile grid that overhangs the problem computes the overhang too (M=17 on
  block_m=128 does 128 rows of work for 17);
- waves: CTAs run in waves of (SMs x CTAs per SM); a last partial wave costs as much as a
  full one, and a grid smaller than one wave leaves SMs idle.

`tile_cost` combines them in a roofline (padded FLOPs or bytes loaded, whichever bounds,
over the wave efficiency): proportional to the predicted time of a tile kernel up to a
per-tactic efficiency the measurement settles. It is a pruning rule, not a ranking: keep
the slack wide (0.5 by default), so that a tactic the model underrates still gets timed. `benchmarks/bench_tune.py --regret` measures what the
pruning costs against exhaustive search.
"""

from __future__ import annotations

import math

__all__ = ["padding_waste", "wave_efficiency", "tile_cost"]


def padding_waste(sizes: tuple[int, ...], blocks: tuple[int, ...]) -> float:
    """The fraction of the work a tile grid spends on padding: 1 - useful / computed.
    sizes: the problem's extents (M, N, K); blocks: the tile's extents along them."""
    useful = computed = 1.0
    for size, block in zip(sizes, blocks, strict=True):
        if size <= 0 or block <= 0:
            raise ValueError(f"padding_waste: sizes {sizes} and blocks {blocks} must be > 0")
        useful *= size
        computed *= math.ceil(size / block) * block
    return 1.0 - useful / computed


def wave_efficiency(ctas: int, sm_count: int, ctas_per_sm: int = 1) -> float:
    """The fraction of SM time a grid of `ctas` uses: ctas / (waves x slots per wave)."""
    if ctas <= 0 or sm_count <= 0 or ctas_per_sm <= 0:
        raise ValueError("wave_efficiency: ctas, sm_count and ctas_per_sm must be > 0")
    slots = sm_count * ctas_per_sm
    return ctas / (math.ceil(ctas / slots) * slots)


def tile_cost(
    m: int,
    n: int,
    k: int,
    block_m: int,
    block_n: int,
    block_k: int = 1,
    split_k: int = 1,
    sm_count: int = 132,
    ctas_per_sm: int = 1,
    elem_bytes: int = 2,
    flops_per_byte: float = 300.0,
    stream_k: int = 0,
    l2_bytes: int = 0,
    l2_weight: float = 0.25,
    bandwidth_waves: bool = True,
) -> float:
    """Predicted relative cost of a (block_m x block_n [x block_k], split_k) GEMM tiling at
    M x N x K (lower is better): a roofline, max(padded FLOPs / flops_per_byte, bytes
    loaded), divided by how well the grid fills the SMs.

    Bytes: every CTA row of tiles reads all of B's K extent, every CTA column all of A's,
    plus C once. With l2_bytes (the device's L2) the re-reads of an operand no larger than
    half the L2 cost l2_weight of a first read: the operand stays resident between the
    CTAs that share it (64 x 14336 bf16 activations re-read by 64 CTA columns come from L2,
    not HBM). 0: every read from HBM, which overprices narrow tiles at small M.
    flops_per_byte: the machine balance (H100 bf16 dense: ~990 TFLOP/s / 3.35 TB/s ~ 300),
    so a decode GEMM (M=1) is priced by its loads and a 16-row tile is not penalised for
    the 15 padded rows it computes for free, while a large GEMM is priced by its padded
    FLOPs. split_k multiplies the CTAs (parallelism for small M x N), pads K per split, and
    costs its fp32 partials (each split writes its padded output tile, the fixup reads them
    all): among splits that fill the SMs alike the smallest is cheapest (H200, M=8 N=K=4096:
    split 2 ran 7% faster than split 4, which the model had priced the same).
    stream_k > 0: stream_k programs per SM share the tiles' K loops evenly (split_k
    unused): every SM busy, one fp32 partial written and read per tile a program boundary
    crosses. bandwidth_waves=False: only the FLOPs term pays for a partly filled grid (a
    deeply pipelined small-M kernel streams HBM at full rate from fewer CTAs than SMs: 96
    CTAs of 16 x 64 won at M=16 N=6144 K=4096 on an H200 against 384 of split 8, which the
    waves on the bytes had priced 1.33x worse). The GEMM runners pass the device's L2 and
    False. Replayed on the 44 Triton winners of an H200 sweep over 82 shapes (leave one
    out: priors from the other 81): the HBM-only model with waves on the bytes put 3
    winners beyond prune_slack (up to 3.9x their runner's best estimate, stream-K priced as
    its bare grid) and left 5 untimed; this one puts every winner within 1.3x and, with
    patience_band 8%, leaves none untimed, timing 33 of 47 candidates a shape on average."""
    tiles_m, tiles_n = math.ceil(m / block_m), math.ceil(n / block_n)
    split = 1 if stream_k else max(split_k, 1)
    k_per_split = math.ceil(k / split)
    k_padded = math.ceil(k_per_split / block_k) * block_k * split
    flops = 2.0 * tiles_m * block_m * tiles_n * block_n * k_padded
    a_bytes, b_bytes = elem_bytes * m * k, elem_bytes * n * k

    def rereads(size: int, times: int) -> float:
        resident = l2_bytes > 0 and size <= l2_bytes / 2
        return size * times * (l2_weight if resident else 1.0)

    loaded = float(a_bytes + b_bytes + elem_bytes * m * n)
    loaded += rereads(a_bytes, tiles_n - 1) + rereads(b_bytes, tiles_m - 1)
    if stream_k:
        ctas = sm_count * stream_k
        loaded += 2 * 4 * min(ctas, tiles_m * tiles_n) * block_m * block_n
        filled = 1.0
    else:
        ctas = tiles_m * tiles_n * split
        if split > 1:
            loaded += 2 * 4 * split * (tiles_m * block_m) * (tiles_n * block_n)
        filled = wave_efficiency(ctas, sm_count, ctas_per_sm)
    if bandwidth_waves:
        return max(flops / flops_per_byte, loaded) / filled
    return max(flops / flops_per_byte / filled, loaded)

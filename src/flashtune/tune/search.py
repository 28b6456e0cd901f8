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
) -> float:
    """Predicted relative cost of a (block_m x block_n [x block_k], split_k) GEMM tiling at
    M x N x K (lower is better): a roofline, max(padded FLOPs / flops_per_byte, bytes
    loaded), divided by how well the grid fills the SMs.

    Bytes: every CTA row of tiles reads all of B's K extent, every CTA column all of A's
    (no L2 reuse assumed: it favours larger tiles the way the loads do), plus C once.
    flops_per_byte: the machine balance (H100 bf16 dense: ~990 TFLOP/s / 3.35 TB/s ~ 300),
    so a decode GEMM (M=1) is priced by its loads and a 16-row tile is not penalised for
    the 15 padded rows it computes for free, while a large GEMM is priced by its padded
    FLOPs. split_k multiplies the CTAs (parallelism for small M x N), pads K per split, and
    costs its fp32 partials (each split writes its padded output tile, the fixup reads them
    all): among splits that fill the SMs alike the smallest is cheapest (H200, M=8 N=K=4096:
    split 2 ran 7% faster than split 4, which the model had priced the same)."""
    tiles_m, tiles_n = math.ceil(m / block_m), math.ceil(n / block_n)
    k_per_split = math.ceil(k / max(split_k, 1))
    k_padded = math.ceil(k_per_split / block_k) * block_k * max(split_k, 1)
    flops = 2.0 * tiles_m * block_m * tiles_n * block_n * k_padded
    loaded = elem_bytes * (m * k * tiles_n + n * k * tiles_m + m * n)
    if split_k > 1:
        loaded += 2 * 4 * split_k * (tiles_m * block_m) * (tiles_n * block_n)
    ctas = tiles_m * tiles_n * max(split_k, 1)
    return max(flops / flops_per_byte, loaded) / wave_efficiency(ctas, sm_count, ctas_per_sm)

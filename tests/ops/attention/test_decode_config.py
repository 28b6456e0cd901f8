"""Decode launch policy (decode/config.py): SM counts, the persistent grid, the tactic space,
and a caller's fixed launch reaching the plan and the kernel."""

from __future__ import annotations

import dataclasses

import torch

from flashtune import platform
from flashtune.ops.attention.decode import BatchDecodeWithPagedKVCacheWrapper
from flashtune.ops.attention.decode import launch as decode_launch
from flashtune.ops.attention.decode.config import (
    INTERPRETER_SM_COUNT,
    DecodeLaunch,
    DecodeTactic,
    ctas_per_sm,
    default_tactic,
    kernel_registers,
    latency_regime,
    launch_shape,
    plan_sm_count,
    short_requests,
)
from flashtune.ops.attention.page import build_page_table

H100 = dataclasses.replace(platform.STAND_IN_LIMITS, stand_in=False)


def test_sm_count_off_gpu_on_gpu_and_fixed():
    cpu = platform.device_limits("cpu")
    assert cpu is platform.STAND_IN_LIMITS and cpu.stand_in
    assert plan_sm_count(cpu) == INTERPRETER_SM_COUNT  # the interpreter runs CTAs one by one
    assert plan_sm_count(H100) == 132
    assert plan_sm_count(cpu, DecodeLaunch(sm_count=78)) == 78


def test_grid_follows_the_launch():
    smem = H100.shared_memory_per_block
    default = launch_shape(132, smem, 128, 16, 16, 8)
    # A larger cap cannot shrink the grid; a cap of 1 gives one CTA per SM.
    wide = launch_shape(132, smem, 128, 16, 16, 8, DecodeLaunch(max_ctas_per_sm=8))
    one = launch_shape(132, smem, 128, 16, 16, 8, DecodeLaunch(max_ctas_per_sm=1))
    assert wide[0] >= default[0] >= one[0] == 132 // 8
    # The chunk alignment is the tactic's KV block.
    fixed = launch_shape(132, smem, 128, 16, 16, 8, DecodeLaunch(DecodeTactic(128, 4, 2)))
    assert fixed[1] == 128
    # Less shared memory, fewer resident CTAs.
    assert launch_shape(132, smem // 4, 128, 16, 16, 8)[0] <= default[0]


def test_registers_limit_the_resident_ctas():
    """The grid assumes its CTAs run at once: registers, not only shared memory, decide how
    many fit (226 registers x 128 threads: 2 a 64K register file, where shared memory has 4)."""
    smem = H100.shared_memory_per_block
    t = DecodeTactic(64, 4, 2)
    assert ctas_per_sm(t, 128, 16, smem, 4) == 4  # shared memory alone
    assert ctas_per_sm(t, 128, 16, smem, 4, registers=128) == 4  # 128 x 128 x 4 = 64K
    assert ctas_per_sm(t, 128, 16, smem, 4, registers=129) == 3  # rounded up to 136
    assert ctas_per_sm(t, 128, 16, smem, 4, registers=226) == 2
    assert ctas_per_sm(DecodeTactic(64, 8, 2), 128, 16, smem, 4, registers=255) == 1
    # Every measured tactic and variant has an entry; the plan's grid follows it.
    for d in (64, 128, 256):
        for tactic in DecodeTactic.space(d):
            for kw in ({}, {"rope": True}, {"kv_itemsize": 1}):
                regs = kernel_registers(tactic, d, **kw)
                assert regs is not None and 32 <= regs <= 255
    rope = DecodeLaunch(DecodeTactic(64, 4, 2))
    plain_grid = launch_shape(132, smem, 128, 16, 16, 8, rope)[0]
    rope_grid = launch_shape(132, smem, 128, 16, 16, 8, rope, rope=True)[0]
    regs = kernel_registers(DecodeTactic(64, 4, 2), 128, rope=True)
    assert regs is not None
    assert rope_grid == 132 * ctas_per_sm(t, 128, 16, smem, 4, registers=regs) // 8
    assert rope_grid <= plain_grid


def test_tactic_space_keeps_d256_tiles_small():
    assert {t.block_n for t in DecodeTactic.space(128)} == {32, 64, 128}
    assert {t.block_n for t in DecodeTactic.space(256)} == {32, 64}


def test_a_fixed_tactic_reaches_the_kernel(monkeypatch):
    """plan(launch=...) fixes the tactic of every run of that plan (the autotuner is not
    asked), and the plan's grid is sized for it."""
    seen = []
    monkeypatch.setattr(decode_launch, "launch_kernels", lambda *args: seen.append(args[-1]))
    indptr, indices, last, num_pages = build_page_table([40, 7], 16, shuffle=False)
    tactic = DecodeTactic(32, 4, 3)
    w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(2**20, dtype=torch.uint8), "NHD")
    w.plan(
        indptr,
        indices,
        last,
        4,
        2,
        64,
        16,
        q_data_type=torch.float16,
        launch=DecodeLaunch(tactic, sm_count=3),
    )
    assert w._planner.plan is not None and w._planner.plan.sm_count == 3
    q = torch.randn(2, 4, 64, dtype=torch.float16)
    cache = torch.randn(num_pages, 2, 16, 2, 64, dtype=torch.float16)
    w.run(q, cache)
    assert seen == [tactic]


def test_the_default_tactic_follows_the_kernel_variant(monkeypatch):
    """Without a fixed launch or a tuned pick, each run uses its plan's default tactic, chosen
    for the variant: fp8 caches and fused RoPE get their own (H100 sweeps, decode_config)."""
    seen = []
    monkeypatch.setattr(decode_launch, "launch_kernels", lambda *args: seen.append(args[-1]))
    indptr, indices, last, num_pages = build_page_table([40, 7], 16, shuffle=False)
    q = torch.randn(2, 4, 64, dtype=torch.float16)
    cache = torch.randn(num_pages, 2, 16, 2, 64, dtype=torch.float16)
    plain = default_tactic(64, 16, 16)
    for kw, kv_dtype, expected in [
        ({}, torch.float16, plain),
        ({}, torch.float8_e4m3fn, default_tactic(64, 16, 16, kv_itemsize=1)),
        # 2 requests x 2 KV heads on the interpreter's 2 SMs: not the latency regime, but
        # short requests (40 and 7 tokens).
        (
            {"pos_encoding_mode": "ROPE_LLAMA"},
            torch.float16,
            default_tactic(64, 16, 16, rope=True, short=True),
        ),
    ]:
        w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(2**20, dtype=torch.uint8), "NHD")
        w.plan(
            indptr, indices, last, 4, 2, 64, 16,
            q_data_type=torch.float16, kv_data_type=kv_dtype, **kw,
        )  # fmt: skip
        assert w._planner.plan is not None and w._planner.plan.default_tactic == expected
        w.run(q, cache.to(kv_dtype))
        assert seen[-1] == expected
    assert default_tactic(64, 16, 16, kv_itemsize=1) != plain
    assert default_tactic(64, 16, 16, rope=True) != plain
    # Few requests for the SMs (short chunks): RoPE takes short tiles with a third stage.
    assert default_tactic(64, 16, 16, rope=True, latency=True) == DecodeTactic(32, 4, 3)
    # Short requests (each work item a few blocks): the same short tiles for RoPE only.
    assert default_tactic(64, 16, 16, rope=True, short=True) == DecodeTactic(32, 4, 3)
    assert default_tactic(64, 16, 16, short=True) == plain
    assert short_requests(64, 8, 132, 1024.0) and not short_requests(256, 8, 132, 1024.0)
    assert not short_requests(16, 8, 132, 4096.0)
    assert latency_regime(1, 8, 132) and not latency_regime(16, 8, 132)

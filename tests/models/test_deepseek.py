"""The DeepSeek-V3-shaped MLA decoder (flashtune.models.deepseek) on CPU: the tiny config on
the torch backend and on flashtune's (its Triton kernels in the interpreter, float16: the
interpreter reads bf16 wrong), a ragged prefill then decode steps over the paged latent
cache; the absorbed attention against the non-absorbed math of the references; the
non-absorbed prefill against the absorbed one; `flashtune e2e --config deepseek-tiny`. On a
GPU (marked cuda): DeepSeek-V3 TP8 shapes in bf16, flashtune and FlashInfer against torch."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from flashtune.cli import app
from flashtune.models import (
    DEEPSEEK_TINY,
    DEEPSEEK_V3_TP8,
    DeepseekV3,
    DeepseekV3Config,
    DeepseekV3Weights,
)
from flashtune.models.backends import make_ops
from flashtune.models.latent import PagedLatentCache
from flashtune.models.loop import loop_model
from flashtune.models.paging import PageTable
from flashtune.ops.mla.reference import mla_paged_ref, mla_ragged_prefill_ref

DTYPE = torch.float16
DECODE_STEPS = 3
# Logits are O(3) (1/sqrt(fan_in) weights); fp16 through two layers differs by ~3e-3.
ATOL = RTOL = 2e-2
C = DEEPSEEK_TINY


def _generate(
    model: DeepseekV3,
    prompts: list[int],
    tokens: torch.Tensor,
    follow: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Logits of a ragged prefill and of each decode step (through DecodeGraph: eager on
    CPU), greedy tokens fed back: this model's, or those of `follow` (teacher forcing)."""
    table = model.page_table
    requests = [table.add_request() for _ in prompts]
    logits = model.forward(tokens, table.step(requests, prompts))
    steps = [logits]
    decode = model.decode_graph(len(prompts), max_kv_len=max(prompts) + DECODE_STEPS)
    for step in range(DECODE_STEPS):
        fed = model.sample(logits if follow is None else follow[step])
        logits = decode.step(fed, table.step(requests, [1] * len(prompts))).clone()
        steps.append(logits)
    return steps


def _assert_close_logits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got.float(), want.float(), atol=ATOL, rtol=RTOL, msg=what)
    # The greedy token agrees wherever the reference's top two are clearly apart.
    top2 = want.float().topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * (ATOL + RTOL * top2[:, 0].abs())
    same = got.argmax(-1) == want.argmax(-1)
    assert bool(same[clear].all()), f"greedy tokens differ: {what}"


@pytest.mark.parametrize(
    ("page_size", "prompts"),
    [
        (1, [5, 3]),
        # ~4-5 s on 2 cores: in the slow step (the main suite stays under 10 minutes)
        pytest.param(16, [19, 7, 1], marks=pytest.mark.slow),
    ],
)
def test_flashtune_backend_matches_torch(page_size: int, prompts: list[int]) -> None:
    """Prefill (non-absorbed, ragged) and decode steps (absorbed, over the paged latents;
    odd lengths, requests of different lengths, a prompt across two pages of 16)."""
    reference = DeepseekV3(C, "torch", device="cpu", dtype=DTYPE, page_size=page_size, num_pages=64)
    ours = DeepseekV3(
        C,
        "flashtune",
        device="cpu",
        dtype=DTYPE,
        page_size=page_size,
        num_pages=64,
        weights=reference.weights,
    )
    tokens = torch.randint(0, C.vocab_size, (sum(prompts),))
    expected = _generate(reference, prompts, tokens)
    actual = _generate(ours, prompts, tokens, follow=expected)
    assert len(actual) == 1 + DECODE_STEPS
    for step, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert got.shape == (len(prompts), C.vocab_size)
        _assert_close_logits(got, want, f"step {step}")
    # The latents the two wrote into their caches agree too.
    torch.testing.assert_close(ours.cache.ckv, reference.cache.ckv, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(ours.cache.kpe, reference.cache.kpe, atol=1e-2, rtol=1e-2)


def _decode_case(page_size: int, kv_lens: list[int], dtype: torch.dtype):
    """A decode step's page table (requests of kv_lens, the last token new), random latents
    in the pages, random per-head queries and the tiny config's W_UK / W_UV."""
    h, lora, rope = C.num_heads, C.kv_lora_rank, C.qk_rope_head_dim
    table = PageTable(num_pages=64, page_size=page_size, device="cpu")
    requests = [table.add_request(n - 1) for n in kv_lens]
    batch = table.step(requests, [1] * len(kv_lens))
    cache = PagedLatentCache(1, 64, page_size, lora, rope, dtype, "cpu")
    cache.fill_random()
    b = len(kv_lens)
    q_nope = torch.randn(b, h, C.qk_nope_head_dim).to(dtype)
    q_pe = torch.randn(b, h, rope).to(dtype)
    kv_b = (torch.randn(h * (C.qk_nope_head_dim + C.v_head_dim), lora) / math.sqrt(lora)).to(dtype)
    return batch, cache, q_nope, q_pe, kv_b


def _non_absorbed(batch, cache, q_nope, q_pe, kv_b) -> torch.Tensor:
    """Each request's keys and values decompressed per head (k_nope, v = kv_b_proj(c_kv)),
    then plain attention over them: mla_ragged_prefill_ref, float32; [B, H, v]."""
    h, nope = C.num_heads, C.qk_nope_head_dim
    ckv, kpe = (t.float() for t in cache.layer(0))
    ks, vs = [], []
    for pages, n in zip(batch.pages, batch.kv_lens, strict=True):
        c = ckv[list(pages)].flatten(0, 1)[:n]  # [n, lora]
        kv = (c @ kv_b.float().T).view(n, h, nope + C.v_head_dim)
        k_pe = kpe[list(pages)].flatten(0, 1)[:n, None, :].expand(n, h, -1)
        ks.append(torch.cat((kv[..., :nope], k_pe), dim=-1))
        vs.append(kv[..., nope:])
    q = torch.cat((q_nope, q_pe), dim=-1).float()
    kv_indptr = torch.tensor([0, *torch.tensor(batch.kv_lens).cumsum(0).tolist()])
    qo_indptr = torch.arange(len(batch.kv_lens) + 1)
    out, _ = mla_ragged_prefill_ref(
        q, torch.cat(ks), torch.cat(vs), qo_indptr, kv_indptr, C.sm_scale, causal=True
    )
    return out


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("backend", ["reference", "torch", "flashtune"])
def test_absorbed_decode_equals_the_non_absorbed_math(page_size: int, backend: str) -> None:
    """q_nope through W_UK into the latent, attention over the paged (ckv, kpe), the output
    through W_UV: the per-head attention over the decompressed keys and values."""
    dtype = torch.float32 if backend == "reference" else DTYPE
    batch, cache, q_nope, q_pe, kv_b = _decode_case(page_size, [1, 7, 33, 16], dtype)
    model_like = replace(C, num_layers=1)
    per_head = kv_b.view(C.num_heads, -1, C.kv_lora_rank)
    w_uk, w_uv_t = per_head[:, : C.qk_nope_head_dim], per_head[:, C.qk_nope_head_dim :].mT
    q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)
    if backend == "reference":
        o_lat, _ = mla_paged_ref(
            q_lat,
            q_pe,
            *cache.layer(0),
            batch.kv_indptr,
            batch.kv_indices,
            model_like.sm_scale,
            kv_last_page_len=batch.kv_last_page_len,
            causal=False,
        )
    else:
        ds = DeepseekV3(
            model_like, backend, device="cpu", dtype=dtype, page_size=page_size, cache=cache
        )
        attention = ds.step_attention(batch)
        attention.plan(batch)
        o_lat = attention.run(q_lat, q_pe.contiguous(), cache.layer(0))
    absorbed = torch.bmm(o_lat.transpose(0, 1), w_uv_t).transpose(0, 1)
    expected = _non_absorbed(batch, cache, q_nope, q_pe, kv_b)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(absorbed.float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize(
    "backend",
    # flashtune: ~4.5 s on 2 cores, in the slow step (the main suite stays under 10 minutes)
    ["torch", pytest.param("flashtune", marks=pytest.mark.slow)],
)
def test_ragged_prefill_equals_the_absorbed_prefill(backend: str) -> None:
    """prefill="ragged" (k_nope / v decompressed, mla_ragged_prefill) and prefill="absorbed"
    (the paged latent attention, causal) give the same logits."""
    dtype = torch.float32 if backend == "torch" else DTYPE
    prompts = [6, 11]
    tokens = torch.randint(0, C.vocab_size, (sum(prompts),))
    logits = []
    weights = DeepseekV3Weights.random(C, dtype, "cpu", seed=3)
    for form in ("ragged", "absorbed"):
        model = DeepseekV3(
            C, backend, device="cpu", dtype=dtype, page_size=4, num_pages=16, prefill=form,
            weights=weights,
        )  # fmt: skip
        requests = [model.page_table.add_request() for _ in prompts]
        logits.append(model.forward(tokens, model.page_table.step(requests, prompts)))
    tol = 1e-4 if dtype == torch.float32 else ATOL
    torch.testing.assert_close(logits[0].float(), logits[1].float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", ["torch", "flashtune"])
def test_a_prompt_prefilled_in_two_chunks_gives_the_whole_prompts_logits(backend: str) -> None:
    """The second chunk attends to the first through the cache (absorbed, causal with the
    mask offset by the prefix): what one (ragged) prefill of the whole prompt computes."""
    model = DeepseekV3(C, backend, device="cpu", dtype=DTYPE, page_size=4, num_pages=16)
    prompt = torch.randint(0, C.vocab_size, (9,))
    table = model.page_table
    whole, chunked = table.add_request(), table.add_request()
    expected = model.forward(prompt, table.step([whole], [9]))
    model.forward(prompt[:6], table.step([chunked], [6]))
    actual = model.forward(prompt[6:], table.step([chunked], [3]))
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)


def test_decode_graph_step_matches_an_eager_forward() -> None:
    """The static-buffer decode step (a padded page table) computes a plain forward's."""
    model = DeepseekV3(C, "torch", device="cpu", dtype=torch.float32, page_size=4, num_pages=32)
    requests = [model.page_table.add_request(kv_len=n) for n in (5, 9, 3)]
    model.cache.fill_random()
    tokens = torch.randint(0, C.vocab_size, (3,))
    batch = model.page_table.step(requests, [1, 1, 1])
    eager = model.forward(tokens, batch)
    graphed = model.decode_graph(3, max_kv_len=16).step(tokens, batch)
    torch.testing.assert_close(graphed, eager, atol=1e-4, rtol=1e-4)


def test_config_comes_from_model_shapes() -> None:
    c = DEEPSEEK_V3_TP8
    assert (c.num_heads, c.hidden_size, c.intermediate_size) == (16, 7168, 18432 // 8)
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim) == (1536, 512, 64)
    assert (c.qk_nope_head_dim, c.v_head_dim, c.qk_head_dim) == (128, 128, 192)
    assert math.isclose(c.sm_scale, 192**-0.5)
    assert c.with_layers(3).num_layers == 3 and c.with_layers(3).name == "deepseek-v3-tp8-3l"
    with pytest.raises(ValueError, match="prefill must be one of"):
        DeepseekV3(C, "torch", device="cpu", dtype=DTYPE, prefill="dense")


def test_e2e_command_runs_the_deepseek_config_on_cpu() -> None:
    result = CliRunner().invoke(
        app,
        [
            "e2e",
            "--config",
            "deepseek-tiny",
            "--device",
            "cpu",
            "--dtype",
            "float16",
            "--backends",
            "torch,flashtune",
            "--batches",
            "2",
            "--kv-lens",
            "12",
            "--repetitions",
            "1",
            "--no-tune",
            "--skip-prefill",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "e2e_decode    2 x     12 flashtune" in result.output
    assert "greedy=1.00" in result.output


def test_the_loop_takes_the_deepseek_configs() -> None:
    """The loop's model for an MLA config: the DeepSeek stack with the tiny prompts (the
    whole loop on it is a slow test in tests/models/test_e2e_loop.py)."""
    model, prompts = loop_model("deepseek-tiny", device="cpu", dtype="float16")
    assert isinstance(model, DeepseekV3) and prompts == (5, 9, 3)


# ------------------------------------------------------------------------------ GPU


def _gpu_config() -> DeepseekV3Config:
    return DEEPSEEK_V3_TP8.with_layers(2)


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["flashtune", "flashinfer"])
def test_gpu_backends_match_torch_at_deepseek_v3_tp8_shapes(backend: str) -> None:
    if backend == "flashinfer" and importlib.util.find_spec("flashinfer") is None:
        pytest.skip("FlashInfer is not installed")
    config, dtype = _gpu_config(), torch.bfloat16
    reference = DeepseekV3(config, "torch", device="cuda", dtype=dtype, num_pages=256)
    ours = DeepseekV3(
        config, make_ops(backend), device="cuda", dtype=dtype, num_pages=256,
        weights=reference.weights,
    )  # fmt: skip
    prompts = [300, 17, 64]
    tokens = torch.randint(0, config.vocab_size, (sum(prompts),), device="cuda")
    expected = _generate(reference, prompts, tokens)
    actual = _generate(ours, prompts, tokens, follow=expected)
    for step, (want, got) in enumerate(zip(expected, actual, strict=True)):
        rel = float((got.float() - want.float()).norm() / want.float().norm())
        assert rel < 5e-2, f"step {step}: relative L2 error {rel:.3e}"

"""The Llama decoder (flashtune.models) end to end on CPU: the tiny config through the same
code path on the torch backend and on flashtune's (its Triton kernels in the interpreter):
a ragged prefill, then decode steps through `DecodeGraph` (eager without a GPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from flashtune.models import TINY, Llama, LlamaConfig
from flashtune.models.llama import Llama31RopeScaling, rope_cos_sin
from flashtune.models.paging import PageTable

# float16: the decode kernel takes float16/bfloat16 queries; the interpreter has no bf16.
DTYPE = torch.float16
PROMPTS = [5, 9, 3]  # ragged; 9 tokens span three pages of 4
PAGE_SIZE = 4
DECODE_STEPS = 3
# Logits are O(3) (1/sqrt(fan_in) weights); fp16 through two layers differs by ~3e-3.
ATOL = RTOL = 2e-2


def _generate(
    model: Llama, prompt_tokens: torch.Tensor, follow: list[torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """Logits of the prefill and of each decode step, greedy tokens fed back: this model's
    own, or those of `follow`'s logits (teacher forcing: the same inputs at every step, so a
    near-tie picked the other way cannot make later steps incomparable)."""
    table = model.page_table
    requests = [table.add_request() for _ in PROMPTS]
    logits = model.forward(prompt_tokens, table.step(requests, PROMPTS))
    steps = [logits]
    decode = model.decode_graph(len(PROMPTS), max_kv_len=max(PROMPTS) + DECODE_STEPS)
    for step in range(DECODE_STEPS):
        tokens = model.sample(logits if follow is None else follow[step])
        logits = decode.step(tokens, table.step(requests, [1] * len(PROMPTS))).clone()
        steps.append(logits)
    return steps


def _pair(config: LlamaConfig) -> tuple[Llama, Llama]:
    torch_model = Llama(
        config, "torch", device="cpu", dtype=DTYPE, page_size=PAGE_SIZE, num_pages=32
    )
    flashtune_model = Llama(
        config,
        "flashtune",
        device="cpu",
        dtype=DTYPE,
        page_size=PAGE_SIZE,
        num_pages=32,
        weights=torch_model.weights,
    )
    return torch_model, flashtune_model


def _assert_same_generation(config: LlamaConfig) -> None:
    torch_model, flashtune_model = _pair(config)
    prompt = torch.randint(0, config.vocab_size, (sum(PROMPTS),))
    expected = _generate(torch_model, prompt)
    actual = _generate(flashtune_model, prompt, follow=expected)
    assert len(actual) == 1 + DECODE_STEPS
    for step, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert got.shape == (len(PROMPTS), config.vocab_size), step
        torch.testing.assert_close(got.float(), want.float(), atol=ATOL, rtol=RTOL)
        # The greedy token agrees wherever the reference's top two are further apart than
        # the tolerance (fresh random prompts: a near-tie may go either way in fp16).
        top2 = want.float().topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * (ATOL + RTOL * top2[:, 0].abs())
        same = got.argmax(-1) == want.argmax(-1)
        assert bool(same[clear].all()), f"greedy tokens differ at step {step}"


def test_flashtune_backend_matches_torch() -> None:
    _assert_same_generation(TINY)


@pytest.mark.slow  # ~5 s on 2 cores: the main suite stays under its 10 minutes
def test_qwen3_qk_norm_and_llama31_rope_match_torch() -> None:
    config = replace(TINY, qk_norm=True, rope_scaling=Llama31RopeScaling(original_max_position=64))
    _assert_same_generation(config)


def test_decode_step_matches_an_eager_forward() -> None:
    """The static-buffer decode step computes what a plain forward of the same step does
    (up to fp16 rounding: it gathers a wider, padded KV)."""
    model = Llama(TINY, "torch", device="cpu", dtype=DTYPE, page_size=PAGE_SIZE, num_pages=32)
    requests = [model.page_table.add_request(kv_len=n) for n in PROMPTS]
    model.cache.fill_random()
    tokens = torch.randint(0, TINY.vocab_size, (len(PROMPTS),))
    batch = model.page_table.step(requests, [1] * len(PROMPTS))
    eager = model.forward(tokens, batch)
    graphed = model.decode_graph(len(PROMPTS), max_kv_len=16).step(tokens, batch)
    torch.testing.assert_close(graphed, eager, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("backend", ["torch", "flashtune"])
def test_a_prompt_prefilled_in_two_chunks_gives_the_whole_prompts_logits(backend: str) -> None:
    """Prefill appending to a request's earlier KV (q_len < kv_len: the causal mask is
    offset) computes what one prefill of the whole prompt does."""
    model = Llama(TINY, backend, device="cpu", dtype=DTYPE, page_size=PAGE_SIZE, num_pages=32)
    prompt = torch.randint(0, TINY.vocab_size, (9,))
    table = model.page_table
    whole, chunked = table.add_request(), table.add_request()
    expected = model.forward(prompt, table.step([whole], [9]))
    model.forward(prompt[:6], table.step([chunked], [6]))
    actual = model.forward(prompt[6:], table.step([chunked], [3]))
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)


def test_page_table_describes_a_ragged_step() -> None:
    table = PageTable(num_pages=8, page_size=4, device="cpu")
    a, b = table.add_request(), table.add_request(kv_len=6)
    batch = table.step([a, b], [5, 1])
    assert batch.kv_lens == (5, 7)
    assert batch.qo_indptr.tolist() == [0, 5, 6]
    assert batch.kv_indptr.tolist() == [0, 2, 4]
    assert batch.kv_last_page_len.tolist() == [1, 3]
    assert batch.positions.tolist() == [0, 1, 2, 3, 4, 6]
    assert batch.batch_indices.tolist() == [0, 0, 0, 0, 0, 1]
    pages_a, pages_b = batch.pages
    assert batch.slot_pages.tolist() == [pages_a[0]] * 4 + [pages_a[1], pages_b[1]]
    assert batch.slot_offsets.tolist() == [0, 1, 2, 3, 0, 2]
    assert batch.last_token_rows.tolist() == [4, 5]
    assert not batch.is_decode


def test_page_table_runs_out_of_pages_loudly() -> None:
    table = PageTable(num_pages=2, page_size=4, device="cpu")
    with pytest.raises(RuntimeError, match="out of pages"):
        table.add_request(kv_len=9)


def test_sampling_greedy_and_top_k_top_p() -> None:
    torch_model, flashtune_model = _pair(TINY)
    logits = torch.full((3, TINY.vocab_size), -10.0)
    logits[0, 7] = logits[1, 3] = logits[2, 100] = 10.0
    logits[:, 50] = 9.0  # second choice everywhere
    for model in (torch_model, flashtune_model):
        assert model.sample(logits).tolist() == [7, 3, 100]
        drawn = model.sample(logits, top_k=2, top_p=0.5, generator=torch.Generator())
        assert drawn.tolist() == [7, 3, 100]  # the nucleus holds only the top token
        drawn = model.sample(logits, top_k=2, generator=torch.Generator().manual_seed(0))
        assert set(drawn.tolist()) <= {7, 3, 100, 50}


def test_rope_table_llama31_scaling_slows_only_long_wavelengths() -> None:
    plain = rope_cos_sin(TINY, "cpu")
    scaled = rope_cos_sin(replace(TINY, rope_scaling=Llama31RopeScaling()), "cpu")
    half = TINY.head_dim // 2
    assert plain.shape == (TINY.max_position, TINY.head_dim)
    torch.testing.assert_close(scaled[:, 0], plain[:, 0])  # the fastest frequency: kept
    assert not torch.allclose(scaled[:, half - 1], plain[:, half - 1])  # the slowest: scaled


def test_unknown_backend_and_missing_flashinfer_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        Llama(TINY, "tvm", device="cpu", dtype=DTYPE)
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="needs FlashInfer"):
            Llama(TINY, "flashinfer", device="cpu", dtype=DTYPE)


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["torch", "flashtune", "flashinfer"])
def test_cuda_graph_decode_replays_what_an_eager_step_computes(backend: str) -> None:
    """On a GPU: the captured decode step, replayed for later steps (new lengths, a new page
    for some requests), gives the eager forward's logits; bf16, Llama 3.1 RoPE."""
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    config = replace(TINY, rope_scaling=Llama31RopeScaling(original_max_position=64))
    graphed = Llama(config, backend, device="cuda", page_size=PAGE_SIZE, num_pages=64)
    eager = Llama(
        config, backend, device="cuda", page_size=PAGE_SIZE, num_pages=64, weights=graphed.weights
    )
    requests = [graphed.page_table.add_request(n) for n in PROMPTS]
    for n in PROMPTS:
        eager.page_table.add_request(n)
    graphed.cache.fill_random()
    eager.cache.pages.copy_(graphed.cache.pages)
    decode = graphed.decode_graph(len(PROMPTS), max_kv_len=32)
    tokens = torch.randint(0, config.vocab_size, (len(PROMPTS),), device="cuda")
    for _ in range(5):  # the last page of 4 fills up: steps that allocate a page
        want = eager.forward(tokens, eager.page_table.step(requests, [1] * len(PROMPTS)))
        got = decode.step(tokens, graphed.page_table.step(requests, [1] * len(PROMPTS)))
        assert decode.graph is not None
        torch.testing.assert_close(got.float(), want.float(), atol=5e-2, rtol=5e-2)
        tokens = graphed.sample(got).long()


def test_torch_compile_leaves_the_kv_cache_write_out_of_its_graphs() -> None:
    """Inside torch.compile's graph the K/V write mutates a view of the whole multi-layer
    cache, and inductor rewrote the entire cache each decode step (53.9 ms against eager's
    1.7 ms on an H100). The write runs eagerly between the compiled parts; the compiled step
    still computes what the eager one does."""
    graphs: list[torch.fx.GraphModule] = []

    def recording_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    eager = Llama(TINY, "torch", device="cpu", dtype=DTYPE, page_size=PAGE_SIZE, num_pages=32)
    compiled = Llama(
        TINY, "torch", device="cpu", dtype=DTYPE, page_size=PAGE_SIZE, num_pages=32,
        weights=eager.weights,
    )  # fmt: skip
    compiled.compile(backend=recording_backend, dynamic=False)
    prompt = torch.randint(0, TINY.vocab_size, (sum(PROMPTS),))
    torch._dynamo.reset()
    expected, actual = _generate(eager, prompt), _generate(compiled, prompt)
    for want, got in zip(expected, actual, strict=True):
        torch.testing.assert_close(got.float(), want.float(), atol=ATOL, rtol=RTOL)
    assert graphs  # the layers did compile
    cache_shape = tuple(eager.cache.layer(0).shape)

    def base(node: torch.fx.Node) -> torch.fx.Node:
        # a view's chain back to what it views (x[...], x.view(...), x.select(...))
        while node.op in ("call_function", "call_method") and node.args:
            first = node.args[0]
            if not isinstance(first, torch.fx.Node):
                break
            node = first
        return node

    def is_cache(node: torch.fx.Node) -> bool:
        value = node.meta.get("example_value")
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else ()
        return shape[-len(cache_shape) :] == cache_shape  # a layer's cache, or all layers'

    writes = [
        node
        for gm in graphs
        for node in gm.graph.nodes
        if node.op == "call_function"
        and ("setitem" in str(node.target) or "index_put" in str(node.target))
        and is_cache(base(node))
    ]
    assert writes == []  # (the prefill's own output buffer is written, not the cache)


def test_released_requests_give_their_pages_back() -> None:
    from flashtune.models.paging import PageTable

    table = PageTable(num_pages=4, page_size=4, device="cpu")
    a = table.add_request(kv_len=9)  # 3 pages
    with pytest.raises(RuntimeError, match="out of pages"):
        table.add_request(kv_len=8)
    table.release([a])
    assert table.pages[a] == [] and table.lens[a] == 0
    b = table.add_request(kv_len=16)  # all four pages again, page 0 first
    assert sorted(table.pages[b]) == [0, 1, 2, 3] and table.pages[b][0] == 0

"""What the decoders (llama.py's Llama, deepseek.py's DeepseekV3) share: the step (plan the
step's attention, run the layers), the layer stack around each model's attention block
(norms fused with the residual adds, the SwiGLU MLP, the LM head), torch.compile, sampling,
and the CUDA-graph decode step (`DecodeGraph`). A model brings its config, weights, cache
and the attention of each kind of step."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from flashtune.models.attention import GraphShape
from flashtune.models.backends import Ops, make_ops
from flashtune.models.paging import PageTable, StepBatch

__all__ = ["StepAttention", "RandomInit", "PagedDecoder", "DecodeGraph"]


class StepAttention(Protocol):
    """A step's attention as the decoder drives it: planned once, then run by every layer."""

    def plan(self, batch: StepBatch) -> None: ...


class _Config(Protocol):
    @property
    def rms_eps(self) -> float: ...
    @property
    def max_position(self) -> int: ...


class _Cache(Protocol):
    @property
    def page_size(self) -> int: ...
    @property
    def num_pages(self) -> int: ...


class _LayerWeights(Protocol):
    @property
    def input_norm(self) -> torch.Tensor: ...
    @property
    def post_norm(self) -> torch.Tensor: ...
    # The dense MLP's (None in a layer whose MLP is something else: an MoE layer)
    @property
    def gate_up(self) -> torch.Tensor | None: ...
    @property
    def down(self) -> torch.Tensor | None: ...


class _Weights(Protocol):
    @property
    def embed(self) -> torch.Tensor: ...
    @property
    def layers(self) -> Sequence[_LayerWeights]: ...
    @property
    def final_norm(self) -> torch.Tensor | None: ...
    @property
    def lm_head(self) -> torch.Tensor | None: ...


class RandomInit:
    """Seeded random weights (nothing is downloaded), drawn on the host in call order:
    linear layers of std 1/sqrt(fan_in), so activations stay O(1) through the layers and
    logits spread over a few units (greedy tokens are well separated); norms near 1."""

    def __init__(self, dtype: torch.dtype, device: torch.device | str, seed: int = 0) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.dtype, self.device = dtype, device

    def _cast(self, w: torch.Tensor) -> torch.Tensor:
        return w.to(dtype=self.dtype, device=self.device)

    def linear(self, n: int, k: int) -> torch.Tensor:
        """A weight [n, k] (out, in)."""
        return self._cast(torch.randn(n, k, generator=self.gen) / math.sqrt(k))

    def norm(self, n: int) -> torch.Tensor:
        return self._cast(1.0 + 0.1 * torch.randn(n, generator=self.gen))

    def stacked(self, count: int, n: int, k: int) -> torch.Tensor:
        """`count` weights [n, k] as one [count, n, k] (experts), std 1/sqrt(k). Drawn on
        the device from a seed the host generator draws: a DeepSeek-V3 layer's experts are
        billions of values, minutes of host randn."""
        seed = int(torch.randint(0, 2**62, (1,), generator=self.gen))
        device = torch.device(self.device)
        gen = torch.Generator(device=device).manual_seed(seed)
        w = torch.randn(count, n, k, generator=gen, device=device, dtype=self.dtype)
        return w.mul_(1.0 / math.sqrt(k))

    def bias(self, n: int, scale: float = 0.1) -> torch.Tensor:
        """A float32 vector [n] of std `scale` (a router's score-correction bias)."""
        return (scale * torch.randn(n, generator=self.gen)).to(self.device)

    def embedding(self, vocab: int, hidden: int) -> torch.Tensor:
        return self._cast(torch.randn(vocab, hidden, generator=self.gen))


class PagedDecoder(ABC):
    """A decoder over a paged cache whose hot ops run on `self.ops`; a subclass's __init__
    calls this one with its weights and cache (another model's, to run the same model and
    KV on another backend)."""

    config: _Config
    device: torch.device
    ops: Ops
    weights: _Weights
    cache: _Cache
    page_table: PageTable
    # What forward and decode graphs call for the layers: `layers`, or its compiled form.
    run_layers: Callable[..., torch.Tensor]

    def __init__(
        self,
        config: Any,
        backend: str | Ops,
        device: torch.device,
        dtype: torch.dtype,
        weights: Any,
        cache: Any,
    ) -> None:
        self.config = config
        self.device = device
        self.dtype = dtype
        self.ops = make_ops(backend) if isinstance(backend, str) else backend
        self.weights = weights
        self.cache = cache
        self.page_table = PageTable(cache.num_pages, cache.page_size, device)
        self.run_layers = self.layers

    @abstractmethod
    def step_attention(self, batch: StepBatch) -> StepAttention:
        """The eager attention for this kind of step (not yet planned)."""

    @abstractmethod
    def graph_attention(self, graph: GraphShape) -> StepAttention:
        """The decode attention of a CUDA-graph step of `graph`'s sizes (DecodeGraph's)."""

    @abstractmethod
    def attention_block(
        self, index: int, layer: Any, x: torch.Tensor, positions: torch.Tensor, attention: Any
    ) -> torch.Tensor:
        """Layer `index`'s attention on the normed x [nnz, hidden]: its output [nnz, hidden]
        (the step's K/V or latents appended to the layer's cache on the way)."""

    def forward(self, tokens: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """One step, eagerly: plan attention, run the layers; logits [B, V] of each
        request's last new token. tokens [nnz]: the step's new tokens, request by request."""
        attention = self.step_attention(batch)
        attention.plan(batch)
        last_rows = None if batch.is_decode else batch.last_token_rows
        return self.run_layers(tokens, batch.positions.to(torch.int64), attention, last_rows)

    def layers(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        attention: StepAttention,
        last_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The planned step's device work (what a CUDA graph captures): embedding, layers,
        final norm and LM head. positions [nnz] int64; last_rows [B]: the rows to compute
        logits for (None: every row, as in decode)."""
        ops, w, eps = self.ops, self.weights, self.config.rms_eps
        x = F.embedding(tokens, w.embed)  # [nnz, H]
        residual: torch.Tensor | None = None
        for index, layer in enumerate(w.layers):
            if residual is None:
                residual, x = x, ops.rmsnorm(x, layer.input_norm, eps)
            else:
                ops.fused_add_rmsnorm(x, residual, layer.input_norm, eps)
            x = self.attention_block(index, layer, x, positions, attention)
            ops.fused_add_rmsnorm(x, residual, layer.post_norm, eps)
            x = self.mlp_block(index, layer, x)
        assert residual is not None and w.final_norm is not None and w.lm_head is not None
        ops.fused_add_rmsnorm(x, residual, w.final_norm, eps)
        if last_rows is not None:
            x = x[last_rows]
        return ops.linear(x, w.lm_head)

    def mlp_block(self, index: int, layer: Any, x: torch.Tensor) -> torch.Tensor:
        """Layer `index`'s MLP on the normed x [nnz, hidden]: a dense SwiGLU MLP (a
        subclass with mixture-of-experts layers overrides it)."""
        ops = self.ops
        return ops.linear(ops.silu_and_mul(ops.linear(x, layer.gate_up)), layer.down)

    def compile(self, **options: Any) -> None:
        """Run the layers under torch.compile(**options) from now on (forward and decode
        graphs made after this call). With our own CUDA graph around the decode step, use a
        mode without CUDA graphs of its own ("max-autotune-no-cudagraphs", "default")."""
        self.run_layers = torch.compile(self.layers, **options)

    def decode_graph(
        self, batch_size: int, max_kv_len: int | None = None, use_cuda_graph: bool | None = None
    ) -> DecodeGraph:
        """A decode step for `batch_size` requests of at most `max_kv_len` tokens each
        (default: the RoPE table's length), captured in a CUDA graph on a GPU."""
        ps = self.cache.page_size
        per_request = -(-(max_kv_len or self.config.max_position) // ps)
        graph = GraphShape(
            batch_size, min(self.cache.num_pages, batch_size * per_request), per_request
        )
        if use_cuda_graph is None:
            use_cuda_graph = self.device.type == "cuda"
        return DecodeGraph(self, graph, use_cuda_graph)

    def sample(
        self,
        logits: torch.Tensor,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The next token of each row of logits [B, V] (int32): greedy without top_k and
        top_p, else drawn from the top_k most likely tokens, then the top_p nucleus."""
        if top_k is None and top_p is None:
            return logits.argmax(dim=-1).to(torch.int32)
        k = top_k if top_k is not None else logits.shape[-1]
        p = top_p if top_p is not None else 1.0
        return self.ops.top_k_top_p(logits, k, p, generator)


class DecodeGraph:
    """Decode steps of a fixed batch size through static buffers: `step` plans (host),
    copies the new tokens and positions into the buffers and replays the graph captured on
    the first step (or runs the layers eagerly without CUDA graphs). After `compile`, the
    graph holds the compiled kernels."""

    def __init__(self, model: PagedDecoder, shape: GraphShape, use_cuda_graph: bool) -> None:
        self.model = model
        self.shape = shape
        self.use_cuda_graph = use_cuda_graph
        self.attention = model.graph_attention(shape)
        dev, b = model.device, shape.batch_size
        self.tokens = torch.zeros(b, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(b, dtype=torch.int64, device=dev)
        self.logits: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None

    def step(self, tokens: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """Logits [B, V] of the step's requests; tokens [B]: each request's new token. The
        returned tensor is the graph's output buffer: the next step overwrites it."""
        self.attention.plan(batch)
        self.tokens.copy_(tokens, non_blocking=True)
        self.positions.copy_(batch.positions, non_blocking=True)
        if not self.use_cuda_graph:
            return self.run()
        if self.graph is None:
            self.capture()
        assert self.graph is not None and self.logits is not None
        self.graph.replay()
        return self.logits

    def run(self) -> torch.Tensor:
        """The step's device work on the current buffers (what the graph holds)."""
        return self.model.run_layers(self.tokens, self.positions, self.attention)

    def capture(self, warmup: int = 2) -> None:
        """Warm up on a side stream (autotuning, compilation, lazy allocations), then
        capture. The warm-up steps rewrite the planned step's K/V with the same values."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self.run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.logits = self.run()
        self.graph = graph

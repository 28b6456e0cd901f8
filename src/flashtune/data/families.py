"""Value families: what a synthesized float input looks like, per op type.

i.i.d. N(0, 1) inputs let wrong kernels pass: every row has the same scale, so a wrong eps
in rmsnorm, a GEMM that mishandles small rows or a kernel that clips outliers changes
nothing a global check can see. Each input set therefore draws its float values from a
family that its seed chooses, per op type (docs/evaluation.md, "Input families"):

- entries: normal, uniform or Laplace (heavy-tailed), each of unit variance, one kind per
  input set;
- per-row scales (rows: every dimension but the last) over a range of decades, stratified
  so that a handful of rows already spans the range, given to the *activations*: the inputs
  whose first axis is a var axis (tokens, batch), not the weights (const axes only);
- outlier channels: in half the input sets, a few channels of the last dimension scaled up,
  as LLM activations have.

| op type | activations | weights / other |
| --- | --- | --- |
| rmsnorm | rows 10^[-3, 2], one scale per row shared by every input (hidden and residual); outliers x10..100 on <= 4 channels | as drawn |
| gemm | rows 10^[-3, 1]; outliers x4..32 on <= 8 channels of K | as drawn |
| activation | rows 10^[-2, 1.5] | |
| rope | rows (token-heads) 10^[-2, 0.5] | the cos/sin cache in [-1, 1] |
| attention (ATTENTION_OP_TYPES) | q, k: rows 10^[-0.3, 0.3] (logits stay moderate) | values: ATTENTION_VALUE_MEAN + entries, unscaled |
| gdn | q, k: unit rows (`gdn_values`) | A_log, dt_bias: Qwen3-Next's initial ranges (`gdn_values`) |
| moe | as drawn | a routed MoE's packed `topk_ids`: valid routings (`packed_topk_ids`) |
| mamba_ssu (SSM_OP_TYPES) | as drawn (x, dt, B, C: N(0, 1)) | A: -[1, 16] log-uniform, dt_bias: softplus^-1 of [1e-3, 0.5] log-uniform, one value per head |
| any other | N(0, 1), as before | N(0, 1) |

float8 inputs get entries only (clamped to [-8, 8]): decades of scale would round small
rows to zero. Probability and logit rows of the sampling op types come from
`flashtune.data.sampling_inputs`.

Everything is drawn from the input set's generator, so the seed still fixes every value,
bit for bit on the same kind of device: tensors of at least `DEVICE_DRAW_MIN_NUMEL`
elements are drawn on the target GPU from a generator seeded by the CPU one (`Draws`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "ATTENTION_OP_TYPES",
    "ATTENTION_VALUE_MEAN",
    "DEVICE_DRAW_MIN_NUMEL",
    "FLOAT8_CHUNK_NUMEL",
    "ENTRY_KINDS",
    "Draws",
    "Profile",
    "PROFILES",
    "SSM_OP_TYPES",
    "ValueFamily",
    "profile_for",
    "is_attention_value",
    "gdn_values",
    "packed_topk_ids",
]

# Op types whose outputs are softmax-weighted means of value rows (plus a base-2 LSE).
ATTENTION_OP_TYPES: frozenset[str] = frozenset(
    {"gqa_paged", "gqa_ragged", "mla_paged", "mla_ragged", "dsa_paged", "block_sparse"}
)
# Values are drawn with mean ATTENTION_VALUE_MEAN. With zero-mean values an output averages
# kv_len rows to about 1/sqrt(kv_len) in size (0.007 at 32k tokens), below bf16's atol, so
# an all-zero output "matched" 92% of elements. With mean 0.5 outputs are about 0.5 and zeros
# match none. The mean also shrinks the relative-norm error of wrong kernels (skipping 128 of
# 2048 pages: 0.26 at mean 0, 5.3e-3 at mean 0.5, measured at 32k tokens), so those are
# caught by the LSE bound (9.8e-2 > 1e-3), see flashtune.bench.correctness.
ATTENTION_VALUE_MEAN = 0.5
# Inputs that hold the values an attention output averages: v / v_cache / paged_v_cache, and
# MLA's compressed cache (ckv_cache), which is both key and value: a constant added to every
# key shifts each query's logits by the same amount, which the softmax ignores.
_VALUE_NAMES = frozenset({"v", "value", "values"})
_VALUE_SUFFIXES = ("v_cache", "value_cache")

# State-space decode steps (Mamba-2's selective state update). Their decay dA = exp(dt' * A),
# dt' = softplus(dt + dt_bias), is what the op is about: N(0, 1) weights give A > 0 for half
# the heads (a state that grows by up to e^10 a step, which no trained model has) and decays
# near 1 otherwise, so a kernel that skips the decay or the softplus barely shows. Drawn as
# Mamba-2 parametrizes them instead: A = -exp(A_log) with |A| log-uniform in [1, 16] (its
# init range), dt_bias = softplus^-1(dt0) with dt0 log-uniform in [1e-3, 0.5] (its init is
# [1e-3, 0.1]; trained models reach larger steps), both one value per head as the models
# store them; dt itself N(0, 1). The decays then spread over (0, 1): 8% under 0.1, 18% in
# [0.1, 0.5], 30% in [0.5, 0.9], 32% in [0.9, 0.99], 12% above (64 heads x 256 rows).
SSM_OP_TYPES: frozenset[str] = frozenset({"mamba_ssu"})
_SSM_A_RANGE = (1.0, 16.0)
_SSM_DT_RANGE = (1e-3, 0.5)

# Float tensors at least this large are drawn on the target GPU (see `Draws`).
DEVICE_DRAW_MIN_NUMEL = 1 << 20
# float8 inputs larger than this are drawn in slabs of about this many elements
# (ValueFamily._float8_in_slabs): 1 GiB of float32 entries at a time.
FLOAT8_CHUNK_NUMEL = 1 << 28

ENTRY_KINDS = ("normal", "uniform", "laplace")
# Rows up to this many get stratified log-scales (a random permutation of equal strata);
# more rows cover the range by plain log-uniform draws.
_STRATIFY_MAX_ROWS = 1 << 16
_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_attention_value(op_type: str, lname: str) -> bool:
    """Whether input `lname` (lower case) of an `op_type` definition holds attention values."""
    return op_type in ATTENTION_OP_TYPES and (
        lname in _VALUE_NAMES or lname.endswith(_VALUE_SUFFIXES)
    )


class Draws:
    """The random numbers of one input set: from the CPU generator `gen`, or, for tensors of
    at least DEVICE_DRAW_MIN_NUMEL elements bound for a GPU, on that GPU from a generator
    seeded by one draw of `gen` (the same seed gives the same values on the same kind of
    device, and a 10^8-element cache takes milliseconds instead of seconds)."""

    def __init__(self, gen: torch.Generator, device: torch.device | None = None) -> None:
        self.gen = gen
        self.device = device

    def _source(self, numel: int) -> tuple[torch.Generator, torch.device | None]:
        dev = self.device
        if dev is None or dev.type != "cuda" or numel < DEVICE_DRAW_MIN_NUMEL:
            return self.gen, None
        seed = int(torch.randint(0, 2**62, (1,), generator=self.gen).item())
        return torch.Generator(device=dev).manual_seed(seed), dev

    def randn(self, shape: Sequence[int]) -> torch.Tensor:
        gen, dev = self._source(math.prod(shape))
        return torch.randn(tuple(shape), generator=gen, device=dev)

    def rand(self, shape: Sequence[int]) -> torch.Tensor:
        gen, dev = self._source(math.prod(shape))
        return torch.rand(tuple(shape), generator=gen, device=dev)

    def entries(self, kind: str, shape: Sequence[int]) -> torch.Tensor:
        """Unit-variance entries of `kind` (ENTRY_KINDS), float32."""
        if kind == "normal":
            return self.randn(shape)
        if kind not in ENTRY_KINDS:
            raise ValueError(f"unknown entry kind {kind!r}; known: {', '.join(ENTRY_KINDS)}")
        u = self.rand(shape)  # in place from here: a 10^8-element weight costs ~1 s on a CPU
        if kind == "uniform":
            return u.mul_(2 * math.sqrt(3.0)).sub_(math.sqrt(3.0))
        # Laplace by the inverse CDF; |u - 1/2| = 1/2 (u = 0) is clamped to a finite tail.
        sign = u.sub_(0.5).sign()
        tail = u.abs_().mul_(-2).add_(1).clamp_min_(2.0**-24).log_()
        return tail.mul_(sign).mul_(-1 / math.sqrt(2.0))


@dataclass(frozen=True)
class Profile:
    """An op type's family (module docstring's table).

    kinds: the entry kinds an input set picks from; row_decades: log10 range of the per-row
    scales of activations (None: no scales); shared_rows: one scale vector for every
    activation with the same rows; outliers: at most this many channels scaled up, in half
    the input sets, by a log-uniform factor in outlier_scale."""

    kinds: tuple[str, ...] = ("normal",)
    row_decades: tuple[float, float] | None = None
    shared_rows: bool = False
    outliers: int = 0
    outlier_scale: tuple[float, float] = (1.0, 1.0)


GENERIC = Profile()
_ATTENTION = Profile(kinds=ENTRY_KINDS, row_decades=(-0.3, 0.3))
PROFILES: dict[str, Profile] = {
    "rmsnorm": Profile(
        kinds=ENTRY_KINDS,
        row_decades=(-3.0, 2.0),
        shared_rows=True,
        outliers=4,
        outlier_scale=(10.0, 100.0),
    ),
    "gemm": Profile(
        kinds=ENTRY_KINDS, row_decades=(-3.0, 1.0), outliers=8, outlier_scale=(4.0, 32.0)
    ),
    "activation": Profile(kinds=ENTRY_KINDS, row_decades=(-2.0, 1.5)),
    # up to ~3: beyond, a rotation in bf16 arithmetic (HuggingFace's) misses atol on the
    # elements where x1 cos - x2 sin cancels, more often than matched_ratio allows
    "rope": Profile(kinds=ENTRY_KINDS, row_decades=(-2.0, 0.5)),
    **{op_type: _ATTENTION for op_type in sorted(ATTENTION_OP_TYPES)},
}


def profile_for(op_type: str) -> Profile:
    """The op type's family; unknown op types get N(0, 1) entries, unscaled (GENERIC)."""
    return PROFILES.get(op_type, GENERIC)


# Gated Delta Net (op type "gdn"): the delta rule S <- g S + beta (v - g S k) k^T is stable only
# for beta |k|^2 < 2, so N(0, 1) keys (|k|^2 ~ head_size) blow the state up ~60x a token: the
# model l2-normalizes q and k first, and so do these draws. N(0, 1) gate parameters give a
# decay g = exp(-exp(A_log) softplus(a + dt_bias)) near 0.3 every token, which forgets a
# 64-token chunk's state entirely and would leave the chunked prefill's state passing
# untested; Qwen3-Next's initial ranges (exp(A_log) in [1, 16], softplus(dt_bias) in
# [1e-3, 1e-1], log-uniform) give per-token decays from ~0.01 to ~0.999 (memories of a few
# to thousands of tokens). a and b stay as drawn (beta = sigmoid(b) mostly in 0.2..0.8).
_GDN_INPUTS = frozenset({"q", "k", "a_log", "dt_bias"})


def gdn_values(lname: str, x: torch.Tensor, draws: Draws) -> torch.Tensor:
    """GDN's q and k rows at unit norm, A_log and dt_bias in Qwen3-Next's initial ranges
    (see above), from the entries `x` (float32) and the input set's generator."""
    if lname in ("q", "k"):
        return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    u = draws.rand(x.shape).to(x.device)
    if lname == "a_log":
        return u * math.log(16.0)  # exp(A_log) in [1, 16]
    dt = torch.pow(10.0, -3.0 + 2.0 * u)  # softplus(dt_bias) = dt in [1e-3, 1e-1]
    return torch.log(torch.expm1(dt))


def _ssm_weight(lname: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A state-space op's A or dt_bias: one value per head (the first dimension), broadcast
    over the rest (see SSM_OP_TYPES)."""
    u = torch.rand(shape[0], generator=gen, dtype=torch.float64)
    if lname == "a":
        lo, hi = (math.log(v) for v in _SSM_A_RANGE)
        per_head = -torch.exp(lo + (hi - lo) * u)
    else:
        lo, hi = (math.log(v) for v in _SSM_DT_RANGE)
        dt0 = torch.exp(lo + (hi - lo) * u)
        per_head = dt0 + torch.log(-torch.expm1(-dt0))  # softplus^-1(dt0)
    view = per_head.float().reshape(-1, *([1] * (len(shape) - 1)))
    return view.expand(shape).contiguous()


# A routed MoE's pre-computed routing (FlashInfer's trtllm_fp4_block_scale_routed_moe):
# topk_ids [T, K] int32 packing each expert id (high 16 bits) with its routing weight's
# bfloat16 bits (low 16). Random int32s would name experts far outside [0, E), repeat an
# expert within a row and hold NaN or negative weights, none of which a router produces:
# each row names K distinct experts with positive weights, a softmax over K draws (summing to
# 1, as Renormalize's do) or, for K = 1, a sigmoid of one (Llama4's top-1 weight: a weight of
# exactly 1 would hide whether a kernel applies it to the token or to the expert's output).
MOE_PACKED_IDS: frozenset[str] = frozenset({"topk_ids"})


def packed_topk_ids(shape: Sequence[int], num_experts: int, gen: torch.Generator) -> torch.Tensor:
    """Valid packed routings [T, K] int32 over `num_experts` experts (see MOE_PACKED_IDS)."""
    rows, k = shape
    if not 1 <= k <= num_experts < 1 << 15:
        raise ValueError(f"topk_ids [T, {k}] cannot route over {num_experts} experts")
    ids = torch.rand(rows, num_experts, generator=gen).argsort(dim=1)[:, :k]
    logits = torch.randn(rows, k, generator=gen)
    weights = torch.sigmoid(logits) if k == 1 else torch.softmax(logits, dim=-1)
    bits = weights.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    return (ids.to(torch.int32) << 16) | bits


class ValueFamily:
    """One input set's draw of its op type's family: the entry kind and whether it has
    outlier channels are chosen here, from `draws`' generator, once per input set."""

    def __init__(self, op_type: str, draws: Draws) -> None:
        self.op_type = op_type
        self.profile = profile_for(op_type)
        self.draws = draws
        gen = draws.gen
        kinds = self.profile.kinds
        self.kind = kinds[int(torch.randint(len(kinds), (1,), generator=gen))]
        self.with_outliers = (
            self.profile.outliers > 0 and int(torch.randint(2, (1,), generator=gen)) == 1
        )
        self._rows: dict[int, torch.Tensor] = {}  # rows -> scales (shared_rows)
        self._outliers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # last dim -> (idx, x)

    def describe(self) -> str:
        """E.g. "rmsnorm: laplace entries, rows 10^[-3, 2], outlier channels"."""
        p = self.profile
        parts = [f"{self.kind} entries"]
        if p.row_decades is not None:
            parts.append(f"rows 10^[{p.row_decades[0]:g}, {p.row_decades[1]:g}]")
        if self.with_outliers:
            parts.append("outlier channels")
        return f"{self.op_type}: {', '.join(parts)}"

    def values(
        self, lname: str, shape: tuple[int, ...], dtype: torch.dtype, activation: bool
    ) -> torch.Tensor:
        """Float values for input `lname` (lower case) of `shape`, as `dtype`. `activation`:
        the input's first axis is a var axis (module docstring)."""
        if self.op_type in SSM_OP_TYPES and lname in ("a", "dt_bias") and shape:
            return _ssm_weight(lname, shape, self.draws.gen).to(dtype)
        if dtype in _FLOAT8 and math.prod(shape) > FLOAT8_CHUNK_NUMEL and len(shape) >= 2:
            return self._float8_in_slabs(lname, shape, dtype)
        x = self.draws.entries(self.kind, shape)
        if dtype in _FLOAT8:
            return self._as_float8(lname, x, dtype)
        shaped = self._op_specific(lname, x)
        if shaped is not None:
            return shaped.to(dtype)
        p = self.profile
        if activation and len(shape) >= 2 and p.row_decades is not None:
            rows = math.prod(shape[:-1])
            scales = self._row_scales(rows, p.row_decades, p.shared_rows)
            x = x * scales.to(x.device).reshape(*shape[:-1], 1)
            if self.with_outliers and shape[-1] > 1:
                idx, factor = self._outlier_channels(shape[-1])
                x[..., idx.to(x.device)] *= factor.to(x.device)
        return x.to(dtype)

    def _op_specific(self, lname: str, x: torch.Tensor) -> torch.Tensor | None:
        """The entries `x` mapped as this op type's input `lname` takes them (GDN's unit rows
        and gate ranges, attention values' mean), or None: drawn as the profile says."""
        if self.op_type == "gdn" and lname in _GDN_INPUTS:
            return gdn_values(lname, x, self.draws)
        if is_attention_value(self.op_type, lname):
            return x + ATTENTION_VALUE_MEAN
        return None

    def _as_float8(self, lname: str, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Entries as a float8 input: op-specific values, else the entries clamped to [-8, 8]
        (no row scales: decades of scale would round small rows to zero)."""
        shaped = self._op_specific(lname, x)
        return (x.clamp_(-8, 8) if shaped is None else shaped).to(dtype)

    def _float8_in_slabs(
        self, lname: str, shape: tuple[int, ...], dtype: torch.dtype
    ) -> torch.Tensor:
        """A large float8 input drawn a slab of its first axis at a time, each slab as
        `_as_float8` makes a whole one: drawn whole, its float32 entries and their temporaries
        (Laplace's sign) take 12x the float8 tensor, 135 GB for the 384 experts of a Kimi-K2
        MoE layer's gemm1_weights (11 GB as float8), more than an H200 has."""
        step = max(1, FLOAT8_CHUNK_NUMEL // math.prod(shape[1:]))
        out: torch.Tensor | None = None
        for start in range(0, shape[0], step):
            stop = min(start + step, shape[0])
            slab = self._as_float8(
                lname, self.draws.entries(self.kind, (stop - start, *shape[1:])), dtype
            )
            if out is None:  # on the device the draws chose
                out = torch.empty(shape, dtype=dtype, device=slab.device)
            out[start:stop] = slab
        assert out is not None  # shape[0] >= 1: the caller's size test
        return out

    def _row_scales(self, rows: int, decades: tuple[float, float], shared: bool) -> torch.Tensor:
        if shared and rows in self._rows:
            return self._rows[rows]
        lo, hi = decades
        gen = self.draws.gen
        u = torch.rand(rows, generator=gen, dtype=torch.float64)
        if rows <= _STRATIFY_MAX_ROWS:  # one row in each of `rows` equal strata, shuffled
            u = (torch.randperm(rows, generator=gen).double() + u) / rows
        scales = torch.pow(10.0, lo + (hi - lo) * u).float()
        if shared:
            self._rows[rows] = scales
        return scales

    def _outlier_channels(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        if width not in self._outliers:
            gen = self.draws.gen
            count = int(
                torch.randint(1, min(self.profile.outliers, width) + 1, (1,), generator=gen)
            )
            idx = torch.randperm(width, generator=gen)[:count]
            lo, hi = (math.log10(v) for v in self.profile.outlier_scale)
            factor = torch.pow(10.0, lo + (hi - lo) * torch.rand(count, generator=gen)).float()
            self._outliers[width] = (idx, factor)
        return self._outliers[width]

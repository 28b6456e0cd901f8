"""`import flashtune as flashinfer`: FlashInfer 0.2.14's names at the top level and in its
submodules, names the attention package has not grown yet, and the drop-in runner of
FlashInfer's own tests (scripts/flashinfer_dropin) with its stand-ins."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import flashtune
from flashtune.ops.rope import reference as rope_ops

ROOT = Path(__file__).resolve().parents[1]
DROPIN = ROOT / "scripts" / "flashinfer_dropin"

# FlashInfer 0.2.14's top-level names (flashinfer/__init__.py) that flashtune implements, by
# the submodule FlashInfer defines them in.
FLASHINFER_TOP_LEVEL = {
    "activation": ["gelu_and_mul", "gelu_tanh_and_mul", "silu_and_mul"],
    "cascade": [
        "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
        "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
        "MultiLevelCascadeAttentionWrapper",
        "merge_state",
        "merge_state_in_place",
        "merge_states",
    ],
    "decode": [
        "BatchDecodeWithPagedKVCacheWrapper",
        "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
        "single_decode_with_kv_cache",
    ],
    "fused_moe": [
        "RoutingMethodType",
        "trtllm_fp8_block_scale_moe",
        "trtllm_fp8_per_tensor_scale_moe",
    ],
    "mla": ["BatchMLAPagedAttentionWrapper"],
    "norm": ["fused_add_rmsnorm", "gemma_fused_add_rmsnorm", "gemma_rmsnorm", "rmsnorm"],
    "page": [
        "append_paged_kv_cache",
        "append_paged_mla_kv_cache",
        "get_batch_indices_positions",
        "get_seq_lens",
    ],
    "prefill": [
        "BatchPrefillWithPagedKVCacheWrapper",
        "BatchPrefillWithRaggedKVCacheWrapper",
        "single_prefill_with_kv_cache",
        "single_prefill_with_kv_cache_return_lse",
    ],
    "rope": [
        "apply_llama31_rope",
        "apply_llama31_rope_inplace",
        "apply_llama31_rope_pos_ids",
        "apply_llama31_rope_pos_ids_inplace",
        "apply_rope",
        "apply_rope_inplace",
        "apply_rope_pos_ids",
        "apply_rope_pos_ids_inplace",
        "apply_rope_with_cos_sin_cache",
        "apply_rope_with_cos_sin_cache_inplace",
    ],
    "sampling": [
        "chain_speculative_sampling",
        "min_p_sampling_from_probs",
        "sampling_from_logits",
        "sampling_from_probs",
        "softmax",
        "top_k_mask_logits",
        "top_k_renorm_probs",
        "top_k_sampling_from_probs",
        "top_k_top_p_sampling_from_logits",
        "top_k_top_p_sampling_from_probs",
        "top_p_renorm_probs",
        "top_p_sampling_from_probs",
    ],
}


@pytest.mark.parametrize("module", sorted(FLASHINFER_TOP_LEVEL))
def test_flashinfer_names_at_the_top_and_in_their_submodule(module):
    import flashtune as flashinfer

    sub = getattr(flashinfer, module)
    assert isinstance(sub, ModuleType) and sub.__name__ == f"flashtune.{module}"
    assert importlib.import_module(f"flashtune.{module}") is sub
    for name in FLASHINFER_TOP_LEVEL[module]:
        assert getattr(flashinfer, name) is getattr(sub, name), name
        assert callable(getattr(sub, name)), name
        assert name in sub.__all__ and name in flashinfer.__all__, name


def test_submodule_only_names():
    """Names FlashInfer keeps in a submodule, not at its top level."""
    import flashtune as flashinfer

    assert callable(flashinfer.rope.mla_rope_quantize_fp8)
    assert "mla_rope_quantize_fp8" not in flashinfer.__all__


def test_star_imports_take_what_exists():
    names: dict[str, object] = {}
    exec("from flashtune import *", names)
    assert names["rmsnorm"] is flashtune.rmsnorm
    assert names["decode"] is flashtune.decode
    for module in FLASHINFER_TOP_LEVEL:
        sub_names: dict[str, object] = {}
        exec(f"from flashtune.{module} import *", sub_names)
        assert set(FLASHINFER_TOP_LEVEL[module]) <= set(sub_names), module


def test_unknown_names_are_attribute_errors():
    # A FlashInfer name flashtune does not serve (cuDNN's decode).
    with pytest.raises(AttributeError, match="no attribute 'cudnn_batch_decode_with_kv_cache'"):
        flashtune.cudnn_batch_decode_with_kv_cache  # noqa: B018
    with pytest.raises(AttributeError):
        flashtune.decode.trtllm_batch_decode_with_kv_cache  # noqa: B018


def test_return_lse_form_is_single_prefill_with_return_lse(monkeypatch):
    seen = {}

    def fake(*args, **kwargs):
        seen.update(kwargs, args=args)
        return "out", "lse"

    monkeypatch.setattr(flashtune.prefill, "single_prefill_with_kv_cache", fake)
    assert flashtune.prefill.single_prefill_with_kv_cache_return_lse(1, 2, 3, causal=True) == (
        "out",
        "lse",
    )
    assert seen == {"args": (1, 2, 3), "causal": True, "return_lse": True}


# --------------------------------------------------------------------------- the drop-in runner


def _load_runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flashinfer_dropin_run", DROPIN / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sampling_is_deterministic_and_grows_by_inclusion():
    run = _load_runner()
    ids = [f"test_x.py::test_y[{i}-{i % 7}]" for i in range(200)]
    small, large = run.sample(ids, 10), run.sample(ids, 40)
    assert len(small) == 10 and len(large) == 40
    assert set(run.sample(list(reversed(ids)), 10)) == set(small)  # order-free choice
    assert set(small) <= set(large)
    assert small == [i for i in ids if i in set(small)]  # file order kept
    assert run.sample(ids, None) == ids and run.sample(ids[:5], 10) == ids[:5]
    # the key ignores the file part: a renamed copy samples the same tests
    renamed = [i.replace("test_x.py", "other/test_x.py") for i in ids]
    assert [i.split("::")[1] for i in run.sample(renamed, 10)] == [i.split("::")[1] for i in small]


def test_cpu_mode_rewrites_only_the_device():
    run = _load_runner()
    source = (
        'x = torch.randn(3, device="cuda:0")\n'
        "y = torch.randn(3).to(0)\n"
        "major, _ = get_compute_capability(x.device)\n"
        'z = torch.empty(2, device="cuda")\n'
        'name = "cudagraph"\n'
    )
    assert run.rewrite_for_cpu(source) == (
        'x = torch.randn(3, device="cpu")\n'
        'y = torch.randn(3).to("cpu")\n'
        "major = 9\n"
        'z = torch.empty(2, device="cpu")\n'
        'name = "cudagraph"\n'
    )


def test_out_of_scope_lists_reasons():
    run = _load_runner()
    assert run.OUT_OF_SCOPE and all(reason for reason in run.OUT_OF_SCOPE.values())
    assert not set(run.OUT_OF_SCOPE) & set(run.FILES)


@pytest.mark.slow  # processes for seconds (the main suite stays under 10 minutes)
def test_runner_runs_a_flashinfer_style_file_against_the_standin(tmp_path):
    """The whole path on CPU: a test file written as FlashInfer's are (import flashinfer, the
    JIT warm-up fixture, jit_utils and rope_reference), one process per file, the sample,
    the counts and the JSON summary."""
    (tmp_path / "test_standin.py").write_text(
        "import pytest, torch\n"
        "from jit_utils import gen_decode_attention_modules\n"
        "from rope_reference import *\n"
        "import flashinfer\n"
        "from flashinfer.utils import get_compute_capability\n"
        "\n"
        "@pytest.fixture(autouse=True, scope='module')\n"
        "def warmup_jit():\n"
        "    flashinfer.jit.build_jit_specs(gen_decode_attention_modules(), verbose=False)\n"
        "    flashinfer.jit.build_jit_specs([flashinfer.activation.gen_act_and_mul_module('silu')])\n"
        "    yield\n"
        "\n"
        "@pytest.mark.parametrize('rows', [1, 3, 5, 7])\n"
        "def test_rmsnorm(rows):\n"
        "    x, w = torch.randn(rows, 64), torch.randn(64)\n"
        "    y = flashinfer.norm.rmsnorm(x, w, enable_pdl=False)\n"
        "    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w\n"
        "    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)\n"
        "\n"
        "def test_missing_api():\n"
        "    flashinfer.cudnn_batch_decode_with_kv_cache\n"
        "\n"
        "def test_skipped():\n"
        "    pytest.skip('needs a GPU')\n"
    )
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(DROPIN / "run.py"),
            "--tests-dir",
            str(tmp_path),
            "--files",
            "test_standin",
            "--per-file",
            "5",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(out.read_text())
    (row,) = summary["files"]
    assert row["collected"] == 6 and row["selected"] == 5
    counts = row["counts"]
    assert sum(counts.values()) == 5
    assert counts["failed"] == ("test_standin.py::test_missing_api" in row["failures"])
    assert counts["error"] == 0
    assert all("cudnn" in message for message in row["failures"].values())
    assert summary["passed"] == counts["passed"] >= 3
    assert "test_standin" in proc.stdout and "passed" in proc.stdout


# --------------------------------------------------------------------------- rope_reference


def _rope_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "rope_reference_standin", DROPIN / "standin" / "rope_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("use_scaled", [False, True], ids=["rope", "llama31"])
def test_rope_reference_agrees_with_flashtune_references(use_scaled):
    """The stand-in (complex rotations, as FlashInfer's test compares) and flashtune's
    references (real arithmetic, interleaved pairs) are two writings of one definition."""
    ref = _rope_reference()
    torch.manual_seed(0)
    batch, seq, offset, heads, dim, rd = 3, 5, 7, 2, 64, 48
    theta = 5e5 if use_scaled else 1e4
    q = torch.randn(batch * seq, heads, dim)
    k = torch.randn(batch * seq, 1, dim)
    freqs = ref.precompute_freqs_cis(rd, seq + offset, theta, use_scaled=use_scaled)
    q_rot, k_rot = ref.apply_rotary_emb(
        q.reshape(batch, seq, heads, dim)[..., :rd],
        k.reshape(batch, seq, 1, dim)[..., :rd],
        freqs[offset : offset + seq],
    )
    indptr = torch.arange(0, batch * seq + 1, seq, dtype=torch.int32)
    offsets = torch.full((batch,), offset, dtype=torch.int32)
    if use_scaled:
        q_ref, k_ref = rope_ops.apply_llama31_rope_ref(
            q, k, indptr, offsets, rd, interleave=True, rope_theta=theta
        )
    else:
        q_ref, k_ref = rope_ops.apply_rope_ref(
            q, k, indptr, offsets, rd, interleave=True, rope_theta=theta
        )
    torch.testing.assert_close(q_rot.reshape(-1, heads, rd), q_ref[..., :rd], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_rot.reshape(-1, 1, rd), k_ref[..., :rd], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
def test_rotary_embedding_agrees_with_the_cache_reference(neox):
    ref = _rope_reference()
    layer = ref.RotaryEmbedding(64, 32, 100, 8000, neox, torch.float32, "cpu")
    assert layer.cos_sin_cache.dtype == torch.float32 and layer.cos_sin_cache.shape == (100, 32)
    pos = torch.randint(0, 100, (9,))
    q, k = torch.randn(9, 3 * 64), torch.randn(9, 64)
    q_out, k_out = layer.forward_native(pos, q, k)
    q_ref, k_ref = rope_ops.rope_with_cos_sin_cache_ref(q, k, layer.cos_sin_cache, pos, 64, neox)
    torch.testing.assert_close(q_out, q_ref)
    torch.testing.assert_close(k_out, k_ref)
    assert q_out.shape == q.shape and k_out.shape == k.shape

"""`flashinfer.jit.attention`: the JIT module generators FlashInfer's attention tests call in
their warm-up fixtures (test_deepseek_mla.py: single/batch prefill at QK 192 / VO 128 and the
batch MLA module) and hand to `build_jit_specs`. flashtune builds nothing ahead: each
returns None, whatever its arguments (backend, dtypes, head dims, variant flags)."""

from typing import Any


def gen_single_prefill_module(*args: Any, **kwargs: Any) -> None:
    return None


def gen_batch_prefill_module(*args: Any, **kwargs: Any) -> None:
    return None


def gen_single_decode_module(*args: Any, **kwargs: Any) -> None:
    return None


def gen_batch_decode_module(*args: Any, **kwargs: Any) -> None:
    return None


def gen_batch_mla_module(*args: Any, **kwargs: Any) -> None:
    return None


def gen_batch_decode_mla_module(*args: Any, **kwargs: Any) -> None:
    return None

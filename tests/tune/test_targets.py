"""`flashtune tune --ops NAME`: the targets come from the op schemas and their examples."""

from __future__ import annotations

import torch

from flashtune.cli.tune import tune_targets_for
from flashtune.model_shapes import get_model
from flashtune.schema import Const, OpSchema, Tensor, Var, api
from flashtune.tune.targets import tune_targets


def test_targets_at_a_models_shapes() -> None:
    model = get_model("llama-3.1-8b")
    targets = tune_targets_for(model.name)
    assert {"gemm", "rmsnorm", "fused_add_rmsnorm", "silu_and_mul"} <= set(targets)
    gemms = sorted(call.definition_name for call in targets["gemm"])
    assert gemms == sorted(f"gemm_n{n}_k{k}" for n, k in model.gemm_nk())
    assert [c.definition_name for c in targets["rmsnorm"]] == [f"rmsnorm_h{model.hidden_size}"]
    # A page table cannot be made up at another batch size: attention is not a target.
    assert not [name for name in targets if name.startswith("gqa_")]


def test_a_target_remakes_its_inputs_at_any_token_count() -> None:
    (call,) = tune_targets_for("llama-3.1-8b")["rope_with_cos_sin_cache_neox_style"]
    arguments = call.arguments(5, torch.float16, "cpu")
    assert arguments["query"].shape == (5, 32, 128) and arguments["query"].dtype == torch.float16
    assert arguments["key"].shape == (5, 8, 128)
    assert arguments["positions"].shape == (5,) and arguments["positions"].dtype == torch.int64
    assert arguments["cos_sin_cache"].dtype == torch.float32  # fixed by the schema
    assert arguments["head_size"] == 128 and arguments["is_neox"] is True


SCALE = OpSchema(
    op_type="scale",
    name_prefix="scale",
    axes={"rows": Var(), "cols": Const(abbrev="c")},
    inputs={"x": Tensor(["rows", "cols"], dtype_from="x")},
    outputs={"y": Tensor(["rows", "cols"], dtype_from="x")},
    reference=lambda x: x * 2,
)
CALLS: list[tuple[int, ...]] = []


@api(schema=SCALE)
def scale(x: torch.Tensor) -> torch.Tensor:
    CALLS.append(tuple(x.shape))
    return x * 2


def test_running_a_target_calls_the_op_at_that_size() -> None:
    example = (scale, (torch.empty(1, 3, device="meta"),), {})
    (call,) = tune_targets([example, example])["scale"]  # one per Definition
    CALLS.clear()
    call.run(7, torch.float32, "cpu")
    assert CALLS == [(7, 3)]

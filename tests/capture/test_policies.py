"""Dump and filter policies, and config resolution."""

from __future__ import annotations

import pytest
import torch

from flashtune.capture.policies import CaptureConfig, WorkloadFilter, resolve_config, should_dump
from flashtune.data import Workload


def _w(**axes: int) -> Workload:
    return Workload(uuid="u", axes=axes, inputs={})


FLOAT = torch.randn(3)
INT = torch.tensor([1, 2], dtype=torch.int32)
BOOL = torch.tensor([True])


@pytest.mark.parametrize(
    ("policy", "name", "value", "expected"),
    [
        ("dump_all", "x", FLOAT, True),
        ("dump_all", "i", INT, True),
        ("dump_none", "x", FLOAT, False),
        ("dump_none", "i", INT, False),
        ("dump_int", "x", FLOAT, False),
        ("dump_int", "i", INT, True),
        ("dump_int", "m", BOOL, True),
        (("x",), "x", FLOAT, True),
        (("x",), "i", INT, False),
        ("dump_all", "s", 0.5, False),  # scalars are recorded by value, never as blobs
    ],
)
def test_should_dump(policy, name, value, expected) -> None:
    assert should_dump(policy, name, value) is expected


def _kept(config: CaptureConfig, seq: list[tuple[str, dict[str, int]]]) -> list[int]:
    f = WorkloadFilter(config)
    return [i for i, (d, axes) in enumerate(seq) if f.keep(d, _w(**axes))]


SEQ = [
    ("a", {"m": 1}),
    ("a", {"m": 1}),
    ("a", {"m": 2}),
    ("b", {"m": 1}),
    ("a", {"m": 2}),
    ("a", {"m": 3}),
    ("a", {"m": 1}),
]


@pytest.mark.parametrize(
    ("policy", "k", "expected"),
    [
        ("keep_all", 8, [0, 1, 2, 3, 4, 5, 6]),
        ("keep_none", 8, []),
        ("keep_first", 8, [0, 3]),
        ("keep_first_k", 2, [0, 1, 3]),
        ("keep_first_k_by_axes", 2, [0, 1, 2, 3, 4, 5]),
        ("shape_only", 8, [0, 2, 3, 5]),
    ],
)
def test_filter_policies(policy, k, expected) -> None:
    assert _kept(CaptureConfig(filter_policy=policy, k=k), SEQ) == expected


def test_callable_filter_dedups_on_its_key() -> None:
    # Keep one workload per parity of m (per definition).
    config = CaptureConfig(filter_policy=lambda w: w.axes["m"] % 2)
    assert _kept(config, SEQ) == [0, 2, 3]


def test_sticky_only_for_final_drops() -> None:
    assert CaptureConfig(filter_policy="shape_only").sticky
    assert not CaptureConfig(filter_policy="keep_all").sticky
    assert not CaptureConfig(filter_policy=lambda w: 0).sticky


def test_invalid_configs() -> None:
    with pytest.raises(ValueError, match="input_dump_policy"):
        CaptureConfig(input_dump_policy="dump_some")
    with pytest.raises(ValueError, match="filter_policy"):
        CaptureConfig(filter_policy="keep_most")
    with pytest.raises(TypeError):
        CaptureConfig(filter_policy=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be"):
        CaptureConfig(k=0)
    assert CaptureConfig(input_dump_policy=["a", "b"]).input_dump_policy == ("a", "b")


def test_resolve_config_order() -> None:
    exact, glob, op, default = (CaptureConfig(k=i) for i in range(1, 5))
    configs = {"gemm_n8_k8": exact, "gemm_n1*": glob, "gemm": op}
    assert resolve_config(configs, default, "gemm_n8_k8", "gemm") is exact
    assert resolve_config(configs, default, "gemm_n16_k8", "gemm") is glob
    assert resolve_config(configs, default, "gemm_n32_k8", "gemm") is op
    assert resolve_config(configs, default, "rmsnorm_h8", "rmsnorm") is default
    assert resolve_config(configs, None, "rmsnorm_h8", "rmsnorm") is None

"""When a launch uses programmatic dependent launch (ops/pdl.py)."""

from __future__ import annotations

import pytest
import torch

from flashtune.ops import pdl


@pytest.mark.parametrize("enable_pdl", [None, False, True])
def test_never_on_cpu_tensors(enable_pdl):
    assert pdl.use_pdl(torch.device("cpu"), enable_pdl) is False


def test_off_in_the_interpreter_even_on_cuda_tensors(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.use_pdl(torch.device("cuda", 0), True) is False


def test_asked_for_by_a_bool_or_none():
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None, got str"):
        pdl.use_pdl(torch.device("cpu"), "yes")  # type: ignore[arg-type]


def test_launch_options_only_name_pdl_when_used():
    assert pdl.launch_options(False) == {}
    assert pdl.launch_options(True) == {"launch_pdl": True}


@pytest.mark.cuda
def test_follows_the_device_capability(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    major = torch.cuda.get_device_capability()[0]
    assert pdl.use_pdl(torch.device("cuda"), True) is (major >= 9)
    assert pdl.use_pdl(torch.device("cuda"), False) is False
    assert pdl.use_pdl(torch.device("cuda"), None) is (pdl.PDL_BY_DEFAULT and major >= 9)

"""The sandbox's messages, decoded in the worker: an "outputs" message keeps its shape
whether or not the inputs it sends back are borrowed."""

from __future__ import annotations

import pytest
import torch

from flashtune.bench.messages import decode, decode_message, decode_outputs, encode


def test_outputs_message_round_trips_with_inputs_and_without():
    x, y = torch.randn(3, 4), torch.randn(3)
    payload = {
        "phase": "first",
        "sets": [{"index": 0, "outputs": {"y": y}, "inputs": {"x": x, "scale": 0.5}}],
        "call_s": 0.25,
    }
    for message in (payload, {"phase": "inputs", "sets": [{"index": 0, "inputs": None}]}):
        got = decode_outputs(encode(message))
        assert got.keys() == message.keys()
        assert got["phase"] == message["phase"]
        assert [e.keys() for e in got["sets"]] == [e.keys() for e in message["sets"]]
    got = decode_outputs(encode(payload))
    assert torch.equal(got["sets"][0]["outputs"]["y"], y)
    assert (
        torch.equal(got["sets"][0]["inputs"]["x"], x) and got["sets"][0]["inputs"]["scale"] == 0.5
    )
    assert got["call_s"] == 0.25


def test_messages_without_sets_decode_as_before():
    message = {"phase": "draws", "stacked": torch.arange(6).view(2, 3), "count": 2}
    got, plain = decode_outputs(encode(message)), decode(encode(message))
    assert got.keys() == plain.keys() and torch.equal(got["stacked"], plain["stacked"])
    assert decode_outputs(encode([1, 2])) == [1, 2]


def _cuda_description(size, stride, offset, nbytes):
    return {
        "__kind__": "cuda",
        "dtype": "float32",
        "size": size,
        "stride": stride,
        "offset": offset,
        "device": 0,
        "nbytes": nbytes,
        "offset_bytes": 0,
        "rc_offset": 0,
        "handle": b"x" * 64,
        "rc_handle": b"y",
        "ev_handle": None,
    }


@pytest.mark.parametrize(
    "size,stride,offset,nbytes",
    [
        ([4, 4], [4, 1], 0, 60),  # one element past a 16-float storage's 15
        ([4, 4], [4, 1], 1, 64),  # the offset pushes the last element out
        ([2, 8], [16, 1], 0, 64),  # a stride that skips past the end
        ([4], [-1], 3, 64),  # negative strides are never sent
        ([4], [1], -1, 64),
        ([4, 4], [1], 0, 64),  # a stride missing
    ],
)
def test_a_cuda_view_outside_its_storage_is_refused_before_mapping(size, stride, offset, nbytes):
    with pytest.raises(ValueError, match="leaves its storage"):
        decode(_cuda_description(size, stride, offset, nbytes))


def test_a_handle_that_does_not_open_is_the_sandboxs_fault():
    """A forged handle (here on a machine without CUDA, or on a GPU: the driver refuses it)
    is a malformed message, never an error of the worker's."""
    with pytest.raises(ValueError, match="malformed tensor description"):
        decode(_cuda_description([4, 4], [4, 1], 0, 64))


def test_a_message_nested_too_deeply_is_refused():
    payload: dict = {"__kind__": "list", "items": []}
    for _ in range(100_000):
        payload = {"__kind__": "list", "items": [payload]}
    with pytest.raises(ValueError, match="nested too deeply"):
        decode_message("outputs", payload)

"""Weights drawn once per workload, when per-sample values do not fit the device.

Every timed sample normally gets new values for every float input (bench/checked_timing.py).
That costs the worker two copies of an input set (its set and the sample's values) and the
sandbox two more, and the worker runs the reference on each sample, whose temporaries come
on top (`reference_temporaries`). A FlashInfer-Trace MoE workload at 128 experts x 5120 x
8192 with float32 weights has a 60 GB set: four copies do not fit a 141 GB H200; with fp8
weights the set is 16 GB, but the reference's float32 copy of the experts takes 64 GB. For
such a workload the *weights* (float inputs whose shape has only const axes: they do not
grow with tokens or batch) keep their first values; activations, and everything else, still
change every sample. The trace's log says so.

What it gives up: a solution may cache work derived from the weights (a re-layout, a
quantization) across samples and leave it out of the timed region, as a serving engine
does once at load time. Outputs still come from new activations every sample, so cached
results stay stale and fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from flashtune.data.models import Definition
from flashtune.timing import tensor_bytes

# Per-sample values cost about four input sets at once (worker: its set and the sample's
# values; sandbox: the same), beside the reference's temporaries on the sample. Weights are
# fixed when that exceeds this share of the device.
_DEVICE_SHARE = 0.8


def reference_temporaries(definition: Definition, inputs: Mapping[str, Any]) -> int:
    """Bytes a reference may hold beside its inputs: a float32 copy of every weight (the
    dataset's MoE references dequantize all experts to float32 before they route: 64 GB for
    128 experts of 5120 x 8192, where the fp8 weights take 16)."""
    names = constant_weights(definition, inputs)
    return sum(4 * inputs[name].numel() for name in names)


def weights_to_fix(
    definition: Definition, inputs: Mapping[str, Any], device: torch.device
) -> tuple[str, ...]:
    """The inputs to draw once per workload (module docstring), or () when per-sample
    values fit."""
    if device.type != "cuda":
        return ()
    set_bytes = tensor_bytes(inputs.values())
    total = torch.cuda.get_device_properties(device).total_memory
    need = 4 * set_bytes + reference_temporaries(definition, inputs)
    if need <= _DEVICE_SHARE * total:
        return ()
    return constant_weights(definition, inputs)


def constant_weights(definition: Definition, inputs: Mapping[str, Any]) -> tuple[str, ...]:
    """Float tensor inputs whose every axis is const (weights, not activations)."""
    return tuple(
        name
        for name, spec in definition.inputs.items()
        if spec.shape
        and all(definition.axes[a].type == "const" for a in spec.shape)
        and isinstance(inputs.get(name), torch.Tensor)
        and inputs[name].is_floating_point()
    )


_CHUNK = 1 << 27  # bytes summed at once (two int64 temporaries of 1 GB)


def checksum(t: torch.Tensor) -> tuple[int, int]:
    """A position-weighted sum of a tensor's bytes: tells whether trusted code (the
    reference) wrote into a tensor too large to copy. Not for untrusted code (forgeable)."""
    data = t.detach().contiguous().view(-1).view(torch.uint8)
    plain = weighted = 0
    for i in range(0, data.numel(), _CHUNK):
        part = data[i : i + _CHUNK].to(torch.int64)
        weights = torch.arange(i, i + part.numel(), device=part.device) % 65521 + 1
        plain += int(part.sum())
        weighted += int((part * weights).sum())
    return plain, weighted

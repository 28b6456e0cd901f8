"""Host <-> device transfers of the small integer arrays attention plans are made of.

Plans read index arrays (indptr, last-page lengths) on the host and upload packed work lists.
One pinned buffer per device serves both directions, so a plan costs one stream sync to read
and one asynchronous copy to upload, whatever the number of arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["HostStaging", "host_staging", "host_int64", "packed_offsets"]


class HostStaging:
    """A pinned host buffer reused across plans of one device, for both directions.

    Device-to-host: all small index arrays of a plan are copied into it non_blocking and
    waited for with ONE stream synchronize (a .cpu() per array would sync once each).
    Host-to-device: the packed plan is written into it and copied non_blocking; an event
    marks when the copy has read it, so the next plan never overwrites bytes in flight.
    """

    def __init__(self) -> None:
        self.d2h: torch.Tensor | None = None  # int64, pinned
        self.h2d: torch.Tensor | None = None  # int32, pinned
        self.h2d_done: Any = None  # torch.cuda.Event of the last H2D copy out of h2d

    @staticmethod
    def _grow(buf: torch.Tensor | None, n: int, dtype: torch.dtype) -> torch.Tensor:
        if buf is None or buf.numel() < n:
            size = 1 << max(10, (n - 1).bit_length())  # powers of two: few reallocations
            buf = torch.empty(size, dtype=dtype, pin_memory=True)
        return buf

    def to_host(self, tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
        sizes = [t.numel() for t in tensors]
        self.d2h = self._grow(self.d2h, sum(sizes), torch.int64)
        views, off = [], 0
        for t, n in zip(tensors, sizes, strict=True):
            dst = self.d2h[off : off + n]
            dst.copy_(t, non_blocking=True)  # casts to int64 on the way
            views.append(dst)
            off += n
        cuda = next(t.device for t in tensors if t.device.type == "cuda")
        torch.cuda.current_stream(cuda).synchronize()
        # Copies: the pinned buffer is reused by the next plan.
        return [v.numpy().copy() for v in views]

    def host_buffer(self, n: int) -> np.ndarray:
        """An int32 pinned area of n elements, free to overwrite (waits for the last copy)."""
        if self.h2d_done is not None:
            self.h2d_done.synchronize()
        self.h2d = self._grow(self.h2d, n, torch.int32)
        return self.h2d[:n].numpy()

    def upload(self, dst: torch.Tensor, n: int) -> None:
        """Copy the first n elements written into `host_buffer(n)` to `dst`, asynchronously."""
        h2d = self.h2d
        assert h2d is not None, "upload() follows host_buffer()"
        dst.copy_(h2d[:n], non_blocking=True)
        if self.h2d_done is None:
            self.h2d_done = torch.cuda.Event()
        self.h2d_done.record(torch.cuda.current_stream(dst.device))


_BY_DEVICE: dict[torch.device, HostStaging] = {}


def host_staging(device: torch.device) -> HostStaging:
    if device not in _BY_DEVICE:
        _BY_DEVICE[device] = HostStaging()
    return _BY_DEVICE[device]


def host_int64(*tensors: torch.Tensor) -> list[np.ndarray]:
    """int64 host copies of small index tensors: free on the CPU, one sync on a GPU."""
    if tensors and all(t.device.type == "cpu" for t in tensors):
        return [t.detach().numpy().astype(np.int64) for t in tensors]
    cuda = next(t.device for t in tensors if t.device.type != "cpu")
    return host_staging(cuda).to_host([t.detach() for t in tensors])


def packed_offsets(sizes: Sequence[int]) -> tuple[list[int], int]:
    """(offset of each array, total elements) of int32 arrays of `sizes` packed into one
    buffer, each starting on a 16-byte boundary: Triton specializes kernels on pointer
    alignment, so a view whose alignment followed the batch size would compile a second
    variant of every kernel that reads it."""
    offsets, off = [], 0
    for n in sizes:
        offsets.append(off)
        off += -(-n // 4) * 4
    return offsets, off

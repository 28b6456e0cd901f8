"""Messages from a sandbox to its worker, decoded without running the sender's code.

The child (untrusted: it hosts a solution) sends pickled plain data; `loads` resolves no
global at all, so a message cannot make the worker import or call anything. Tensors travel
as plain descriptions: CPU tensors by value, CUDA tensors as CUDA IPC handles that the worker
opens and copies at once (`decode`) while the child waits.
"""

from __future__ import annotations

import io
import math
import pickle
from collections.abc import Mapping
from typing import Any

import torch
import torch.multiprocessing.reductions as _reductions

__all__ = ["encode", "decode", "loads"]

_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    )
}


def encode(value: Any) -> Any:
    """Tensors -> plain dicts (CPU by value, CUDA as an IPC handle); containers recurse."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        name = str(t.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            return {"__kind__": "unsupported", "type": f"tensor of {t.dtype}"}
        if t.device.type == "cuda":
            _, args = _reductions.reduce_tensor(t)
            (
                _,
                size,
                stride,
                offset,
                _,
                _,
                device,
                handle,
                nbytes,
                offset_bytes,
                _,
                rc_handle,
                rc_offset,
                ev_handle,
                ev_sync,
            ) = args
            return {
                "__kind__": "cuda",
                "dtype": name,
                "size": list(size),
                "stride": list(stride),
                "offset": int(offset),
                "device": int(device),
                "handle": handle,
                "nbytes": int(nbytes),
                "offset_bytes": int(offset_bytes),
                "rc_handle": rc_handle,
                "rc_offset": int(rc_offset),
                "ev_handle": ev_handle,
                "ev_sync": bool(ev_sync),
            }
        c = t.contiguous()
        return {
            "__kind__": "cpu",
            "dtype": name,
            "size": list(c.shape),
            "data": c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b"",
        }
    if isinstance(value, Mapping):
        return {"__kind__": "dict", "items": {str(k): encode(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"__kind__": "list", "items": [encode(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"__kind__": "unsupported", "type": type(value).__name__}


class _Unsupported:
    """A value the child could not describe (the checker reports its type)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


def _ints(values: Any, what: str) -> list[int]:
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise ValueError(f"malformed tensor description: {what}")
    return values


def decode(value: Any, borrow: bool = False) -> Any:
    """Inverse of `_encode`, in the worker; CUDA tensors are copied into the worker's memory
    at once (the child's allocation goes away with the child). With `borrow`, they are not:
    the worker reads the child's memory in place, and must be done with it before it
    answers (the harness waits for that answer)."""
    if not isinstance(value, dict):
        return value
    kind = value.get("__kind__")
    if kind == "dict":
        return {k: decode(v, borrow) for k, v in value["items"].items()}
    if kind == "list":
        return [decode(v, borrow) for v in value["items"]]
    if kind == "unsupported":
        return _Unsupported(str(value.get("type")))
    dtype = _DTYPES.get(value.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise ValueError(f"malformed tensor description: dtype {value.get('dtype')!r}")
    size = _ints(value.get("size"), "size")
    if kind == "cpu":
        data = value.get("data")
        if not isinstance(data, bytes):
            raise ValueError("malformed tensor description: data")
        numel = math.prod(size)
        if len(data) != numel * torch.empty((), dtype=dtype).element_size():
            raise ValueError("malformed tensor description: data size")
        if numel == 0:
            return torch.empty(size, dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(size)
    if kind == "cuda":
        stride = _ints(value.get("stride"), "stride")
        fields = ("offset", "device", "nbytes", "offset_bytes", "rc_offset")
        if not all(type(value.get(f)) is int for f in fields):
            raise ValueError("malformed tensor description: offsets")
        for f in ("handle", "rc_handle", "ev_handle"):
            if value.get(f) is not None and not isinstance(value.get(f), bytes):
                raise ValueError(f"malformed tensor description: {f}")
        numel = math.prod(size)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel and (
            len(stride) != len(size)
            or min(stride) < 0
            or value["offset"] < 0
            or (value["offset"] + sum((n - 1) * st for n, st in zip(size, stride, strict=True)) + 1)
            * itemsize
            > value["nbytes"]
        ):
            # A view past its storage would read another allocation of the child's, or
            # fault the worker's CUDA context: refused before anything is mapped.
            raise ValueError("malformed tensor description: the view leaves its storage")
        try:
            shared = _reductions.rebuild_cuda_tensor(
                torch.Tensor,
                torch.Size(size),
                tuple(stride),
                value["offset"],
                torch.storage.TypedStorage,
                dtype,
                value["device"],
                value["handle"],
                value["nbytes"],
                value["offset_bytes"],
                False,
                value["rc_handle"],
                value["rc_offset"],
                value["ev_handle"],
                bool(value.get("ev_sync")),
            )
        except Exception as exc:  # noqa: BLE001 - whatever the driver says of a bad handle
            # A forged or stale handle: the sandbox's fault, never the worker's.
            raise ValueError(f"malformed tensor description: {exc}") from None
        if borrow:
            return shared
        copy = shared.clone()
        torch.cuda.synchronize(copy.device)
        del shared
        return copy
    raise ValueError(f"malformed message: unknown kind {kind!r}")


def decode_message(kind: str, payload: Any) -> Any:
    """A sandbox message's payload, decoded (`decode_outputs` for "outputs"). Anything the
    decoding cannot take is a ValueError: the sandbox's fault, never the worker's."""
    try:
        return decode_outputs(payload) if kind == "outputs" else decode(payload)
    except RecursionError:
        raise ValueError("malformed message: nested too deeply") from None


def decode_outputs(payload: Any) -> Any:
    """A sandbox's "outputs" message: as `decode`, except that the inputs it sends back (the
    `inputs` of each entry of `sets`, read once for the unchanged check before the worker
    answers) are borrowed, not copied. A set of MoE weights can be 60 GB: a copy of it in
    the worker, beside the worker's own set and the child's, ran an H200 out of memory."""
    if not (isinstance(payload, dict) and payload.get("__kind__") == "dict"):
        return decode(payload)
    items = payload["items"]
    sets = items.get("sets") if isinstance(items, dict) else None
    if not (isinstance(sets, dict) and sets.get("__kind__") == "list"):
        return decode(payload)
    out = {k: decode(v) for k, v in items.items() if k != "sets"}
    out["sets"] = [
        {k: decode(v, borrow=k == "inputs") for k, v in entry["items"].items()}
        if isinstance(entry, dict) and entry.get("__kind__") == "dict"
        else decode(entry)
        for entry in sets["items"]
    ]
    return out


class _SafeUnpickler(pickle.Unpickler):
    """Plain data only: the child is untrusted, and unpickling a global can run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the sandbox may not send objects ({module}.{name})")


def loads(data: bytes) -> Any:
    return _SafeUnpickler(io.BytesIO(data)).load()

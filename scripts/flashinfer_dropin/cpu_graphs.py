"""CUDA graphs emulated on the CPU, for `run.py --cpu`: FlashInfer's graph tests (plan a
warm-up batch, capture `run()`, plan the real batch, `g.replay()`) then run in the Triton
interpreter and check what a real replay checks.

A CUDA graph replays the device work of the captured region with the arguments it had at
capture: the same kernels, grids, pointers and scalars; host code (Python, plan state) does
not run again. The emulation records exactly that work while `torch.cuda.graph(g)` is open:

- each Triton launch (InterpretedFunction.run: the kernel, its grid, its arguments), and
- each torch op that computes into memory (a TorchDispatchMode), not allocations or views,
  which a graph holds as fixed memory, not as work;

and `g.replay()` runs them again in order, writing each op's result into the tensor the
capture produced. A wrapper whose run reads state that its plan changed without going through
the captured memory therefore fails here as it would on a GPU.

The torch.cuda entry points the tests call (Stream, current_stream, stream, CUDAGraph, graph,
synchronize) are replaced by these stand-ins; nothing else of torch.cuda is touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Ops that hand out memory or change no values: a graph keeps their memory, not work.
_NO_WORK_PREFIXES = ("empty", "new_empty", "lift_fresh", "detach", "alias", "set_")

_Step = Callable[[], None]


class _Recorder(TorchDispatchMode):
    """Records the torch ops of a captured region (Triton launches pause it)."""

    def __init__(self, steps: list[_Step]) -> None:
        super().__init__()
        self.steps = steps
        self.paused = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        if self.paused or func.is_view or name.startswith(_NO_WORK_PREFIXES):
            return out
        captured = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if captured:

            def step() -> None:
                again = [t for t in tree_flatten(func(*args, **kwargs))[0]]
                for dst, src in zip(captured, again, strict=True):
                    if dst.data_ptr() != src.data_ptr():
                        dst.copy_(src)

            self.steps.append(step)
        return out


_active: list[_Recorder] = []


class CUDAGraph:
    """torch.cuda.CUDAGraph's stand-in: the steps of its capture, run again on replay."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.steps: list[_Step] = []

    def replay(self) -> None:
        for step in self.steps:
            step()

    def reset(self) -> None:
        self.steps.clear()


@contextlib.contextmanager
def graph(g: CUDAGraph, *args: Any, **kwargs: Any) -> Iterator[None]:
    recorder = _Recorder(g.steps)
    _active.append(recorder)
    try:
        with recorder:
            yield
    finally:
        _active.pop()


class Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _recording_launcher(launch: Callable[..., Any]) -> Callable[..., Any]:
    """InterpretedFunction.run that also records each launch made while a capture is open."""

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if warmup or not _active:
            return launch(self, *args, grid=grid, warmup=warmup, **kwargs)
        recorder = _active[-1]

        def step() -> None:
            recorder.paused += 1  # the interpreter's own torch ops are not graph work
            try:
                launch(self, *args, grid=grid, warmup=False, **kwargs)
            finally:
                recorder.paused -= 1

        recorder.steps.append(step)
        step()

    return run


def install() -> Callable[[], None]:
    """Replace the torch.cuda entry points of FlashInfer's graph tests and record Triton
    launches (CPU runs only). Returns the function that puts everything back."""
    from triton.runtime.interpreter import InterpretedFunction

    stand_ins: dict[str, Any] = {
        "CUDAGraph": CUDAGraph,
        "graph": graph,
        "Stream": Stream,
        "current_stream": lambda *a, **k: Stream(),
        "stream": lambda *a, **k: contextlib.nullcontext(),
        "synchronize": lambda *a, **k: None,
    }
    saved = {name: getattr(torch.cuda, name) for name in stand_ins}
    launch = InterpretedFunction.run
    for name, value in stand_ins.items():
        setattr(torch.cuda, name, value)
    InterpretedFunction.run = _recording_launcher(launch)

    def uninstall() -> None:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)
        InterpretedFunction.run = launch

    return uninstall

"""FlashInfer's convenience methods of its attention wrappers, written once.

`run_return_lse` and `forward_return_lse` are FlashInfer's `functools.partialmethod`s of
run / forward with return_lse=True; `end_forward` is a no-op kept for old callers. A
wrapper that inherits `WrapperAliases` defines `run` (and `forward` where it has one).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["WrapperAliases"]


class WrapperAliases:
    """run_return_lse, forward_return_lse and end_forward on top of a wrapper's run/forward."""

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def run_return_lse(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """run(..., return_lse=True): (out, base-2 LSE)."""
        return self.run(*args, return_lse=True, **kwargs)

    def forward_return_lse(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """forward(..., return_lse=True): (out, base-2 LSE) (deprecated FlashInfer API)."""
        return self.forward(*args, return_lse=True, **kwargs)

    def end_forward(self) -> None:
        """FlashInfer compatibility no-op."""

"""The persistent grid of the fused-MoE GEMM kernels, shared by the general path
(experts.py) and the decode path without the alignment (direct.py)."""

from __future__ import annotations

import torch

from flashtune import platform

__all__ = ["INTERPRETER_PROGRAMS", "persistent_programs"]

# Persistent programs per SM at most: enough to hide a program's pipeline ramp behind
# another's; shared memory may allow fewer.
_MAX_PROGRAMS_PER_SM = 4
# The interpreter runs a few programs, so that its tests walk the persistent loops (tests
# raise it to make the tiles split).
INTERPRETER_PROGRAMS = 3


def persistent_programs(device: torch.device, work_bound: int, smem_bytes: int) -> int:
    """As many programs as fit on the SMs at once (by a program's shared memory, up to
    _MAX_PROGRAMS_PER_SM each), never more than the host's bound on the work items."""
    if device.type == "cpu":
        return max(1, min(work_bound, INTERPRETER_PROGRAMS))
    limits = platform.device_limits(device)
    per_sm = limits.shared_memory_per_sm // max(1, smem_bytes)
    per_sm = max(1, min(_MAX_PROGRAMS_PER_SM, per_sm))
    return max(1, min(work_bound, per_sm * limits.sm_count))

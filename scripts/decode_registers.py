"""Measure the registers a thread of the paged decode kernel takes for every tactic, variant
and head_dim (sm_90, Triton's bundled ptxas, no GPU needed) and write them to
src/flashtune/ops/attention/decode/registers.py, which the plan reads to know how many CTAs
fit on an SM (registers, not only shared memory, can be the limit).

    env -u TRITON_INTERPRET python scripts/decode_registers.py        # ~5 minutes

Rerun it after changing decode/kernels.py; tests/test_sass_decode.py checks a sample.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_decode import decode_sass, registers  # noqa: E402

from flashtune.ops.attention.decode.config import DecodeTactic  # noqa: E402

TARGET = Path(__file__).resolve().parents[1] / "src/flashtune/ops/attention/decode/registers.py"
KINDS = {
    "plain": dict(kv_dtype=torch.bfloat16, rope=False),
    "rope": dict(kv_dtype=torch.bfloat16, rope=True),
    "fp8": dict(kv_dtype=torch.float8_e4m3fn, rope=False),
}
HEAD_DIMS = (64, 128, 256)
HEADER = '''"""Registers a thread of `decode.kernels.paged_attn_kernel` takes, measured for sm_90 with
Triton's bundled ptxas by scripts/decode_registers.py (generated: rerun it, do not edit).

Keys: (variant, head_dim, block_n, num_warps, num_stages), variant "plain" (bf16), "rope"
(ROPE_LLAMA, bf16) or "fp8" (e4m3 cache, bf16 queries), each with "+fused_merge" for the
tactics that merge their split tiles in the kernel; one query token of a 4-head group
(BLOCK_M 16), page size 16.
"""

from __future__ import annotations

'''


def main() -> None:
    rows = []
    start = time.time()
    for kind, kw in KINDS.items():
        for d in HEAD_DIMS:
            for t in DecodeTactic.space(d):
                sass = decode_sass(torch.bfloat16, kw["kv_dtype"], (32, 8, d), 16, t, kw["rope"])
                variant = kind + ("+fused_merge" if t.fused_merge else "")
                rows.append(((variant, d, t.block_n, t.num_warps, t.num_stages), registers(sass)))
                print(f"{rows[-1]}  ({time.time() - start:.0f} s)", flush=True)
    body = "".join(
        f'    ("{key[0]}", {", ".join(map(str, key[1:]))}): {regs},\n' for key, regs in rows
    )
    TARGET.write_text(
        HEADER + "REGISTERS_SM90: dict[tuple[str, int, int, int, int], int] = {\n" + body + "}\n"
    )
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()

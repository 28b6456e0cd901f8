"""Where the FlashInfer-Trace compatibility corpus is, for the conftest fixture and for tests
that parametrize over its files at collection time."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def corpus_root() -> Path:
    """The FlashInfer-Trace corpus (FLASHTUNE_TRACE_CORPUS, default ../shared/flashinfer-trace)."""
    from flashtune import env

    path = env.TRACE_CORPUS.get()
    return path if path.is_absolute() else (REPO_ROOT / path).resolve()

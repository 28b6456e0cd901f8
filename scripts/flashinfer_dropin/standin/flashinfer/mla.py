"""`flashinfer.mla` served by `flashtune.mla` (BatchMLAPagedAttentionWrapper)."""

from flashtune.mla import *  # noqa: F403

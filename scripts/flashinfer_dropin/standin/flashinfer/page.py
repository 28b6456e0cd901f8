"""`flashinfer.page` served by `flashtune.page`, plus MLA's append (flashtune.ops.mla)."""

from flashtune.ops.mla import append_paged_mla_kv_cache  # noqa: F401  (FlashInfer's page name)
from flashtune.page import *  # noqa: F403

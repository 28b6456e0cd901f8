"""`flashinfer.prefill` served by `flashtune.prefill`."""

from flashtune.prefill import *  # noqa: F403

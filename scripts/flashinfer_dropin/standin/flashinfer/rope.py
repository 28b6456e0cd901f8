"""`flashinfer.rope` served by `flashtune.rope`."""

from flashtune.rope import *  # noqa: F403

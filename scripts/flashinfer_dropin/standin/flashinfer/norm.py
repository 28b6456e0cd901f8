"""`flashinfer.norm` served by `flashtune.norm`."""

from flashtune.norm import *  # noqa: F403

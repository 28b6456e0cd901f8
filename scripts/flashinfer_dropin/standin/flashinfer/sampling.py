"""`flashinfer.sampling` served by `flashtune.sampling`."""

from flashtune.sampling import *  # noqa: F403

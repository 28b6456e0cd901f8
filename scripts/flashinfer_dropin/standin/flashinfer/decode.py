"""`flashinfer.decode` served by `flashtune.decode`."""

from flashtune.decode import *  # noqa: F403

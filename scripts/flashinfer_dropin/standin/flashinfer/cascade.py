"""`flashinfer.cascade` served by `flashtune.cascade`."""

from flashtune.cascade import *  # noqa: F403

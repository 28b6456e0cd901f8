"""`flashinfer.page` served by `flashtune.page`."""

from flashtune.page import *  # noqa: F403

"""`flashinfer.sparse` served by `flashtune.sparse`."""

from flashtune.sparse import *  # noqa: F403

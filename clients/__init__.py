"""Python client for the streamdec server (protocol v1): :func:`connect`, and ``streamdec stream``.

The public names are :mod:`.client`'s ``__all__``, listed once there."""

from __future__ import annotations

from . import client
from .client import *  # noqa: F403 (re-exports exactly client.__all__)

__all__ = list(client.__all__)

"""Python client for the streamdec server (protocol v1): :func:`connect`, and ``streamdec stream``."""

from __future__ import annotations

from .client import (
    AudioFrame,
    ClientStream,
    Connection,
    RetryPolicy,
    connect,
    open_stream_retrying,
    retryable,
)

__all__ = [
    "AudioFrame",
    "ClientStream",
    "Connection",
    "RetryPolicy",
    "connect",
    "open_stream_retrying",
    "retryable",
]

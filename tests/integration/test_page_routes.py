"""The browser page's HTTP side: `/` and `/web/NAME` serve clients/web/, `/sample.npy` the sample clip."""

from __future__ import annotations

import io

import numpy as np
import pytest

from streamdec.server.app import SAMPLE_SECONDS, SAMPLE_SEED, sample_latents
from support.server_support import http, running_server, tiny_codec


async def test_the_page_and_its_files_are_served_with_their_types() -> None:
    """`/` is the page with the contract's element ids; its modules come as JavaScript."""
    async with running_server(tiny_codec(), token="t") as server:
        page = await http(server.port, "/")
        script = await http(server.port, "/web/player-worklet.js")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    for element in ('id="sample"', 'id="stop"', 'id="text"', 'id="speak"', 'src="/web/app.js"'):
        assert element.encode() in page.body
    assert script.status == 200 and script.headers["content-type"].startswith("text/javascript")
    assert b"registerProcessor" in script.body


@pytest.mark.parametrize(
    "path",
    ["/web/app.py", "/web/../app.py", "/web/.hidden.js", "/web/missing.js", "/web/"],
    ids=["other-kind", "parent", "dotfile", "missing", "empty"],
)
async def test_only_the_page_files_are_served(path: str) -> None:
    """Anything but a plain name of a page file is a 404."""
    async with running_server(tiny_codec()) as server:
        reply = await http(server.port, path)
    assert reply.status == 404


async def test_the_sample_clip_is_the_seeded_latents_as_npy() -> None:
    """`/sample.npy` holds SAMPLE_SECONDS of the seeded latents, float32 [frames, latent_dim]."""
    async with running_server(tiny_codec()) as server:
        reply = await http(server.port, "/sample.npy")
        expected = sample_latents(server.codec, SAMPLE_SECONDS, SAMPLE_SEED)
    latents = np.load(io.BytesIO(reply.body))
    assert reply.status == 200 and latents.dtype == np.float32 and latents.shape == (150, 64)
    assert np.array_equal(latents, expected)

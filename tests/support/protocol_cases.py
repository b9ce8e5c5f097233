"""What the protocol tests share (no tests here): a toy codec's description and its latent width."""

from __future__ import annotations

from streamdec.protocol import CodecInfo

DIM = 4
CODEC = CodecInfo(name="toy", latent_dim=DIM, hop_size=3, sample_rate=24000, channels=2, context=(5, 2))

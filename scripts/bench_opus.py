"""Opus against PCM on the wire: SNR, bytes per second and added latency, on speech and on noise.

Two signals, each through a real in-process server on loopback and the Python client:
- speech: the Piper voice (``piper-joe``, 22,050 Hz, resampled to Opus's 24 kHz) speaking DEMO_TEXT;
- noise: the ``tiny`` codec (random weights: broadband noise, 24 kHz) decoding seeded latents.

For each: the stream as ``pcm_s16le`` (the reference: "the PCM decode"), ``pcm_f32le`` (the float samples
and the tile sizes the server sent) and ``opus`` at the server's default bit rate, ``--runs`` times each
(time to first audio, wall clock). Then the bit-rate curve: the float samples cut into those same tiles go
through the server's encoder (:class:`streamdec.server.opus.OpusEncoder`) and the client's decoder at each
``--bitrates``, which gives SNR against the PCM decode, bytes per second of audio messages (headers and Ogg
framing included) and the audio each message holds back (the encoder's 20 ms frames and look-ahead).

    python scripts/bench_opus.py --out bench/results/cpu/opus-vs-pcm.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import torch

import streamdec
from streamdec.audio.libopus import libopus_version
from streamdec.audio.resample import Resampler
from streamdec.bench.meta import environment, finish_environment
from streamdec.clients import connect
from streamdec.clients.opus import OpusStreamDecoder
from streamdec.protocol import AUDIO_HEADER
from streamdec.server import ServerConfig, StreamServer
from streamdec.server.opus import DEFAULT_BITRATE, OpusEncoder, wire_rate

BITRATES = [12000, 16000, 24000, 32000, 40000, 48000, 56000, 64000, 76800, 96000, 128000]


async def _one_stream(url: str, fmt: str, source: dict[str, Any]) -> dict[str, Any]:
    """One stream through the client: its samples, message sizes, tile sizes and time to first audio."""
    async with connect(url) as conn:
        started = time.perf_counter()
        stream = await conn.open_stream(format=fmt, text=source.get("text"))
        if "latents" in source:
            await stream.send(source["latents"])
            await stream.end()
        frames, first = [], None
        async for frame in stream:
            if first is None and frame.samples.shape[1] > 0:
                first = time.perf_counter() - started
            frames.append(frame)
    messages = frames[:-1] if fmt == "opus" else frames  # an Opus stream's last frame is the decoder's rest
    return {
        "samples": np.concatenate([f.samples[0] for f in frames]),
        "message_bytes": [AUDIO_HEADER.size + len(f.pcm) for f in messages],
        "tiles": [f.n_samples for f in messages],
        "ttfa_s": first,
    }


async def _measure_server(codec: Any, voice: Any, source: dict[str, Any], runs: int) -> dict[str, Any]:
    options: dict[str, Any] = {"min_emit": 4, "max_emit": 16}
    async with streamdec.StreamDecoder(codec, **options) as dec:
        server = StreamServer(dec, ServerConfig(host="127.0.0.1", port=0, probe_capacity=False), voice=voice)
        async with server:
            await server.warmup()
            floats = await _one_stream(server.url, "pcm_f32le", source)
            results: dict[str, list[dict[str, Any]]] = {"pcm_s16le": [], "opus": []}
            for _ in range(runs):  # alternating, so that drift in machine load hits both alike
                for fmt in results:
                    results[fmt].append(await _one_stream(server.url, fmt, source))
    return {"floats": floats, **results}


def _snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference**2) / np.sum((reference - test) ** 2)))


def _curve_point(
    floats: np.ndarray, tiles: list[int], reference: np.ndarray, rate: int, bitrate: int
) -> dict[str, Any]:
    """The server's encoder and the client's decoder at ``bitrate`` over ``floats`` cut into ``tiles``."""
    enc = OpusEncoder(rate, 1, bitrate)
    dec = OpusStreamDecoder(rate, enc.wire_rate)
    out, sizes, held, at = [], [], [], 0
    encode_s = decode_s = 0.0
    for n in tiles:
        t0 = time.perf_counter()
        payload = enc.encode(torch.from_numpy(floats[at : at + n])[None])
        t1 = time.perf_counter()
        out.append(dec.push(payload, n))
        decode_s += time.perf_counter() - t1
        encode_s += t1 - t0
        at += n
        sizes.append(AUDIO_HEADER.size + len(payload))
        held.append(at - sum(len(o) for o in out))
    tail = enc.flush()
    sizes.append(AUDIO_HEADER.size + len(tail))
    out.append(dec.push(tail, 0))
    out.append(dec.finish(len(floats)))
    decoded = np.concatenate(out)
    seconds = len(floats) / rate
    return {
        "bitrate": bitrate,
        "snr_db": round(_snr_db(reference, decoded), 2),
        "bytes_per_second": round(sum(sizes) / seconds, 1),
        "held_back_ms_mean": round(1000 * float(np.mean(held)) / rate, 2),
        "held_back_ms_max": round(1000 * float(np.max(held)) / rate, 2),
        "encode_ms_per_audio_second": round(1000 * encode_s / seconds, 2),
        "decode_ms_per_audio_second": round(1000 * decode_s / seconds, 2),
    }


def _summary(name: str, codec: Any, measured: dict[str, Any], bitrates: list[int]) -> dict[str, Any]:
    rate = int(codec.sample_rate)
    floats = measured["floats"]["samples"]
    tiles = measured["floats"]["tiles"]
    reference = measured["pcm_s16le"][0]["samples"]
    seconds = len(reference) / rate
    pcm_bps = sum(measured["pcm_s16le"][0]["message_bytes"]) / seconds
    opus_runs = measured["opus"]

    def ttfa(fmt: str) -> dict[str, float]:
        values = [1000 * r["ttfa_s"] for r in measured[fmt]]
        return {"median_ms": round(statistics.median(values), 1), "min_ms": round(min(values), 1),
                "max_ms": round(max(values), 1)}  # fmt: skip

    wire = wire_rate(rate)
    reach_server = Resampler(rate, wire).reach if wire != rate else 0
    reach_client = Resampler(wire, rate).reach if wire != rate else 0
    lookahead = OpusEncoder(rate, 1).lookahead
    curve = [_curve_point(floats, tiles, reference, rate, b) for b in bitrates]
    return {
        "signal": name,
        "codec": codec.name,
        "sample_rate": rate,
        "wire_rate": wire,
        "audio_seconds": round(seconds, 3),
        "messages": len(tiles),
        "tile_samples": tiles,
        "pcm_s16le_bytes_per_second": round(pcm_bps, 1),
        "fifth_of_pcm_s16le_bytes_per_second": round(pcm_bps / 5, 1),
        "server_default": {
            "bitrate": DEFAULT_BITRATE,
            "snr_db": [round(_snr_db(reference, r["samples"]), 2) for r in opus_runs],
            "bytes_per_second": round(sum(opus_runs[0]["message_bytes"]) / seconds, 1),
            "bytes_ratio_to_pcm_s16le": round(sum(opus_runs[0]["message_bytes"]) / seconds / pcm_bps, 4),
            "ttfa_pcm_s16le": ttfa("pcm_s16le"),
            "ttfa_opus": ttfa("opus"),
        },
        "algorithmic_delay_ms": {
            "frame_wait_max": 20.0,
            "encoder_lookahead": round(1000 * lookahead / wire, 2),
            "server_resampler_lookahead": round(1000 * reach_server / rate, 2),
            "client_resampler_lookahead": round(1000 * reach_client / wire, 2),
        },
        "curve": curve,
    }


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from streamdec.voice import DEMO_TEXT, Voice

    speech_codec = streamdec.load_codec("piper-joe")
    voice = Voice.load("piper-joe")
    noise_codec = streamdec.load_codec("tiny", device="cpu")
    latents = torch.randn(
        args.noise_frames, noise_codec.latent_dim, generator=torch.Generator().manual_seed(7)
    )
    speech = await _measure_server(speech_codec, voice, {"text": DEMO_TEXT}, args.runs)
    noise = await _measure_server(noise_codec, None, {"latents": latents}, args.runs)
    return {
        "speech": {"text": DEMO_TEXT, **_summary("speech", speech_codec, speech, args.bitrates)},
        "noise": {
            "latent_frames": args.noise_frames,
            "seed": 7,
            **_summary("noise", noise_codec, noise, args.bitrates),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/cpu/opus-vs-pcm.json"))
    parser.add_argument("--runs", type=int, default=5, help="streams per format for time to first audio")
    parser.add_argument("--noise-frames", type=int, default=200, help="latent frames of the tiny codec")
    parser.add_argument("--bitrates", type=lambda s: [int(v) for v in s.split(",")], default=BITRATES)
    args = parser.parse_args()
    env = environment(torch.device("cpu"))
    results = anyio.run(_run, args)
    finish_environment(env)
    doc = {
        "what": "Opus (libopus, constant bit rate, 20 ms frames) against pcm_s16le on the wire: SNR against "
        "the PCM decode, bytes per second of audio messages, audio held back per message, time to first "
        "audio; speech (piper-joe) and noise (tiny)",
        **env,
        "libopus": libopus_version(),
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    for key in ("speech", "noise"):
        r = results[key]
        print(f"{key}: PCM s16 {r['pcm_s16le_bytes_per_second']:.0f} B/s (a fifth: "
              f"{r['fifth_of_pcm_s16le_bytes_per_second']:.0f}); server default {r['server_default']}")  # fmt: skip
        for point in r["curve"]:
            print(f"  {point}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

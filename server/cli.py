"""``streamdec serve``: load a codec, warm the decoder up, serve protocol v1 until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import math
import os
import socket
import time
from typing import TYPE_CHECKING, Any

import anyio

from streamdec import settings
from streamdec.affinity import check_cpus, format_cpus, parse_cpus, pin
from streamdec.cli_errors import UsageError
from streamdec.engine.core import DEFAULT_LAUNCH_INTERVAL_S
from streamdec.protocol import STREAM_PATH, Limits
from streamdec.streaming import DEFAULT_MAX_STEP, DEFAULT_MAX_STREAMS

from .config import ServerConfig
from .eventloop import EVENT_LOOPS, backend_options, running_loop_name

if TYPE_CHECKING:
    from .app import StreamServer

__all__ = ["configure_serve", "run_serve"]


def configure_serve(parser: argparse.ArgumentParser) -> None:
    """Add the ``streamdec serve`` arguments to ``parser``."""
    from streamdec.cli import add_codec_arguments
    from streamdec.codecs.precision import PRECISIONS

    defaults = ServerConfig()
    add_codec_arguments(parser)  # --codec, --device, --dtype: as every codec-loading command
    parser.add_argument("--host", default=defaults.host, help=f"interface to listen on ({defaults.host})")
    parser.add_argument(
        "--port", type=int, default=defaults.port, help=f"port, 0 for a free one ({defaults.port})"
    )
    parser.add_argument("--token", default=settings.TOKEN.value(),
                        help="require this bearer token (default: $STREAMDEC_TOKEN; unset: no auth)")  # fmt: skip
    parser.add_argument("--max-streams", type=int, default=defaults.limits.max_streams,
                        help="streams per connection")  # fmt: skip
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections)
    parser.add_argument("--max-streams-total", type=int, default=None,
                        help="real-time streams admitted on all connections (default: measured at warm-up)")  # fmt: skip
    parser.add_argument("--max-connections-per-client", type=int, default=defaults.max_connections_per_client,
                        help="connections per client IP address")  # fmt: skip
    parser.add_argument("--max-handshakes", type=int, default=defaults.max_handshakes,
                        help="connections in the opening handshake at once; more are refused at accept")  # fmt: skip
    parser.add_argument("--idle-timeout", type=float, default=defaults.idle_timeout,
                        help="seconds a connection with no open stream may send nothing before it is closed")  # fmt: skip
    parser.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="a browser Origin allowed besides the server's own page (repeatable)")  # fmt: skip
    parser.add_argument("--public-healthz", action="store_true",
                        help="with --token: keep /healthz open for probes that cannot send the token")  # fmt: skip
    parser.add_argument("--grace", type=float, default=defaults.grace,
                        help="seconds in-flight streams get to finish on shutdown before 1001")  # fmt: skip
    parser.add_argument("--send-timeout", type=float, default=defaults.send_timeout,
                        help="seconds a listener may read nothing before it is closed with 1013")  # fmt: skip
    parser.add_argument("--opus-bitrate", type=int, default=defaults.opus_bitrate, metavar="BITS_PER_SECOND",
                        help=f"bit rate of format opus ({defaults.opus_bitrate}: at most a fifth of pcm_s16le's "
                             "bytes for codecs of 22.05 kHz and up)")  # fmt: skip
    parser.add_argument("--mode", choices=["stateful", "halo"], default=None,
                        help="stateful: each frame decoded once, per-stream layer state in device slots (default "
                             "where the codec supports it); halo: overlapping windows that recompute context")  # fmt: skip
    parser.add_argument("--slots", type=int, default=None,
                        help="stateful: stream slots allocated at start (default: --max-streams-total, else "
                             f"{DEFAULT_MAX_STREAMS}); a stream beyond them is refused. Steps batch up to what "
                             "the slots fill (at most 256 streams a replay), so more slots mean more and larger "
                             "graphs at start-up")  # fmt: skip
    parser.add_argument("--min-emit", type=int, default=4, help="frames in a stream's first tile")
    parser.add_argument("--max-emit", type=int, default=None,
                        help=f"largest tile or step, in frames (default {DEFAULT_MAX_STEP} stateful, 64 halo)")  # fmt: skip
    parser.add_argument("--precision", choices=["auto", *PRECISIONS], default="auto",
                        help="CUDA convolutions: auto (default: fp16x3 where every convolution takes the float16 "
                             "split kernel, an H100/H200; else tf32x3 where every one takes the TF32 split "
                             "kernel; else fp32), fp32 (CUDA cores), tf32x3 / fp16x3 (split operands on TF32 / "
                             "float16 tensor cores; with Triton float32-accurate and faster) or tf32 (fastest; "
                             "output moves by ~1e-3)")  # fmt: skip
    parser.add_argument("--engine", choices=["auto", "simulated"], default="auto",
                        help="auto: the codec device's engine; simulated: a measurement tool that returns stand-in "
                             "audio after a modelled delay, to measure the host path alone (never for listening)")  # fmt: skip
    parser.add_argument("--simulated-cost-ms", default="0,0", metavar="FIXED,PER_FRAME",
                        help="--engine simulated: modelled ms per device call and per window frame (0,0)")  # fmt: skip
    parser.add_argument("--launch-interval-ms", type=float, default=DEFAULT_LAUNCH_INTERVAL_S * 1e3, metavar="MS",
                        help="the engine launches device calls in rounds at least this far apart, each taking "
                             f"all work queued when it starts ({DEFAULT_LAUNCH_INTERVAL_S * 1e3:g}; 0: launch as "
                             "work arrives): fewer, fuller calls for the host to stage and hand back")  # fmt: skip
    parser.add_argument("--edge-lane", choices=["auto", "on", "off"], default="auto",
                        help="stateful on a GPU: a stream's first and last calls (prime, flush) replay on a CUDA "
                             "stream of their own beside the steps, so first audio does not wait behind a step "
                             "(auto: on wherever the engine keeps slots on a GPU; off: one stream for all calls, "
                             "and no graphs of their own: about 0.24 GiB less at 512 slots)")  # fmt: skip
    parser.add_argument("--devices", default=None, metavar="all|cuda:0,cuda:1",
                        help="several GPUs in this process: one engine per device (each with --slots slots), each "
                             "new stream on the device with the most free slots; replaces --device")  # fmt: skip
    parser.add_argument("--voice", default=None, metavar="NAME|VOICE.onnx",
                        help="speak text: a start may carry text, which this voice (piper-joe, the `voice` extra, "
                             "or a Piper .onnx file) turns into latents for its own decoder, the codec")  # fmt: skip
    parser.add_argument("--event-loop", choices=EVENT_LOOPS, default="auto",
                        help="auto (default): uvloop where it is installed (the `fast` extra), else asyncio's "
                             "own; uvloop moves the loop's socket and callback work into C")  # fmt: skip
    parser.add_argument("--cpus", default=None, metavar="LIST",
                        help="once warm, run the whole process (its event loop and the engine's threads) on these "
                             "CPUs, e.g. 0 or 0-1 (Linux; default: wherever the scheduler puts it): one core kept "
                             "for the loop costs less CPU per message than threads that move between cores. "
                             "Warm-up (compiling, capturing) runs before, on every CPU")  # fmt: skip
    parser.add_argument("--inductor-cache", default=os.path.expanduser("~/.cache/streamdec/inductor"),
                        help="CUDA: torch.compile cache, so a second start skips most compiling")  # fmt: skip
    parser.add_argument("--capacity-cache", default=os.path.expanduser("~/.cache/streamdec/capacity"),
                        metavar="DIR",
                        help="CUDA: the capacity probe's verdicts, reused by a start whose code, settings, device "
                             "and graph replay times match; '' probes at every start")  # fmt: skip


def run_serve(args: argparse.Namespace) -> int:
    """Run ``streamdec serve``; returns the process exit code after a graceful shutdown."""
    cpus = None if args.cpus is None else check_cpus(parse_cpus(args.cpus))  # before a long warm-up
    if not (math.isfinite(args.launch_interval_ms) and args.launch_interval_ms >= 0):
        raise UsageError(
            f"--launch-interval-ms {args.launch_interval_ms:g}: expected a number of ms >= 0 (e.g. 2)"
        )
    config = ServerConfig(
        host=args.host,
        port=args.port,
        token=args.token or None,
        limits=Limits(max_streams=args.max_streams),
        max_connections=args.max_connections,
        max_streams_total=args.max_streams_total,
        max_connections_per_client=args.max_connections_per_client,
        max_handshakes=args.max_handshakes,
        idle_timeout=args.idle_timeout,
        allow_origins=tuple(args.allow_origin),
        public_healthz=args.public_healthz,
        grace=args.grace,
        send_timeout=args.send_timeout,
        opus_bitrate=args.opus_bitrate,
        capacity_cache=args.capacity_cache or None,
    )
    anyio.run(_serve, args, config, cpus, backend_options=backend_options(args.event_loop))
    return 0


async def _serve(args: argparse.Namespace, config: ServerConfig, cpus: frozenset[int] | None) -> None:
    from streamdec.cli import load_codec_from_args

    from .app import StreamServer
    from .devices import DecoderGroup

    began = time.monotonic()
    voice = await _load_voice(args)
    names = _device_names(args)
    codecs = [load_codec_from_args(argparse.Namespace(**{**vars(args), "device": n})) for n in names]
    codec = codecs[0]
    for each in codecs:
        chosen = _set_precision(each, args.precision)
    if codec.pad_latent.device.type == "cuda":  # the precision means nothing on the CPU
        print(f"streamdec: precision {chosen}" + (" (auto)" if args.precision == "auto" else ""), flush=True)
    # On CUDA: warm every bucket at start-up, then freeze; a shape nobody warmed (a clip shorter than the
    # smallest window) is decoded eagerly and counted, never captured mid-serving.
    if codec.pad_latent.device.type == "cuda":
        settings.use_inductor_cache_dir(args.inductor_cache)  # process-wide: once, before anything compiles
    decoders = [_decoder(args, each) for each in codecs]
    group = DecoderGroup(decoders, names) if args.devices else None
    if args.engine == "simulated" and _host_path_only(args.simulated_cost_ms):
        # Cost 0,0 models no device: what such a server carries is the host path, which `streamdec
        # loadtest` sweeps for; a warm-up probe would cap the very figure being measured.
        config = dataclasses.replace(config, probe_capacity=False)
    async with group or decoders[0] as decoder:
        server = StreamServer(decoder, config, voice=voice)
        await _start(server, config)
        loaded = time.monotonic()
        report = await server.warmup(before_probe=settings.freeze_heap)  # what warm-up made lives on
        warmed = time.monotonic()
        decoder.freeze()
        settings.freeze_heap()  # and what the probe left: no collection walks either
        state = sum(d.engine.state_memory_bytes() for d in decoders)
        if group is not None:
            print(f"streamdec: {len(names)} devices ({', '.join(names)}), {decoders[0].max_streams or 'no'} "
                  "slots each; each new stream goes to the device with the most free slots", flush=True)  # fmt: skip
        lanes = " (primes and flushes in a lane of their own)" if decoders[0].engine.lanes > 1 else ""
        print(f"streamdec: {decoder.mode} mode{lanes}; warm-up {report.seconds:.1f} s, {report.graphs} graphs, "
              f"{report.graph_memory_bytes / 2**30:.2f} GiB of graph memory, {state / 2**30:.2f} GiB of stream "
              f"state; capacity "
              f"{server.admission.capacity} real-time streams ({server.admission.source})", flush=True)  # fmt: skip
        if report.notes and codec.pad_latent.device.type == "cuda":
            print(f"streamdec: warm-up: {'; '.join(_warmup_highlights(report.notes))}", flush=True)
        if server.capacity_report is not None:
            kept = server.capacity_measured_at
            print(f"streamdec: capacity probe: {server.capacity_report.summary()}"
                  + (f" (kept from the probe at {kept}: code, settings, device and replays as then)" if kept else ""),
                  flush=True)  # fmt: skip
        if server.admission.capacity == 0:
            print("streamdec: this engine cannot keep one real-time stream's listener supplied here: every start "
                  "is refused with over_capacity (--max-streams-total N serves N streams at best effort)",
                  flush=True)  # fmt: skip
        if voice is not None:
            print(f"streamdec: voice {voice.name!r} speaks a start's text{_phonemes_note()}", flush=True)
        spent = [f"codec and server {loaded - began:.1f} s", f"warm-up {report.seconds:.1f} s"]
        if server.capacity_report is not None:
            probe = "capacity verdict kept" if server.capacity_measured_at else "capacity probe"
            spent.append(f"{probe} {warmed - loaded - report.seconds:.1f} s")
        print(f"streamdec: ready {warmed - began:.1f} s after start-up began: {', '.join(spent)}", flush=True)
        print(f"streamdec: event loop {running_loop_name()}", flush=True)
        if cpus is not None:
            pin(cpus)
            print(f"streamdec: running on CPUs {format_cpus(cpus)}", flush=True)
        print(f"streamdec: serving codec {codec.name!r} at ws://{config.host}:{server.port}{STREAM_PATH} "
              f"(health: http://{config.host}:{server.port}/healthz)", flush=True)  # fmt: skip
        await server.run_until_signalled(lambda line: print(f"streamdec: {line}", flush=True))
    print("streamdec: stopped", flush=True)


def _warmup_highlights(notes: tuple[str, ...]) -> list[str]:
    """The warm-up notes a start-up log keeps: where its seconds went, not one line per bucket."""
    return [note for note in notes if "Triton variants" in note or "captures:" in note]


async def _load_voice(args: argparse.Namespace) -> Any:
    """``--voice``: the voice (loaded off the event loop), whose own decoder becomes the codec; else None."""
    if args.voice is None:
        return None
    if args.codec not in ("tiny", args.voice):  # "tiny": the --codec default, i.e. not given
        raise UsageError(f"--voice {args.voice} serves that voice's own decoder; drop --codec {args.codec}")
    from streamdec.voice import Voice

    args.codec = args.voice
    return await anyio.to_thread.run_sync(Voice.load, args.voice)


def _phonemes_note() -> str:
    from streamdec.voice.phonemes import espeak_available

    if espeak_available():
        return ""
    return (" (espeak-ng is not installed: only the demo sentences can be spoken; "
            "apt-get install espeak-ng for any text)")  # fmt: skip


async def _start(server: StreamServer, config: ServerConfig) -> None:
    """Start listening; a host or port that cannot be had is the user's to change, so say which."""
    where = f"{config.host}:{config.port}"
    try:
        await server.start()
    except socket.gaierror as exc:
        raise UsageError(f"--host {config.host}: not a known host name or address ({exc.strerror}); "
                         "use 127.0.0.1, 0.0.0.0 or this machine's address") from exc  # fmt: skip
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"cannot listen on {where}: the port is already in use (another server?); "
                             "pick another --port, or --port 0 for a free one") from exc  # fmt: skip
        if exc.errno == errno.EACCES:
            raise UsageError(f"cannot listen on {where}: permission denied (ports below 1024 need root); "
                             "pick a --port above 1023") from exc  # fmt: skip
        if exc.errno == errno.EADDRNOTAVAIL:
            raise UsageError(f"cannot listen on {where}: that address is not on this machine; "
                             "use 127.0.0.1, 0.0.0.0 or one of this machine's addresses") from exc  # fmt: skip
        raise


def _host_path_only(cost: str) -> bool:
    from streamdec.engine.simulated import SimulatedCost

    return SimulatedCost.parse(cost) == SimulatedCost()


def _device_names(args: argparse.Namespace) -> list[str]:
    """``--devices`` resolved to device names; without it, the one ``--device``."""
    if not args.devices:
        return [args.device]
    import torch

    from .placement import parse_devices

    return parse_devices(args.devices, torch.cuda.device_count())


def _set_precision(codec: Any, precision: str) -> str:
    if precision == "auto":
        return str(codec.use_auto_precision())
    codec.precision = precision
    return precision


def _decoder(args: argparse.Namespace, codec: Any) -> Any:
    """One StreamDecoder for ``codec``'s device, as the flags say."""
    import streamdec

    cuda_options = {"inductor_cache_dir": args.inductor_cache, "on_frozen_miss": "eager"}
    options: dict[str, Any] = cuda_options if codec.pad_latent.device.type == "cuda" else {}
    stateful = args.mode != "halo" and streamdec.supports_stateful(codec)
    slots = args.slots or args.max_streams_total or DEFAULT_MAX_STREAMS
    launch_interval = args.launch_interval_ms / 1e3
    if args.edge_lane == "on" and not stateful:
        raise UsageError("--edge-lane on: primes and flushes are stateful calls; it needs --mode stateful")
    if args.edge_lane != "auto" and args.engine == "simulated":
        raise UsageError(
            "--edge-lane: the simulated engine models one lane of device calls; leave it at auto"
        )
    if args.engine == "simulated":
        from streamdec.engine.simulated import DEFAULT_SIMULATED_SLOTS, SimulatedCost, simulated_engine

        slots = args.slots or args.max_streams_total or DEFAULT_SIMULATED_SLOTS
        cost = SimulatedCost.parse(args.simulated_cost_ms)
        options = {
            "engine": simulated_engine(
                codec, cost=cost, max_streams=slots if stateful else 0, launch_interval=launch_interval
            )
        }
    else:
        options["launch_interval"] = launch_interval
        if stateful:
            options["max_streams"] = slots
        if args.edge_lane != "auto":
            options["edge_lane"] = args.edge_lane == "on"
    return streamdec.StreamDecoder(
        codec, mode=args.mode, min_emit=args.min_emit, max_emit=args.max_emit, **options
    )

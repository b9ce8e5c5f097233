"""A small ctypes binding to the system's libopus (Debian ``libopus0``): one encoder, one decoder, mono.

Only what the wire needs: encode 20 ms float frames at a chosen bit rate, read the encoder's look-ahead
(the ``pre_skip`` of the Ogg header), decode packets back to float. Every libopus error is raised as
:class:`~streamdec.errors.ConfigError` with libopus's own message and the call that failed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

import numpy as np

from streamdec.errors import ConfigError

__all__ = [
    "MAX_BITRATE",
    "MIN_BITRATE",
    "OPUS_RATES",
    "LibopusDecoder",
    "LibopusEncoder",
    "libopus_available",
    "libopus_version",
]

#: the sample rates libopus takes and gives natively
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
#: libopus clamps bit rates outside these (bits per second, one channel)
MIN_BITRATE, MAX_BITRATE = 6000, 510000
_MAX_PACKET = 1500  # bytes: libopus's recommended output buffer; no 20 ms mono packet is larger

# Requests of opus_encoder_ctl (opus_defines.h)
_SET_BITRATE, _GET_BITRATE = 4002, 4003
_SET_VBR = 4006
_SET_COMPLEXITY = 4010
_SET_SIGNAL = 4024
_GET_LOOKAHEAD = 4027
_APPLICATION_AUDIO = 2049  # transparent coding of the input, not a speech model tuned for calls
_SIGNAL_MUSIC = 3002  # CELT at the bit rates used here: a waveform coder, not SILK's speech model
_OK = 0


@functools.cache
def _library() -> Any:
    """The loaded libopus, or None where the system has none."""
    name = ctypes.util.find_library("opus")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.opus_encoder_create.restype = ctypes.c_void_p
    lib.opus_encoder_create.argtypes = [
        ctypes.c_int32,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_int),
    ]
    lib.opus_encoder_destroy.argtypes = [ctypes.c_void_p]
    lib.opus_encode_float.restype = ctypes.c_int32
    lib.opus_encode_float.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_float),
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int32,
    ]
    lib.opus_decoder_create.restype = ctypes.c_void_p
    lib.opus_decoder_create.argtypes = [ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]
    lib.opus_decode_float.restype = ctypes.c_int
    lib.opus_decode_float.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_float),
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.opus_strerror.restype = ctypes.c_char_p
    lib.opus_strerror.argtypes = [ctypes.c_int]
    lib.opus_get_version_string.restype = ctypes.c_char_p
    # opus_encoder_ctl is variadic: its argument types are given per call
    return lib


def libopus_available() -> bool:
    return _library() is not None


def libopus_version() -> str:
    lib = _library()
    return "none" if lib is None else str(lib.opus_get_version_string().decode())


def _lib() -> Any:
    lib = _library()
    if lib is None:
        raise ConfigError(
            "libopus was not found on this system: install it (Debian/Ubuntu: apt-get install libopus0), "
            "or ask for a PCM format"
        )
    return lib


def _check(code: int, call: str) -> int:
    if code < _OK:
        raise ConfigError(f"libopus {call} failed: {_lib().opus_strerror(code).decode()} ({code})")
    return code


def _check_rate(sample_rate: int) -> None:
    if sample_rate not in OPUS_RATES:
        raise ConfigError(f"Opus takes sample rates {list(OPUS_RATES)}, got {sample_rate} Hz")


class LibopusEncoder:
    """A mono libopus encoder at ``bitrate`` bits per second, constant bit rate, highest complexity.

    Constant bit rate: the SNR and the bytes per second the docs state hold for every stretch of the
    stream, not on average. ``encode`` takes exactly ``frame`` float samples (20 ms).
    """

    def __init__(self, sample_rate: int, bitrate: int) -> None:
        _check_rate(sample_rate)
        if not MIN_BITRATE <= bitrate <= MAX_BITRATE:
            raise ConfigError(
                f"Opus bit rate {bitrate} b/s is outside libopus's range [{MIN_BITRATE}, {MAX_BITRATE}]"
            )
        lib = _lib()
        error = ctypes.c_int(0)
        handle = lib.opus_encoder_create(sample_rate, 1, _APPLICATION_AUDIO, ctypes.byref(error))
        _check(error.value, "opus_encoder_create")
        self._lib, self._handle = lib, ctypes.c_void_p(handle)
        self.sample_rate, self.frame = sample_rate, sample_rate // 50
        self._ctl(_SET_BITRATE, bitrate)
        self._ctl(_SET_VBR, 0)
        self._ctl(_SET_COMPLEXITY, 10)
        self._ctl(_SET_SIGNAL, _SIGNAL_MUSIC)
        self.bitrate = self._get(_GET_BITRATE)
        self.lookahead = self._get(_GET_LOOKAHEAD)  # samples at sample_rate: the decoder drops these
        self._out = ctypes.create_string_buffer(_MAX_PACKET)

    def _ctl(self, request: int, value: int) -> None:
        _check(self._lib.opus_encoder_ctl(self._handle, ctypes.c_int(request), ctypes.c_int32(value)), "ctl")

    def _get(self, request: int) -> int:
        value = ctypes.c_int32(0)
        _check(self._lib.opus_encoder_ctl(self._handle, ctypes.c_int(request), ctypes.byref(value)), "ctl")
        return int(value.value)

    def encode(self, pcm: np.ndarray) -> bytes:
        """One packet for ``pcm``: ``frame`` float32 samples in [-1, 1]."""
        samples = np.ascontiguousarray(pcm, np.float32)
        if samples.shape != (self.frame,):
            raise ConfigError(f"an Opus frame here is {self.frame} samples, got shape {samples.shape}")
        pointer = samples.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        size = _check(
            self._lib.opus_encode_float(self._handle, pointer, self.frame, self._out, _MAX_PACKET),
            "opus_encode_float",
        )
        return self._out.raw[:size]

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and handle.value:
            self._lib.opus_encoder_destroy(handle)
            handle.value = None


class LibopusDecoder:
    """A mono libopus decoder: one packet in, its float32 samples at ``sample_rate`` out."""

    def __init__(self, sample_rate: int) -> None:
        _check_rate(sample_rate)
        lib = _lib()
        error = ctypes.c_int(0)
        handle = lib.opus_decoder_create(sample_rate, 1, ctypes.byref(error))
        _check(error.value, "opus_decoder_create")
        self._lib, self._handle = lib, ctypes.c_void_p(handle)
        self.sample_rate = sample_rate
        self._capacity = sample_rate * 120 // 1000  # the longest packet Opus allows: 120 ms
        self._pcm = np.zeros(self._capacity, np.float32)

    def decode(self, packet: bytes) -> np.ndarray:
        """The samples of one Opus packet (a copy)."""
        pointer = self._pcm.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        n = _check(
            self._lib.opus_decode_float(self._handle, packet, len(packet), pointer, self._capacity, 0),
            "opus_decode_float",
        )
        return self._pcm[:n].copy()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and handle.value:
            self._lib.opus_decoder_destroy(handle)
            handle.value = None

"""The band-limited resampler: streaming equals one call for every split, the pass band is kept, nothing
above the lower Nyquist frequency survives, lengths are exact, bad settings are refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdec.audio.resample import Resampler, resample
from streamdec.errors import ConfigError

RATES = [(22050, 24000), (22050, 48000), (24000, 22050), (44100, 48000), (16000, 16000 * 3)]


def _tone(freq: float, rate: int, seconds: float = 0.5) -> np.ndarray:
    return np.sin(2 * np.pi * freq * np.arange(int(rate * seconds)) / rate).astype(np.float32)


@settings(max_examples=40, deadline=None)
@given(
    rates=st.sampled_from(RATES),
    cuts=st.lists(st.integers(0, 700), min_size=0, max_size=12),
    seed=st.integers(0, 2**16),
)
def test_any_split_gives_the_one_call_output(rates: tuple[int, int], cuts: list[int], seed: int) -> None:
    """Pushing the input in any pieces (empty ones too), then flushing, equals resampling it whole."""
    x = np.random.default_rng(seed).standard_normal(sum(cuts) + 37).astype(np.float32)
    conv, parts, at = Resampler(*rates), [], 0
    for n in [*cuts, 37]:
        parts.append(conv.push(x[at : at + n]))
        at += n
    parts.append(conv.flush())
    np.testing.assert_allclose(np.concatenate(parts), resample(x, *rates), atol=1e-6, rtol=0)


@pytest.mark.parametrize(("rate_in", "rate_out"), RATES, ids=[f"{a}-{b}" for a, b in RATES])
def test_the_output_has_every_sample_before_the_inputs_end(rate_in: int, rate_out: int) -> None:
    """n samples in give ceil(n * rate_out / rate_in) out."""
    for n in (0, 1, 147, 1000, 4411):
        assert len(resample(np.zeros(n, np.float32), rate_in, rate_out)) == -(-n * rate_out // rate_in)


@pytest.mark.parametrize("freq", [100.0, 1000.0, 4000.0, 8000.0, 9000.0])
def test_the_pass_band_is_kept_to_the_sample(freq: float) -> None:
    """A tone below 0.82 x the lower Nyquist frequency comes out as that tone, at the new rate, to -80 dB."""
    y = resample(_tone(freq, 22050), 22050, 24000)
    t = np.arange(len(y)) / 24000
    inner = slice(200, len(y) - 200)  # away from the zeros before the start and after the end
    err = y[inner] - np.sin(2 * np.pi * freq * t[inner])
    assert 10 * np.log10(np.mean(err**2) / 0.5) < -80


@pytest.mark.parametrize(("rate_in", "rate_out", "freq"), [(24000, 16000, 9000.0), (48000, 22050, 15000.0)])
def test_nothing_above_the_lower_nyquist_folds_back(rate_in: int, rate_out: int, freq: float) -> None:
    """Down-sampling: a tone above the output's Nyquist frequency is removed, not aliased (< -80 dB)."""
    y = resample(_tone(freq, rate_in), rate_in, rate_out)[200:-200]
    assert 10 * np.log10(np.mean(y**2) / 0.5) < -80


def test_up_sampling_makes_no_images() -> None:
    """22,050 -> 48,000 Hz: the output holds the tone and nothing above 11,025 Hz (images < -80 dB)."""
    y = resample(_tone(3000.0, 22050, 1.0), 22050, 48000)[1000:-1000]
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y)))) ** 2
    freqs = np.fft.rfftfreq(len(y), 1 / 48000)
    assert spectrum[freqs > 11500].max() < spectrum.max() * 1e-8


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rate_in": 0, "rate_out": 24000}, "rates"),
        ({"rate_in": 22050, "rate_out": 24000, "rolloff": 1.2}, "rolloff"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float], match: str) -> None:
    """Rates below 1 Hz and a roll-off outside [0.5, 1] raise ConfigError saying which."""
    with pytest.raises(ConfigError, match=match):
        Resampler(**kwargs)  # type: ignore[arg-type]

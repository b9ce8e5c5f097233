// A streaming band-limited resampler (Kaiser-windowed sinc), used when the AudioContext cannot run at the
// stream's rate or the Opus decoder hands out another rate. Linear interpolation would alias (a down-rate)
// or image (an up-rate); a windowed sinc with its cut-off below the lower Nyquist does neither.

const HALF_TAPS = 24; // zero crossings on each side at the lower rate
const BETA = 8.6; // Kaiser window: about 90 dB stop-band

function besselI0(x) {
  let sum = 1;
  let term = 1;
  for (let k = 1; k < 30; k++) {
    term *= (x / (2 * k)) ** 2;
    sum += term;
  }
  return sum;
}

export class Resampler {
  constructor(fromRate, toRate) {
    this.step = fromRate / toRate; // input samples per output sample
    this.cutoff = Math.min(1, toRate / fromRate) * 0.97; // of the input Nyquist
    this.half = Math.ceil(HALF_TAPS / this.cutoff);
    this.history = new Float32Array(0); // input samples not yet fully used, starting at input index `base`
    this.base = -this.half; // the stream starts with `half` zeros of history
    this.history = new Float32Array(this.half);
    this.next = 0; // input position (fractional) of the next output sample
    this.norm = besselI0(BETA);
  }

  kernel(x) {
    if (Math.abs(x) >= this.half) return 0;
    const w = besselI0(BETA * Math.sqrt(1 - (x / this.half) ** 2)) / this.norm;
    const arg = Math.PI * this.cutoff * x;
    return this.cutoff * (arg === 0 ? 1 : Math.sin(arg) / arg) * w;
  }

  /** Resample the next input block; returns the output samples that are complete. */
  push(input, final = false) {
    const joined = new Float32Array(this.history.length + input.length + (final ? this.half : 0));
    joined.set(this.history, 0);
    joined.set(input, this.history.length);
    const end = this.base + this.history.length + input.length; // one past the last real input index
    const out = [];
    const limit = final ? end : end - this.half;
    while (this.next < limit) {
      const center = Math.floor(this.next);
      let acc = 0;
      for (let k = center - this.half + 1; k <= center + this.half; k++) {
        const i = k - this.base;
        if (i >= 0 && i < joined.length) acc += joined[i] * this.kernel(this.next - k);
      }
      out.push(acc);
      this.next += this.step;
    }
    const keepFrom = Math.max(Math.floor(this.next) - this.half, this.base);
    this.history = joined.slice(keepFrom - this.base, keepFrom - this.base + (end - keepFrom));
    this.base = keepFrom;
    return Float32Array.from(out);
  }
}

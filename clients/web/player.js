// The page's half of the player: an AudioContext at the stream's rate where the browser allows it (else a
// band-limited resampler), the ring-buffer worklet (player-worklet.js), a level meter, and the numbers the
// page shows: time to first audio, buffer level, under-runs.

import { Resampler } from "./resampler.js";

export class Player {
  constructor({ prebufferMs = 100, capture = false, onEvent = () => {} } = {}) {
    this.prebufferMs = prebufferMs;
    this.capture = capture;
    this.onEvent = onEvent;
    this.ctx = null;
    this.latest = { state: "idle", samplesPlayed: 0, underruns: 0, bufferedSamples: 0, prebufferSamples: 0 };
    this.ttfaMs = null;
    this.captured = [];
  }

  /** Opens (or reopens) the AudioContext for a stream at `rate`; the worklet then starts buffering. */
  async begin(rate, startedAt) {
    await this.ensureContext(rate);
    this.resampler = this.ctx.sampleRate === rate ? null : new Resampler(rate, this.ctx.sampleRate);
    this.sourceRate = rate;
    this.startedAt = startedAt;
    this.ttfaMs = null;
    this.captured = [];
    this.latest = { ...this.latest, state: "buffering", samplesPlayed: 0 };
    this.node.port.postMessage({ type: "start" });
  }

  async ensureContext(rate) {
    if (this.ctx && this.wantedRate === rate) return this.ctx.resume();
    if (this.ctx) await this.ctx.close();
    this.wantedRate = rate;
    try {
      this.ctx = new AudioContext({ sampleRate: rate, latencyHint: "interactive" });
    } catch {
      this.ctx = new AudioContext({ latencyHint: "interactive" }); // the browser refused the rate
    }
    await this.ctx.audioWorklet.addModule(new URL("./player-worklet.js", import.meta.url));
    this.node = new AudioWorkletNode(this.ctx, "streamdec-ring-player", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: { prebufferMs: this.prebufferMs },
    });
    this.node.port.onmessage = (event) => this.fromWorklet(event.data);
    this.node.port.postMessage({ type: "capture", on: this.capture });
    this.analyser = this.ctx.createAnalyser();
    this.analyser.fftSize = 1024;
    this.node.connect(this.ctx.destination);
    this.node.connect(this.analyser);
    await this.ctx.resume();
  }

  /** Samples of the stream at `rate` (the stream's rate, or the Opus decoder's). */
  push(samples, rate = this.sourceRate) {
    if (rate !== this.ctx.sampleRate) {
      if (!this.resampler || this.resamplerFrom !== rate) {
        this.resampler = new Resampler(rate, this.ctx.sampleRate);
        this.resamplerFrom = rate;
      }
      samples = this.resampler.push(samples);
    }
    if (samples.length) this.node.port.postMessage({ type: "push", samples }, [samples.buffer]);
  }

  /** No more input: play to the last sample. */
  end() {
    if (this.resampler) {
      const tail = this.resampler.push(new Float32Array(0), true);
      if (tail.length) this.node.port.postMessage({ type: "push", samples: tail }, [tail.buffer]);
    }
    this.node?.port.postMessage({ type: "end" });
  }

  /** Barge-in: drop what is buffered after a one-quantum fade. */
  stop() {
    this.node?.port.postMessage({ type: "stop" });
  }

  fromWorklet(msg) {
    if (msg.type === "stats") this.latest = msg;
    else if (msg.type === "captured") this.captured.push(msg.samples);
    else if (msg.type === "playing" && this.ttfaMs === null) this.ttfaMs = performance.now() - this.startedAt;
    this.onEvent(msg);
  }

  /** The contract for tests and embedders. */
  stats() {
    const s = this.latest;
    const rate = this.ctx ? this.ctx.sampleRate : 0;
    return {
      samplesPlayed: s.samplesPlayed,
      underruns: s.underruns,
      ttfaMs: this.ttfaMs,
      state: s.state,
      bufferedMs: rate ? (1000 * s.bufferedSamples) / rate : 0,
      prebufferMs: rate ? (1000 * s.prebufferSamples) / rate : 0,
      sampleRate: rate,
    };
  }

  /** What the worklet rendered of the last stream (only with capture on). */
  played() {
    const length = this.captured.reduce((a, c) => a + c.length, 0);
    const all = new Float32Array(length);
    let at = 0;
    for (const part of this.captured) {
      all.set(part, at);
      at += part.length;
    }
    return all;
  }

  /** RMS level of the last ~20 ms, 0..1, for the meter. */
  level() {
    if (!this.analyser) return 0;
    const buf = new Float32Array(this.analyser.fftSize);
    this.analyser.getFloatTimeDomainData(buf);
    return Math.sqrt(buf.reduce((a, x) => a + x * x, 0) / buf.length);
  }
}

// The audio thread's half of the player: a ring buffer (a jitter buffer) that starts after a prebuffer,
// fades out into an under-run and back in after it, adapts its prebuffer after under-runs, and plays to the
// last sample once the page says the input ended. The page's half is player.js.
//
// Messages in:  {type:"push", samples: Float32Array}  {type:"end"}  {type:"stop"}  {type:"capture", on}
// Messages out: {type:"stats", ...}  {type:"playing"} (first sample of a stream rendered)
//               {type:"drained"} (input ended and every sample played)  {type:"stopped"}
//               {type:"captured", samples}  (what was rendered, for tests; only while capture is on)

const QUANTUM = 128;
const FADE = 64; // samples of fade after an under-run: ~3 ms at 24 kHz, enough to avoid a click
const STATS_EVERY = 8; // quanta between stats messages (~40 ms at 24 kHz)
const CAPTURE_CHUNK = 4096;

class RingPlayer extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions || {};
    this.capacity = Math.ceil(sampleRate * (opts.capacitySeconds || 60));
    this.ring = new Float32Array(this.capacity);
    this.basePrebuffer = Math.round((sampleRate * (opts.prebufferMs ?? 100)) / 1000);
    this.maxPrebuffer = Math.round(sampleRate); // adapting never waits more than one second
    this.reset();
    this.underruns = 0;
    this.capture = false;
    this.captured = [];
    this.capturedLength = 0;
    this.quanta = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  reset() {
    this.readPos = 0; // absolute sample counters; the ring index is counter % capacity
    this.writePos = 0;
    this.ended = false;
    this.state = "idle"; // idle -> buffering -> playing (-> buffering after an under-run) -> drained
    this.prebuffer = this.basePrebuffer;
    this.fadeIn = 0;
    this.played = 0;
    this.largestPush = 0; // the largest audio message so far: audio arrives a tile at a time
    this.stopping = false;
  }

  onMessage(msg) {
    if (msg.type === "push") this.push(msg.samples);
    else if (msg.type === "end") this.ended = true;
    else if (msg.type === "stop") this.stopping = true;
    else if (msg.type === "capture") this.capture = Boolean(msg.on);
    else if (msg.type === "start") {
      this.reset();
      this.state = "buffering";
      this.sendStats();
    }
  }

  push(samples) {
    if (this.state === "idle" || this.state === "drained" || this.stopping) return; // a late packet
    this.largestPush = Math.max(this.largestPush, samples.length);
    const free = this.capacity - (this.writePos - this.readPos);
    if (samples.length > free) {
      this.port.postMessage({ type: "overflow", dropped: samples.length - free });
      samples = samples.subarray(0, free);
    }
    let index = this.writePos % this.capacity;
    const first = Math.min(samples.length, this.capacity - index);
    this.ring.set(samples.subarray(0, first), index);
    this.ring.set(samples.subarray(first), 0);
    this.writePos += samples.length;
  }

  available() {
    return this.writePos - this.readPos;
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    out.fill(0);
    if (this.stopping) this.stopNow(out);
    else if (this.state === "buffering") this.maybeStart(out);
    else if (this.state === "playing") this.play(out);
    for (let ch = 1; ch < outputs[0].length; ch++) outputs[0][ch].set(out);
    if (++this.quanta % STATS_EVERY === 0) this.sendStats();
    return true;
  }

  maybeStart(out) {
    // The buffer level saws between a low point and the low point plus one message; the prebuffer is the
    // margin kept at the low point, so playback starts once a whole message more than that is in.
    const avail = this.available();
    if (avail >= this.prebuffer + this.largestPush || (this.ended && avail > 0)) {
      if (this.played === 0) this.port.postMessage({ type: "playing" });
      this.state = "playing";
      this.play(out);
    } else if (this.ended && avail === 0) {
      this.drain();
    }
  }

  play(out) {
    const avail = this.available();
    const n = Math.min(QUANTUM, avail);
    this.copyOut(out, n);
    if (this.fadeIn > 0) this.applyFadeIn(out, n);
    if (this.ended && this.available() === 0) {
      this.keep(out, n);
      this.drain();
      return;
    }
    // Less than a quantum left after this one and more to come: fade this quantum out and wait for the
    // buffer to fill again (with a larger prebuffer), instead of cutting mid-waveform.
    if (!this.ended && this.available() < QUANTUM) {
      for (let i = 0; i < n; i++) out[i] *= 1 - (i + 1) / n;
      this.underruns += 1;
      this.prebuffer = Math.min(Math.round(this.prebuffer * 1.5), this.maxPrebuffer);
      this.state = "buffering";
      this.fadeIn = FADE;
      this.sendStats();
    }
    this.keep(out, n);
  }

  applyFadeIn(out, n) {
    for (let i = 0; i < n && this.fadeIn > 0; i++, this.fadeIn--) out[i] *= 1 - this.fadeIn / FADE;
  }

  copyOut(out, n) {
    const index = this.readPos % this.capacity;
    const first = Math.min(n, this.capacity - index);
    out.set(this.ring.subarray(index, index + first), 0);
    if (n > first) out.set(this.ring.subarray(0, n - first), first);
    this.readPos += n;
    this.played += n;
  }

  stopNow(out) {
    // Barge-in: one quantum fading out from where playback is, then silence; what was buffered is dropped.
    if (this.state === "playing") {
      const n = Math.min(QUANTUM, this.available());
      this.copyOut(out, n);
      for (let i = 0; i < n; i++) out[i] *= 1 - (i + 1) / n;
      this.keep(out, n);
    }
    this.flushCapture();
    this.readPos = this.writePos;
    this.state = "drained";
    this.stopping = false;
    this.port.postMessage({ type: "stopped" });
    this.sendStats();
  }

  drain() {
    this.state = "drained";
    this.flushCapture();
    this.port.postMessage({ type: "drained" });
    this.sendStats();
  }

  keep(out, n) {
    if (!this.capture || n === 0) return;
    this.captured.push(out.slice(0, n));
    this.capturedLength += n;
    if (this.capturedLength >= CAPTURE_CHUNK) this.flushCapture();
  }

  flushCapture() {
    if (this.capturedLength === 0) return;
    const all = new Float32Array(this.capturedLength);
    let at = 0;
    for (const part of this.captured) {
      all.set(part, at);
      at += part.length;
    }
    this.captured = [];
    this.capturedLength = 0;
    this.port.postMessage({ type: "captured", samples: all }, [all.buffer]);
  }

  sendStats() {
    this.port.postMessage({
      type: "stats",
      state: this.state,
      samplesPlayed: this.played,
      underruns: this.underruns,
      bufferedSamples: this.available(),
      prebufferSamples: this.prebuffer,
    });
  }
}

registerProcessor("streamdec-ring-player", RingPlayer);

// Opus on the wire: the server sends an Ogg Opus stream (RFC 7845) in its audio messages; this splits it
// into packets and decodes them with WebCodecs' AudioDecoder, so nothing but the browser is needed.

/** Splits a byte stream of Ogg pages into packets (a packet may span pages, a page may span messages). */
export class OggPackets {
  constructor() {
    this.pending = new Uint8Array(0);
    this.partial = [];
  }

  push(bytes) {
    const data = new Uint8Array(this.pending.length + bytes.length);
    data.set(this.pending, 0);
    data.set(bytes, this.pending.length);
    const packets = [];
    let at = 0;
    while (data.length - at >= 27) {
      if (data[at] !== 0x4f || data[at + 1] !== 0x67 || data[at + 2] !== 0x67 || data[at + 3] !== 0x53) {
        throw new Error("Opus stream: an Ogg page does not start with OggS");
      }
      const nSegments = data[at + 26];
      if (data.length - at < 27 + nSegments) break;
      const lacing = data.subarray(at + 27, at + 27 + nSegments);
      const bodyLength = lacing.reduce((a, b) => a + b, 0);
      if (data.length - at < 27 + nSegments + bodyLength) break;
      let body = at + 27 + nSegments;
      for (const size of lacing) {
        this.partial.push(data.subarray(body, body + size));
        body += size;
        if (size < 255) packets.push(this.takePartial());
      }
      at = body;
    }
    this.pending = data.slice(at);
    return packets;
  }

  takePartial() {
    const length = this.partial.reduce((a, p) => a + p.length, 0);
    const packet = new Uint8Array(length);
    let at = 0;
    for (const part of this.partial) {
      packet.set(part, at);
      at += part.length;
    }
    this.partial = [];
    return packet;
  }
}

/** Decodes one stream's Ogg Opus bytes; `onSamples(Float32Array, sampleRate)` gets channel 0 in order. */
export class OpusStreamDecoder {
  constructor(onSamples, onError) {
    if (typeof AudioDecoder === "undefined") throw new Error("this browser has no WebCodecs AudioDecoder: use PCM");
    this.ogg = new OggPackets();
    this.onSamples = onSamples;
    this.decoder = new AudioDecoder({
      output: (audio) => this.output(audio),
      error: (err) => onError(err),
    });
    this.packets = 0;
    this.timestampUs = 0;
    this.skip = 0; // pre-skip samples still to drop, at the decoder's output rate
  }

  push(bytes) {
    for (const packet of this.ogg.push(bytes)) this.packet(packet);
  }

  packet(packet) {
    this.packets += 1;
    if (this.packets === 1) return this.configure(packet);
    if (this.packets === 2) return; // OpusTags
    const chunk = new EncodedAudioChunk({ type: "key", timestamp: this.timestampUs, data: packet });
    this.timestampUs += 20000; // informational only: output order is decode order
    this.decoder.decode(chunk);
  }

  configure(head) {
    const view = new DataView(head.buffer, head.byteOffset, head.byteLength);
    const tag = String.fromCharCode(...head.subarray(0, 8));
    if (tag !== "OpusHead") throw new Error(`Opus stream: expected OpusHead, got ${tag}`);
    this.channels = head[9];
    this.preSkip48k = view.getUint16(10, true);
    this.inputRate = view.getUint32(12, true);
    // No description: the decoder then leaves the pre-skip in, and it is dropped here at the output rate.
    this.decoder.configure({ codec: "opus", sampleRate: 48000, numberOfChannels: this.channels });
    this.skipPending = true;
  }

  output(audio) {
    const n = audio.numberOfFrames;
    const samples = new Float32Array(n);
    audio.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
    const rate = audio.sampleRate;
    audio.close();
    if (this.skipPending) {
      this.skip = Math.round((this.preSkip48k * rate) / 48000);
      this.skipPending = false;
    }
    const drop = Math.min(this.skip, n);
    this.skip -= drop;
    if (drop < n) this.onSamples(samples.subarray(drop), rate);
  }

  async flush() {
    await this.decoder.flush();
  }

  close() {
    if (this.decoder.state !== "closed") this.decoder.close();
  }
}

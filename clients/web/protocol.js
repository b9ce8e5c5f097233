// Wire protocol v1 (PROTOCOL.md) for the page: latent messages out, audio messages in, .npy latents.

export const STREAM_PATH = "/v1/stream";
const LATENT_HEADER = 16; // "<4sIII": SDLT, stream, seq, n_frames
const AUDIO_HEADER = 24; // "<4sIIQI": SDAU, stream, seq, start_sample, n_samples

/** One latent message: `frames` is a Float32Array of n_frames x latent_dim values, frame-major. */
export function encodeLatents(stream, seq, frames, latentDim) {
  const nFrames = frames.length / latentDim;
  const buf = new ArrayBuffer(LATENT_HEADER + frames.length * 4);
  const view = new DataView(buf);
  [0x53, 0x44, 0x4c, 0x54].forEach((b, i) => view.setUint8(i, b));
  view.setUint32(4, stream, true);
  view.setUint32(8, seq, true);
  view.setUint32(12, nFrames, true);
  for (let i = 0; i < frames.length; i++) view.setFloat32(LATENT_HEADER + 4 * i, frames[i], true);
  return buf;
}

/** The header of an audio message and its payload bytes; throws on a foreign message. */
export function parseAudio(buf) {
  const view = new DataView(buf);
  const magic = String.fromCharCode(...new Uint8Array(buf, 0, 4));
  if (buf.byteLength < AUDIO_HEADER || magic !== "SDAU") throw new Error(`not an audio message (${magic})`);
  return {
    stream: view.getUint32(4, true),
    seq: view.getUint32(8, true),
    startSample: Number(view.getBigUint64(12, true)),
    nSamples: view.getUint32(20, true),
    payload: new Uint8Array(buf, AUDIO_HEADER),
  };
}

/** PCM payload -> Float32Array of channel 0 (s16 scaled by 1/32767, as PROTOCOL.md says). */
export function pcmToFloat(payload, format, channels) {
  const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const width = format === "pcm_s16le" ? 2 : 4;
  const n = payload.byteLength / (width * channels);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const at = i * width * channels;
    out[i] = width === 2 ? view.getInt16(at, true) / 32767 : view.getFloat32(at, true);
  }
  return out;
}

/** A 2-D little-endian float32/float16 .npy -> {frames, dim, data: Float32Array}. */
export function parseNpy(buf) {
  const bytes = new Uint8Array(buf);
  if (String.fromCharCode(...bytes.subarray(1, 6)) !== "NUMPY") throw new Error("not a .npy file");
  const major = bytes[6];
  const view = new DataView(buf);
  const headerLen = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const start = (major === 1 ? 10 : 12) + headerLen;
  const header = new TextDecoder().decode(bytes.subarray(major === 1 ? 10 : 12, start));
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
  const fortran = /'fortran_order':\s*True/.test(header);
  const shape = (/'shape':\s*\(([^)]*)\)/.exec(header)?.[1] || "").split(",").filter((s) => s.trim()).map(Number);
  if (shape.length !== 2 || fortran) throw new Error(`latents must be a C-order [frames, latent_dim] array, got shape (${shape}) ${fortran ? "in Fortran order" : ""}`);
  const count = shape[0] * shape[1];
  let data;
  if (descr === "<f4") data = new Float32Array(buf.slice(start, start + count * 4));
  else if (descr === "<f2") data = float16ToFloat32(new Uint16Array(buf.slice(start, start + count * 2)));
  else throw new Error(`latents must be float32 or float16 (<f4, <f2), got ${descr}`);
  return { frames: shape[0], dim: shape[1], data };
}

function float16ToFloat32(halves) {
  const out = new Float32Array(halves.length);
  for (let i = 0; i < halves.length; i++) {
    const h = halves[i];
    const sign = h & 0x8000 ? -1 : 1;
    const exp = (h >> 10) & 0x1f;
    const frac = h & 0x3ff;
    if (exp === 0) out[i] = sign * 2 ** -14 * (frac / 1024);
    else if (exp === 31) out[i] = frac ? NaN : sign * Infinity;
    else out[i] = sign * 2 ** (exp - 15) * (1 + frac / 1024);
  }
  return out;
}

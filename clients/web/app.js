// The streamdec page: connects to /v1/stream (reconnecting when the server goes away), streams latents
// (a .npy the user picks, the server's sample clip, or an array a test hands to window.streamdecPlayer)
// or text (when the server has a voice) and plays the audio through the ring-buffer player.

import { OpusStreamDecoder } from "./opus.js";
import { Player } from "./player.js";
import { STREAM_PATH, encodeLatents, parseAudio, parseNpy, pcmToFloat } from "./protocol.js";

const params = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);
const FRAMES_PER_MESSAGE = 2; // small messages at real-time pace, as a TTS model would emit them
const RECONNECT_MS = [250, 500, 1000, 2000];

const player = new Player({
  prebufferMs: Number(params.get("prebuffer_ms") || 100),
  capture: params.get("capture") === "1",
  onEvent: onPlayerEvent,
});
const conn = { ws: null, ready: null, state: "idle", reconnects: 0, attempt: 0, everConnected: false, timer: null };
let nextStream = 1;
let active = null; // the stream being played: {id, format, startedAt, ...}
let last = null; // the last stream's summary, for tests

// -- connection ------------------------------------------------------------------------------------
function token() {
  return $("token").value.trim();
}

function withToken(path) {
  return token() ? `${path}?token=${encodeURIComponent(token())}` : path;
}

function setConnState(state, text) {
  conn.state = state;
  $("status").textContent = text || state;
  $("status").dataset.state = state;
  $("reconnects").textContent = String(conn.reconnects);
  const usable = state === "connected";
  for (const id of ["sample", "speak", "file"]) $(id).disabled = !usable;
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

async function connect() {
  clearTimeout(conn.timer);
  setConnState("connecting", "connecting…");
  // A WebSocket handshake refused with 401 only reads as "closed" in a browser: ask /healthz first, which
  // the token protects the same way and which answers with the server's own words.
  let health;
  try {
    health = await fetch(withToken("/healthz"), { cache: "no-store" });
  } catch {
    return scheduleReconnect("the server does not answer");
  }
  if (health.status === 401) {
    const body = await health.json().catch(() => ({}));
    setConnState("unauthorized", "wrong token");
    return showError(`unauthorized: ${body.message || "wrong token"}`);
  }
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${proto}//${location.host}${withToken(STREAM_PATH)}`);
  ws.binaryType = "arraybuffer";
  conn.ws = ws;
  ws.onmessage = (event) => onMessage(event.data);
  ws.onclose = (event) => onClose(ws, event);
}

function scheduleReconnect(why) {
  const delay = RECONNECT_MS[Math.min(conn.attempt, RECONNECT_MS.length - 1)];
  conn.attempt += 1;
  setConnState("reconnecting", `${why}; reconnecting in ${delay} ms`);
  conn.timer = setTimeout(connect, delay);
}

function onClose(ws, event) {
  if (conn.ws !== ws) return;
  conn.ws = null;
  conn.ready = null;
  if (active) {
    // The audio already received still plays to its end; the stream itself is gone.
    finish("lost", `connection closed (${event.code}) before the stream's done`);
  }
  if (conn.state === "unauthorized") return;
  scheduleReconnect(event.code === 1001 ? "the server is restarting" : `connection closed (${event.code})`);
}

function onReady(msg) {
  conn.ready = msg;
  if (conn.everConnected) conn.reconnects += 1;
  conn.everConnected = true;
  conn.attempt = 0;
  const c = msg.codec;
  $("codec").textContent = `${c.name}: ${c.sample_rate} Hz, ${c.channels} ch, latent_dim ${c.latent_dim}, hop ${c.hop_size}`;
  $("voice").hidden = !msg.voice; // a server with a voice says so in ready
  // ready.opus (protocol 1.2) is null where the server cannot encode Opus: then the menu does not offer it
  const opus = $("format").querySelector('option[value="opus"]');
  opus.disabled = !msg.opus;
  if (!msg.opus && $("format").value === "opus") $("format").value = "pcm_s16le";
  setConnState("connected", "connected");
  showError("");
}

// -- messages --------------------------------------------------------------------------------------
function onMessage(data) {
  if (typeof data !== "string") return onAudio(data);
  const msg = JSON.parse(data);
  if (msg.type === "ready") onReady(msg);
  else if (msg.type === "started" && active && msg.stream === active.id) active.started();
  else if (msg.type === "error") onServerError(msg);
  else if (msg.type === "done" && active && msg.stream === active.id) onDone(msg);
}

function onServerError(msg) {
  showError(`${msg.code}: ${msg.message}`);
  if (active && msg.stream === active.id) active.error = msg;
}

function onAudio(buf) {
  const msg = parseAudio(buf);
  if (!active || msg.stream !== active.id) return;
  active.bytes += buf.byteLength;
  active.samplesIn += msg.nSamples;
  if (active.opus) {
    active.allowed = active.samplesIn;
    active.opus.push(msg.payload);
    releaseOpus(active);
  } else {
    player.push(pcmToFloat(msg.payload, active.format, conn.ready.codec.channels));
  }
}

async function onDone(msg) {
  const stream = active;
  stream.done = msg;
  if (msg.status === "cancelled" && stream.stopAt !== undefined) {
    stream.stopMs = performance.now() - stream.stopAt;
    $("stoplatency").textContent = `${stream.stopMs.toFixed(1)} ms`;
  }
  if (stream.opus && msg.status === "completed") {
    await stream.opus.flush();
    releaseOpus(stream);
  }
  finish(msg.status);
}

function finish(status, why) {
  const stream = active;
  active = null;
  stream.stopSending = true;
  stream.opus?.close();
  if (status !== "cancelled") player.end();
  if (why) showError(why);
  last = summary(stream, status);
  $("stop").disabled = true;
}

function summary(stream, status) {
  return {
    id: stream.id,
    status,
    format: stream.format,
    bytes: stream.bytes,
    samples: stream.samplesIn,
    seconds: stream.samplesIn / stream.rate,
    stopMs: stream.stopMs ?? null,
    done: stream.done ?? null,
    error: stream.error ?? null,
  };
}

// -- Opus: hold decoded audio back to what the headers announced (the last packet is padded) -------
function releaseOpus(stream) {
  const rate = stream.opusRate;
  if (!rate) return;
  const limit = Math.round((stream.allowed * rate) / stream.rate);
  while (stream.held.length && stream.decodedOut < limit) {
    const block = stream.held.shift();
    const take = Math.min(block.length, limit - stream.decodedOut);
    player.push(block.slice(0, take), rate);
    stream.decodedOut += take;
    if (take < block.length) stream.held.unshift(block.slice(take));
  }
}

// -- streams ---------------------------------------------------------------------------------------
async function play({ latents = null, frames = 0, dim = 0, text = null, format = $("format").value } = {}) {
  if (!conn.ready) throw new Error("not connected");
  if (active) stop();
  const codec = conn.ready.codec;
  if (latents && dim !== codec.latent_dim) {
    showError(`these latents have ${dim} values per frame; the server's codec takes latent_dim=${codec.latent_dim}`);
    return;
  }
  showError("");
  const stream = {
    id: nextStream++,
    format,
    rate: codec.sample_rate,
    bytes: 0,
    samplesIn: 0,
    allowed: 0,
    held: [],
    decodedOut: 0,
    stopSending: false,
  };
  const started = new Promise((resolve) => (stream.started = resolve));
  if (format === "opus") {
    stream.opus = new OpusStreamDecoder(
      (samples, rate) => {
        stream.opusRate = rate;
        stream.held.push(samples.slice());
        releaseOpus(stream);
      },
      (err) => showError(`Opus decoder: ${err.message}`),
    );
  }
  active = stream;
  $("stop").disabled = false;
  await player.begin(codec.sample_rate, performance.now());
  const start = { type: "start", stream: stream.id, format };
  if (text !== null) start.text = text;
  conn.ws.send(JSON.stringify(start));
  await started;
  if (latents) await sendPaced(stream, latents, frames, dim, codec);
  else if (text === null) return;
  if (!stream.stopSending && conn.ws) conn.ws.send(JSON.stringify({ type: "end", stream: stream.id }));
}

/** Sends latents at real-time pace: message k leaves k x FRAMES_PER_MESSAGE frame periods after the first. */
async function sendPaced(stream, latents, frames, dim, codec) {
  const framePeriodMs = (1000 * codec.hop_size) / codec.sample_rate;
  const began = performance.now();
  let seq = 0;
  for (let f = 0; f < frames && !stream.stopSending; f += FRAMES_PER_MESSAGE) {
    const n = Math.min(FRAMES_PER_MESSAGE, frames - f);
    const wait = began + f * framePeriodMs - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    if (stream.stopSending || !conn.ws) return;
    conn.ws.send(encodeLatents(stream.id, seq++, latents.subarray(f * dim, (f + n) * dim), dim));
  }
}

function stop() {
  if (!active) return;
  active.stopAt = performance.now();
  active.stopSending = true;
  player.stop();
  conn.ws?.send(JSON.stringify({ type: "cancel", stream: active.id }));
}

async function playSample() {
  const reply = await fetch(withToken("/sample.npy"), { cache: "no-store" });
  if (!reply.ok) return showError(`the sample clip: HTTP ${reply.status}`);
  const npy = parseNpy(await reply.arrayBuffer());
  await play({ latents: npy.data, frames: npy.frames, dim: npy.dim });
}

async function playFile(file) {
  try {
    const npy = parseNpy(await file.arrayBuffer());
    await play({ latents: npy.data, frames: npy.frames, dim: npy.dim });
  } catch (err) {
    showError(`${file.name}: ${err.message}`);
  }
}

// -- display ---------------------------------------------------------------------------------------
function onPlayerEvent(msg) {
  if (msg.type === "playing") $("ttfa").textContent = `${player.ttfaMs.toFixed(0)} ms`;
}

function render() {
  const s = player.stats();
  $("state").textContent = s.state;
  $("buffer").textContent = `${s.bufferedMs.toFixed(0)} ms (prebuffer ${s.prebufferMs.toFixed(0)} ms)`;
  $("underruns").textContent = String(s.underruns);
  const level = Math.min(1, player.level() * 4);
  $("meter").style.width = `${(100 * level).toFixed(1)}%`;
  requestAnimationFrame(render);
}

// -- wiring ----------------------------------------------------------------------------------------
$("token").value = params.get("token") || "";
$("connect").onclick = () => {
  const old = conn.ws;
  conn.ws = null; // its close is not a reason to reconnect: connect() opens the new one
  old?.close(1000);
  connect();
};
$("sample").onclick = () => playSample().catch((err) => showError(err.message));
$("speak").onclick = () => play({ text: $("text").value }).catch((err) => showError(err.message));
$("file").onchange = (event) => event.target.files[0] && playFile(event.target.files[0]);
$("stop").onclick = stop;

window.streamdecPlayer = {
  stats: () => player.stats(),
  played: () => Array.from(player.played()),
  playLatents: (values, frames, dim, format = "pcm_s16le") =>
    play({ latents: Float32Array.from(values), frames, dim, format }),
  stop,
  lastStream: () => last,
  connection: () => ({ state: conn.state, reconnects: conn.reconnects, codec: conn.ready?.codec ?? null }),
};

requestAnimationFrame(render);
connect();

// ortflash web-check in a browser: onnxruntime-web (wasm or WebGPU) runs models on safetensors inputs.
//
// The page is served with onnxruntime-web's dist/ under ./ort/. The ?backend= query picks the build:
// wasm -> ort.wasm.min.mjs (execution provider "wasm"), webgpu -> ort.webgpu.min.mjs ("webgpu").
// The driver (selenium, ortflash/checks/web_check.py) calls, through execute_async_script,
//   window.ortflashRun(modelUrl, [inputUrl, ...]) -> {ok: true, outputs: [base64 safetensors, ...], ...}
//                                                  | {ok: false, stage, message}
// Tensors use the same safetensors exchange as run.mjs (README.md): 8-byte little-endian header
// length, JSON header, raw little-endian bytes; outputs list their order in __metadata__.order.

const backend = new URLSearchParams(location.search).get('backend') || 'wasm';
const status = document.getElementById('status');

const DTYPES = {
  F32: ['float32', Float32Array, 4],
  F64: ['float64', Float64Array, 8],
  F16: ['float16', Uint16Array, 2],
  I64: ['int64', BigInt64Array, 8],
  I32: ['int32', Int32Array, 4],
  I16: ['int16', Int16Array, 2],
  I8: ['int8', Int8Array, 1],
  U64: ['uint64', BigUint64Array, 8],
  U32: ['uint32', Uint32Array, 4],
  U16: ['uint16', Uint16Array, 2],
  U8: ['uint8', Uint8Array, 1],
  BOOL: ['bool', Uint8Array, 1],
};
const FROM_ORT = Object.fromEntries(Object.entries(DTYPES).map(([st, [t]]) => [t, st]));

function firstLine(err) {
  const text = String((err && err.message) || err || 'unknown error');
  return text.split('\n').map((s) => s.trim()).find((s) => s) || text;
}

async function fetchBytes(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

function readTensors(ort, bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = Number(view.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  const feeds = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [type, Typed] = DTYPES[info.dtype];
    const [begin, end] = info.data_offsets;
    const copy = bytes.slice(8 + n + begin, 8 + n + end); // aligned copy for the typed array
    feeds[name] = new ort.Tensor(type, new Typed(copy.buffer), info.shape.map(Number));
  }
  return feeds;
}

function toBase64(bytes) {
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function writeTensors(names, results) {
  const header = {};
  const chunks = [];
  let offset = 0;
  for (const name of names) {
    const t = results[name];
    const dtype = FROM_ORT[t.type];
    if (!dtype) throw new Error(`output ${name} has type ${t.type}, which cannot be written back`);
    const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    header[name] = { dtype, shape: Array.from(t.dims), data_offsets: [offset, offset + bytes.length] };
    chunks.push(bytes);
    offset += bytes.length;
  }
  header.__metadata__ = { order: JSON.stringify(names) };
  let json = new TextEncoder().encode(JSON.stringify(header));
  const padded = new Uint8Array(json.length + ((8 - (json.length % 8)) % 8)).fill(0x20);
  padded.set(json);
  json = padded;
  const out = new Uint8Array(8 + json.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  let at = 8 + json.length;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return toBase64(out);
}

let ortModule = null;

async function loadOrt() {
  if (ortModule) return ortModule;
  const file = backend === 'webgpu' ? './ort/ort.webgpu.min.mjs' : './ort/ort.wasm.min.mjs';
  ortModule = await import(file);
  ortModule.env.logLevel = 'error';
  ortModule.env.wasm.numThreads = 1; // no cross-origin isolation on a plain local server
  ortModule.env.wasm.wasmPaths = new URL('./ort/', location.href).href;
  return ortModule;
}

window.ortflashRun = async function ortflashRun(modelUrl, inputUrls) {
  let stage = 'import';
  try {
    const ort = await loadOrt();
    if (backend === 'webgpu') {
      stage = 'adapter';
      const adapter = navigator.gpu ? await navigator.gpu.requestAdapter() : null;
      if (!adapter) throw new Error('no WebGPU adapter in this browser (navigator.gpu.requestAdapter() gave none)');
    }
    stage = 'load';
    const t0 = performance.now();
    const session = await ort.InferenceSession.create(await fetchBytes(modelUrl), {
      executionProviders: [backend],
      graphOptimizationLevel: 'all',
      logSeverityLevel: 3,
    });
    const loadMs = performance.now() - t0;
    const outputs = [];
    const runs = [];
    for (const url of inputUrls) {
      stage = 'io';
      const feeds = readTensors(ort, await fetchBytes(url));
      stage = 'run';
      const t1 = performance.now();
      const results = await session.run(feeds);
      runs.push(performance.now() - t1);
      outputs.push(writeTensors(session.outputNames, results));
    }
    await session.release();
    return { ok: true, backend, userAgent: navigator.userAgent, load_ms: loadMs, runs, outputs };
  } catch (e) {
    return { ok: false, stage, message: firstLine(e) };
  }
};

status.textContent = `ready (${backend})`;
window.ortflashReady = true;

#!/usr/bin/env node
// Run one ONNX model in a JavaScript ONNX Runtime on one or more sets of inputs.
//
//   node run.mjs --runtime web-wasm|node-cpu|node-webgpu --model M.onnx [--threads N]
//                IN1.safetensors OUT1.safetensors [IN2.safetensors OUT2.safetensors ...]
//   node run.mjs --info
//
// Tensors travel as safetensors files (see README.md): an 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets: [begin, end]}}, then the raw little-endian
// bytes. The model is loaded once; each input file is run in turn and its outputs are written
// to the paired output file, in the session's output order.
//
// The last line on stdout is one JSON object: {"ok": true, ...} or
// {"ok": false, "stage": "args|io|import|load|run", "message": "..."}; the exit status is 0 or 1.

import { readFileSync, writeFileSync, renameSync } from 'node:fs';
import { endianness } from 'node:os';
import v8 from 'node:v8';

const RUNTIMES = {
  'web-wasm': { pkg: 'onnxruntime-web', providers: ['wasm'] },
  'node-cpu': { pkg: 'onnxruntime-node', providers: ['cpu'] },
  'node-webgpu': { pkg: 'onnxruntime-node', providers: ['webgpu'] },
};

// safetensors dtype -> [onnxruntime-js type, typed array, bytes per element]
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
const FROM_ORT = Object.fromEntries(Object.entries(DTYPES).map(([st, [ortType]]) => [ortType, st]));

class Failure extends Error {
  constructor(stage, message) {
    super(message);
    this.stage = stage;
  }
}

function firstLine(err) {
  const text = String((err && err.message) || err || 'unknown error');
  return text.split('\n').map((s) => s.trim()).find((s) => s) || text;
}

function parseArgs(argv) {
  const opts = { runtime: 'web-wasm', model: null, threads: 1, info: false, pairs: [] };
  const rest = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Failure('args', `${a} needs a value`);
      return argv[++i];
    };
    if (a === '--runtime') opts.runtime = value();
    else if (a === '--model') opts.model = value();
    else if (a === '--threads') opts.threads = Number(value());
    else if (a === '--info') opts.info = true;
    else if (a.startsWith('--')) throw new Failure('args', `unknown option ${a}`);
    else rest.push(a);
  }
  if (!(opts.runtime in RUNTIMES)) {
    throw new Failure('args', `unknown runtime ${opts.runtime} (one of ${Object.keys(RUNTIMES).join(', ')})`);
  }
  if (!Number.isInteger(opts.threads) || opts.threads < 0) throw new Failure('args', '--threads must be an integer >= 0');
  if (opts.info) return opts;
  if (!opts.model) throw new Failure('args', '--model is required');
  if (rest.length === 0 || rest.length % 2) throw new Failure('args', 'expected pairs of INPUT.safetensors OUTPUT.safetensors');
  for (let i = 0; i < rest.length; i += 2) opts.pairs.push([rest[i], rest[i + 1]]);
  return opts;
}

function readTensors(ort, path) {
  let buf;
  try {
    buf = readFileSync(path);
  } catch (e) {
    throw new Failure('io', `${path}: ${firstLine(e)}`);
  }
  if (buf.length < 8) throw new Failure('io', `${path}: not a safetensors file (too short)`);
  const headerLen = Number(buf.readBigUInt64LE(0));
  if (8 + headerLen > buf.length) throw new Failure('io', `${path}: not a safetensors file (bad header length)`);
  let header;
  try {
    header = JSON.parse(buf.subarray(8, 8 + headerLen).toString('utf8'));
  } catch (e) {
    throw new Failure('io', `${path}: bad safetensors header (${firstLine(e)})`);
  }
  const base = 8 + headerLen;
  const feeds = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const spec = DTYPES[info.dtype];
    if (!spec) throw new Failure('io', `${path}: tensor ${name} has unsupported dtype ${info.dtype}`);
    const [ortType, Typed, size] = spec;
    const [begin, end] = info.data_offsets;
    const count = info.shape.reduce((a, b) => a * b, 1);
    if (end - begin !== count * size || base + end > buf.length) {
      throw new Failure('io', `${path}: tensor ${name}: byte range does not match its shape and dtype`);
    }
    // Copy into a fresh, aligned buffer: typed arrays need offsets that are multiples of their size.
    const bytes = new Uint8Array(end - begin);
    bytes.set(buf.subarray(base + begin, base + end));
    feeds[name] = new ort.Tensor(ortType, new Typed(bytes.buffer, 0, count), info.shape.map(Number));
  }
  return feeds;
}

function writeTensors(path, names, results) {
  const header = {};
  const chunks = [];
  let offset = 0;
  for (const name of names) {
    const t = results[name];
    const dtype = FROM_ORT[t.type];
    if (!dtype) throw new Failure('run', `output ${name} has type ${t.type}, which cannot be written back`);
    const data = t.data;
    const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    header[name] = { dtype, shape: Array.from(t.dims), data_offsets: [offset, offset + bytes.length] };
    chunks.push(bytes);
    offset += bytes.length;
  }
  header.__metadata__ = { order: JSON.stringify(names) };
  let jsonBytes = Buffer.from(JSON.stringify(header), 'utf8');
  // Pad the header with spaces so the data starts 8-byte aligned (the safetensors convention).
  jsonBytes = Buffer.concat([jsonBytes, Buffer.alloc((8 - (jsonBytes.length % 8)) % 8, 0x20)]);
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(jsonBytes.length));
  const tmp = `${path}.tmp`;
  try {
    writeFileSync(tmp, Buffer.concat([head, jsonBytes, ...chunks.map((c) => Buffer.from(c.buffer, c.byteOffset, c.byteLength))]));
    renameSync(tmp, path);
  } catch (e) {
    throw new Failure('io', `${path}: ${firstLine(e)}`);
  }
}

async function importRuntime(runtime, threads) {
  const { pkg } = RUNTIMES[runtime];
  if (runtime === 'web-wasm') {
    // Baseline-compile the ~12 MB wasm module only: V8's optimizing tier recompiles all of it in
    // the background, which costs several CPU-seconds per process and gains nothing for a check.
    v8.setFlagsFromString('--liftoff-only');
  }
  let ort;
  try {
    ort = await import(pkg);
  } catch (e) {
    throw new Failure('import', `cannot import ${pkg} (run npm ci in the folder of run.mjs): ${firstLine(e)}`);
  }
  ort.env.logLevel = 'error';
  if (runtime === 'web-wasm') {
    ort.env.wasm.numThreads = threads; // 1: no worker threads; 0: let onnxruntime-web decide
    ort.env.wasm.proxy = false;
  }
  return ort;
}

function versions() {
  const out = { node: process.versions.node };
  for (const pkg of ['onnxruntime-web', 'onnxruntime-node']) {
    try {
      // Not through require(): onnxruntime-web's "exports" map hides its package.json.
      const url = new URL(`./node_modules/${pkg}/package.json`, import.meta.url);
      out[pkg] = JSON.parse(readFileSync(url, 'utf8')).version;
    } catch {
      out[pkg] = null;
    }
  }
  return out;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (endianness() !== 'LE') throw new Failure('args', 'only little-endian machines are supported');
  if (opts.info) {
    const info = { ok: true, versions: versions() };
    try {
      const ortNode = await import('onnxruntime-node');
      info.node_backends = ortNode.listSupportedBackends ? ortNode.listSupportedBackends() : null;
    } catch (e) {
      info.node_backends = `unavailable: ${firstLine(e)}`;
    }
    return info;
  }
  const ort = await importRuntime(opts.runtime, opts.threads);
  let modelBytes;
  try {
    modelBytes = new Uint8Array(readFileSync(opts.model));
  } catch (e) {
    throw new Failure('io', `${opts.model}: ${firstLine(e)}`);
  }
  let session;
  const t0 = performance.now();
  try {
    session = await ort.InferenceSession.create(modelBytes, {
      executionProviders: RUNTIMES[opts.runtime].providers,
      graphOptimizationLevel: 'all',
      logSeverityLevel: 3,
    });
  } catch (e) {
    throw new Failure('load', firstLine(e));
  }
  const loadMs = performance.now() - t0;
  const runs = [];
  for (const [input, output] of opts.pairs) {
    const feeds = readTensors(ort, input);
    const t1 = performance.now();
    let results;
    try {
      results = await session.run(feeds);
    } catch (e) {
      throw new Failure('run', firstLine(e));
    }
    runs.push({ input, ms: performance.now() - t1 });
    writeTensors(output, session.outputNames, results);
  }
  await session.release();
  return { ok: true, runtime: opts.runtime, versions: versions(), load_ms: loadMs, runs };
}

main().then(
  (result) => {
    process.stdout.write(`${JSON.stringify(result)}\n`);
    process.exit(0);
  },
  (err) => {
    const stage = err instanceof Failure ? err.stage : 'internal';
    process.stdout.write(`${JSON.stringify({ ok: false, stage, message: firstLine(err) })}\n`);
    process.exit(1);
  },
);

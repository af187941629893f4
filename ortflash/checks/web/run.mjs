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
import { decodeTensors, encodeTensors, firstLine } from './safetensors.mjs';

const RUNTIMES = {
  'web-wasm': { pkg: 'onnxruntime-web', providers: ['wasm'] },
  'node-cpu': { pkg: 'onnxruntime-node', providers: ['cpu'] },
  'node-webgpu': { pkg: 'onnxruntime-node', providers: ['webgpu'] },
};

class Failure extends Error {
  constructor(stage, message) {
    super(message);
    this.stage = stage;
  }
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
  try {
    return decodeTensors(ort.Tensor, new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength));
  } catch (e) {
    throw new Failure('io', `${path}: ${firstLine(e)}`);
  }
}

function writeTensors(path, names, results) {
  let bytes;
  try {
    bytes = encodeTensors(names, results);
  } catch (e) {
    throw new Failure('run', firstLine(e));
  }
  const tmp = `${path}.tmp`;
  try {
    writeFileSync(tmp, bytes);
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

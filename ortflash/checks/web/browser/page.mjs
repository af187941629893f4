// ortflash web-check in a browser: onnxruntime-web (wasm or WebGPU) runs models on safetensors inputs.
//
// The page is served with onnxruntime-web's dist/ under ./ort/. The ?backend= query picks the build:
// wasm -> ort.wasm.min.mjs (execution provider "wasm"), webgpu -> ort.webgpu.min.mjs ("webgpu").
// The driver (selenium, ortflash/checks/web_check.py) calls, through execute_async_script,
//   window.ortflashRun(modelUrl, [inputUrl, ...]) -> {ok: true, outputs: [base64 safetensors, ...], ...}
//                                                  | {ok: false, stage, message}
// Tensors use the safetensors exchange of run.mjs, from the same module (../safetensors.mjs, copied
// next to this page by ortflash/checks/browser.py).

import { decodeTensors, encodeTensors, firstLine } from './safetensors.mjs';

const backend = new URLSearchParams(location.search).get('backend') || 'wasm';
const status = document.getElementById('status');

async function fetchBytes(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

function toBase64(bytes) {
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
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
      const feeds = decodeTensors(ort.Tensor, await fetchBytes(url));
      stage = 'run';
      const t1 = performance.now();
      const results = await session.run(feeds);
      runs.push(performance.now() - t1);
      outputs.push(toBase64(encodeTensors(session.outputNames, results)));
    }
    await session.release();
    return { ok: true, backend, userAgent: navigator.userAgent, load_ms: loadMs, runs, outputs };
  } catch (e) {
    return { ok: false, stage, message: firstLine(e) };
  }
};

status.textContent = `ready (${backend})`;
window.ortflashReady = true;

// The safetensors exchange between Python and the JS runtimes (README.md), written once for run.mjs
// (Node) and browser/page.mjs (Chromium): an 8-byte little-endian header length, a JSON header, then
// raw little-endian bytes; outputs list their order in __metadata__.order. Uint8Array in and out, so
// the module needs neither Node's nor the browser's own APIs.

// safetensors dtype -> [onnxruntime-js type, typed array]
export const DTYPES = {
  F32: ['float32', Float32Array],
  F64: ['float64', Float64Array],
  F16: ['float16', Uint16Array],
  I64: ['int64', BigInt64Array],
  I32: ['int32', Int32Array],
  I16: ['int16', Int16Array],
  I8: ['int8', Int8Array],
  U64: ['uint64', BigUint64Array],
  U32: ['uint32', Uint32Array],
  U16: ['uint16', Uint16Array],
  U8: ['uint8', Uint8Array],
  BOOL: ['bool', Uint8Array],
};
const FROM_ORT = Object.fromEntries(Object.entries(DTYPES).map(([st, [ortType]]) => [ortType, st]));

export function firstLine(err) {
  const text = String((err && err.message) || err || 'unknown error');
  return text.split('\n').map((s) => s.trim()).find((s) => s) || text;
}

// {name: new Tensor(type, data, dims)} for every tensor of the file's bytes; errors are one line.
export function decodeTensors(Tensor, bytes) {
  if (bytes.length < 8) throw new Error('not a safetensors file (too short)');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLen = Number(view.getBigUint64(0, true));
  if (8 + headerLen > bytes.length) throw new Error('not a safetensors file (bad header length)');
  let header;
  try {
    header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLen)));
  } catch (e) {
    throw new Error(`bad safetensors header (${firstLine(e)})`);
  }
  const base = 8 + headerLen;
  const feeds = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const spec = DTYPES[info.dtype];
    if (!spec) throw new Error(`tensor ${name} has unsupported dtype ${info.dtype}`);
    const [ortType, Typed] = spec;
    const [begin, end] = info.data_offsets;
    const count = info.shape.reduce((a, b) => a * b, 1);
    if (end - begin !== count * Typed.BYTES_PER_ELEMENT || base + end > bytes.length) {
      throw new Error(`tensor ${name}: byte range does not match its shape and dtype`);
    }
    // slice() copies into a fresh buffer: typed arrays need offsets that are multiples of their size.
    const copy = bytes.slice(base + begin, base + end);
    feeds[name] = new Tensor(ortType, new Typed(copy.buffer, 0, count), info.shape.map(Number));
  }
  return feeds;
}

// The bytes of a safetensors file holding results[name] for each of names, in that order.
export function encodeTensors(names, results) {
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
  const json = new TextEncoder().encode(JSON.stringify(header));
  // Pad the header with spaces so the data starts 8-byte aligned (the safetensors convention).
  const headerLen = json.length + ((8 - (json.length % 8)) % 8);
  const out = new Uint8Array(8 + headerLen + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(headerLen), true);
  out.fill(0x20, 8, 8 + headerLen);
  out.set(json, 8);
  let at = 8 + headerLen;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

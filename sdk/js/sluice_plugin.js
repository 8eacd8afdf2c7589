// sluice_plugin.js: write sluice preprocessing and postprocessing plugins
// in JavaScript. A plugin is a WebAssembly component built from one ES
// module with componentize-qjs (QuickJS); the host calls its `describe` and
// its `preprocess` (or `postprocess`) with the tensors of one request.
// This module gives typed views and builders over the WIT tensors of
// sdk/wit/plugin.wit, so a plugin never does byte arithmetic, and turns
// whatever a plugin throws into the WIT `plugin-error`.
//
//   import { preprocessor, spec, tensor, log, InvalidInput } from "./sluice_plugin.js";
//
//   export const { describe, preprocess } = preprocessor({
//     name: "scale",
//     version: "1.0.0",
//     inputs: [spec("x", "f32", [-1, 64])],
//     outputs: [spec("x", "f32", [-1, 64])],
//     sample: [tensor("x", [1, 64], new Float32Array(64))], // or null
//     run(inputs) {
//       const x = inputs.get("x");          // missing → invalid-input
//       const v = x.f32();                  // Float32Array; wrong dtype → invalid-input
//       const out = new Float32Array(v.length);
//       for (let i = 0; i < v.length; i++) out[i] = v[i] * 2;
//       if (x.rows > 1000) throw new InvalidInput("at most 1000 rows");
//       log.debug(`scaled ${x.rows} rows`);
//       return [tensor("x", x.shape, out)];  // the dtype follows the typed array
//     },
//   });
//
// A postprocessor is the same with `export const { describe, postprocess }
// = postprocessor({...})`. Build (the world must match):
//
//   componentize-qjs --sync --wit wit/plugin.wit --world preprocessor --js app.js -o NAME.wasm
//
// `--sync` is required: sluice's host does not enable the component-model
// async ABI that componentize-qjs's default runtime uses.
//
// Errors: `throw new InvalidInput(message)` answers the client
// INVALID_ARGUMENT with that message; any other throw becomes WIT
// `internal` carrying the error's name, message and stack (at most 1000
// characters), which the host logs as the plugin's last words.
//
// Runtime facts (QuickJS inside the component): no TextEncoder/TextDecoder
// (use `.texts()`, `utf8Encode`, `utf8Decode`), no async (`run` must be
// synchronous), no files, network, clock or state between requests: each
// request gets a fresh instance. Module top-level code runs once, at build
// time, and its result is snapshotted, so constant tables and the sample
// cost nothing per call. The module also runs under plain Node.js (>= 20)
// for unit tests; `log` then writes to stderr.

// ---------------------------------------------------------------- log

let hostLog = null;
try {
  // The WIT `log` import exists only inside the component; under Node.js
  // the import fails and `log` falls back to stderr.
  hostLog = (await import("sluice:plugin/log@0.1.0")).default;
} catch {
  hostLog = null;
}

function emit(level, parts) {
  let message = "";
  for (let i = 0; i < parts.length; i++) {
    if (i) message += " ";
    const p = parts[i];
    message += typeof p === "string" ? p : describeValue(p);
  }
  if (hostLog) hostLog.log(level, message);
  else if (typeof console !== "undefined") console.error(`[${level}] ${message}`);
}

/** Lines into the host's log (rate-limited by the host): log.info("a", 1). */
export const log = Object.freeze({
  debug: (...parts) => emit("debug", parts),
  info: (...parts) => emit("info", parts),
  warn: (...parts) => emit("warn", parts),
  error: (...parts) => emit("error", parts),
});

// ---------------------------------------------------------------- errors

/** The caller's input is wrong: the client gets INVALID_ARGUMENT with the message. */
export class InvalidInput extends Error {
  constructor(message) {
    super(message);
    this.name = "InvalidInput";
  }
}

const LAST_WORDS = 1000;

function describeValue(v) {
  try {
    if (typeof v === "bigint") return `${v}n`;
    if (v instanceof Error) return `${v.name}: ${v.message}`;
    const s = JSON.stringify(v);
    return s === undefined ? String(v) : s;
  } catch {
    try {
      return String(v);
    } catch {
      return Object.prototype.toString.call(v);
    }
  }
}

function cap(text) {
  return text.length > LAST_WORDS ? `${text.slice(0, LAST_WORDS - 1)}…` : text;
}

/** What a thrown value becomes at the WIT boundary: a `plugin-error`. */
export function toPluginError(e) {
  try {
    if (e instanceof InvalidInput) return { tag: "invalid-input", val: String(e.message) };
    if (e && (e.tag === "invalid-input" || e.tag === "internal") && typeof e.val === "string") return e;
    if (e instanceof Error) {
      const head = `${e.name}: ${e.message}`;
      let stack = typeof e.stack === "string" ? e.stack.trimEnd() : "";
      if (stack.startsWith(head)) stack = stack.slice(head.length).replace(/^\n/, "");
      return { tag: "internal", val: cap(stack ? `${head}\n${stack}` : head) };
    }
    return { tag: "internal", val: cap(`thrown: ${describeValue(e)}`) };
  } catch {
    return { tag: "internal", val: "the plugin threw a value that cannot be described" };
  }
}

// ---------------------------------------------------------------- dtypes

// WIT dtype → [bytes per element, typed array]. f16 and bf16 are raw bits.
const DTYPES = {
  f32: [4, Float32Array],
  f64: [8, Float64Array],
  f16: [2, Uint16Array],
  bf16: [2, Uint16Array],
  i8: [1, Int8Array],
  i16: [2, Int16Array],
  i32: [4, Int32Array],
  i64: [8, BigInt64Array],
  u8: [1, Uint8Array],
  u16: [2, Uint16Array],
  u32: [4, Uint32Array],
  u64: [8, BigUint64Array],
  boolean: [1, Uint8Array],
  string: [0, null],
};

/** Every WIT dtype name, in the WIT enum's order. */
export const DTYPE_NAMES = Object.freeze(Object.keys(DTYPES));

function canonicalDtype(dtype, what) {
  if (dtype === "bool") return "boolean";
  if (typeof dtype === "string" && Object.prototype.hasOwnProperty.call(DTYPES, dtype)) return dtype;
  throw new TypeError(`${what}: unknown dtype ${describeValue(dtype)} (one of ${DTYPE_NAMES.join(", ")})`);
}

function inferDtype(values, what) {
  if (values instanceof Float32Array) return "f32";
  if (values instanceof Float64Array) return "f64";
  if (values instanceof Int8Array) return "i8";
  if (values instanceof Int16Array) return "i16";
  if (values instanceof Int32Array) return "i32";
  if (values instanceof BigInt64Array) return "i64";
  if (values instanceof Uint8Array) return "u8";
  if (values instanceof Uint16Array) return "u16";
  if (values instanceof Uint32Array) return "u32";
  if (values instanceof BigUint64Array) return "u64";
  throw new TypeError(`${what}: give a dtype for values that are not a typed array`);
}

function formatShape(shape) {
  return `[${shape.join(", ")}]`;
}

// Dimensions as plain numbers (s64 crosses as a JS number; a BigInt traps).
function checkShape(shape, what, allowAny) {
  if (!Array.isArray(shape) && !ArrayBuffer.isView(shape)) {
    throw new TypeError(`${what}: shape must be an array of dimensions, not ${describeValue(shape)}`);
  }
  const out = new Array(shape.length);
  for (let i = 0; i < shape.length; i++) {
    const d = typeof shape[i] === "bigint" ? Number(shape[i]) : shape[i];
    if (!Number.isSafeInteger(d) || d < (allowAny ? -1 : 0)) {
      throw new TypeError(`${what}: dimension ${i} of ${formatShape(Array.from(shape))} is not a valid size`);
    }
    out[i] = d;
  }
  return out;
}

function elementCount(shape) {
  let n = 1;
  for (let i = 0; i < shape.length; i++) n *= shape[i];
  return n;
}

// ---------------------------------------------------------------- utf-8

/** A string as UTF-8 bytes (lone surrogates become U+FFFD). */
export function utf8Encode(text) {
  const s = String(text);
  const n = s.length;
  let ascii = true;
  for (let i = 0; i < n; i++) {
    if (s.charCodeAt(i) > 0x7f) {
      ascii = false;
      break;
    }
  }
  if (ascii) {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  const out = new Uint8Array(n * 3);
  let j = 0;
  for (let i = 0; i < n; i++) {
    let c = s.charCodeAt(i);
    if (c < 0x80) {
      out[j++] = c;
      continue;
    }
    if (c < 0x800) {
      out[j++] = 0xc0 | (c >> 6);
      out[j++] = 0x80 | (c & 0x3f);
      continue;
    }
    if (c >= 0xd800 && c < 0xe000) {
      const d = i + 1 < n ? s.charCodeAt(i + 1) : 0;
      if (c < 0xdc00 && d >= 0xdc00 && d < 0xe000) {
        i++;
        c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
        out[j++] = 0xf0 | (c >> 18);
        out[j++] = 0x80 | ((c >> 12) & 0x3f);
        out[j++] = 0x80 | ((c >> 6) & 0x3f);
        out[j++] = 0x80 | (c & 0x3f);
        continue;
      }
      c = 0xfffd;
    }
    out[j++] = 0xe0 | (c >> 12);
    out[j++] = 0x80 | ((c >> 6) & 0x3f);
    out[j++] = 0x80 | (c & 0x3f);
  }
  return out.slice(0, j);
}

// Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF);
// null when the bytes are not UTF-8.
function decode(b) {
  const n = b.length;
  let out = "";
  let units = [];
  let i = 0;
  while (i < n) {
    const c = b[i++];
    if (c < 0x80) {
      units.push(c);
    } else if (c >= 0xc2 && c < 0xe0) {
      const c1 = b[i++];
      if ((c1 & 0xc0) !== 0x80) return null;
      units.push(((c & 0x1f) << 6) | (c1 & 0x3f));
    } else if (c >= 0xe0 && c < 0xf0) {
      const c1 = b[i++];
      const c2 = b[i++];
      if ((c1 & 0xc0) !== 0x80 || (c2 & 0xc0) !== 0x80) return null;
      const cp = ((c & 0x0f) << 12) | ((c1 & 0x3f) << 6) | (c2 & 0x3f);
      if (cp < 0x800 || (cp >= 0xd800 && cp < 0xe000)) return null;
      units.push(cp);
    } else if (c >= 0xf0 && c < 0xf5) {
      const c1 = b[i++];
      const c2 = b[i++];
      const c3 = b[i++];
      if ((c1 & 0xc0) !== 0x80 || (c2 & 0xc0) !== 0x80 || (c3 & 0xc0) !== 0x80) return null;
      let cp = ((c & 0x07) << 18) | ((c1 & 0x3f) << 12) | ((c2 & 0x3f) << 6) | (c3 & 0x3f);
      if (cp < 0x10000 || cp > 0x10ffff) return null;
      cp -= 0x10000;
      units.push(0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
    } else {
      return null;
    }
    if (units.length >= 4096) {
      out += String.fromCharCode.apply(null, units);
      units = [];
    }
  }
  return units.length ? out + String.fromCharCode.apply(null, units) : out;
}

/** UTF-8 bytes as a string; throws TypeError when they are not UTF-8. */
export function utf8Decode(bytes) {
  const s = decode(bytes);
  if (s === null) throw new TypeError("the bytes are not UTF-8");
  return s;
}

// ---------------------------------------------------------------- specs

/** A declared input or output: spec("x", "f32", [-1, 64]); -1 is any size. */
export function spec(name, dtype, shape) {
  if (typeof name !== "string" || name === "") throw new TypeError(`spec: name must be a non-empty string`);
  return { name, dtype: canonicalDtype(dtype, `spec '${name}'`), shape: checkShape(shape, `spec '${name}'`, true) };
}

/** Why `t` (a tensor or a view) does not fit `s`, or null when it does. */
export function mismatch(s, t) {
  const tensor = t instanceof TensorView ? t.tensor : t;
  if (tensor.name !== s.name) return `tensor '${tensor.name}' where '${s.name}' was expected`;
  if (tensor.dtype !== s.dtype) return `'${s.name}' is ${tensor.dtype}, but ${s.dtype} was declared`;
  const fits =
    tensor.shape.length === s.shape.length && s.shape.every((want, i) => want < 0 || tensor.shape[i] === want);
  if (!fits) return `'${s.name}' has shape ${formatShape(tensor.shape)}, but ${formatShape(s.shape)} was declared`;
  const size = DTYPES[tensor.dtype][0];
  const n = elementCount(tensor.shape);
  if (size ? tensor.data.length !== n * size : tensor.strings.length !== n) {
    return `'${s.name}': ${tensor.data.length} bytes and ${tensor.strings.length} strings do not match shape ${formatShape(tensor.shape)} of ${tensor.dtype}`;
  }
  return null;
}

// ---------------------------------------------------------------- builders

/**
 * A tensor from values: a typed array (the dtype follows it unless given)
 * or an array of numbers (i64/u64 also take BigInts; boolean takes
 * booleans). Throws when the shape does not hold exactly values.length
 * elements. dtype "string" is stringsTensor. The tensor shares the typed
 * array's memory until it is returned.
 */
export function tensor(name, shape, values, dtype) {
  const what = `tensor '${name}'`;
  const dims = checkShape(shape, what, false);
  dtype = dtype === undefined ? inferDtype(values, what) : canonicalDtype(dtype, what);
  if (dtype === "string") return stringsTensor(name, dims, values);
  const n = elementCount(dims);
  if (values == null || typeof values.length !== "number") {
    throw new TypeError(`${what}: values must be a typed array or an array, not ${describeValue(values)}`);
  }
  if (values.length !== n) {
    throw new RangeError(`${what}: shape ${formatShape(dims)} holds ${n} values, ${values.length} given`);
  }
  const Ctor = DTYPES[dtype][1];
  let typed;
  if (dtype === "boolean") {
    typed = new Uint8Array(n);
    for (let i = 0; i < n; i++) typed[i] = values[i] ? 1 : 0;
  } else if (values instanceof Ctor) {
    typed = values;
  } else if (Ctor === BigInt64Array || Ctor === BigUint64Array) {
    typed = new Ctor(n);
    for (let i = 0; i < n; i++) {
      const v = values[i];
      typed[i] = typeof v === "bigint" ? v : BigInt(v);
    }
  } else if (values instanceof BigInt64Array || values instanceof BigUint64Array) {
    typed = new Ctor(n);
    for (let i = 0; i < n; i++) typed[i] = Number(values[i]);
  } else {
    typed = new Ctor(values);
  }
  const data = new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength);
  return { name, dtype, shape: dims, data, strings: [] };
}

/** A string tensor from strings (stored as UTF-8) and/or Uint8Arrays. */
export function stringsTensor(name, shape, list) {
  const what = `tensor '${name}'`;
  const dims = checkShape(shape, what, false);
  const n = elementCount(dims);
  if (list == null || typeof list.length !== "number") {
    throw new TypeError(`${what}: strings must be an array, not ${describeValue(list)}`);
  }
  if (list.length !== n) {
    throw new RangeError(`${what}: shape ${formatShape(dims)} holds ${n} strings, ${list.length} given`);
  }
  const strings = new Array(n);
  for (let i = 0; i < n; i++) {
    const s = list[i];
    if (typeof s === "string") strings[i] = utf8Encode(s);
    else if (s instanceof Uint8Array) strings[i] = s;
    else if (Array.isArray(s)) strings[i] = Uint8Array.from(s);
    else throw new TypeError(`${what}: element ${i} is neither a string nor bytes`);
  }
  return { name, dtype: "string", shape: dims, data: new Uint8Array(0), strings };
}

/** Tensors of zeros (empty strings) fitting specs, -1 dimensions as `rows`. */
export function zeros(specs, rows = 1) {
  return specs.map((s) => {
    const shape = s.shape.map((d) => (d < 0 ? rows : d));
    const n = elementCount(shape);
    if (s.dtype === "string") return stringsTensor(s.name, shape, new Array(n).fill(""));
    return tensor(s.name, shape, new DTYPES[s.dtype][1](n), s.dtype);
  });
}

// ---------------------------------------------------------------- views

/**
 * An input tensor, read through typed views. The views share the input's
 * memory (no copy when aligned): changing one and returning it through
 * tensor() is allowed.
 */
export class TensorView {
  constructor(t) {
    /** The WIT tensor record ({name, dtype, shape, data, strings}). */
    this.tensor = t;
  }
  get name() {
    return this.tensor.name;
  }
  get dtype() {
    return this.tensor.dtype;
  }
  get shape() {
    return this.tensor.shape;
  }
  /** Dimension 0 (1 for a scalar). */
  get rows() {
    const shape = this.tensor.shape;
    return shape.length ? shape[0] : 1;
  }
  /** The number of elements. */
  get size() {
    return elementCount(this.tensor.shape);
  }
  f32() {
    return this.typed("f32");
  }
  f64() {
    return this.typed("f64");
  }
  i8() {
    return this.typed("i8");
  }
  i16() {
    return this.typed("i16");
  }
  i32() {
    return this.typed("i32");
  }
  /** BigInt64Array. */
  i64() {
    return this.typed("i64");
  }
  u8() {
    return this.typed("u8");
  }
  u16() {
    return this.typed("u16");
  }
  u32() {
    return this.typed("u32");
  }
  /** BigUint64Array. */
  u64() {
    return this.typed("u64");
  }
  /** Raw IEEE half bits (Uint16Array). */
  f16() {
    return this.typed("f16");
  }
  /** Raw bfloat16 bits (Uint16Array). */
  bf16() {
    return this.typed("bf16");
  }
  /** Booleans (an array of true/false). */
  bools() {
    const b = this.typed("boolean");
    const out = new Array(b.length);
    for (let i = 0; i < b.length; i++) out[i] = b[i] !== 0;
    return out;
  }
  /** The values as the typed array of the tensor's own dtype (strings: Uint8Array[]). */
  values() {
    return this.tensor.dtype === "string" ? this.strings() : this.typed(this.tensor.dtype);
  }
  /** The elements of a string tensor, as bytes (Uint8Array[]). */
  strings() {
    const t = this.tensor;
    this.expect("string");
    const n = elementCount(t.shape);
    if (t.strings.length !== n) {
      throw new InvalidInput(`'${t.name}' (string ${formatShape(t.shape)}) has ${t.strings.length} elements, but ${n} were expected`);
    }
    return t.strings;
  }
  /** The elements of a string tensor as text; invalid UTF-8 is an input error. */
  texts() {
    const bytes = this.strings();
    const out = new Array(bytes.length);
    for (let i = 0; i < bytes.length; i++) {
      const s = decode(bytes[i]);
      if (s === null) throw new InvalidInput(`'${this.tensor.name}' element ${i} is not UTF-8`);
      out[i] = s;
    }
    return out;
  }
  expect(dtype) {
    const t = this.tensor;
    if (t.dtype !== dtype) throw new InvalidInput(`'${t.name}' is ${t.dtype}, but ${dtype} is needed`);
  }
  typed(dtype) {
    const t = this.tensor;
    this.expect(dtype);
    const [size, Ctor] = DTYPES[dtype];
    const n = elementCount(t.shape);
    let data = t.data;
    if (data.length !== n * size) {
      throw new InvalidInput(
        `'${t.name}' (${dtype} ${formatShape(t.shape)}) has ${data.length} bytes, but ${n * size} were expected`,
      );
    }
    if (!(data instanceof Uint8Array)) data = Uint8Array.from(data);
    if (Ctor === Uint8Array) return data;
    if (data.byteOffset % size !== 0) data = data.slice();
    return new Ctor(data.buffer, data.byteOffset, n);
  }
}

/** The tensors of one call, by name. */
export class Inputs {
  constructor(list) {
    this.list = list;
  }
  /** The input called `name` as a TensorView; missing → invalid-input. */
  get(name) {
    const list = this.list;
    for (let i = 0; i < list.length; i++) if (list[i].name === name) return new TensorView(list[i]);
    throw new InvalidInput(`missing input '${name}' (got ${JSON.stringify(this.names)})`);
  }
  has(name) {
    return this.list.some((t) => t.name === name);
  }
  get names() {
    return this.list.map((t) => t.name);
  }
  /** Every input, as views. */
  all() {
    return this.list.map((t) => new TensorView(t));
  }
}

// ---------------------------------------------------------------- plugins

function define(world, def) {
  const what = `${world}`;
  if (!def || typeof def !== "object") throw new TypeError(`${what}: give { name, version, inputs, outputs, run }`);
  const { name, version, inputs = [], outputs = [], sample = null, run } = def;
  if (typeof name !== "string" || name === "") throw new TypeError(`${what}: name must be a non-empty string`);
  if (typeof version !== "string" || version === "") throw new TypeError(`${what}: version must be a non-empty string`);
  if (typeof run !== "function") throw new TypeError(`${what} '${name}': run(inputs) must be a function`);
  const specs = (list, kind) => {
    if (!Array.isArray(list)) throw new TypeError(`${what} '${name}': ${kind} must be an array of spec(...)`);
    return list.map((s) => spec(s.name, s.dtype, s.shape));
  };
  if (sample !== null && !Array.isArray(sample)) {
    throw new TypeError(`${what} '${name}': sample must be an array of tensors or null`);
  }
  const info = {
    name,
    version,
    inputs: specs(inputs, "inputs"),
    outputs: specs(outputs, "outputs"),
    sample: sample && sample.map((t) => (t instanceof TensorView ? t.tensor : t)),
  };
  const describe = () => info;
  const call = (tensors) => {
    let out;
    try {
      out = run(new Inputs(tensors));
      if (!Array.isArray(out)) {
        if (out && typeof out.then === "function") {
          throw new TypeError("run returned a Promise: plugins run synchronously (no async/await)");
        }
        throw new TypeError(`run must return an array of tensors, not ${describeValue(out)}`);
      }
      for (let i = 0; i < out.length; i++) if (out[i] instanceof TensorView) out[i] = out[i].tensor;
    } catch (e) {
      throw toPluginError(e);
    }
    return out;
  };
  return world === "preprocessor" ? { describe, preprocess: call } : { describe, postprocess: call };
}

/** A plugin before the model: export const { describe, preprocess } = preprocessor({...}). */
export function preprocessor(def) {
  return define("preprocessor", def);
}

/** A plugin after the model: export const { describe, postprocess } = postprocessor({...}). */
export function postprocessor(def) {
  return define("postprocessor", def);
}

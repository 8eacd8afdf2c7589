// `feature-transform` in JavaScript: the twin of plugins/feature-transform
// (same name, version, inputs, outputs and sample, bit-identical answers).
//
// - `raw_dense` (rows × 13 f32): features 0–7 are counts, `log1p` then
//   standardised; features 8–12 are bucketised at 0, 1, 10, 100 and scaled
//   to 0..1 → `dense` (rows × 13 f32).
// - `user_ids` (rows × 4 strings): each id hashed (FNV-1a, 64-bit) into the
//   embedding table's 1000 rows → `ids` (rows × 4 i64).
//
// f32 arithmetic is Math.fround after every operation. log1p is musl's
// log1pf (what Rust's f32::ln_1p runs on wasm32-wasip2) step for step, so
// the answers equal the Rust plugin's to the last bit; Math.log1p rounded
// to f32 would differ in the last place for a few inputs.
import { preprocessor, spec, tensor, stringsTensor, InvalidInput } from "../../../sdk/js/sluice_plugin.js";

const fround = Math.fround;

/** Rows of the recommender's embedding table. */
const TABLE_ROWS = 1000n;
/** Mean and standard deviation of log1p(count) for the count features. */
const LOG_MEAN = 1;
const LOG_STD = 2;

/** FNV-1a, 64-bit (BigInt arithmetic, wrapped to 64 bits). */
function fnv1a(bytes) {
  let h = 0xcbf29ce484222325n;
  for (let i = 0; i < bytes.length; i++) h = BigInt.asUintN(64, (h ^ BigInt(bytes[i])) * 0x100000001b3n);
  return h;
}

// musl's log1pf (src/math/log1pf.c), in f32 throughout.
const bits = new Float32Array(1);
const word = new Uint32Array(bits.buffer);
const LN2_HI = fround(6.9313812256e-1);
const LN2_LO = fround(9.0580006145e-6);
const LG1 = fround(0xaaaaaa * 2 ** -24);
const LG2 = fround(0xccce13 * 2 ** -25);
const LG3 = fround(0x91e9ee * 2 ** -25);
const LG4 = fround(0xf89e26 * 2 ** -26);

function log1pf(x) {
  bits[0] = x;
  const ix = word[0];
  let k = 1;
  let c = 0;
  let f = 0;
  if (ix < 0x3ed413d0 || ix >>> 31) {
    if (ix >= 0xbf800000) return x === -1 ? -Infinity : NaN;
    if (ix << 1 >>> 0 < 0x67000000) return x; // |x| < 2**-24
    if (ix <= 0xbe95f619) {
      k = 0;
      f = x;
    }
  } else if (ix >= 0x7f800000) {
    return x;
  }
  if (k) {
    const u = fround(1 + x);
    bits[0] = u;
    const iu = (word[0] + (0x3f800000 - 0x3f3504f3)) >>> 0;
    k = (iu >>> 23) - 0x7f;
    if (k < 25) c = fround((k >= 2 ? fround(1 - fround(u - x)) : fround(x - fround(u - 1))) / u);
    word[0] = (iu & 0x007fffff) + 0x3f3504f3;
    f = bits[0] - 1; // exact (Sterbenz): no rounding
  }
  const s = fround(f / fround(2 + f));
  const z = fround(s * s);
  const w = fround(z * z);
  const R = fround(fround(z * fround(LG1 + fround(w * LG3))) + fround(w * fround(LG2 + fround(w * LG4))));
  const hfsq = fround(0.5 * f * f); // 0.5 * f is exact: one rounding
  // k * LN2_HI is exact (LN2_HI has 17 significant bits, |k| <= 128).
  const sum = fround(fround(s * fround(hfsq + R)) + fround(fround(k * LN2_LO) + c));
  return fround(fround(fround(sum - hfsq) + f) + k * LN2_HI);
}

// Rust's Display for the values the finiteness check rejects.
const rustFloat = (v) => (Number.isNaN(v) ? "NaN" : v > 0 ? "inf" : "-inf");

export const { describe, preprocess } = preprocessor({
  name: "feature-transform",
  version: "1.0.0",
  inputs: [spec("raw_dense", "f32", [-1, 13]), spec("user_ids", "string", [-1, 4])],
  outputs: [spec("dense", "f32", [-1, 13]), spec("ids", "i64", [-1, 4])],
  sample: [
    tensor("raw_dense", [1, 13], new Float32Array(13).fill(1)),
    stringsTensor("user_ids", [1, 4], ["u1", "u2", "u3", "u4"]),
  ],
  run(inputs) {
    const raw = inputs.get("raw_dense");
    const users = inputs.get("user_ids");
    if (raw.rows !== users.rows) {
      throw new InvalidInput(`raw_dense has ${raw.rows} rows but user_ids has ${users.rows}`);
    }
    const values = raw.f32();
    const dense = new Float32Array(values.length);
    for (let i = 0; i < values.length; i++) {
      const x = values[i];
      if (x - x !== 0) throw new InvalidInput(`raw_dense value ${i} is ${rustFloat(x)}`); // NaN, ±inf
      if (i % 13 < 8) {
        // ln(1 + max(x, 0)), standardised (the division by 2 is exact).
        dense[i] = fround(log1pf(x > 0 ? x : 0) - LOG_MEAN) / LOG_STD;
      } else {
        // The share of the bucket boundaries 0, 1, 10, 100 that x reaches.
        dense[i] = ((x >= 0) + (x >= 1) + (x >= 10) + (x >= 100)) / 4;
      }
    }
    const strings = users.strings();
    const ids = new BigInt64Array(strings.length);
    for (let i = 0; i < strings.length; i++) ids[i] = fnv1a(strings[i]) % TABLE_ROWS;
    return [tensor("dense", raw.shape, dense), tensor("ids", users.shape, ids)];
  },
});

"""`feature-transform`: raw features into the example recommender's inputs;
the Python twin of plugins/feature-transform, answer for answer.

- `raw_dense` (rows x 13 f32): features 0-7 are counts, `log1p` then
  standardised; features 8-12 are bucketised at 0, 1, 10, 100 and scaled to
  0..1 -> `dense` (rows x 13 f32).
- `user_ids` (rows x 4 strings): each id hashed (FNV-1a, 64-bit) into the
  embedding table's 1000 rows -> `ids` (rows x 4 i64).

The Rust plugin computes in f32 with musl's `log1pf`; Python floats are
doubles, so `log1pf` below is that algorithm with every operation rounded to
f32 (a double operation on f32 values rounded once to f32 is exactly the f32
operation), which makes the answers bit-identical. Plain
`math.log1p` rounded to f32 differs in the last bit for about 1% of inputs.
"""

import math
import struct
from array import array
from itertools import cycle

import sluice_plugin
from sluice_plugin import InvalidInput, Preprocessor, spec, strings_tensor, tensor

TABLE_ROWS = 1000
LOG_MEAN = 1.0
LOG_STD = 2.0
BOUNDARIES = (0.0, 1.0, 10.0, 100.0)

_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_pack, _unpack = _F32.pack, _F32.unpack
_slot = array("f", [0.0])


def _r(v):
    """`v` rounded to f32 (to nearest, ties to even; inf past f32's range)."""
    _slot[0] = v
    return _slot[0]


def _bits(v):
    return _U32.unpack(_pack(v))[0]


def _from_bits(i):
    return _unpack(_U32.pack(i))[0]


_LN2_HI = _from_bits(0x3F317180)
_LN2_LO = _from_bits(0x3717F7D1)
_LG1 = 0xAAAAAA * 2.0**-24
_LG2 = 0xCCCE13 * 2.0**-25
_LG3 = 0x91E9EE * 2.0**-25
_LG4 = 0xF89E26 * 2.0**-26


def log1pf(x):
    """musl's (FreeBSD's) log1pf, in f32 arithmetic; `x` an f32 value."""
    r = _r
    ix = _bits(x)
    k = 1
    c = f = 0.0
    if ix < 0x3ED413D0 or ix >> 31:  # 1+x < sqrt(2)+
        if ix >= 0xBF800000:  # x <= -1.0
            return math.inf if x == -1.0 else math.nan
        if (ix << 1) & 0xFFFFFFFF < 0x33800000 << 1:  # |x| < 2**-24
            return x
        if ix <= 0xBE95F619:  # sqrt(2)/2- <= 1+x < sqrt(2)+
            k = 0
            f = x
    elif ix >= 0x7F800000:
        return x
    if k:
        u = r(1.0 + x)
        iu = (_bits(u) + (0x3F800000 - 0x3F3504F3)) & 0xFFFFFFFF
        k = (iu >> 23) - 0x7F
        # correction term ~ log(1+x)-log(u), avoid underflow in c/u
        if k < 25:
            c = r(1.0 - r(u - x)) if k >= 2 else r(x - r(u - 1.0))
            c = r(c / u)
        # reduce u into [sqrt(2)/2, sqrt(2)]
        f = r(_from_bits((iu & 0x007FFFFF) + 0x3F3504F3) - 1.0)
    s = r(f / r(2.0 + f))
    z = r(s * s)
    w = r(z * z)
    t1 = r(w * r(_LG2 + r(w * _LG4)))
    t2 = r(z * r(_LG1 + r(w * _LG3)))
    big_r = r(t2 + t1)
    hfsq = r(0.5 * f * f)  # 0.5 * f is exact
    dk = float(k)
    # dk * _LN2_HI is exact by the constant's design.
    y = r(r(s * r(hfsq + big_r)) + r(r(dk * _LN2_LO) + c))
    return r(r(r(y - hfsq) + f) + dk * _LN2_HI)


def count_feature(x):
    """((max(x, 0)).ln_1p() - LOG_MEAN) / LOG_STD, in f32."""
    return _r(log1pf(x if x > 0.0 else 0.0) - LOG_MEAN) / LOG_STD  # / 2 is exact


def bucket_feature(x):
    return sum(1 for b in BOUNDARIES if x >= b) / len(BOUNDARIES)


# Counts are mostly small integers: their answers, computed once at build
# time (componentize-py snapshots the imported module).
_COUNT_TABLE = {float(i): count_feature(float(i)) for i in range(1024)}


def fnv1a(data):
    """FNV-1a, 64-bit."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _rust_f32(v):
    """`v` as Rust's Display writes an f32 (only needed for NaN and infinities here)."""
    return "NaN" if v != v else ("inf" if v > 0 else "-inf")


class FeatureTransform(Preprocessor):
    name = "feature-transform"
    version = "1.0.0"
    inputs = [spec("raw_dense", "f32", [-1, 13]), spec("user_ids", "string", [-1, 4])]
    outputs = [spec("dense", "f32", [-1, 13]), spec("ids", "i64", [-1, 4])]
    sample = [
        tensor("raw_dense", [1, 13], array("f", [1.0] * 13)),
        strings_tensor("user_ids", [1, 4], [b"u1", b"u2", b"u3", b"u4"]),
    ]

    def run(self, inputs):
        raw = inputs["raw_dense"]
        users = inputs["user_ids"]
        if raw.rows != users.rows:
            raise InvalidInput(f"raw_dense has {raw.rows} rows but user_ids has {users.rows}")
        values = raw.f32()
        table = _COUNT_TABLE.get
        isfinite = math.isfinite
        dense = array("f")
        append = dense.append
        for i, (column, x) in enumerate(zip(cycle(range(13)), values)):
            if not isfinite(x):
                raise InvalidInput(f"raw_dense value {i} is {_rust_f32(x)}")
            if column < 8:
                y = table(x)
                append(count_feature(x) if y is None else y)
            else:
                append(bucket_feature(x))
        ids = array("q", [fnv1a(s) % TABLE_ROWS for s in users.strings()])
        return [tensor("dense", raw.shape, dense), tensor("ids", users.shape, ids)]


WitWorld = sluice_plugin.export(FeatureTransform)

"""Write sluice preprocessing and postprocessing plugins in Python.

A plugin is a WebAssembly component built with componentize-py from the WIT
contract ``sdk/wit/plugin.wit``; this module (standard library only) sits
over the generated bindings so that a plugin reads and writes typed values,
never bytes::

    # app.py (plugins/python/scale is a whole project)
    from array import array
    import sluice_plugin
    from sluice_plugin import Preprocessor, spec, tensor

    class Negate(Preprocessor):
        name = "negate"
        version = "0.1.0"
        inputs = [spec("x", "f32", [-1, -1])]
        outputs = [spec("y", "f32", [-1, -1])]

        def run(self, inputs):
            x = inputs["x"]                       # a TensorView
            return [tensor("y", x.shape, array("f", [-v for v in x.f32()]))]

    WitWorld = sluice_plugin.export(Negate)    # what componentize-py calls

Build it (the directory holding this module, and app.py, on ``-p``)::

    componentize-py -d sdk/wit -w preprocessor componentize \\
        -p sdk/python -p . app -o negate.wasm
    sluice plugin check negate.wasm

Errors: raise ``InvalidInput(message)`` for bad client input (the client
gets INVALID_ARGUMENT with the message); any other exception escaping
``run`` is returned as the WIT ``internal`` error carrying the last frames
of its Python traceback (at most ~1000 characters), which the host logs as
the plugin's last words. MemoryError alone escapes: the instance traps, and
the host reports the memory limit and discards the instance.

State: every call starts from the instance as it was after warm-up
(the host's default `reset` instances), so nothing one request leaves in
module globals reaches the next. That includes `random`'s generator: a
plugin that draws random numbers calls ``random.seed()`` at the start of
``run`` (it reseeds from the host's entropy), or every call draws the same.

The module also runs in plain CPython with the generated bindings on
``sys.path`` (``componentize-py -d sdk/wit -w preprocessor bindings DIR``), so
``check(Scale)`` can run a plugin in a unit test; ``log`` then prints to
stderr.
"""

import struct
import sys
import traceback
from array import array

from componentize_py_types import Err
from wit_world.imports import log as _wit_log
from wit_world.imports.types import (
    Dtype,
    PluginError_Internal,
    PluginError_InvalidInput,
    PluginInfo,
    Tensor,
    TensorSpec,
)

__all__ = [
    "InvalidInput", "Plugin", "Preprocessor", "Postprocessor", "TensorView", "Inputs",
    "spec", "tensor", "strings_tensor", "zeros", "export", "check", "log",
]

# -- dtypes -----------------------------------------------------------------

_DTYPES = {
    "f32": Dtype.F32, "f64": Dtype.F64, "f16": Dtype.F16, "bf16": Dtype.BF16,
    "i8": Dtype.I8, "i16": Dtype.I16, "i32": Dtype.I32, "i64": Dtype.I64,
    "u8": Dtype.U8, "u16": Dtype.U16, "u32": Dtype.U32, "u64": Dtype.U64,
    "bool": Dtype.BOOLEAN, "string": Dtype.STRING,
}
_DTYPES["boolean"] = Dtype.BOOLEAN
_NAMES = {d: n for n, d in _DTYPES.items() if n != "boolean"}
# Bytes per element.
_SIZE = {
    Dtype.F32: 4, Dtype.F64: 8, Dtype.F16: 2, Dtype.BF16: 2, Dtype.I8: 1,
    Dtype.I16: 2, Dtype.I32: 4, Dtype.I64: 8, Dtype.U8: 1, Dtype.U16: 2,
    Dtype.U32: 4, Dtype.U64: 8, Dtype.BOOLEAN: 1,
}
# array.array type codes (f16 and bf16 have none).
_CODE = {
    Dtype.F32: "f", Dtype.F64: "d", Dtype.I8: "b", Dtype.I16: "h",
    Dtype.I32: "i", Dtype.I64: "q", Dtype.U8: "B", Dtype.U16: "H",
    Dtype.U32: "I", Dtype.U64: "Q", Dtype.BOOLEAN: "B",
}
_FROM_CODE = {c: d for d, c in _CODE.items() if d is not Dtype.BOOLEAN}
for _d, _c in _CODE.items():
    assert array(_c).itemsize == _SIZE[_d], (_d, _c)
_SWAP = sys.byteorder != "little"  # the wire is little-endian


def _dtype(dtype):
    if isinstance(dtype, Dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(n for n in _DTYPES)}") from None


def _count(name, shape):
    n = 1
    for d in shape:
        if not isinstance(d, int) or d < 0:
            raise ValueError(f"tensor '{name}' has shape {list(shape)}; dimensions are integers >= 0")
        n *= d
    return n


# -- errors -----------------------------------------------------------------

class InvalidInput(Exception):
    """Raise for bad client input: the client gets INVALID_ARGUMENT with the message."""

    def __init__(self, message):
        super().__init__(message)
        self.message = str(message)


_FRAMES = 6         # traceback frames kept, at most
_LAST_WORDS = 1000  # characters kept, at most


def _cut(text, limit):
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _last_words(error):
    """`error` with the last frames of its traceback, in at most _LAST_WORDS characters."""
    try:
        tb = error.__traceback__
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next  # the SDK's own frame
        # Free the failed frames' locals (say, a hoard of memory) first.
        traceback.clear_frames(tb)
        what = _cut("".join(traceback.format_exception_only(type(error), error)).rstrip(), _LAST_WORDS // 2)
        frames = traceback.format_tb(tb, limit=-_FRAMES)
        while frames and sum(map(len, frames)) + len(what) + 40 > _LAST_WORDS:
            frames.pop(0)  # the oldest first
        return "Traceback (most recent call last):\n" + "".join(frames) + what
    except BaseException:  # formatting can fail too (out of memory)
        return type(error).__name__


# -- logging ----------------------------------------------------------------

_IN_WASM = sys.platform == "wasi"


class _Log:
    """Writes into the host's log (rate-limited there); stderr outside wasm."""

    __slots__ = ()

    @staticmethod
    def _emit(level, message):
        if _IN_WASM:
            _wit_log.log(level, str(message))
        else:
            print(f"[{level.name.lower()}] {message}", file=sys.stderr)

    def debug(self, message):
        self._emit(_wit_log.Level.DEBUG, message)

    def info(self, message):
        self._emit(_wit_log.Level.INFO, message)

    def warn(self, message):
        self._emit(_wit_log.Level.WARN, message)

    def error(self, message):
        self._emit(_wit_log.Level.ERROR, message)


log = _Log()

# -- declaring --------------------------------------------------------------


def spec(name, dtype, shape):
    """A declared input or output: `dtype` as "f32", "i64", "string", ...; -1 in `shape` for any size."""
    return TensorSpec(name, _dtype(dtype), [int(d) for d in shape])


# -- reading ----------------------------------------------------------------

class TensorView:
    """An input tensor, read as typed values; wrong dtypes or lengths are InvalidInput."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor  # the generated WIT record

    name = property(lambda self: self.tensor.name)
    shape = property(lambda self: self.tensor.shape, doc="Dimensions, a list of ints.")
    dtype = property(lambda self: _NAMES[self.tensor.dtype], doc='"f32", "string", ...')
    data = property(lambda self: self.tensor.data, doc="The raw little-endian bytes.")

    @property
    def rows(self):
        """Dimension 0 (1 for a scalar)."""
        shape = self.tensor.shape
        return shape[0] if shape else 1

    @property
    def size(self):
        """The number of elements."""
        n = 1
        for d in self.tensor.shape:
            n *= d
        return n

    def __repr__(self):
        return f"TensorView({self.name!r}, {self.dtype}, {self.shape})"

    def _expect(self, dtype):
        if self.tensor.dtype is not dtype:
            raise InvalidInput(f"'{self.name}' is {self.dtype}, but {_NAMES[dtype]} is needed")

    def _values(self, dtype):
        self._expect(dtype)
        data = self.tensor.data
        want = self.size * _SIZE[dtype]
        if len(data) != want:
            raise InvalidInput(
                f"'{self.name}' ({self.dtype} {self.shape}) carries {len(data)} bytes, but {want} are needed")
        values = array(_CODE[dtype])
        values.frombytes(data)
        if _SWAP:
            values.byteswap()
        return values

    def f32(self):
        """The values as array('f')."""
        return self._values(Dtype.F32)

    def f64(self):
        """The values as array('d')."""
        return self._values(Dtype.F64)

    def i32(self):
        """The values as array('i')."""
        return self._values(Dtype.I32)

    def i64(self):
        """The values as array('q')."""
        return self._values(Dtype.I64)

    def u8(self):
        """The values as array('B')."""
        return self._values(Dtype.U8)

    def values(self):
        """The values of any fixed-width dtype: an array (bool: 0/1 bytes), or floats for f16/bf16."""
        dtype = self.tensor.dtype
        if dtype is Dtype.STRING:
            raise InvalidInput(f"'{self.name}' is string, but a fixed-width dtype is needed")
        if dtype in _CODE:
            return self._values(dtype)
        raw = self._values_16(dtype)
        if dtype is Dtype.F16:
            return array("f", [v[0] for v in struct.iter_unpack("<e", raw)])
        wide = array("I", [b << 16 for b in array("H", raw)])  # bf16 is the top half of an f32
        return array("f", wide.tobytes())

    def _values_16(self, dtype):
        want = self.size * 2
        if len(self.tensor.data) != want:
            raise InvalidInput(f"'{self.name}' carries {len(self.tensor.data)} bytes, but {want} are needed")
        return self.tensor.data

    def bools(self):
        """The values of a bool tensor, as a list of bool."""
        return [b != 0 for b in self._values(Dtype.BOOLEAN)]

    def strings(self):
        """The elements of a string tensor, a list of bytes."""
        self._expect(Dtype.STRING)
        strings = self.tensor.strings
        if len(strings) != self.size:
            raise InvalidInput(f"'{self.name}' {self.shape} carries {len(strings)} strings")
        return strings

    def texts(self):
        """The elements of a string tensor as str (UTF-8; anything else is InvalidInput)."""
        out = []
        for i, s in enumerate(self.strings()):
            try:
                out.append(s.decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidInput(f"'{self.name}' element {i} is not UTF-8") from None
        return out


class Inputs:
    """The tensors a plugin was called with: ``inputs["x"]`` is a TensorView."""

    __slots__ = ("_by_name",)

    def __init__(self, tensors):
        self._by_name = {t.name: t for t in tensors}

    def __getitem__(self, name):
        t = self._by_name.get(name)
        if t is None:
            got = ", ".join(f'"{n}"' for n in self._by_name)
            raise InvalidInput(f"missing input '{name}' (got [{got}])")
        return TensorView(t)

    def get(self, name, default=None):
        t = self._by_name.get(name)
        return default if t is None else TensorView(t)

    def __contains__(self, name):
        return name in self._by_name

    def __iter__(self):
        return (TensorView(t) for t in self._by_name.values())

    def __len__(self):
        return len(self._by_name)

    def names(self):
        return list(self._by_name)


# -- building ---------------------------------------------------------------

def tensor(name, shape, values, dtype=None):
    """An output tensor from an array.array, a list, or little-endian bytes.

    `dtype` defaults to the array's own ("f" is f32, "q" i64, ...) and must be
    given for a list or bytes. The number of values must fill `shape`.
    """
    shape = [int(d) for d in shape]
    count = _count(name, shape)
    if dtype is None:
        if not isinstance(values, array) or values.typecode not in _FROM_CODE:
            raise ValueError(f"tensor '{name}': give its dtype (the values are a {type(values).__name__})")
        dtype = _FROM_CODE[values.typecode]
    else:
        dtype = _dtype(dtype)
    if dtype is Dtype.STRING:
        return strings_tensor(name, shape, values)
    size = _SIZE[dtype]
    if isinstance(values, (bytes, bytearray, memoryview)):
        data = bytes(values)
        if len(data) != count * size:
            raise ValueError(
                f"tensor '{name}': {len(data)} bytes do not fill {_NAMES[dtype]} {shape} ({count * size} bytes)")
        return Tensor(name, dtype, shape, data, [])
    n = len(values)
    if n != count:
        raise ValueError(f"tensor '{name}': {n} values do not fill shape {shape} ({count})")
    code = _CODE.get(dtype)
    if dtype is Dtype.BOOLEAN:
        data = bytes(1 if v else 0 for v in values)
    elif code is not None:
        if not (isinstance(values, array) and values.typecode == code):
            values = array(code, values)
        if _SWAP:
            values = array(code, values)
            values.byteswap()
        data = values.tobytes()
    elif dtype is Dtype.F16:
        data = struct.pack(f"<{n}e", *values)
    else:  # bf16: round each f32 to nearest even on its top 16 bits
        bits = array("I", array("f", values).tobytes())
        data = array("H", [
            (b >> 16) | 0x40 if (b & 0x7FFFFFFF) > 0x7F800000 else ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
            for b in bits
        ]).tobytes()
    return Tensor(name, dtype, shape, data, [])


def strings_tensor(name, shape, items):
    """A string tensor from a list of bytes or str (str is encoded as UTF-8)."""
    shape = [int(d) for d in shape]
    count = _count(name, shape)
    strings = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in items]
    if len(strings) != count:
        raise ValueError(f"tensor '{name}': {len(strings)} strings do not fill shape {shape} ({count})")
    return Tensor(name, Dtype.STRING, shape, b"", strings)


def zeros(spec, rows=1):
    """A tensor of zeros (empty strings) fitting `spec`: its first -1 is `rows`, any other -1 is 1."""
    shape = [(rows if i == 0 else 1) if d < 0 else d for i, d in enumerate(spec.shape)]
    n = _count(spec.name, shape)
    if spec.dtype is Dtype.STRING:
        return Tensor(spec.name, spec.dtype, shape, b"", [b""] * n)
    return Tensor(spec.name, spec.dtype, shape, bytes(n * _SIZE[spec.dtype]), [])


# -- defining ---------------------------------------------------------------

class Plugin:
    """A plugin: subclass Preprocessor or Postprocessor (or this, setting `world`)."""

    world = None  # "preprocessor" or "postprocessor"
    name = None
    version = "0.1.0"
    inputs = ()
    outputs = ()
    sample = None  # optional list of tensors to try the plugin with

    def run(self, inputs):
        """Takes Inputs, returns a list of tensors (or TensorViews, passed through)."""
        raise NotImplementedError


class Preprocessor(Plugin):
    """Runs before the model: client tensors in, model inputs out."""
    world = "preprocessor"


class Postprocessor(Plugin):
    """Runs after the model: model outputs in, the answer out."""
    world = "postprocessor"


def _info(cls):
    if not isinstance(cls.name, str) or not cls.name:
        raise TypeError(f"{cls.__name__} needs a name")
    for what in ("inputs", "outputs"):
        for s in getattr(cls, what):
            if not isinstance(s, TensorSpec):
                raise TypeError(f"{cls.__name__}.{what} holds {s!r}; use spec(name, dtype, shape)")
    sample = None if cls.sample is None else list(cls.sample)
    return PluginInfo(cls.name, str(cls.version), list(cls.inputs), list(cls.outputs), sample)


def _output(t):
    if isinstance(t, Tensor):
        return t
    if isinstance(t, TensorView):
        return t.tensor
    raise TypeError(f"run() returned {t!r} among its outputs; tensors are expected (tensor(), strings_tensor())")


def _caller(cls):
    """The plugin's run() as the WIT export: errors become WIT errors."""
    run = cls().run

    def call(self, inputs):
        # Each call starts from the image frozen after warm-up, `random`'s
        # state included. Not reseeded here: it costs ~17 µs a call, a
        # fifth of a small call, for the few plugins that draw numbers;
        # those call random.seed() in run() (see the module docstring).
        try:
            outputs = run(Inputs(inputs))
            if not isinstance(outputs, (list, tuple)):
                raise TypeError(f"run() returned {type(outputs).__name__}; a list of tensors is expected")
            return [_output(t) for t in outputs]
        except InvalidInput as e:
            raise Err(PluginError_InvalidInput(e.message)) from None
        except Err:
            raise
        except MemoryError as e:
            # Out of memory: escape, so the instance traps and the host reports
            # the memory limit and drops the instance, rather than keeping it,
            # grown to the limit, for the next call. Its frames are freed first.
            if e.__traceback__ is not None:
                traceback.clear_frames(e.__traceback__.tb_next)
            raise
        except BaseException as e:
            raise Err(PluginError_Internal(_last_words(e))) from None

    return call


def export(cls):
    """The `WitWorld` class componentize-py wants, for a Preprocessor or Postprocessor subclass.

    In app.py: ``WitWorld = sluice_plugin.export(MyPlugin)``.
    """
    import wit_world

    world = getattr(cls, "world", None)
    if world not in ("preprocessor", "postprocessor"):
        raise TypeError(f"{cls.__name__}.world is {world!r}; subclass Preprocessor or Postprocessor")
    method = "preprocess" if world == "preprocessor" else "postprocess"
    if not hasattr(wit_world.WitWorld, method):
        other = "postprocessor" if world == "preprocessor" else "preprocessor"
        raise TypeError(f"{cls.__name__} is a {world}, but it is being built as a {other} (-w {other})")
    info = _info(cls)
    attrs = {"describe": lambda self: info, method: _caller(cls), "__doc__": cls.__doc__}
    return type("WitWorld", (wit_world.WitWorld,), attrs)


# -- testing ----------------------------------------------------------------

def check(cls, inputs=None):
    """Runs a plugin as the host would, in plain CPython, for unit tests.

    `inputs` (a list of tensors) defaults to the plugin's sample, else zeros
    shaped from its declared inputs (-1 as 1). They are checked as the host
    checks a request (names, dtypes, ranks, fixed dimensions) before `run`;
    the outputs are checked against the declared outputs. Raises
    InvalidInput, RuntimeError (an internal error, with its traceback) or
    AssertionError (outputs that do not match the declaration).
    """
    info = _info(cls)
    if inputs is None:
        inputs = info.sample if info.sample is not None else [zeros(s) for s in info.inputs]
    inputs = list(inputs)
    # What the host checks before it calls a plugin: every declared input
    # is there, with its dtype, rank and fixed dimensions, and nothing else.
    declared = {s.name: s for s in info.inputs}
    given = [t.name for t in inputs]
    if sorted(given) != sorted(declared):
        raise InvalidInput(f"inputs {sorted(given)}, but the plugin declares {sorted(declared)}")
    for t in inputs:
        s = declared[t.name]
        if t.dtype is not s.dtype:
            raise InvalidInput(f"input '{t.name}' is {_NAMES[t.dtype]}, but the plugin expects {_NAMES[s.dtype]}")
        fits = len(t.shape) == len(s.shape) and all(w < 0 or g == w for g, w in zip(t.shape, s.shape))
        if not fits:
            raise InvalidInput(f"input '{t.name}' has shape {list(t.shape)}, but the plugin expects {list(s.shape)}")
    failure = None
    try:
        outputs = _caller(cls)(None, inputs)
    except Err as e:
        # Raised after the except block: componentize-py's Err is a frozen
        # dataclass, and an exception raised inside the block would carry
        # it as context, which unittest cannot annotate.
        failure = e.value
    if failure is not None:
        if isinstance(failure, PluginError_InvalidInput):
            raise InvalidInput(failure.value)
        raise RuntimeError(failure.value)
    names = [t.name for t in outputs]
    assert names == [s.name for s in info.outputs], f"outputs {names}, declared {[s.name for s in info.outputs]}"
    for t, s in zip(outputs, info.outputs):
        assert t.dtype is s.dtype, f"'{t.name}' is {_NAMES[t.dtype]}, but {_NAMES[s.dtype]} was declared"
        fits = len(t.shape) == len(s.shape) and all(w < 0 or g == w for g, w in zip(t.shape, s.shape))
        assert fits, f"'{t.name}' has shape {t.shape}, but {s.shape} was declared"
        n = _count(t.name, t.shape)
        if t.dtype is Dtype.STRING:
            assert len(t.strings) == n and not t.data, f"'{t.name}' carries {len(t.strings)} strings for {n}"
        else:
            assert len(t.data) == n * _SIZE[t.dtype] and not t.strings, f"'{t.name}' carries {len(t.data)} bytes"
    return outputs

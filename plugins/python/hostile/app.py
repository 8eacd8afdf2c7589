"""`hostile-py`: a test fixture, the Python counterpart of plugins/hostile.

A preprocessor (x: rows x 64 f32 -> x) that, depending on its `attack`
input, misbehaves; the host must contain every one of these:

- "none": returns x;
- "loop": loops forever (the time limit must stop it);
- "memory": hoards 16 MiB bytearrays until stopped (the memory limit);
- "exception": raises ValueError (the SDK returns WIT `internal` with the
  traceback);
- "huge": returns x with 100000 rows of zeros;
- "invalid": raises InvalidInput;
- "remember:TEXT": keeps TEXT in a module global, returns x;
- "recall": raises InvalidInput naming the global's value (proves that no
  state survives from one call to the next);
- "wrong-dtype": returns x's bytes declared i32 instead of f32.

Anything else is an InvalidInput naming it.
"""

import sluice_plugin
from sluice_plugin import InvalidInput, Preprocessor, spec, tensor

remembered = None


class Hostile(Preprocessor):
    name = "hostile-py"
    version = "6.6.6"
    inputs = [spec("attack", "string", [1]), spec("x", "f32", [-1, 64])]
    outputs = [spec("x", "f32", [-1, 64])]

    def run(self, inputs):
        global remembered
        attacks = inputs["attack"].texts()
        attack = attacks[0] if attacks else ""
        x = inputs["x"]
        verb, _, argument = attack.partition(":")
        if verb == "none":
            return [x]
        if verb == "loop":
            spins = 0
            while True:
                spins += 1
        if verb == "memory":
            hoard = []
            while True:
                hoard.append(bytearray(16 << 20))
        if verb == "exception":
            raise ValueError("the hostile plugin raises on purpose")
        if verb == "huge":
            rows = 100_000
            return [tensor("x", [rows, 64], bytes(rows * 64 * 4), "f32")]
        if verb == "invalid":
            raise InvalidInput("the hostile plugin refuses this input")
        if verb == "remember":
            remembered = argument
            return [x]
        if verb == "recall":
            raise InvalidInput(f"remembered: {remembered!r}")
        if verb == "wrong-dtype":
            return [tensor("x", x.shape, x.data, "i32")]
        raise InvalidInput(f"unknown attack '{attack}'")


WitWorld = sluice_plugin.export(Hostile)

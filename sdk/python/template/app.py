"""{{name}}: a sluice {{world}} plugin, in Python.

As generated it passes its inputs through: each declared output is the input
of the same name, unchanged (an output no input is named like gets zeros),
so it builds and passes `sluice plugin check` as it is. To make it yours:

1. `inputs` / `outputs`: the tensors it takes and returns, as
   spec(name, dtype, shape), dtype "f32", "f64", "i32", "i64", "u8",
   "bool", "string", ...; -1 in a shape is any size (dimension 0 is the
   batch).
2. `sample`: inputs to try it with (checks, uploads), or None for zeros.
3. `run`: the transform (see the TODO). Read an input with
   `inputs["x"].f32()` (an array.array; .i64(), .texts(), ... for other
   dtypes), build each output with tensor(name, shape, values, dtype) or
   strings_tensor(name, shape, items). Raise InvalidInput("...") when the
   client's input is wrong; any other exception is reported as an internal
   error with its traceback. log.info("...") writes to the server's log.

Then `./build.sh test` and `./build.sh` (see README.md).
"""

from array import array  # noqa: F401  (typed values: array("f", ...), array("q", ...))

import sluice_plugin
from sluice_plugin import InvalidInput, log, spec, strings_tensor, tensor, zeros  # noqa: F401


class Plugin(sluice_plugin.Plugin):
    world = "{{world}}"
    name = "{{name}}"
    version = "0.1.0"
    inputs = [
{{inputs}}
    ]
    outputs = [
{{outputs}}
    ]
    sample = {{sample}}

    def run(self, inputs):
        # TODO: the transform. For instance, doubling an f32 input "x":
        #     x = inputs["x"]
        #     return [tensor("x", x.shape, array("f", [v * 2.0 for v in x.f32()]))]
        rows = next(iter(inputs)).rows if len(inputs) else 1
        return [inputs[s.name] if s.name in inputs else zeros(s, rows) for s in self.outputs]


# What componentize-py calls: keep this line, naming the class above.
WitWorld = sluice_plugin.export(Plugin)

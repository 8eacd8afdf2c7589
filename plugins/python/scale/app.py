"""`scale`: doubles its input; the Python twin of plugins/scale (same name,
version, inputs, outputs and answers)."""

from array import array

import sluice_plugin
from sluice_plugin import Preprocessor, spec, tensor


class Scale(Preprocessor):
    name = "scale"
    version = "1.0.0"
    inputs = [spec("x", "f32", [-1, 64])]
    outputs = [spec("x", "f32", [-1, 64])]

    def run(self, inputs):
        x = inputs["x"]
        # Doubling is exact in a double; array("f") rounds it back to f32
        # (inf past f32's range), as f32 arithmetic does.
        return [tensor("x", x.shape, array("f", [v * 2.0 for v in x.f32()]))]


WitWorld = sluice_plugin.export(Scale)

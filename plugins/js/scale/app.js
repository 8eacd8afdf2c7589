// `scale` in JavaScript: doubles its input, the twin of plugins/scale
// (same name, version, inputs and outputs, the same answers).
import { preprocessor, spec, tensor } from "../../../sdk/js/sluice_plugin.js";

export const { describe, preprocess } = preprocessor({
  name: "scale",
  version: "1.0.0",
  inputs: [spec("x", "f32", [-1, 64])],
  outputs: [spec("x", "f32", [-1, 64])],
  run(inputs) {
    const x = inputs.get("x");
    const v = x.f32();
    const doubled = new Float32Array(v.length);
    for (let i = 0; i < v.length; i++) doubled[i] = v[i] * 2;
    return [tensor("x", x.shape, doubled)];
  },
});

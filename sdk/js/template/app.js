// {{name}}: a sluice {{world}} plugin in JavaScript.
//
// As generated it passes each declared output through from the input of
// the same name, unchanged, and builds and passes `sluice plugin check`.
// Edit:
//   - `inputs` / `outputs`: what the plugin takes and returns, as
//     spec(name, dtype, shape) with dtype one of f32 f64 f16 bf16 i8 i16 i32
//     i64 u8 u16 u32 u64 boolean string, and -1 for a dimension of any size;
//   - `run`: the transform (synchronous; throw new InvalidInput(message)
//     when the caller's input is wrong, anything else thrown is an internal
//     error the host logs);
//   - `sample`: inputs `sluice plugin check` and uploads try the plugin
//     with (null: zeros shaped from `inputs`);
//   - `version`: raise it with every change you push.
// The SDK (./sluice_plugin.js) documents every helper at its top.
import { {{world}}, spec, tensor, stringsTensor, zeros, log, InvalidInput } from "./sluice_plugin.js";

// A preprocessor exports `preprocess`, a postprocessor `postprocess`: the
// one this plugin's world does not have stays undefined and is ignored.
export const { describe, preprocess, postprocess } = {{world}}({
  name: "{{name}}",
  version: "0.1.0",
  inputs: [
{{inputs}}
  ],
  outputs: [
{{outputs}}
  ],
  sample: {{sample}},
  run(inputs) {
    // inputs.get("x") is the input called x (missing → invalid input);
    // read it with .f32() .f64() .i32() .i64() .u8() .strings() .texts() …,
    // see .name .dtype .shape .rows; build outputs with
    // tensor(name, shape, values) and stringsTensor(name, shape, list).
    // For example, doubling an f32 input x:
    //   const x = inputs.get("x");
    //   const out = Float32Array.from(x.f32(), (v) => v * 2);
    //   return [tensor("x", x.shape, out)];
    return describe().outputs.map((output) => inputs.get(output.name));
  },
});

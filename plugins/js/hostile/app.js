// A test fixture, the JavaScript cousin of plugins/hostile: a preprocessor
// (x: rows × 64 f32 → x) that, depending on its `attack` input, loops
// forever, exhausts memory, throws, returns malformed outputs or tries to
// keep state between requests. The host must contain every one of these.
//
//   none            return x
//   loop            spin forever (only the time limit stops it)
//   memory          keep allocating 16 MiB ArrayBuffers (only the memory limit stops it)
//   exception       throw an Error (→ internal, with its stack)
//   huge            return x with 100000 rows of zeros
//   invalid         throw InvalidInput (→ invalid-input)
//   remember:TEXT   keep TEXT in a module-level variable, return x
//   recall          throw InvalidInput("remembered: <the variable as JSON>"):
//                   null unless state survived from an earlier request
//   wrong-dtype     return x labelled i32
import { preprocessor, spec, tensor, InvalidInput } from "../../../sdk/js/sluice_plugin.js";

let remembered = null;

export const { describe, preprocess } = preprocessor({
  name: "hostile-js",
  version: "6.6.6",
  inputs: [spec("attack", "string", [1]), spec("x", "f32", [-1, 64])],
  outputs: [spec("x", "f32", [-1, 64])],
  run(inputs) {
    const attack = inputs.has("attack") ? (inputs.get("attack").texts()[0] ?? "") : "";
    const x = inputs.get("x");
    const colon = attack.indexOf(":");
    const verb = colon < 0 ? attack : attack.slice(0, colon);
    const argument = colon < 0 ? "" : attack.slice(colon + 1);
    switch (verb) {
      case "none":
        return [x];
      case "loop": {
        let spins = 0;
        for (;;) spins = (spins + 1) | 0;
      }
      case "memory": {
        const hoard = [];
        for (;;) hoard.push(new ArrayBuffer(16 << 20));
      }
      case "exception":
        throw new Error("the hostile plugin throws on purpose");
      case "huge":
        return [tensor("x", [100000, 64], new Float32Array(100000 * 64))];
      case "invalid":
        throw new InvalidInput("the hostile plugin refuses this input");
      case "remember":
        remembered = argument;
        return [x];
      case "recall":
        throw new InvalidInput(`remembered: ${JSON.stringify(remembered)}`);
      case "wrong-dtype":
        return [{ ...x.tensor, dtype: "i32" }];
      default:
        throw new InvalidInput(`unknown attack '${attack}'`);
    }
  },
});

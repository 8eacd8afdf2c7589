// `npm test`: the plugin's logic under Node.js, outside WebAssembly (the
// SDK's log writes to stderr here). `npm run build` and then
// `sluice plugin check {{name}}.wasm` run the same code in the real host.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as plugin from "./app.js";
import { mismatch, zeros, TensorView } from "./sluice_plugin.js";

const run = plugin.preprocess ?? plugin.postprocess;
const info = plugin.describe();

test("describes itself", () => {
  assert.equal(info.name, "{{name}}");
  assert.equal(typeof run, "function");
});

test("answers its sample (or zeros) with its declared outputs", () => {
  const outputs = run(info.sample ?? zeros(info.inputs));
  assert.equal(outputs.length, info.outputs.length);
  info.outputs.forEach((spec, i) => assert.equal(mismatch(spec, outputs[i]), null));
});

// Replace with your plugin's answers: a view reads what it returned, e.g.
// assert.deepEqual(Array.from(new TensorView(outputs[0]).f32()), [2, 4, 6]).
test("passes its input through unchanged", () => {
  const inputs = info.sample ?? zeros(info.inputs, 2);
  const outputs = run(inputs);
  for (const output of outputs) {
    const input = inputs.find((t) => t.name === output.name);
    assert.deepEqual(new TensorView(output).values(), new TensorView(input).values());
  }
});

test("a missing input is the caller's error", { skip: info.outputs.length === 0 }, () => {
  assert.throws(() => run([]), { tag: "invalid-input" });
});

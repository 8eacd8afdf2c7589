//! What calling a plugin costs, and WebAssembly against native code.
//!
//! - Each instance policy — `fresh` (a new instance per call), `reset`
//!   (the default: one instance, put back as it was made after each call)
//!   and `reuse` (kept as it is) — for the trivial `identity` plugin and
//!   for `scale` (64 floats doubled) written in Rust, Python
//!   (componentize-py) and JavaScript (componentize-qjs), when
//!   scripts/build-plugins has built them.
//! - `image-normalize` on 32 images of 32 × 32 × 3 bytes, in WebAssembly
//!   and natively: the plugin and the host's built-in run the same SDK
//!   function.
//!
//! ```text
//! scripts/build-plugins && cargo bench --bench plugin
//! ```

use std::sync::Arc;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use sluice::plugin::{InstancePolicy, Plugin, PluginEngine, PluginLimits, PluginsConfig};
use sluice::tensor::{DType, NamedTensor, Tensor};
use sluice_sdk::transforms::{image_normalize, ImageNormalize};

fn load(engine: &Arc<PluginEngine>, name: &str, instances: InstancePolicy) -> Plugin {
    // A reused Python instance leaks (componentize-py keeps ~0.3 KiB a
    // call): room for the hundreds of thousands of calls a measurement makes.
    let limits = PluginLimits { instances, timeout_ms: 1000, memory_mib: 256, ..PluginLimits::default() };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/plugins").join(format!("{name}.wasm"));
    Plugin::load_file(engine, &path, limits, None).unwrap_or_else(|e| panic!("{e} (run scripts/build-plugins)"))
}

fn plugins(c: &mut Criterion) {
    let engine = Arc::new(PluginEngine::new(&PluginsConfig::default()).expect("engine"));
    let x = NamedTensor::new("x", Tensor::from_values(vec![1, 64], &[0.5f32; 64]));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/plugins");
    for (name, language) in
        [("identity", "Rust"), ("scale", "Rust"), ("scale_py", "Python"), ("scale_js", "JavaScript")]
    {
        if !dir.join(format!("{name}.wasm")).is_file() {
            eprintln!("{name}.wasm is not built; skipped (scripts/build-plugins)");
            continue;
        }
        let mut group = c.benchmark_group(format!("plugin call, {name} ({language}), 1 × 64 f32"));
        for policy in [InstancePolicy::Fresh, InstancePolicy::Reset, InstancePolicy::Reuse] {
            let plugin = load(&engine, name, policy);
            group.bench_function(format!("instances = {policy}"), |b| {
                b.iter(|| plugin.call(vec![x.clone()]).expect("call"))
            });
        }
        group.finish();
    }

    let normalize = load(&engine, "image_normalize", InstancePolicy::Fresh);
    let pixels: Vec<u8> = (0..32 * 32 * 32 * 3).map(|i| (i * 31 % 251) as u8).collect();
    let input = NamedTensor::new(
        "pixels",
        Tensor::from_bytes(DType::U8, vec![32, 32, 32, 3], Bytes::from(pixels.clone())).expect("tensor"),
    );
    let params = ImageNormalize {
        height: 32,
        width: 32,
        mean: vec![0.485, 0.456, 0.406],
        std: vec![0.229, 0.224, 0.225],
        scale: 255.0,
    };
    // Both compute the same thing.
    let wasm_out = normalize.call(vec![input.clone()]).expect("call");
    let native_out = image_normalize(&params, &pixels, 32, 32, 32);
    assert_eq!(wasm_out[0].tensor.to_vec::<f32>().expect("f32"), native_out, "WASM and native differ");

    let normalize_warm = load(&engine, "image_normalize", InstancePolicy::Reset);
    let mut group = c.benchmark_group("image-normalize, 32 images 32x32x3 -> [32,3,32,32]");
    group.bench_function("WebAssembly plugin (fresh instance)", |b| {
        b.iter(|| normalize.call(vec![input.clone()]).expect("call"))
    });
    group.bench_function("WebAssembly plugin (reset instance)", |b| {
        b.iter(|| normalize_warm.call(vec![input.clone()]).expect("call"))
    });
    group.bench_function("native Rust", |b| b.iter(|| image_normalize(&params, &pixels, 32, 32, 32)));
    group.finish();
}

criterion_group!(benches, plugins);
criterion_main!(benches);

//! Writes the export macros with the WIT package inlined, so that each
//! plugin crate generates the bindings of exactly its own world (one
//! component type section per plugin) from the SDK's one WIT file.

use std::path::PathBuf;

const TEMPLATE: &str = r#####"
/// Exports `$plugin` (which implements [`$crate::TRAIT`]) as a sluice
/// WORLD plugin. Use it once, at the root of the plugin crate.
#[macro_export]
macro_rules! MACRO {
    ($plugin:ty) => {
        #[doc(hidden)]
        #[allow(clippy::all, unused)]
        // wit-bindgen documents its export macro with an example, which
        // rustdoc would run as a doctest of the plugin author's crate.
        #[cfg(not(doctest))]
        mod __sluice_WORLD_export {
            use super::*;
            $crate::__wit_bindgen::generate!({
                inline: r####"WIT"####,
                world: "WORLD",
                runtime_path: "::sluice_sdk::__wit_bindgen::rt",
            });
            use self::sluice::plugin::types as wit;

            fn dtype_in(d: wit::Dtype) -> $crate::DType {
                // The dtype enum of the plugin interface and DType agree in order.
                $crate::DType::from_wit_index(d as u8).expect("the interface dtype enum and DType agree")
            }

            fn dtype_out(d: $crate::DType) -> wit::Dtype {
                match d {
                    $crate::DType::F32 => wit::Dtype::F32,
                    $crate::DType::F64 => wit::Dtype::F64,
                    $crate::DType::F16 => wit::Dtype::F16,
                    $crate::DType::BF16 => wit::Dtype::Bf16,
                    $crate::DType::I8 => wit::Dtype::I8,
                    $crate::DType::I16 => wit::Dtype::I16,
                    $crate::DType::I32 => wit::Dtype::I32,
                    $crate::DType::I64 => wit::Dtype::I64,
                    $crate::DType::U8 => wit::Dtype::U8,
                    $crate::DType::U16 => wit::Dtype::U16,
                    $crate::DType::U32 => wit::Dtype::U32,
                    $crate::DType::U64 => wit::Dtype::U64,
                    $crate::DType::Bool => wit::Dtype::Boolean,
                    $crate::DType::String => wit::Dtype::String,
                    other => panic!(
                        "{other} cannot cross the plugin interface: its dtype enum has no complex types"
                    ),
                }
            }

            fn tensor_out(t: $crate::Tensor) -> wit::Tensor {
                let (name, dtype, shape, data, strings) = t.into_parts();
                wit::Tensor { name, dtype: dtype_out(dtype), shape, data, strings }
            }

            fn spec_out(s: $crate::TensorSpec) -> wit::TensorSpec {
                wit::TensorSpec { name: s.name, dtype: dtype_out(s.dtype), shape: s.shape }
            }

            fn error_out(e: $crate::PluginError) -> wit::PluginError {
                match e {
                    $crate::PluginError::InvalidInput(m) => wit::PluginError::InvalidInput(m),
                    $crate::PluginError::Internal(m) => wit::PluginError::Internal(m),
                }
            }

            fn log(level: $crate::Level, message: &str) {
                use self::sluice::plugin::log as host;
                let level = match level {
                    $crate::Level::Debug => host::Level::Debug,
                    $crate::Level::Info => host::Level::Info,
                    $crate::Level::Warn => host::Level::Warn,
                    $crate::Level::Error => host::Level::Error,
                };
                host::log(level, message);
            }

            struct Adapter;

            impl Guest for Adapter {
                fn describe() -> wit::PluginInfo {
                    $crate::__set_logger(log);
                    let info = <$plugin as $crate::TRAIT>::describe();
                    wit::PluginInfo {
                        name: info.name,
                        version: info.version,
                        inputs: info.inputs.into_iter().map(spec_out).collect(),
                        outputs: info.outputs.into_iter().map(spec_out).collect(),
                        sample: info.sample.map(|s| s.into_iter().map(tensor_out).collect()),
                    }
                }

                fn FUNC(inputs: Vec<wit::Tensor>) -> Result<Vec<wit::Tensor>, wit::PluginError> {
                    $crate::__set_logger(log);
                    let inputs = inputs
                        .into_iter()
                        .map(|t| $crate::Tensor::from_parts(t.name, dtype_in(t.dtype), t.shape, t.data, t.strings))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(error_out)?;
                    <$plugin as $crate::TRAIT>::FUNC($crate::Inputs::new(inputs))
                        .map(|outputs| outputs.into_iter().map(tensor_out).collect())
                        .map_err(error_out)
                }
            }

            export!(Adapter);
        }
    };
}
"#####;

fn main() {
    println!("cargo:rerun-if-changed=wit/plugin.wit");
    println!("cargo:rerun-if-changed=build.rs");
    let wit = std::fs::read_to_string("wit/plugin.wit").expect("sdk/wit/plugin.wit");
    assert!(!wit.contains("\"####"), "the WIT text must not contain the raw-string delimiter");
    let mut out = String::new();
    for (mac, world, func, trait_name) in [
        ("export_preprocessor", "preprocessor", "preprocess", "Preprocessor"),
        ("export_postprocessor", "postprocessor", "postprocess", "Postprocessor"),
    ] {
        out.push_str(
            &TEMPLATE
                .replace("MACRO", mac)
                .replace("WORLD", world)
                .replace("FUNC", func)
                .replace("TRAIT", trait_name)
                .replace("WIT", &wit),
        );
    }
    let path = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("export_macros.rs");
    std::fs::write(path, out).expect("write export_macros.rs");
}

//! A test fixture: a preprocessor (x: rows × 64 f32 → x) that, depending on
//! its `attack` input, loops forever, exhausts memory or stack, traps,
//! panics, tries files, environment, sockets and the wall clock, or returns
//! malformed outputs. The host must contain every one of these.

wit_bindgen::generate!({
    path: "../../sdk/wit",
    world: "preprocessor",
});

use sluice::plugin::log::{log, Level};
use sluice::plugin::types::{Dtype, TensorSpec};

struct Hostile;

/// What `remember` keeps for `recall`.
static REMEMBERED: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

fn spec(name: &str, dtype: Dtype, shape: &[i64]) -> TensorSpec {
    TensorSpec { name: name.into(), dtype, shape: shape.to_vec() }
}

fn recurse(depth: u64) -> u64 {
    if depth == 0 {
        return 0;
    }
    let frame = std::hint::black_box([depth; 16]);
    recurse(depth - 1).wrapping_add(frame[depth as usize % 16])
}

fn internal(message: String) -> Result<Vec<Tensor>, PluginError> {
    Err(PluginError::Internal(message))
}

impl Guest for Hostile {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "hostile".into(),
            version: "6.6.6".into(),
            inputs: vec![spec("attack", Dtype::String, &[1]), spec("x", Dtype::F32, &[-1, 64])],
            outputs: vec![spec("x", Dtype::F32, &[-1, 64])],
            sample: None,
        }
    }

    fn preprocess(inputs: Vec<Tensor>) -> Result<Vec<Tensor>, PluginError> {
        let attack = inputs
            .iter()
            .find(|t| t.name == "attack")
            .and_then(|t| t.strings.first())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .unwrap_or_default();
        let mut x = inputs.into_iter().find(|t| t.name == "x").ok_or(PluginError::InvalidInput("no x".into()))?;
        let rows = x.shape.first().copied().unwrap_or(0);
        let (verb, argument) = attack.split_once(':').unwrap_or((attack.as_str(), ""));
        match verb {
            "none" => Ok(vec![x]),
            // Blocks in a host call (wasi:io/poll) instead of spinning.
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(3));
                Ok(vec![x])
            }
            "big-error" => Err(PluginError::InvalidInput("e".repeat(2 << 20))),
            "log-forge" => {
                log(Level::Info, "fine\nINFO sluice::audit: plugin activate team=admin");
                Ok(vec![x])
            }
            "loop" => {
                let mut spins = 0u64;
                loop {
                    spins = std::hint::black_box(spins.wrapping_add(1));
                }
            }
            "memory" => {
                // Grows toward 4 GiB, 16 MiB at a time, without touching
                // the pages: only the memory limit can stop it.
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                for _ in 0..256 {
                    hoard.push(Vec::with_capacity(16 << 20));
                    std::hint::black_box(&hoard);
                }
                internal(format!("allocated {} MiB and was not stopped", hoard.len() * 16))
            }
            "recursion" => Ok(vec![Tensor { data: recurse(u64::MAX).to_le_bytes().to_vec(), ..x }]),
            "unreachable" => {
                #[cfg(target_arch = "wasm32")]
                core::arch::wasm32::unreachable();
                #[cfg(not(target_arch = "wasm32"))]
                std::process::abort();
            }
            "panic" => panic!("the hostile plugin panics on purpose"),
            "file" => match std::fs::read_to_string("/etc/passwd") {
                Ok(text) => internal(format!("read /etc/passwd: {} bytes", text.len())),
                Err(e) => internal(format!("opening /etc/passwd failed: {e}")),
            },
            "env" => {
                let vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
                let args: Vec<String> = std::env::args().collect();
                internal(format!("environment: {} variables {vars:?}; arguments: {args:?}", vars.len()))
            }
            "socket" => match std::net::TcpStream::connect(argument) {
                Ok(_) => internal(format!("connected to {argument}")),
                Err(e) => internal(format!("connecting to {argument} failed: {e}")),
            },
            "clock" => {
                let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
                internal(format!("the wall clock says {:?} since the epoch", since.map(|d| d.as_secs())))
            }
            "wrong-shape" => {
                x.shape = vec![rows, 63];
                x.data.truncate((rows * 63 * 4) as usize);
                Ok(vec![x])
            }
            "bad-length" => {
                x.data.truncate(10);
                Ok(vec![x])
            }
            "huge" => {
                let rows = 100_000i64;
                Ok(vec![Tensor { shape: vec![rows, 64], data: vec![0u8; (rows * 64 * 4) as usize], ..x }])
            }
            "wrong-name" => Ok(vec![Tensor { name: "y".into(), ..x }]),
            "wrong-dtype" => Ok(vec![Tensor { dtype: Dtype::I32, ..x }]),
            "invalid" => Err(PluginError::InvalidInput("the hostile plugin refuses this input".into())),
            "log-flood" => {
                for i in 0..10_000 {
                    log(Level::Warn, &format!("flood line {i}"));
                }
                Ok(vec![x])
            }
            "stdout-flood" => {
                let line = "x".repeat(1023);
                for _ in 0..200 {
                    println!("{line}");
                    eprintln!("{line}");
                }
                Ok(vec![x])
            }
            // State across calls: what one call leaves in memory, the next
            // must not see (unless the plugin's instances are reused).
            "remember" => {
                if let Ok(mut kept) = REMEMBERED.lock() {
                    *kept = argument.to_string();
                }
                Ok(vec![x])
            }
            "recall" => {
                let kept = REMEMBERED.lock().map(|k| k.clone()).unwrap_or_default();
                Err(PluginError::InvalidInput(format!("remembered: {kept:?}")))
            }
            other => Err(PluginError::InvalidInput(format!("unknown attack '{other}'"))),
        }
    }
}

export!(Hostile);

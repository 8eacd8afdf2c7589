//! What a request costs each backend in CPU: the process's CPU time
//! (every thread: the backend's inference and pool threads included)
//! over back-to-back runs of one request, alone and 32 at a time, with
//! nothing else running in the process.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::infer::{Backend, Batch};
use crate::tensor::Tensor;

/// The batch sizes measured.
pub const BATCH_SIZES: [usize; 2] = [1, 32];

/// The CPU one request cost at one batch size.
#[derive(Debug, Clone, Serialize)]
pub struct Cost {
    /// Requests per run.
    pub batch: usize,
    /// CPU microseconds per request.
    pub cpu_us_per_request: f64,
    /// Wall-clock microseconds per request.
    pub wall_us_per_request: f64,
    /// Runs measured.
    pub runs: usize,
}

/// CPU seconds this process has used, every thread together.
fn process_cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointer it is given,
    // which points at one; RUSAGE_SELF needs nothing else.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return 0.0;
        }
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Runs `request` through `backend` `batch` at a time (joined along
/// dimension 0, as the batcher joins clients' requests) for about
/// `budget` after a few unmeasured runs, and answers what each request
/// cost.
pub async fn measure(backend: &dyn Backend, request: &[Tensor], batch: usize, budget: Duration) -> Result<Cost> {
    let rows = request.first().map_or(1, Tensor::rows);
    let make = || Batch {
        requests: vec![request.to_vec(); batch],
        padded_rows: if batch == 1 { 0 } else { rows * batch },
        deadline: None,
        high_priority: false,
    };
    for _ in 0..3 {
        backend.run(make()).await.map_err(|e| e.context(format_args!("a run of {batch} requests failed")))?;
    }
    let (started, cpu_before) = (Instant::now(), process_cpu_seconds());
    let mut runs = 0;
    // At least 20 runs, so a cheap model's figure is not one clock tick.
    while runs < 20 || started.elapsed() < budget {
        backend.run(make()).await?;
        runs += 1;
        if runs >= 1_000_000 {
            break;
        }
    }
    let (wall, cpu) = (started.elapsed().as_secs_f64(), process_cpu_seconds() - cpu_before);
    let requests = (runs * batch) as f64;
    if requests == 0.0 {
        return Err(Error::internal("no run was measured"));
    }
    Ok(Cost { batch, cpu_us_per_request: cpu * 1e6 / requests, wall_us_per_request: wall * 1e6 / requests, runs })
}

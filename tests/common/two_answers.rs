//! Load that tells two answers apart: clients sending the same Predict
//! request to a pipeline over and over while a test swaps what serves it,
//! each answer counted as the first known answer, the second, neither, or
//! a failure. The plugin hot-swap tests share it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::{eventually, f32_content, f32_values, predict_request, Server};

/// What the clients saw, summed over them.
#[derive(Debug, Default)]
pub struct Seen {
    /// Answers equal to the first known answer, and to the second.
    pub answers: [usize; 2],
    /// Answers equal to neither.
    pub neither: usize,
    /// Requests that failed.
    pub failures: Vec<tonic::Status>,
}

/// Clients loading a pipeline until [`TwoAnswerLoad::stop`].
pub struct TwoAnswerLoad {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    clients: Vec<tokio::task::JoinHandle<Seen>>,
}

impl TwoAnswerLoad {
    /// `clients` connections, each sending `x` (one row of 64) to
    /// `pipeline` and comparing its `logits` with `known`.
    pub async fn start(
        server: &Server,
        pipeline: &str,
        x: &[f32],
        known: [Vec<f32>; 2],
        clients: usize,
    ) -> TwoAnswerLoad {
        let (stop, answered) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let known = Arc::new(known);
        let mut tasks = Vec::with_capacity(clients);
        for _ in 0..clients {
            let mut client = server.predict_client().await;
            let (stop, answered, known) = (stop.clone(), answered.clone(), known.clone());
            let (pipeline, x) = (pipeline.to_string(), x.to_vec());
            tasks.push(tokio::spawn(async move {
                let mut seen = Seen::default();
                while !stop.load(Ordering::Relaxed) {
                    let request = predict_request(&pipeline, vec![("x", f32_content(&[1, 64], &x))]);
                    let result = client.predict(request).await;
                    answered.fetch_add(1, Ordering::Relaxed);
                    match result {
                        Ok(response) => {
                            let got = f32_values(&response.into_inner().outputs["logits"]);
                            match known.iter().position(|answer| *answer == got) {
                                Some(i) => seen.answers[i] += 1,
                                None => seen.neither += 1,
                            }
                        }
                        Err(status) => seen.failures.push(status),
                    }
                }
                seen
            }));
        }
        TwoAnswerLoad { stop, answered, clients: tasks }
    }

    /// Waits until the clients have `n` answers (so every one is sending).
    pub async fn wait_for(&self, n: usize) {
        eventually(&format!("{n} answers"), || {
            let got = self.answered.load(Ordering::Relaxed);
            (got >= n).then_some(()).ok_or(format!("{got} answers so far"))
        })
        .await;
    }

    /// Stops the clients and sums what they saw.
    pub async fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = Seen::default();
        for client in self.clients {
            let seen = client.await.expect("client task");
            total.answers[0] += seen.answers[0];
            total.answers[1] += seen.answers[1];
            total.neither += seen.neither;
            total.failures.extend(seen.failures);
        }
        total
    }
}

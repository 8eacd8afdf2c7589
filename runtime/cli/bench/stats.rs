//! Latency and outcome accounting for the load generator: an HDR histogram
//! of latencies in microseconds, and outcomes by gRPC code.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The canonical name of a gRPC code, as errors are counted.
pub fn code_name(code: tonic::Code) -> &'static str {
    crate::error::Code::name_of_grpc(code)
}

/// Latencies and outcomes of a set of requests.
#[derive(Clone)]
pub struct Recorder {
    latency: Histogram<u64>,
    /// How long failed requests took to fail: a refusal should be fast.
    error_latency: Histogram<u64>,
    ok: u64,
    rows: u64,
    errors: BTreeMap<String, u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            // 1 µs to 10 min, 3 significant digits.
            latency: Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds"),
            error_latency: Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds"),
            ok: 0,
            rows: 0,
            errors: BTreeMap::new(),
        }
    }
}

impl Recorder {
    /// A successful request of `rows` rows that took `latency`.
    pub fn ok(&mut self, latency: Duration, rows: u64) {
        self.latency.saturating_record(latency.as_micros().max(1) as u64);
        self.ok += 1;
        self.rows += rows;
    }

    /// A failed request, by gRPC code name, that took `latency` to fail.
    pub fn error(&mut self, code: &str, latency: Duration) {
        self.error_latency.saturating_record(latency.as_micros().max(1) as u64);
        *self.errors.entry(code.to_string()).or_insert(0) += 1;
    }

    /// Adds another recorder's counts.
    pub fn merge(&mut self, other: &Recorder) {
        let _ = self.latency.add(&other.latency);
        let _ = self.error_latency.add(&other.error_latency);
        self.ok += other.ok;
        self.rows += other.rows;
        for (code, n) in &other.errors {
            *self.errors.entry(code.clone()).or_insert(0) += n;
        }
    }

    /// Requests, successful or not.
    pub fn requests(&self) -> u64 {
        self.ok + self.errors.values().sum::<u64>()
    }

    /// The summary over `elapsed`.
    pub fn summary(&self, elapsed: Duration) -> Summary {
        let ms = |q: f64| self.latency.value_at_quantile(q) as f64 / 1000.0;
        let seconds = elapsed.as_secs_f64().max(1e-9);
        let requests = self.requests();
        Summary {
            requests,
            ok: self.ok,
            errors: self.errors.clone(),
            error_rate: if requests == 0 { 0.0 } else { (requests - self.ok) as f64 / requests as f64 },
            seconds,
            requests_per_second: self.ok as f64 / seconds,
            rows_per_second: self.rows as f64 / seconds,
            p50_ms: ms(0.5),
            p90_ms: ms(0.9),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: self.latency.max() as f64 / 1000.0,
            mean_ms: self.latency.mean() / 1000.0,
            error_p50_ms: self.error_latency.value_at_quantile(0.5) as f64 / 1000.0,
            error_p99_ms: self.error_latency.value_at_quantile(0.99) as f64 / 1000.0,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Requests sent and finished.
    pub requests: u64,
    /// Requests answered OK.
    pub ok: u64,
    /// Failed requests by gRPC code.
    pub errors: BTreeMap<String, u64>,
    /// Failed / all.
    pub error_rate: f64,
    /// Measured time.
    pub seconds: f64,
    /// Successful requests per second.
    pub requests_per_second: f64,
    /// Rows of successful requests per second.
    pub rows_per_second: f64,
    /// Latency percentiles of successful requests, in milliseconds.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Slowest.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
    /// Median time a failed request took to fail.
    pub error_p50_ms: f64,
    /// 99th percentile of the time failed requests took to fail.
    pub error_p99_ms: f64,
}

impl Summary {
    /// The human-readable form.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{} requests in {:.1} s: {:.1} req/s, {:.1} rows/s\nlatency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}  mean {:.3}\n",
            self.requests,
            self.seconds,
            self.requests_per_second,
            self.rows_per_second,
            self.p50_ms,
            self.p90_ms,
            self.p99_ms,
            self.p999_ms,
            self.max_ms,
            self.mean_ms
        );
        if self.errors.is_empty() {
            out.push_str("errors: none\n");
        } else {
            let list: Vec<String> = self.errors.iter().map(|(code, n)| format!("{code} {n}")).collect();
            out.push_str(&format!(
                "errors ({:.2}%): {}; answered in p50 {:.3} ms, p99 {:.3} ms\n",
                self.error_rate * 100.0,
                list.join(", "),
                self.error_p50_ms,
                self.error_p99_ms
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_and_percentiles() {
        let mut r = Recorder::default();
        for ms in 1..=100u64 {
            r.ok(Duration::from_millis(ms), 2);
        }
        r.error("RESOURCE_EXHAUSTED", Duration::from_micros(300));
        let s = r.summary(Duration::from_secs(2));
        assert_eq!(s.requests, 101);
        assert_eq!(s.ok, 100);
        assert!((s.requests_per_second - 50.0).abs() < 1e-9);
        assert!((s.rows_per_second - 100.0).abs() < 1e-9);
        assert!((s.p50_ms - 50.0).abs() < 0.1, "{}", s.p50_ms);
        assert!((s.p99_ms - 99.0).abs() < 0.1, "{}", s.p99_ms);
        assert_eq!(s.errors["RESOURCE_EXHAUSTED"], 1);
        assert!(s.text().contains("RESOURCE_EXHAUSTED 1"));
        assert!((s.error_p99_ms - 0.3).abs() < 0.01, "{}", s.error_p99_ms);
    }
}

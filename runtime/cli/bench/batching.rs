//! What the server's auto batcher chose during a bench run, read from its
//! `/metrics` at the end: the batch size it waits for, the largest within
//! its latency target, its last wait, the arrival rate it measured, and the
//! latency curve it learned, per model version.

use std::collections::BTreeMap;

use super::client::RestClient;

/// The auto batcher's state for one model version.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct AutoBatching {
    /// `model/version`.
    pub version: String,
    /// Rows a batch waits for.
    pub want_rows: f64,
    /// The largest batch within the latency target.
    pub cap_rows: f64,
    /// The last planned wait, in milliseconds.
    pub wait_ms: f64,
    /// Rows arriving per second.
    pub arrival_rows_per_second: f64,
    /// Learned milliseconds per batch, by batch size.
    pub curve_ms: BTreeMap<usize, f64>,
}

/// Fetches `metrics_url` (`http://host:port/metrics`) and returns the auto
/// batchers of `model`.
pub async fn fetch(metrics_url: &str, model: &str) -> anyhow::Result<Vec<AutoBatching>> {
    let rest = metrics_url.strip_prefix("http://").unwrap_or(metrics_url);
    let (authority, path) = rest.split_once('/').map_or((rest, "/metrics".to_string()), |(a, p)| (a, format!("/{p}")));
    let mut client = RestClient::new(authority)?;
    let response = client.call(http::Method::GET, &path, &[], bytes::Bytes::new()).await?;
    if !response.status.is_success() {
        anyhow::bail!("{metrics_url} answered {}: {}", response.status, response.text());
    }
    Ok(parse(&response.text(), model))
}

/// The auto batchers of `model` in a Prometheus exposition.
pub fn parse(exposition: &str, model: &str) -> Vec<AutoBatching> {
    let mut found: BTreeMap<String, AutoBatching> = BTreeMap::new();
    for line in exposition.lines().filter(|l| l.starts_with("sluice_batch_")) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let Some((name, labels)) = series.split_once('{') else { continue };
        let label = |key: &str| {
            let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
            labels[start..].split('"').next()
        };
        if label("model") != Some(model) {
            continue;
        }
        let Some(version) = label("version") else { continue };
        let entry = found
            .entry(version.to_string())
            .or_insert_with(|| AutoBatching { version: format!("{model}/{version}"), ..AutoBatching::default() });
        match name {
            "sluice_batch_auto_want_rows" => entry.want_rows = value,
            "sluice_batch_auto_cap_rows" => entry.cap_rows = value,
            "sluice_batch_auto_wait_seconds" => entry.wait_ms = value * 1e3,
            "sluice_batch_arrival_rows_per_second" => entry.arrival_rows_per_second = value,
            "sluice_batch_latency_estimate_seconds" => {
                if let Some(size) = label("batch_size").and_then(|s| s.parse().ok()) {
                    entry.curve_ms.insert(size, value * 1e3);
                }
            }
            _ => {}
        }
    }
    // Only versions batched in auto mode export a cap.
    found.into_values().filter(|b| b.cap_rows > 0.0).collect()
}

/// A few lines for the end of a run.
pub fn text(batchers: &[AutoBatching]) -> String {
    let mut out = String::new();
    for b in batchers {
        let curve: Vec<String> = b.curve_ms.iter().map(|(n, ms)| format!("{n}: {ms:.3}")).collect();
        out.push_str(&format!(
            "auto batching of {}: waits for {} rows (at most {} within the target), last wait {:.3} ms, \
             arrivals {:.0} rows/s\n  learned ms per batch by size: {}\n",
            b.version,
            b.want_rows,
            b.cap_rows,
            b.wait_ms,
            b.arrival_rows_per_second,
            curve.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_batchers_of_one_model() {
        let exposition = "\
sluice_batch_auto_want_rows{model=\"cnn\",version=\"2\"} 12
sluice_batch_auto_cap_rows{model=\"cnn\",version=\"2\"} 32
sluice_batch_auto_wait_seconds{model=\"cnn\",version=\"2\"} 0.0005
sluice_batch_arrival_rows_per_second{model=\"cnn\",version=\"2\"} 4100.5
sluice_batch_latency_estimate_seconds{model=\"cnn\",version=\"2\",batch_size=\"1\"} 0.0004
sluice_batch_latency_estimate_seconds{model=\"cnn\",version=\"2\",batch_size=\"32\"} 0.003
sluice_batch_auto_cap_rows{model=\"mlp\",version=\"1\"} 64
sluice_batch_rows_count{model=\"cnn\",version=\"2\"} 10
";
        let found = parse(exposition, "cnn");
        assert_eq!(found.len(), 1);
        let b = &found[0];
        assert_eq!((b.version.as_str(), b.want_rows, b.cap_rows), ("cnn/2", 12.0, 32.0));
        assert!((b.wait_ms - 0.5).abs() < 1e-9);
        assert_eq!(b.curve_ms.keys().copied().collect::<Vec<_>>(), vec![1, 32]);
        assert!(text(&found).contains("waits for 12 rows (at most 32"));
        assert!(parse(exposition, "other").is_empty());
    }
}

//! The Grafana dashboard in deploy/grafana/ against what the real server
//! exports: every query names a metric a scrape of sluice serving the
//! example pipelines shows (sluice's own names and TF Serving's), and
//! every label a query groups or filters by is one of that metric's labels.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use sluice::proto::tensorflow::serving::PredictRequest;

const DASHBOARD: &str = "deploy/grafana/sluice.json";

/// What a scrape shows: the families with their kinds, and the label keys
/// of each sample name.
struct Exported {
    kinds: BTreeMap<String, String>,
    labels: BTreeMap<String, BTreeSet<String>>,
}

impl Exported {
    fn parse(text: &str) -> Exported {
        let mut kinds = BTreeMap::new();
        let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    kinds.insert(name.to_string(), kind.to_string());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let keys = labels.entry(line[..name_end].to_string()).or_default();
            if let Some(inside) =
                line.get(name_end..).and_then(|r| r.strip_prefix('{')).and_then(|r| r.split('}').next())
            {
                for pair in inside.split("\",") {
                    if let Some((key, _)) = pair.split_once('=') {
                        keys.insert(key.trim().to_string());
                    }
                }
            }
        }
        Exported { kinds, labels }
    }

    /// Whether `name` is a sample name the server exports: seen in the
    /// scrape, or implied by a family's kind (a counter's `_total`, a
    /// histogram's `_bucket`, `_sum`, `_count`).
    fn exports(&self, name: &str) -> bool {
        if self.labels.contains_key(name) {
            return true;
        }
        let family_of = |suffixes: &[&str], kind: &str| {
            suffixes
                .iter()
                .any(|s| name.strip_suffix(s).is_some_and(|family| self.kinds.get(family).is_some_and(|k| k == kind)))
        };
        family_of(&["_total"], "counter")
            || family_of(&["_bucket", "_sum", "_count"], "histogram")
            || self.kinds.get(name).is_some_and(|k| k == "gauge")
    }
}

/// The metric names in a PromQL expression: sluice's and TF Serving's.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &expr[i..];
        let start = if rest.starts_with("sluice_") || rest.starts_with(":tensorflow:") {
            let before = if i == 0 { b' ' } else { bytes[i - 1] };
            !(before.is_ascii_alphanumeric() || before == b'_' || before == b':')
        } else {
            false
        };
        if start {
            let len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
            names.push(rest[..len].to_string());
            i += len;
        } else {
            i += 1;
        }
    }
    names
}

/// The labels an expression groups by (`by (…)`) or matches on (`{…}`).
fn label_names(expr: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    for part in expr.split("by (").skip(1) {
        for label in part.split(')').next().unwrap_or("").split(',') {
            labels.insert(label.trim().to_string());
        }
    }
    for part in expr.split('{').skip(1) {
        for matcher in part.split('}').next().unwrap_or("").split(',') {
            if let Some(end) = matcher.find(['=', '!']) {
                labels.insert(matcher[..end].trim().to_string());
            }
        }
    }
    labels.retain(|l| !l.is_empty() && l != "le");
    labels
}

/// Every PromQL string in the dashboard: panel targets and variables.
fn queries(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    ("expr" | "definition", serde_json::Value::String(q)) => out.push(q.clone()),
                    _ => queries(inner, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| queries(i, out)),
        _ => {}
    }
}

fn rest(pipeline: &str, body: &str) -> (String, String) {
    (format!("/v1/models/{pipeline}:predict"), body.to_string())
}

#[tokio::test]
async fn every_dashboard_query_names_an_exported_metric_and_its_labels() {
    let server = Server::start(&["--model_config_file", "examples/sluice.toml"]);
    // Traffic through a plain model, a pipeline with feature fetch and a
    // plugin, and a refusal, so that the labelled series exist.
    let mut client = server.predict_client().await;
    let request: PredictRequest = predict_request("mlp", vec![("x", f32_content(&[2, 64], &values(1, 128)))]);
    client.predict(request).await.expect("mlp");
    let x: Vec<String> = values(2, 64).iter().map(f32::to_string).collect();
    for (path, body) in [
        rest("mlp", &format!(r#"{{"instances": [[{}]]}}"#, x.join(","))),
        rest("recommend", r#"{"instances": [{"user_id": "u1", "item_id": "i1"}]}"#),
        rest("nosuch", r#"{"instances": [1]}"#),
    ] {
        let mut http = sluice::cli::bench::client::RestClient::new(&server.http.to_string()).expect("client");
        http.call(http::Method::POST, &path, &[], bytes::Bytes::from(body)).await.expect("REST call");
    }
    let exported = Exported::parse(&http_get(server.http, "/metrics").await);
    assert!(exported.kinds.len() > 20, "a scrape with few families: {:?}", exported.kinds.keys());

    let text = std::fs::read_to_string(root().join(DASHBOARD)).expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut all = Vec::new();
    queries(&dashboard, &mut all);
    assert!(all.len() >= 20, "{DASHBOARD}: only {} queries", all.len());
    let mut used = BTreeSet::new();
    for query in &all {
        let names = metric_names(query);
        assert!(!names.is_empty(), "{DASHBOARD}: a query names no sluice metric: {query}");
        for name in &names {
            assert!(exported.exports(name), "{DASHBOARD}: {name} is not exported by the server (query: {query})");
            used.insert(name.clone());
        }
        let known: BTreeSet<&String> =
            names.iter().filter_map(|n| exported.labels.get(n)).flat_map(|keys| keys.iter()).collect();
        for label in label_names(query) {
            assert!(
                known.contains(&label),
                "{DASHBOARD}: label {label} is on none of {names:?} (they have {known:?}); query: {query}"
            );
        }
    }
    // What the issue asks the board to show, by the metrics that show it.
    for wanted in [
        "sluice_serving_request_count_total",
        "sluice_serving_request_latency_seconds_bucket",
        ":tensorflow:serving:request_count",
        ":tensorflow:serving:request_latency_bucket",
        "sluice_batch_rows_bucket",
        "sluice_queue_wait_seconds_bucket",
        "sluice_stage_seconds_bucket",
        "sluice_plugin_seconds_bucket",
        "sluice_feature_cache_total",
        "sluice_request_log_records_total",
    ] {
        assert!(used.contains(wanted), "{DASHBOARD}: no panel shows {wanted}");
    }
}

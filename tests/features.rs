//! Feature fetch through the real server, with embedded tables and a real
//! `redis-server`: ids in → features → plugin → model → outputs equal to
//! the same pipeline computed here; keys of both dtypes and both shapes,
//! duplicates, misses with and without defaults, bad keys, malformed
//! stored values; a table file replaced while requests flow; Redis killed
//! under load and restarted.
//!
//! The probe pipelines run the `anyrank` fixture (y = x + 1) on the
//! fetched tensor, so every fetched value can be checked exactly: table
//! `ints` holds, for key k in 1..=50, the values [k, 10k, generation].

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::fixtures::{example_model_table, EXAMPLE_FEATURE_TABLES, RECOMMEND_PIPELINE};
use common::redis::RedisServer;
use common::*;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use sluice::cli::bench::client::RestClient;
use sluice::proto::tensorflow::serving::PredictRequest;
use sluice::proto::tensorflow::TensorProto;
use tonic::Code;

/// Where the tables are.
enum Store<'a> {
    /// Files: the example tables and `ints.csv` in this directory.
    Embedded(&'a Path),
    /// Redis at this URL (with or without the local cache).
    Redis { url: &'a str, cache: bool, on_error: &'a str },
}

fn plugin_dir() -> String {
    let dir = root().join("target/plugins");
    assert!(
        dir.join("feature_transform.wasm").is_file(),
        "the plugins are not built: run scripts/build-plugins (scripts/test does)"
    );
    dir.display().to_string()
}

/// `ints.csv`: key k in 1..=50 holds [k, 10k, generation].
fn ints_csv(generation: u32) -> String {
    let mut text = String::from("id,v\n");
    for k in 1..=50 {
        text.push_str(&format!("{k},{k} {} {generation}\n", k * 10));
    }
    text
}

fn config(store: &Store<'_>) -> String {
    let tables = match store {
        Store::Embedded(dir) => format!(
            r#"
[features.tables.ints]
file = "{ints}"
key = "id"
reload_interval_ms = 20
features.v = {{ dtype = "float32", shape = [3] }}

{EXAMPLE_FEATURE_TABLES}
"#,
            ints = dir.join("ints.csv").display(),
        ),
        Store::Redis { url, cache, .. } => format!(
            r#"
[features.redis]
url = "{url}"
timeout_ms = 200
cache_entries = {cache}

[features.tables.ints]
store = "redis"
key = "id"
last_seen_entries = 100
features.v = {{ dtype = "float32", shape = [3] }}

[features.tables.users]
store = "redis"
key = "user_id"
features.recent = {{ dtype = "string", shape = [4] }}

[features.tables.items]
store = "redis"
key = "item_id"
features.stats = {{ dtype = "float32", shape = [13] }}

# A graph that runs its fallback step while the store is down.
[[pipelines]]
name = "fallback-graph"
model = "anyrank"
inputs = ["id"]
outputs = ["y"]
[pipelines.feature_fetch]
on_store_error = "defaults"
[[pipelines.feature_fetch.lookups]]
keys = "id"
key_dtype = "int64"
key_shape = [-1, -1]
table = "ints"
features = [{{ feature = "v", tensor = "x", default = [-1.0, -1.0, -1.0] }}]
[[pipelines.steps]]
name = "main"
model = "anyrank"
unless = "feature_fetch.fell_back"
outputs = {{ y = "y" }}
[[pipelines.steps]]
name = "fallback"
model = "anyrank"
when = "feature_fetch.fell_back"
outputs = {{ y = "y" }}
"#,
            cache = if *cache { 10000 } else { 0 }
        ),
    };
    let on_error = match store {
        Store::Redis { on_error, .. } => on_error,
        Store::Embedded(_) => "fail",
    };
    format!(
        r#"
[plugins]
dir = "{plugins}"

{recommender_table}

[[models]]
name = "anyrank"
base_path = "$ROOT/tests/fixtures/models/anyrank"
onnx = {{ sessions = 1, intra_op_threads = 1 }}

{RECOMMEND_PIPELINE}
[[pipelines]]
name = "probe-ints"
model = "anyrank"
[pipelines.feature_fetch]
on_store_error = "{on_error}"
[[pipelines.feature_fetch.lookups]]
keys = "id"
key_dtype = "int64"
key_shape = [-1, -1]
table = "ints"
features = [{{ feature = "v", tensor = "x", default = [-1.0, -1.0, -1.0] }}]

[[pipelines]]
name = "probe-strings"
model = "anyrank"
[pipelines.feature_fetch]
[[pipelines.feature_fetch.lookups]]
keys = "id"
table = "ints"
features = [{{ feature = "v", tensor = "x", default = -1.0 }}]

[[pipelines]]
name = "probe-strict"
model = "anyrank"
[pipelines.feature_fetch]
max_keys = 8
max_key_bytes = 16
[[pipelines.feature_fetch.lookups]]
keys = "id"
key_dtype = "int64"
table = "ints"
features = [{{ feature = "v", tensor = "x" }}]
{tables}"#,
        recommender_table = example_model_table("recommender"),
        plugins = plugin_dir()
    )
}

/// A config file on disk (the loader and the server both read it).
struct ConfigFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn write_config(store: &Store<'_>) -> ConfigFile {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, config(store).replace("$ROOT", &root().display().to_string())).expect("write config");
    ConfigFile { _dir: dir, path }
}

/// Writes the three tables into Redis with `sluice features load`.
fn load_redis(config: &Path, url: &str) {
    let ints = tempfile::tempdir().expect("temp dir");
    std::fs::write(ints.path().join("ints.csv"), ints_csv(1)).expect("write ints.csv");
    let examples = root().join("examples/features");
    for (file, table) in [
        (ints.path().join("ints.csv"), "ints"),
        (examples.join("users.csv"), "users"),
        (examples.join("items.jsonl"), "items"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["features", "load"])
            .arg(&file)
            .arg("--config")
            .arg(config)
            .args(["--table", table, "--redis", url])
            .output()
            .expect("run sluice features load");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "features load {table}: {}", String::from_utf8_lossy(&output.stderr));
        assert!(stdout.contains(&format!("table '{table}'")), "{stdout}");
    }
}

/// A redis-server holding the three tables, and a config that reads them
/// from it (`cache`: the local cache on; `on_error`: on_store_error).
fn loaded_redis(cache: bool, on_error: &str) -> (RedisServer, ConfigFile) {
    let redis = RedisServer::start();
    let config = write_config(&Store::Redis { url: &redis.url(), cache, on_error });
    load_redis(&config.path, &redis.url());
    (redis, config)
}

fn serve(config: &ConfigFile) -> Server {
    Server::start(&["--model_config_file", config.path.to_str().expect("utf-8 path")])
}

fn i64_keys(dims: &[i64], keys: &[i64]) -> TensorProto {
    i64_typed(dims, keys)
}

fn probe(pipeline: &str, keys: TensorProto) -> PredictRequest {
    predict_request(pipeline, vec![("id", keys)])
}

/// What `probe-*` answers for key `k` of generation `generation` (y = x + 1).
/// What `probe-ints` answers for one row of int64 `keys`, the call
/// expected to succeed (`what` says why it should).
async fn ints_row(
    client: &mut sluice::proto::tensorflow::serving::prediction_service_client::PredictionServiceClient<
        tonic::transport::Channel,
    >,
    keys: &[i64],
    what: &str,
) -> Vec<f32> {
    let request = probe("probe-ints", i64_keys(&[1, keys.len() as i64], keys));
    let answer = client.predict(request).await.unwrap_or_else(|e| panic!("{what}: {e:?}"));
    f32_values(&answer.into_inner().outputs["y"])
}

fn expected_row(k: Option<i64>, generation: u32) -> [f32; 3] {
    match k {
        Some(k) if (1..=50).contains(&k) => [k as f32 + 1.0, (k * 10) as f32 + 1.0, generation as f32 + 1.0],
        _ => [0.0, 0.0, 0.0],
    }
}

/// The example tables read here, to compute the recommendation by hand.
struct ExampleTables {
    users: std::collections::HashMap<String, Vec<String>>,
    items: std::collections::HashMap<String, Vec<f32>>,
}

fn example_tables() -> ExampleTables {
    let dir = root().join("examples/features");
    let users = std::fs::read_to_string(dir.join("users.csv"))
        .expect("users.csv")
        .lines()
        .skip(1)
        .map(|line| {
            let (user, recent) = line.split_once(',').expect("two columns");
            (user.to_string(), recent.split_whitespace().map(str::to_string).collect())
        })
        .collect();
    let items = std::fs::read_to_string(dir.join("items.jsonl"))
        .expect("items.jsonl")
        .lines()
        .map(|line| {
            let row: Value = serde_json::from_str(line).expect("json line");
            let stats = row["stats"].as_array().expect("stats").iter().map(|v| v.as_f64().expect("number") as f32);
            (row["item_id"].as_str().expect("item_id").to_string(), stats.collect())
        })
        .collect();
    ExampleTables { users, items }
}

/// The recommender's scores for `user` and each of `items`, by hand.
fn recommend_expected(tables: &ExampleTables, user: &str, items: &[&str]) -> Vec<f32> {
    let raw: Vec<f32> = items.iter().flat_map(|item| tables.items[*item].clone()).collect();
    let recent = tables.users.get(user).cloned().unwrap_or_else(|| vec![String::new(); 4]);
    let users: Vec<String> = items.iter().flat_map(|_| recent.clone()).collect();
    recommend_by_hand(&raw, &users)
}

/// Asks for a recommendation over gRPC and REST; both must equal the
/// computation by hand.
async fn check_recommend(server: &Server, tables: &ExampleTables) {
    let mut client = server.predict_client().await;
    let items = ["i1", "i17", "i333", "i17", "i499"];
    for user in ["u7", "u150", "nobody"] {
        let want = recommend_expected(tables, user, &items);
        let users = vec![user; items.len()];
        let response = client
            .predict(predict_request(
                "recommend",
                vec![("user_id", string_tensor(&[5], &users)), ("item_id", string_tensor(&[5], &items))],
            ))
            .await
            .unwrap_or_else(|e| panic!("recommend for {user}: {e}"))
            .into_inner();
        assert_eq!(dims(&response.outputs["score"]), vec![5, 1]);
        assert_close(&f32_values(&response.outputs["score"]), &want, 1e-5, &format!("gRPC scores for {user}"));
        let mut rest = RestClient::new(&server.http.to_string()).expect("REST client");
        let body = json!({"inputs": {"user_id": users, "item_id": items}}).to_string();
        let answer =
            rest.call(Method::POST, "/v1/models/recommend:predict", &[], Bytes::from(body)).await.expect("REST call");
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
        let json: Value = serde_json::from_slice(&answer.body).expect("JSON");
        let got: Vec<f32> =
            json["outputs"].as_array().expect("rows").iter().map(|r| r[0].as_f64().expect("score") as f32).collect();
        assert_close(&got, &want, 1e-5, &format!("REST scores for {user}"));
    }
}

/// Keys of both dtypes and both shapes, duplicates, misses with defaults.
async fn check_probes(server: &Server) {
    let mut client = server.predict_client().await;
    // int64 keys, [b, n], with duplicates and misses (0, 99, -4).
    let keys = [7i64, 7, 99, 3, 0, 7, 50, -4];
    let response =
        client.predict(probe("probe-ints", i64_keys(&[2, 4], &keys))).await.expect("probe-ints").into_inner();
    assert_eq!(dims(&response.outputs["y"]), vec![2, 4, 3]);
    let want: Vec<f32> = keys.iter().flat_map(|&k| expected_row(Some(k), 1)).collect();
    assert_eq!(f32_values(&response.outputs["y"]), want, "int64 [2, 4] keys");
    // An empty key list per row: [1, 0] keys give a [1, 0, 3] tensor.
    let response = client.predict(probe("probe-ints", i64_keys(&[1, 0], &[]))).await.expect("empty").into_inner();
    assert_eq!(dims(&response.outputs["y"]), vec![1, 0, 3]);
    // No keys at all, for a model that takes no rows as well.
    let response = client.predict(probe("probe-strict", i64_keys(&[0], &[]))).await.expect("no keys").into_inner();
    assert_eq!(dims(&response.outputs["y"]), vec![0, 3]);
    // String keys, [b]: "7" is the same entity as 7.
    let strings = ["7", "12", "nope", "12"];
    let response =
        client.predict(probe("probe-strings", string_tensor(&[4], &strings))).await.expect("strings").into_inner();
    let want: Vec<f32> = strings.iter().flat_map(|s| expected_row(s.parse().ok(), 1)).collect();
    assert_eq!(f32_values(&response.outputs["y"]), want, "string [4] keys");
    // No default: a miss fails with NOT_FOUND naming the key and table.
    let err = client.predict(probe("probe-strict", i64_keys(&[2], &[5, 77]))).await.expect_err("a miss");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    for part in ["table 'ints'", "\"77\"", "'v'", "no default"] {
        assert!(err.message().contains(part), "{part} not in: {}", err.message());
    }
}

#[tokio::test]
async fn embedded_tables_feed_the_pipeline_with_exactly_the_stored_features() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("ints.csv"), ints_csv(1)).expect("ints.csv");
    let config = write_config(&Store::Embedded(dir.path()));
    let server = serve(&config);
    check_recommend(&server, &example_tables()).await;
    check_probes(&server).await;
    assert!(
        server.metric("sluice_feature_keys_total{table=\"ints\",store=\"embedded\",outcome=\"miss\"}").await >= 4.0
    );
}

#[tokio::test]
async fn redis_over_mutual_tls_with_a_password_from_a_file_serves_features_and_never_logs_it() {
    let pki = common::pki::Pki::new();
    let password = "s3cret-redis-pass";
    let redis = RedisServer::start_tls(&pki.arg("server.pem"), &pki.arg("server.key"), &pki.arg("ca.pem"), password);
    let url = format!("rediss://localhost:{}", redis.port);
    let config = write_config(&Store::Redis { url: &url, cache: false, on_error: "fail" });
    let secret = config.path.with_file_name("redis-password");
    std::fs::write(&secret, format!("{password}\n")).expect("password file");
    let text = std::fs::read_to_string(&config.path).expect("config");
    let access = format!(
        "url = \"{url}\"\npassword_file = \"{}\"\ntls = {{ ca_file = \"{}\", cert_file = \"{}\", key_file = \"{}\" }}",
        secret.display(),
        pki.arg("ca.pem"),
        pki.arg("client.pem"),
        pki.arg("client.key")
    );
    std::fs::write(&config.path, text.replacen(&format!("url = \"{url}\""), &access, 1)).expect("config");
    // Loaded and served over TLS with the password from the file.
    load_redis(&config.path, &url);
    let server = serve(&config);
    check_recommend(&server, &example_tables()).await;
    assert!(server.log().iter().all(|line| !line.contains(password)), "the password reached the log");

    // A wrong password: lookups fail naming the store, never the password.
    let wrong = config.path.with_file_name("wrong-password");
    std::fs::write(&wrong, "not-it\n").expect("password file");
    std::fs::write(
        &config.path,
        std::fs::read_to_string(&config.path)
            .expect("config")
            .replace(&secret.display().to_string(), &wrong.display().to_string()),
    )
    .expect("config");
    let refused = serve(&config);
    let mut client = refused.predict_client().await;
    let users = vec!["u7"; 1];
    let err = client
        .predict(predict_request(
            "recommend",
            vec![("user_id", string_tensor(&[1], &users)), ("item_id", string_tensor(&[1], &["i1"]))],
        ))
        .await
        .expect_err("features behind a wrong password");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("Redis feature store rediss://localhost"), "{}", err.message());
    let log = refused.log().join("\n");
    assert!(!log.contains("not-it") && !log.contains(password), "a password reached the log");
}

#[tokio::test]
async fn redis_tables_feed_the_pipeline_with_exactly_the_stored_features_and_duplicates_go_once() {
    let (_redis, config) = loaded_redis(false, "fail");
    let server = serve(&config);
    check_recommend(&server, &example_tables()).await;
    check_probes(&server).await;
    // One request whose keys repeat: each distinct key crosses once.
    let sum = "sluice_feature_round_trip_keys_sum{table=\"ints\",store=\"redis\"}";
    let before = server.metric(sum).await;
    let mut client = server.predict_client().await;
    client.predict(probe("probe-ints", i64_keys(&[1, 6], &[5, 5, 5, 9, 9, 5]))).await.expect("duplicates");
    assert_eq!(server.metric(sum).await - before, 2.0, "distinct keys sent for [5, 5, 5, 9, 9, 5]");
}

#[tokio::test]
async fn concurrent_requests_share_round_trips_and_the_cache_answers_repeats() {
    let (_redis, config) = loaded_redis(true, "fail");
    let server = serve(&config);
    let mut tasks = Vec::new();
    for t in 0..32i64 {
        let mut client = server.predict_client().await;
        tasks.push(tokio::spawn(async move {
            for i in 0..10i64 {
                let keys: Vec<i64> = (0..16).map(|j| 1 + (t * 7 + i * 3 + j) % 50).collect();
                let response = client.predict(probe("probe-ints", i64_keys(&[1, 16], &keys))).await?.into_inner();
                let want: Vec<f32> = keys.iter().flat_map(|&k| expected_row(Some(k), 1)).collect();
                assert_eq!(f32_values(&response.outputs["y"]), want);
            }
            Ok::<_, tonic::Status>(())
        }));
    }
    for task in tasks {
        task.await.expect("join").expect("every request served");
    }
    let lookups = server.metric("sluice_feature_lookups_total{table=\"ints\",store=\"redis\"}").await;
    let trips = server.metric("sluice_feature_round_trips_total{table=\"ints\",store=\"redis\"}").await;
    let hits = server.metric("sluice_feature_cache_total{table=\"ints\",store=\"redis\",outcome=\"hit\"}").await;
    assert_eq!(lookups, 320.0);
    // 50 distinct keys and a 1 s TTL: most keys come from the cache, and
    // what does not shares round trips.
    assert!(trips < lookups, "{trips} round trips for {lookups} lookups");
    assert!(hits > 0.0, "no cache hits");
}

#[tokio::test]
async fn bad_keys_and_bad_stored_values_get_their_codes_and_the_server_keeps_serving() {
    let (redis, config) = loaded_redis(false, "fail");
    // Malformed values: a float32 [3] feature holding 5 bytes, and a key
    // that is not a hash.
    assert_eq!(redis.command(&[b"HSET", b"ints:8", b"v", b"12345"]).as_deref(), Some(":0\r\n"));
    assert_eq!(redis.command(&[b"SET", b"ints:9", b"x"]).as_deref(), Some("+OK\r\n"));
    // A value far larger than its feature can be: refused, never cached.
    assert_eq!(redis.command(&[b"HSET", b"ints:10", b"v", &[7u8; 100_000]]).as_deref(), Some(":0\r\n"));
    let server = serve(&config);
    let mut client = server.predict_client().await;
    let cases: Vec<(&str, PredictRequest, Code, Vec<&str>)> = vec![
        (
            "no rows",
            predict_request(
                "recommend",
                vec![("user_id", string_tensor(&[0], &[])), ("item_id", string_tensor(&[0], &[]))],
            ),
            Code::InvalidArgument,
            vec!["0 rows"],
        ),
        (
            "too many keys",
            probe("probe-strict", i64_keys(&[9], &[1; 9])),
            Code::InvalidArgument,
            vec!["9 keys", "at most 8", "max_keys"],
        ),
        (
            "a key too long",
            probe("probe-strings", string_tensor(&[2], &["1", &"k".repeat(300)])),
            Code::InvalidArgument,
            vec!["key 1 is 300 bytes", "max_key_bytes"],
        ),
        (
            "an empty key",
            probe("probe-strings", string_tensor(&[1], &[""])),
            Code::InvalidArgument,
            vec!["key 0 is 0 bytes"],
        ),
        (
            "float keys",
            probe("probe-strict", f32_content(&[1], &[1.0])),
            Code::InvalidArgument,
            vec!["'id'", "DT_INT64"],
        ),
        ("keys of the wrong rank", probe("probe-strict", i64_keys(&[1, 1], &[1])), Code::InvalidArgument, vec!["'id'"]),
        (
            "a malformed stored value",
            probe("probe-strict", i64_keys(&[2], &[1, 8])),
            Code::FailedPrecondition,
            vec!["key \"8\"", "field 'v'", "5 bytes", "3 × 4 = 12"],
        ),
        (
            "an oversized stored value",
            probe("probe-strict", i64_keys(&[1], &[10])),
            Code::FailedPrecondition,
            vec!["key \"10\"", "field 'v' holds 100000 bytes", "more than the 12"],
        ),
        (
            "a key that is not a hash",
            probe("probe-strict", i64_keys(&[1], &[9])),
            Code::FailedPrecondition,
            vec!["key \"9\"", "WRONGTYPE"],
        ),
    ];
    for (what, request, code, parts) in cases {
        let err = client.predict(request).await.expect_err(what);
        assert_eq!(err.code(), code, "{what}: {err:?}");
        for part in parts {
            assert!(err.message().contains(part), "{what}: {part:?} not in: {}", err.message());
        }
    }
    let response = client.predict(probe("probe-strict", i64_keys(&[2], &[1, 2]))).await.expect("still serving");
    assert_eq!(
        f32_values(&response.into_inner().outputs["y"]),
        [expected_row(Some(1), 1), expected_row(Some(2), 1)].concat()
    );
}

#[tokio::test]
async fn a_table_file_replaced_while_requests_flow_answers_from_the_old_or_the_new_table_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ints = dir.path().join("ints.csv");
    std::fs::write(&ints, ints_csv(1)).expect("ints.csv");
    let config = write_config(&Store::Embedded(dir.path()));
    let server = serve(&config);
    let stop = Arc::new(AtomicBool::new(false));
    let mut flows = Vec::new();
    for t in 0..4i64 {
        let mut client = server.predict_client().await;
        let stop = stop.clone();
        flows.push(tokio::spawn(async move {
            let (mut served, mut generations) = (0u32, std::collections::BTreeSet::new());
            while !stop.load(Ordering::Relaxed) {
                let keys: Vec<i64> = (0..50).map(|j| 1 + (j + t) % 50).collect();
                let response = client
                    .predict(probe("probe-ints", i64_keys(&[5, 10], &keys)))
                    .await
                    .map_err(|e| format!("request {served} failed: {e}"))?
                    .into_inner();
                let y = f32_values(&response.outputs["y"]);
                let generation = y[2] - 1.0;
                let want: Vec<f32> = keys.iter().flat_map(|&k| expected_row(Some(k), generation as u32)).collect();
                if y != want {
                    return Err(format!("a mixed or wrong answer: {y:?}"));
                }
                generations.insert(generation as u32);
                served += 1;
            }
            Ok::<_, String>((served, generations))
        }));
    }
    let reloads = "sluice_feature_reloads_total{table=\"ints\",store=\"embedded\",outcome=\"ok\"}";
    let refused = "sluice_feature_reloads_total{table=\"ints\",store=\"embedded\",outcome=\"refused\"}";
    server.wait_for_metric("sluice_feature_lookups_total{table=\"ints\",store=\"embedded\"}", 20.0).await;
    // Replaced as deploy tools do: a new file renamed over the old one.
    let next = dir.path().join("ints.csv.new");
    std::fs::write(&next, ints_csv(2)).expect("write");
    std::fs::rename(&next, &ints).expect("rename");
    server.wait_for_metric(reloads, 1.0).await;
    // Then in place, as an editor does.
    std::fs::write(&ints, ints_csv(3)).expect("write in place");
    server.wait_for_metric(reloads, 2.0).await;
    // A bad file is refused; the last good table keeps serving.
    std::fs::write(&ints, "id,v\n1,1 2\n").expect("write a bad file");
    server.wait_for_metric(refused, 1.0).await;
    server.wait_for_log("feature table reload refused").await;
    let before = server.metric("sluice_feature_lookups_total{table=\"ints\",store=\"embedded\"}").await;
    server.wait_for_metric("sluice_feature_lookups_total{table=\"ints\",store=\"embedded\"}", before + 20.0).await;
    stop.store(true, Ordering::Relaxed);
    let mut seen = std::collections::BTreeSet::new();
    for flow in flows {
        let (served, generations) = flow.await.expect("join").unwrap_or_else(|e| panic!("{e}"));
        assert!(served > 0);
        seen.extend(generations);
    }
    assert!(seen.contains(&1) && seen.contains(&3), "generations answered: {seen:?}");
    let mut client = server.predict_client().await;
    let y = ints_row(&mut client, &[4], "after").await;
    assert_eq!(y, expected_row(Some(4), 3), "the last good table serves after a bad file");
}

#[tokio::test]
async fn redis_killed_under_load_fails_fast_with_unavailable_and_recovers_without_a_restart() {
    let (mut redis, config) = loaded_redis(false, "fail");
    let url = redis.url();
    let server = serve(&config);
    let deadline = Duration::from_secs(2);
    let stop = Arc::new(AtomicBool::new(false));
    let mut flows = Vec::new();
    for _ in 0..8 {
        let mut client = server.predict_client().await;
        let stop = stop.clone();
        flows.push(tokio::spawn(async move {
            let mut outcomes: Vec<(Result<(), tonic::Status>, Duration)> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let request = with_timeout(probe("probe-ints", i64_keys(&[1, 3], &[1, 2, 3])), deadline);
                let result = client.predict(request).await.map(drop);
                outcomes.push((result, started.elapsed()));
            }
            outcomes
        }));
    }
    let trips = "sluice_feature_round_trips_total{table=\"ints\",store=\"redis\"}";
    server.wait_for_metric(trips, 50.0).await;
    // The outage's log lines are counted from here.
    let _ = server.log();
    redis.kill();
    // A few round trips fail, and Redis is held down: lookups fail at
    // once, and none reaches Redis while it is.
    let down = "sluice_feature_store_down{store=\"redis\"}";
    server.wait_for_metric(down, 1.0).await;
    assert_eq!(server.metric("sluice_feature_store_outages_total{store=\"redis\"}").await, 1.0);
    let trips_when_held = server.metric(trips).await;
    let errors = "sluice_feature_errors_total{table=\"ints\",store=\"redis\"}";
    let errors_when_held = server.metric(errors).await;
    server.wait_for_metric(errors, errors_when_held + 200.0).await;
    assert_eq!(server.metric(down).await, 1.0, "Redis is still dead");
    assert_eq!(server.metric(trips).await, trips_when_held, "a lookup reached Redis while it was held down");
    // Back, empty, then loaded again: lookups recover on their own.
    redis.restart();
    load_redis(&config.path, &url);
    let recovered = Instant::now();
    let mut client = server.predict_client().await;
    loop {
        match client.predict(probe("probe-ints", i64_keys(&[1, 1], &[6]))).await {
            Ok(response) => {
                assert_eq!(f32_values(&response.into_inner().outputs["y"]), expected_row(Some(6), 1));
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{e:?}");
                assert!(recovered.elapsed() < Duration::from_secs(30), "no recovery in 30 s: {e:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert_eq!(server.metric(down).await, 0.0, "a lookup that reached Redis again closed the breaker");
    let (mut ok, mut unavailable) = (0, 0);
    let mut failed_at_once: Vec<Duration> = Vec::new();
    for flow in flows {
        for (result, took) in flow.await.expect("join") {
            assert!(
                took < deadline + Duration::from_millis(500),
                "a request took {took:?} with a {deadline:?} deadline"
            );
            match result {
                Ok(()) => ok += 1,
                Err(e) => {
                    assert_eq!(e.code(), Code::Unavailable, "while Redis was down: {e:?}");
                    assert!(e.message().contains("Redis feature store"), "{}", e.message());
                    if e.message().contains("is down") {
                        failed_at_once.push(took);
                    }
                    unavailable += 1;
                }
            }
        }
    }
    assert!(ok > 0 && unavailable > 0, "ok {ok}, unavailable {unavailable}");
    assert!(failed_at_once.len() >= 200, "{} failed at once while Redis was held down", failed_at_once.len());
    // One line when Redis went down, one when it came back, and the few
    // failed round trips before it was held down (a line a second): not
    // a line per failed request.
    let lines = server.log_through("is back").await;
    assert!(lines.len() < 10, "{} lines logged for one outage: {lines:#?}", lines.len());
    assert!(lines.iter().any(|l| l.contains("is down after") && l.contains("failures in a row")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("is back")), "{lines:#?}");
    assert!(!lines.iter().any(|l| l.contains("request failed")), "{lines:#?}");
    failed_at_once.sort();
    eprintln!(
        "Redis killed under load: {ok} answered, {unavailable} UNAVAILABLE, recovered in {:?}; while held down, \
         {} failed at once, p50 {:?} p99 {:?}; {} log lines",
        recovered.elapsed(),
        failed_at_once.len(),
        failed_at_once[failed_at_once.len() / 2],
        failed_at_once[failed_at_once.len() * 99 / 100],
        lines.len()
    );
}

#[tokio::test]
async fn with_on_store_error_defaults_a_redis_outage_serves_the_defaults() {
    let (mut redis, config) = loaded_redis(false, "defaults");
    let server = serve(&config);
    let mut client = server.predict_client().await;
    let y = ints_row(&mut client, &[4], "up").await;
    assert_eq!(y, expected_row(Some(4), 1));
    redis.kill();
    let y = ints_row(&mut client, &[4, 5], "down").await;
    assert_eq!(y, [expected_row(None, 1), expected_row(None, 1)].concat(), "the defaults while Redis is down");
    // A pipeline that says nothing fails instead.
    let err = client.predict(probe("probe-strict", i64_keys(&[1], &[4]))).await.expect_err("fail policy");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let served = "sluice_feature_fallbacks_total{table=\"ints\",store=\"redis\",outcome=\"defaults\"}";
    assert_eq!(server.metric(served).await, 1.0, "one lookup fell back");
}

#[tokio::test]
async fn a_graph_runs_its_fallback_step_while_the_feature_store_is_down() {
    let (mut redis, config) = loaded_redis(false, "defaults");
    let server = serve(&config);
    let mut client = server.predict_client().await;
    let ran =
        |step: &str| format!("sluice_graph_steps_total{{pipeline=\"fallback-graph\",step=\"{step}\",outcome=\"ran\"}}");
    let call = |keys: &[i64]| probe("fallback-graph", i64_keys(&[1, keys.len() as i64], keys));
    let answer = client.predict(call(&[4])).await.expect("store up");
    assert_eq!(f32_values(&answer.into_inner().outputs["y"]), expected_row(Some(4), 1));
    assert_eq!((server.metric(&ran("main")).await, server.metric(&ran("fallback")).await), (1.0, 0.0));
    redis.kill();
    let answer = client.predict(call(&[4])).await.expect("store down: the fallback answers");
    assert_eq!(
        f32_values(&answer.into_inner().outputs["y"]),
        expected_row(None, 1),
        "the defaults, through the fallback"
    );
    assert_eq!((server.metric(&ran("main")).await, server.metric(&ran("fallback")).await), (1.0, 1.0));
}

#[tokio::test]
async fn with_on_store_error_last_seen_a_redis_outage_serves_what_was_read_last_and_defaults_for_the_rest() {
    let (mut redis, config) = loaded_redis(false, "last_seen");
    let server = serve(&config);
    let mut client = server.predict_client().await;
    let y = ints_row(&mut client, &[4, 7], "up").await;
    assert_eq!(y, [expected_row(Some(4), 1), expected_row(Some(7), 1)].concat());
    // 8 read, then deleted from Redis and read again: gone from what an
    // outage answers too.
    ints_row(&mut client, &[8], "up").await;
    assert_eq!(redis.command(&[b"DEL", b"ints:8"]).as_deref(), Some(":1\r\n"));
    let y = ints_row(&mut client, &[8], "up").await;
    assert_eq!(y, expected_row(None, 1), "deleted: the default");
    redis.kill();
    // 4 and 7 were read before Redis went: their values; 5 never was and 8
    // is deleted: their defaults. The same while Redis is held down and
    // before.
    for _ in 0..20 {
        let y = ints_row(&mut client, &[7, 5, 4, 8], "down").await;
        let want = [expected_row(Some(7), 1), expected_row(None, 1), expected_row(Some(4), 1), expected_row(None, 1)];
        assert_eq!(y, want.concat());
    }
    let served = "sluice_feature_fallbacks_total{table=\"ints\",store=\"redis\",outcome=\"last_seen\"}";
    assert_eq!(server.metric(served).await, 20.0);
    server.wait_for_metric("sluice_feature_store_down{store=\"redis\"}", 1.0).await;
    // A pipeline whose policy is fail still fails, at once.
    let err = client.predict(probe("probe-strict", i64_keys(&[1], &[4]))).await.expect_err("fail policy");
    assert!(err.message().contains("is down"), "{}", err.message());
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
}

#[tokio::test]
async fn a_client_with_a_tiny_deadline_never_fails_the_requests_sharing_its_round_trip() {
    let (_redis, config) = loaded_redis(false, "fail");
    let server = serve(&config);
    let stop = Arc::new(AtomicBool::new(false));
    let mut hurried = Vec::new();
    for _ in 0..4 {
        let mut client = server.predict_client().await;
        let stop = stop.clone();
        hurried.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let request = with_timeout(
                    probe("probe-ints", i64_keys(&[1, 8], &[1, 2, 3, 4, 5, 6, 7, 8])),
                    Duration::from_micros(300),
                );
                let _ = client.predict(request).await;
            }
        }));
    }
    let mut patient = Vec::new();
    for t in 0..4i64 {
        let mut client = server.predict_client().await;
        patient.push(tokio::spawn(async move {
            for i in 0..100i64 {
                let keys: Vec<i64> = (0..8).map(|j| 1 + (t * 13 + i * 7 + j) % 50).collect();
                let request = with_timeout(probe("probe-ints", i64_keys(&[1, 8], &keys)), Duration::from_secs(5));
                let response = client
                    .predict(request)
                    .await
                    .map_err(|e| format!("a request with 5 s to spare failed beside hurried ones: {e}"))?;
                let want: Vec<f32> = keys.iter().flat_map(|&k| expected_row(Some(k), 1)).collect();
                assert_eq!(f32_values(&response.into_inner().outputs["y"]), want);
            }
            Ok::<_, String>(())
        }));
    }
    for task in patient {
        task.await.expect("join").unwrap_or_else(|e| panic!("{e}"));
    }
    stop.store(true, Ordering::Relaxed);
    for task in hurried {
        task.await.expect("join");
    }
}

/// A Redis that silently stops answering (SIGSTOP: connections stay open,
/// nothing comes back) is held down even while every client's deadline is
/// far under `timeout_ms`, so that no trip of theirs says anything about
/// Redis: a PING given the whole `timeout_ms` does. Then lookups fail at
/// once, naming the store; SIGCONT, and they are served again.
#[tokio::test]
async fn a_redis_that_stops_answering_is_held_down_even_when_every_deadline_is_short() {
    struct Continue(u32);
    impl Drop for Continue {
        fn drop(&mut self) {
            // SAFETY: kill(2) on this test's own redis-server.
            unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGCONT) };
        }
    }
    let (redis, config) = loaded_redis(false, "fail");
    let server = serve(&config);
    let mut client = server.predict_client().await;
    let hurried = || with_timeout(probe("probe-ints", i64_keys(&[1, 1], &[3])), Duration::from_millis(30));
    client.predict(hurried()).await.expect("served while Redis answers");
    let pid = redis.pid().expect("redis-server runs");
    // SAFETY: kill(2) on this test's own redis-server.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) }, 0);
    let stopped = Continue(pid);
    let down = "sluice_feature_store_down{store=\"redis\"}";
    let started = Instant::now();
    while server.metric(down).await < 1.0 {
        let err = client.predict(hurried()).await.expect_err("Redis is stopped");
        // Cancelled: the client's own timer, racing the server's answer.
        assert!(matches!(err.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(30), "Redis was never held down");
    }
    let err = client.predict(hurried()).await.expect_err("held down");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("is down") && err.message().contains("PING"), "{}", err.message());
    drop(stopped);
    let back = Instant::now();
    loop {
        match client.predict(hurried()).await {
            Ok(answer) => {
                assert_eq!(f32_values(&answer.into_inner().outputs["y"]), expected_row(Some(3), 1));
                break;
            }
            Err(e) => assert!(back.elapsed() < Duration::from_secs(30), "no recovery in 30 s: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

//! Opening an object store from a base-path URL, with the credentials the
//! clouds and TF Serving's users set today: the AWS environment (keys,
//! `AWS_REGION`, web-identity tokens for IRSA, container and instance
//! credentials) and TF Serving's own `S3_ENDPOINT`, `S3_USE_HTTPS` and
//! `S3_VERIFY_SSL`; GCP application default credentials (a service-account
//! file, `gcloud`'s, the metadata server of workload identity),
//! `STORAGE_EMULATOR_HOST` and object_store's `GOOGLE_*` variables (such as
//! `GOOGLE_BASE_URL`); Azure's `AZURE_STORAGE_*` keys, service
//! principals, workload and managed identity, and Azurite. Nothing here
//! logs or returns a secret: errors pass through [`redact`].

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};

use crate::error::{Error, Result};

/// An opened store and the prefix a model's versions are under.
pub struct Opened {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: ObjectPath,
}

/// Opens the store `url` names (`s3://bucket/models/m`, `gs://…`,
/// `az://container/…`, `abfs(s)://…`, `http(s)://…`). `timeout` bounds
/// connecting; the caller bounds each request's progress.
pub fn open(url: &str, timeout: Duration) -> Result<Opened> {
    let refuse = |why: String| Error::invalid_argument(format!("model base path {}: {}", shown(url), redact(&why)));
    // The HTTP client's TLS runs on ring, as the listening ports do (see
    // server/tls.rs for why ring); the first store opened installs it.
    #[allow(deprecated)]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let parsed = url::Url::parse(url).map_err(|e| refuse(format!("not a URL: {e}")))?;
    let scheme = parsed.scheme().to_ascii_lowercase();
    let client = ClientOptions::new()
        .with_connect_timeout(timeout)
        // Downloads of large files run for as long as their bytes keep
        // coming; the mirror bounds how long one may stall instead.
        .with_timeout_disabled()
        .with_allow_invalid_certificates(env_is("S3_VERIFY_SSL", "0") && scheme == "s3");
    // Retries are the mirror's (a version's download is tried again at a
    // later poll): the client's own stay short, so an outage is seen soon.
    let retry = RetryConfig { backoff: BackoffConfig::default(), max_retries: 2, retry_timeout: timeout };
    let (store, path): (Arc<dyn ObjectStore>, String) = match scheme.as_str() {
        "s3" => {
            let mut builder = AmazonS3Builder::from_env().with_url(url).with_retry(retry).with_client_options(client);
            // TF Serving's S3 variables: a host (and port), https unless
            // S3_USE_HTTPS=0.
            if let Ok(endpoint) = std::env::var("S3_ENDPOINT") {
                let plain = env_is("S3_USE_HTTPS", "0");
                let endpoint = if endpoint.contains("://") {
                    endpoint
                } else {
                    format!("{}://{endpoint}", if plain { "http" } else { "https" })
                };
                builder = builder
                    .with_endpoint(endpoint)
                    .with_allow_http(plain || std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v == "true"));
            }
            let store = builder.build().map_err(|e| refuse(e.to_string()))?;
            (Arc::new(store), parsed.path().to_string())
        }
        "gs" => {
            // `from_env` reads object_store's own GOOGLE_* variables: an
            // emulator's GOOGLE_BASE_URL with GOOGLE_SKIP_SIGNATURE=true,
            // or a GOOGLE_SERVICE_ACCOUNT_KEY whose `gcs_base_url` names it
            // (with `"disable_oauth": true`). Its builder allows plain http
            // (the base URL is https unless set to an emulator's); the
            // options set here replace its own, so they keep that, or an
            // http:// base URL would be refused at the first request.
            let mut builder = GoogleCloudStorageBuilder::from_env()
                .with_url(url)
                .with_retry(retry)
                .with_client_options(client.with_allow_http(true));
            // The emulator variable Google's own client libraries read.
            if let Ok(host) = std::env::var("STORAGE_EMULATOR_HOST") {
                let base = if host.contains("://") { host } else { format!("http://{host}") };
                let key = serde_json::json!({
                    "private_key": "", "private_key_id": "", "client_email": "",
                    "gcs_base_url": base.trim_end_matches('/'), "disable_oauth": true,
                });
                builder = builder.with_service_account_key(key.to_string());
            }
            let store = builder.build().map_err(|e| refuse(e.to_string()))?;
            (Arc::new(store), parsed.path().to_string())
        }
        "az" | "abfs" | "abfss" => {
            let store = MicrosoftAzureBuilder::from_env()
                .with_url(url)
                .with_retry(retry)
                .with_client_options(client)
                .build()
                .map_err(|e| refuse(e.to_string()))?;
            (Arc::new(store), parsed.path().to_string())
        }
        "http" | "https" => {
            // The store is the server's root; the model is under the path.
            let root = format!("{}://{}", parsed.scheme(), parsed.host_str().unwrap_or(""));
            let root = match parsed.port() {
                Some(port) => format!("{root}:{port}"),
                None => root,
            };
            let store = HttpBuilder::new()
                .with_url(root)
                .with_retry(retry)
                .with_client_options(client.with_allow_http(scheme == "http"))
                .build()
                .map_err(|e| refuse(e.to_string()))?;
            (Arc::new(store), parsed.path().to_string())
        }
        other => return Err(refuse(format!("scheme {other}:// is not served (s3, gs, az, abfs, abfss, http, https)"))),
    };
    let decoded = percent_encoding::percent_decode_str(path.trim_matches('/'))
        .decode_utf8()
        .map_err(|e| refuse(format!("the path is not UTF-8: {e}")))?;
    let prefix = ObjectPath::parse(decoded.as_ref()).map_err(|e| refuse(format!("bad object path: {e}")))?;
    Ok(Opened { store, prefix })
}

/// The object `name` under the prefix `url` names (`s3://b/m/3` and
/// `model.onnx`), whole, or None when there is none; for the command-line
/// tools, which read one version's files.
pub async fn read_object(url: &str, name: &str, timeout: Duration) -> Result<Option<bytes::Bytes>> {
    let opened = open(url, timeout)?;
    let location = name.split('/').fold(opened.prefix.clone(), ObjectPath::join);
    let shown = format!("{}/{name}", shown(url).trim_end_matches('/'));
    let failed = |e: object_store::Error| Error::unavailable(format!("reading {shown}: {}", redact(&e.to_string())));
    match opened.store.get(&location).await {
        Ok(got) => Ok(Some(got.bytes().await.map_err(failed)?)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(failed(e)),
    }
}

/// Writes `bytes` as the object `name` under the prefix `url` names, in
/// one atomic put: a reader sees the old object or the new one, never
/// half of it.
pub async fn write_object(url: &str, name: &str, bytes: Vec<u8>, timeout: Duration) -> Result<()> {
    let opened = open(url, timeout)?;
    let location = name.split('/').fold(opened.prefix.clone(), ObjectPath::join);
    let at = || format!("{}/{name}", shown(url).trim_end_matches('/'));
    // The client's own timeout is off (downloads run as long as bytes
    // come): a put that hangs is bounded here.
    tokio::time::timeout(timeout, opened.store.put(&location, PutPayload::from(bytes)))
        .await
        .map_err(|_| Error::unavailable(format!("writing {}: no answer within {} s", at(), timeout.as_secs())))?
        .map_err(|e| Error::unavailable(format!("writing {}: {}", at(), redact(&e.to_string()))))?;
    Ok(())
}

/// The request-log files `url` names, read whole, in name order: the
/// `*.tfrecord` objects directly under it (a directory), else those whose
/// name starts with its last segment and `-` (a `filename_prefix`), else
/// the object itself. More than `max_bytes` in all is refused before any
/// is read.
pub async fn read_log_objects(url: &str, max_bytes: u64, timeout: Duration) -> Result<Vec<(String, bytes::Bytes)>> {
    let opened = open(url, timeout)?;
    let shown = shown(url);
    let failed =
        |what: &str, e: object_store::Error| Error::unavailable(format!("{what} {shown}: {}", redact(&e.to_string())));
    let listed = |prefix: ObjectPath| {
        let store = opened.store.clone();
        async move { store.list_with_delimiter(Some(&prefix)).await.map(|l| l.objects) }
    };
    let is_log = |meta: &object_store::ObjectMeta| meta.location.filename().is_some_and(|n| n.ends_with(".tfrecord"));
    let mut objects: Vec<object_store::ObjectMeta> =
        listed(opened.prefix.clone()).await.map_err(|e| failed("listing", e))?.into_iter().filter(is_log).collect();
    if objects.is_empty() {
        let parts: Vec<String> = opened.prefix.parts().map(|p| p.as_ref().to_string()).collect();
        if let Some((last, parent)) = parts.split_last() {
            let parent = ObjectPath::from_iter(parent.iter().map(String::as_str));
            let start = format!("{last}-");
            objects = listed(parent)
                .await
                .map_err(|e| failed("listing", e))?
                .into_iter()
                .filter(|m| is_log(m) && m.location.filename().is_some_and(|n| n.starts_with(&start)))
                .collect();
        }
    }
    if objects.is_empty() {
        match opened.store.head(&opened.prefix).await {
            Ok(meta) => objects.push(meta),
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::invalid_argument(format!(
                    "{shown}: no request log files (*.tfrecord) there, nor an object of that name"
                )))
            }
            Err(e) => return Err(failed("reading", e)),
        }
    }
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    let total = objects.iter().fold(0u64, |sum, m| sum.saturating_add(m.size));
    if total > max_bytes {
        return Err(Error::resource_exhausted(format!(
            "{shown}: the log files hold {total} bytes, more than the {max_bytes} allowed"
        )));
    }
    let mut read = Vec::with_capacity(objects.len());
    for meta in objects {
        let bytes = opened.store.get(&meta.location).await.map_err(|e| failed("reading", e))?;
        let bytes = bytes.bytes().await.map_err(|e| failed("reading", e))?;
        read.push((meta.location.to_string(), bytes));
    }
    Ok(read)
}

fn env_is(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == value)
}

/// `url` as log lines and errors may show it: without a user name, a
/// password or a query (an Azure SAS token rides in the query).
pub fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() || parsed.query().is_some() => {
            let query = parsed.query().is_some();
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.set_query(None);
            format!("{parsed}{}", if query { "?<redacted>" } else { "" })
        }
        _ => url.to_string(),
    }
}

/// The environment variables whose values are secrets.
const SECRET_VARIABLES: &[&str] = &[
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_MASTER_KEY",
    "AZURE_STORAGE_KEY",
    "AZURE_CLIENT_SECRET",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_TOKEN",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
];

/// `text` on one line, with the value of every secret variable set in the
/// environment replaced by `<redacted>`: store errors quote requests and
/// responses (XML bodies over several lines), and none of that may carry
/// a key into a log line, a metric or an answer.
pub fn redact(text: &str) -> String {
    let mut text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    for name in SECRET_VARIABLES {
        if let Ok(secret) = std::env::var(name) {
            if secret.len() >= 4 && text.contains(&secret) {
                text = text.replace(&secret, "<redacted>");
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_their_credentials() {
        assert_eq!(shown("s3://bucket/models/m"), "s3://bucket/models/m");
        assert_eq!(
            shown("https://acct.blob.core.windows.net/c/m?sv=2024&sig=SECRET"),
            "https://acct.blob.core.windows.net/c/m?<redacted>"
        );
        assert_eq!(shown("https://user:SECRET@host/m"), "https://host/m");
        let err = open("https://user:SECRET@host/m?sig=SECRET", Duration::from_secs(1))
            .and_then(|_| open("ftp://user:SECRET@host/m", Duration::from_secs(1)))
            .err()
            .expect("ftp refused");
        assert!(!err.to_string().contains("SECRET"), "{err}");
    }

    #[test]
    fn each_scheme_opens_with_its_prefix_and_others_are_named() {
        let opened = open("s3://bucket/models/ranker", Duration::from_secs(1)).expect("s3");
        assert_eq!(opened.prefix.as_ref(), "models/ranker");
        let opened = open("gs://bucket/m/", Duration::from_secs(1)).expect("gs");
        assert_eq!(opened.prefix.as_ref(), "m");
        let opened = open("http://127.0.0.1:9/repo/m%20x", Duration::from_secs(1)).expect("http");
        assert_eq!(opened.prefix.as_ref(), "repo/m x");
        let err = open("ftp://host/m", Duration::from_secs(1)).err().expect("ftp refused");
        assert!(err.to_string().contains("ftp:// is not served"), "{err}");
    }
}

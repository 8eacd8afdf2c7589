//! `sluice plugin push|list|show|activate|promote|end-canary|rollback|delete`: the admin API's
//! command line client. Each request carries `Authorization: Bearer TOKEN`;
//! the token comes from `SLUICE_TOKEN` (or `--token`, which shells keep in
//! their history: prefer the variable).

use std::path::PathBuf;

use bytes::Bytes;
use clap::Args;
use http::Method;

use crate::cli::bench::client::RestClient;

/// Where the admin API is and who is calling.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The server's REST address (the admin API is under /admin/v1/).
    #[arg(long, default_value = "http://127.0.0.1:8501")]
    pub server: String,
    /// The bearer token, sent as `Authorization: Bearer TOKEN`; its
    /// SHA-256 is what `[[admin.tokens]] sha256` holds.
    #[arg(long = "token", env = "SLUICE_TOKEN", hide_env_values = true)]
    pub token: String,
}

/// A plugin, by name.
#[derive(Debug, Clone, Args)]
pub struct NameArgs {
    /// The plugin's name (what pipelines name in `plugin = "…"`).
    pub name: String,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// One version of a plugin.
#[derive(Debug, Clone, Args)]
pub struct VersionArgs {
    /// The plugin's name.
    pub name: String,
    /// The version (as `plugin show` lists them).
    pub version: u32,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// The arguments of `sluice plugin activate`.
#[derive(Debug, Clone, Args)]
pub struct ActivateArgs {
    #[command(flatten)]
    pub version: VersionArgs,
    /// Start the version as a canary taking this percent of the calls,
    /// beside the active one, instead of activating it; promote it with
    /// `sluice plugin promote`, end it with `sluice plugin end-canary`.
    #[arg(long, value_name = "PERCENT")]
    pub canary: Option<f64>,
}

/// The flags of `sluice plugin push`.
#[derive(Debug, Clone, Args)]
pub struct PushArgs {
    /// The plugin, a `.wasm` component.
    pub file: PathBuf,
    /// Upload as a new version of the plugin this pipeline runs.
    #[arg(long, conflicts_with = "name", required_unless_present = "name")]
    pub pipeline: Option<String>,
    /// Upload as a new version of the plugin called NAME.
    #[arg(long)]
    pub name: Option<String>,
    /// With --pipeline: store the version without activating it. With
    /// --name, versions are only stored unless --activate is given.
    #[arg(long = "no-activate", conflicts_with = "activate")]
    pub no_activate: bool,
    /// With --name: activate the new version at once.
    #[arg(long)]
    pub activate: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

async fn send(server: &ServerArgs, method: Method, path: &str, body: Bytes) -> anyhow::Result<String> {
    let mut client = RestClient::new(&server.server)?;
    let authorization = format!("Bearer {}", server.token);
    let response = client.call(method, path, &[("authorization", authorization.as_str())], body).await?;
    let text = response.text();
    if !response.status.is_success() {
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or(text);
        return Err(anyhow::anyhow!(
            "{} {}: {message}",
            response.status.as_u16(),
            response.status.canonical_reason().unwrap_or("")
        ));
    }
    let pretty =
        serde_json::from_str::<serde_json::Value>(&text).and_then(|v| serde_json::to_string_pretty(&v)).unwrap_or(text);
    Ok(pretty)
}

/// Uploads (and by default activates) a plugin; returns the server's answer.
pub async fn push(args: &PushArgs) -> anyhow::Result<String> {
    let wasm = std::fs::read(&args.file).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file.display()))?;
    let path = match (&args.pipeline, &args.name) {
        (Some(pipeline), _) => format!("/admin/v1/pipelines/{pipeline}/plugin?activate={}", !args.no_activate),
        (None, Some(name)) => format!("/admin/v1/plugins/{name}?activate={}", args.activate),
        (None, None) => anyhow::bail!("name the target: --pipeline NAME or --name PLUGIN"),
    };
    send(&args.server, Method::PUT, &path, Bytes::from(wasm)).await
}

/// The plugins the token may see, with their versions (0: the file in
/// the plugin directory), then what each pipeline runs now.
pub async fn list(server: &ServerArgs) -> anyhow::Result<String> {
    let plugins = send(server, Method::GET, "/admin/v1/plugins", Bytes::new()).await?;
    let pipelines = send(server, Method::GET, "/admin/v1/pipelines", Bytes::new()).await?;
    Ok(format!("{plugins}\n{pipelines}"))
}

/// A plugin's manifest: its owner, versions and the active one.
pub async fn show(args: &NameArgs) -> anyhow::Result<String> {
    send(&args.server, Method::GET, &format!("/admin/v1/plugins/{}", args.name), Bytes::new()).await
}

/// Makes a stored version the one every stage running the plugin serves,
/// or with --canary starts it beside the active one for a share of calls.
pub async fn activate(args: &ActivateArgs) -> anyhow::Result<String> {
    let VersionArgs { name, version, server } = &args.version;
    let mut path = format!("/admin/v1/plugins/{name}/versions/{version}/activate");
    if let Some(percent) = args.canary {
        path.push_str(&format!("?canary={percent}"));
    }
    send(server, Method::POST, &path, Bytes::new()).await
}

/// Makes the running canary the active version.
pub async fn promote(args: &NameArgs) -> anyhow::Result<String> {
    send(&args.server, Method::POST, &format!("/admin/v1/plugins/{}/promote", args.name), Bytes::new()).await
}

/// Ends the running canary: the active version serves every call again.
pub async fn end_canary(args: &NameArgs) -> anyhow::Result<String> {
    send(&args.server, Method::DELETE, &format!("/admin/v1/plugins/{}/canary", args.name), Bytes::new()).await
}

/// Goes back to the version active before the current one.
pub async fn rollback(args: &NameArgs) -> anyhow::Result<String> {
    send(&args.server, Method::POST, &format!("/admin/v1/plugins/{}/rollback", args.name), Bytes::new()).await
}

/// Deletes a stored version that is not active.
pub async fn delete(args: &VersionArgs) -> anyhow::Result<String> {
    let path = format!("/admin/v1/plugins/{}/versions/{}", args.name, args.version);
    send(&args.server, Method::DELETE, &path, Bytes::new()).await
}

//! `sluice features load FILE --config CONFIG --table NAME --redis URL`:
//! writes a table file (CSV or JSON lines, read exactly as an embedded
//! table is) into Redis in the format the Redis store reads — one hash per
//! entity, `PREFIX` + key, one field per feature (`docs/FEATURES.md`). The
//! table's schema and prefix come from `[features.tables.NAME]` of the
//! config, so what is written is what the server will read.

use std::path::PathBuf;

use anyhow::{anyhow, Context};
use redis::aio::ConnectionLike;

use crate::config::Config;
use crate::feature::{file, Schema};

/// The arguments of `sluice features load`.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// The table file: `.csv`, `.jsonl` or `.ndjson`.
    pub file: PathBuf,
    /// The config whose `[features.tables.NAME]` declares the table.
    #[arg(long)]
    pub config: PathBuf,
    /// The table's name in the config.
    #[arg(long)]
    pub table: String,
    /// Redis to write to; default: the config's `features.redis.url`.
    #[arg(long)]
    pub redis: Option<String>,
    /// The file's key column (CSV) or field (JSON lines); default: the
    /// table's `key`.
    #[arg(long)]
    pub key: Option<String>,
    /// Entities written per pipelined round trip.
    #[arg(long, default_value_t = 1000)]
    pub chunk: usize,
}

/// Loads the file into Redis; answers what was written.
pub async fn load(args: &LoadArgs) -> anyhow::Result<String> {
    let config = Config::from_file(&args.config)?;
    let table = config.features.tables.get(&args.table).ok_or_else(|| {
        let names: Vec<&str> = config.features.tables.keys().map(String::as_str).collect();
        anyhow!("{}: no [features.tables.{}]; tables: {names:?}", args.config.display(), args.table)
    })?;
    let url = args
        .redis
        .clone()
        .or_else(|| config.features.redis.as_ref().map(|r| r.url.clone()))
        .ok_or_else(|| anyhow!("give --redis URL (the config sets no features.redis.url)"))?;
    let schema = Schema::of(&args.table, table);
    let key = args.key.clone().unwrap_or_else(|| table.key.clone());
    let (path, schema_for_read) = (args.file.clone(), schema.clone());
    let data = tokio::task::spawn_blocking(move || file::read(&path, &schema_for_read, &key))
        .await
        .map_err(|e| anyhow!("reading the file failed: {e}"))??;
    let prefix = table.redis_prefix(&args.table);
    // The config's credentials and TLS settings, also for a --redis URL.
    let access = config.features.redis.as_ref().map(|r| r.access()).unwrap_or_default();
    let client = access.client("features.redis", &url).map_err(|e| anyhow!("{}", e.0))?;
    let shown = crate::config::redis_access::redacted(&url);
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("cannot connect to Redis at {shown}"))?;
    let chunk = args.chunk.max(1);
    for start in (0..data.len()).step_by(chunk) {
        let mut pipe = redis::pipe();
        let rows = start..(start + chunk).min(data.len());
        for row in rows.clone() {
            let mut hash = Vec::with_capacity(prefix.len() + data.key(row).len());
            hash.extend_from_slice(prefix.as_bytes());
            hash.extend_from_slice(data.key(row));
            let command = pipe.cmd("HSET").arg(hash);
            for (f, (name, _)) in schema.features.iter().enumerate() {
                command.arg(name.as_str()).arg(data.stored(row, f));
            }
        }
        connection
            .req_packed_commands(&pipe, 0, rows.len())
            .await
            .with_context(|| format!("writing rows {}..{} to Redis at {shown}", rows.start, rows.end))?;
    }
    Ok(format!(
        "wrote {} entities of table '{}' ({} features) to {shown} as hashes {prefix}KEY",
        data.len(),
        args.table,
        schema.features.len()
    ))
}

//! `[models.logging]` and TF Serving's `logging_config`: which requests of
//! a model are written to its request log, and where. The writer that reads
//! it is `pipeline::request_log`.
//!
//! TF Serving's text format nests the same settings:
//! `logging_config { log_collector_config { type filename_prefix }
//! sampling_config { sampling_rate } }`; both forms become this one.

use std::path::PathBuf;

use serde::Deserialize;

use super::{check_between, MAX_COUNT};
use crate::error::Invalid;
use crate::invalid;

/// The log collector sluice has: files of `PredictionLog` records.
pub const TFRECORD_COLLECTOR: &str = "tfrecord";

/// Where and how often a model's requests are logged.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    /// The collector: `tfrecord` (TF Serving's `log_collector_config.type`;
    /// empty means the same).
    #[serde(default = "default_collector", rename = "type")]
    pub collector: String,
    /// Where the files go: `PREFIX-<start ms>-<seq>.tfrecord`, the
    /// directory made when missing. Relative to the config file. An
    /// object-store URL (`s3://bucket/logs/mlp`, as TF Serving writes to
    /// `gs://`): files are written locally and each is uploaded once it is
    /// closed.
    pub filename_prefix: PathBuf,
    /// The share of requests logged, uniformly at random, in `[0, 1]`.
    pub sampling_rate: f64,
    /// A file is closed and the next one started once it holds this many
    /// MiB.
    #[serde(default = "default_max_file_mib")]
    pub max_file_mib: u64,
    /// The most files of this log kept on disk; the oldest written by this
    /// process is deleted when another starts. 0 keeps them all.
    #[serde(default = "default_max_files")]
    pub max_files: usize,
    /// Records waiting for the writer at most; a record sampled while it is
    /// full is dropped and counted, never waited for.
    #[serde(default = "default_queue_capacity")]
    pub queue_capacity: usize,
    /// With a `filename_prefix` in object storage: a file is closed and
    /// uploaded at most this many seconds after it was started, so a quiet
    /// model's records reach the bucket too.
    #[serde(default = "default_upload_interval_secs")]
    pub upload_interval_secs: u64,
}

fn default_upload_interval_secs() -> u64 {
    60
}

fn default_collector() -> String {
    TFRECORD_COLLECTOR.to_string()
}

fn default_max_file_mib() -> u64 {
    64
}

fn default_max_files() -> usize {
    100
}

fn default_queue_capacity() -> usize {
    1024
}

impl LoggingConfig {
    /// A log with the defaults, as TF Serving's text format gives only the
    /// prefix, the collector and the rate.
    pub fn new(collector: String, filename_prefix: PathBuf, sampling_rate: f64) -> LoggingConfig {
        LoggingConfig {
            collector,
            filename_prefix,
            sampling_rate,
            max_file_mib: default_max_file_mib(),
            max_files: default_max_files(),
            queue_capacity: default_queue_capacity(),
            upload_interval_secs: default_upload_interval_secs(),
        }
    }

    /// Checks the values; `key` names it in errors.
    pub fn check(&self, key: &str) -> Result<(), Invalid> {
        if !self.collector.is_empty() && self.collector != TFRECORD_COLLECTOR {
            return Err(invalid!(
                "{key}.type = \"{}\": no such log collector; sluice has \"{TFRECORD_COLLECTOR}\"",
                self.collector
            ));
        }
        if self.filename_prefix.as_os_str().is_empty() {
            return Err(invalid!("{key}.filename_prefix is empty; give the path the log files start with"));
        }
        if self.filename_prefix.file_name().is_none() {
            return Err(invalid!(
                "{key}.filename_prefix = {:?}: ends in a directory; give a file name prefix too (DIR/requests)",
                self.filename_prefix
            ));
        }
        if !(0.0..=1.0).contains(&self.sampling_rate) {
            return Err(invalid!("{key}.sampling_rate = {}: must be between 0 and 1", self.sampling_rate));
        }
        check_between(
            &format!("{key}.max_file_mib"),
            usize::try_from(self.max_file_mib).unwrap_or(usize::MAX),
            1,
            1 << 20,
        )?;
        check_between(&format!("{key}.max_files"), self.max_files, 0, MAX_COUNT)?;
        check_between(&format!("{key}.queue_capacity"), self.queue_capacity, 1, MAX_COUNT)?;
        check_between(
            &format!("{key}.upload_interval_secs"),
            usize::try_from(self.upload_interval_secs).unwrap_or(usize::MAX),
            1,
            86_400,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_named() {
        let good = LoggingConfig::new(String::new(), "logs/requests".into(), 0.5);
        good.check("models[0].logging").unwrap();
        let cases = [
            (LoggingConfig { collector: "kafka".into(), ..good.clone() }, "type = \"kafka\": no such log collector"),
            (LoggingConfig { sampling_rate: 1.5, ..good.clone() }, "sampling_rate = 1.5: must be between 0 and 1"),
            (LoggingConfig { sampling_rate: f64::NAN, ..good.clone() }, "sampling_rate = NaN"),
            (LoggingConfig { filename_prefix: "".into(), ..good.clone() }, "filename_prefix is empty"),
            (LoggingConfig { filename_prefix: "logs/..".into(), ..good.clone() }, "ends in a directory"),
            (LoggingConfig { queue_capacity: 0, ..good.clone() }, "queue_capacity = 0"),
            (LoggingConfig { max_file_mib: 0, ..good.clone() }, "max_file_mib = 0"),
        ];
        for (config, expected) in cases {
            let err = config.check("models[0].logging").unwrap_err();
            assert!(err.0.contains(expected), "{err} lacks {expected}");
        }
    }
}

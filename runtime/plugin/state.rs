//! What one plugin instance may touch: an empty WASI context, a memory
//! limiter, capped stdout/stderr, and a capped log.
//!
//! A fresh `HostState` goes with every fresh instance, so nothing a call
//! leaves behind — memory, output, log budget — reaches the next one.
//!
//! Guest instructions are stopped by epochs, but a guest can also block in
//! a host call: `wasi:io/poll` (a `sleep`, a wait on a clock). Those calls
//! are replaced here ([`BoundedPoll`]) by ones that give up at the call's
//! own deadline, so no way of blocking outlives the plugin's time limit.
//! Everything a guest writes to the host's log is escaped (no line breaks
//! or control characters that could forge log lines) and capped.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use wasmtime::component::{HasData, Resource};
use wasmtime::ResourceLimiter;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::bindings::sync::io::poll as sync_poll;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{ResourceTable, WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_io::bindings::wasi::io::poll as async_poll;
use wasmtime_wasi_io::poll::DynPollable;

use super::bindings::{pre::sluice::plugin::log, pre::sluice::plugin::types, Level};

/// Bytes of stdout and stderr kept per call; the rest is dropped.
pub const OUTPUT_CAP: usize = 8 * 1024;

/// Log lines a call may write; the rest are counted and dropped.
pub const LOG_LINES_CAP: u32 = 32;

/// Longest log line kept.
const LOG_LINE_CAP: usize = 1024;

/// The memory and table limits of one instance, remembering whether it
/// was refused growth, so a trap that follows can be reported as what it
/// is: running out of memory.
pub struct Limiter {
    memory_bytes: usize,
    /// Linear memory granted, over all the instance's memories.
    total: usize,
    /// Set when the guest asked for more memory than allowed.
    pub memory_denied: bool,
    /// The most linear memory granted, in bytes, over all memories.
    pub peak: usize,
}

impl Limiter {
    /// A limiter allowing `memory_bytes` of linear memory in all, over
    /// every memory of the instance (a component may declare several).
    pub fn new(memory_bytes: usize) -> Limiter {
        Limiter { memory_bytes, total: 0, memory_denied: false, peak: 0 }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        // Called for a new memory too (from 0 to its initial size).
        let total = self.total.saturating_sub(current).saturating_add(desired);
        if total > self.memory_bytes {
            self.memory_denied = true;
            return Ok(false);
        }
        self.total = total;
        self.peak = self.peak.max(total);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }

    fn instances(&self) -> usize {
        // A wasip2 component is a handful of core instances.
        64
    }

    fn tables(&self) -> usize {
        64
    }

    fn memories(&self) -> usize {
        // Python and JavaScript components have one or two.
        4
    }
}

/// Output written by the guest, kept up to a cap.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<CapturedInner>>);

#[derive(Default)]
struct CapturedInner {
    kept: Vec<u8>,
    dropped: usize,
}

impl Captured {
    fn push(&self, bytes: &[u8]) {
        if let Ok(mut inner) = self.0.lock() {
            let room = OUTPUT_CAP.saturating_sub(inner.kept.len());
            let take = room.min(bytes.len());
            inner.kept.extend_from_slice(&bytes[..take]);
            inner.dropped += bytes.len() - take;
        }
    }

    /// The kept text and how many bytes were dropped.
    pub fn take(&self) -> (String, usize) {
        match self.0.lock() {
            Ok(mut inner) => (String::from_utf8_lossy(&std::mem::take(&mut inner.kept)).into_owned(), inner.dropped),
            Err(_) => (String::new(), 0),
        }
    }

    /// What the guest said last before failing: a Python traceback's
    /// exception and where it was raised (componentize-py prints it, then
    /// traps with a panic that says only "Python function threw an
    /// unexpected exception"), a Rust panic's location and message, or
    /// else the last line that is not the standard backtrace hint.
    pub fn last_words(&self) -> Option<String> {
        let inner = self.0.lock().ok()?;
        let text = String::from_utf8_lossy(&inner.kept);
        last_words(&text)
    }
}

fn last_words(text: &str) -> Option<String> {
    let raw: Vec<&str> = text.lines().collect();
    if let Some(start) = raw.iter().rposition(|l| l.starts_with("Traceback (most recent call last)")) {
        let block = &raw[start + 1..];
        if let Some(at) = block.iter().position(|l| !l.starts_with(' ') && !l.trim().is_empty()) {
            let place = block[..at].iter().rev().find(|l| l.trim_start().starts_with("File ")).map(|l| l.trim());
            return Some(match place {
                Some(place) => format!("{} ({place})", block[at].trim()),
                None => block[at].trim().to_string(),
            });
        }
    }
    let lines: Vec<&str> = raw.iter().map(|l| l.trim()).filter(|l| !l.is_empty()).collect();
    if let Some(at) = lines.iter().rposition(|l| l.contains("panicked at")) {
        let message = lines.get(at + 1).filter(|l| !l.starts_with("note:")).copied().unwrap_or("");
        return Some(format!("{} {message}", lines[at]).trim().to_string());
    }
    lines.iter().rev().find(|l| !l.starts_with("note: run with")).map(|l| l.to_string())
}

#[cfg(test)]
mod tests {
    use super::last_words;

    #[test]
    fn a_python_traceback_gives_its_exception_and_where_it_was_raised() {
        let printed =
            "Traceback (most recent call last):\n  File \"/0/app.py\", line 50, in run\n    raise ValueError(x)\n\
                       ValueError: the plugin raises on purpose\nthread '<unnamed>' panicked at src/lib.rs:9:5:\n\
                       Python function threw an unexpected exception\n";
        assert_eq!(
            last_words(printed).as_deref(),
            Some("ValueError: the plugin raises on purpose (File \"/0/app.py\", line 50, in run)")
        );
    }

    #[test]
    fn a_rust_panic_gives_its_place_and_message() {
        let printed = "thread '<unnamed>' panicked at src/lib.rs:88:5:\nboom\nnote: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(last_words(printed).as_deref(), Some("thread '<unnamed>' panicked at src/lib.rs:88:5: boom"));
    }
}

impl IsTerminal for Captured {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Captured {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        // Plugins run synchronously; the p2 stream below is the one used.
        Box::new(tokio::io::sink())
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Captured {
    async fn ready(&mut self) {}
}

impl OutputStream for Captured {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        // Accept everything, keep the first OUTPUT_CAP bytes: a chatty
        // plugin is capped, not failed.
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

/// A wall clock stopped at the Unix epoch: plugins get no wall clock.
struct NoWallClock;

impl wasmtime_wasi::HostWallClock for NoWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// The state of one plugin instance.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    /// Memory limits and whether they were hit.
    pub limiter: Limiter,
    /// The guest's stdout.
    pub stdout: Captured,
    /// The guest's stderr.
    pub stderr: Captured,
    /// Log lines written by this call.
    pub log_lines: u32,
    /// `plugin 'name' version`, for log lines.
    pub label: Arc<str>,
    /// When the current call's time is up: host calls that block give up
    /// then.
    pub deadline: Option<Instant>,
}

impl HostState {
    /// A state granting nothing: no files, environment, arguments, sockets
    /// or wall clock; stdin closed; stdout and stderr captured.
    pub fn new(label: Arc<str>, memory_bytes: usize) -> HostState {
        let stdout = Captured::default();
        let stderr = Captured::default();
        let mut builder = WasiCtx::builder();
        builder.stdout(stdout.clone()).stderr(stderr.clone()).wall_clock(NoWallClock);
        HostState {
            wasi: builder.build(),
            table: ResourceTable::new(),
            limiter: Limiter::new(memory_bytes),
            stdout,
            stderr,
            log_lines: 0,
            label,
            deadline: None,
        }
    }

    /// Clears what one call counts (log lines, memory refused), so a kept
    /// instance's next call starts with the whole of its budgets. The peak
    /// stays: a memory never shrinks, so it is the instance's size.
    pub fn start_call(&mut self) {
        self.log_lines = 0;
        self.limiter.memory_denied = false;
    }

    /// Host resources (streams, pollables) the guest holds.
    pub fn resources(&mut self) -> usize {
        self.table.iter_mut().count()
    }

    /// Drops what the guest printed (a warm-up's output).
    pub fn discard_output(&self) {
        let _ = self.stdout.take();
        let _ = self.stderr.take();
    }

    /// Writes what the guest printed to the host's log, capped.
    pub fn flush_output(&self) {
        for (stream, captured) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            let (text, dropped) = captured.take();
            if !text.is_empty() {
                let text = escape(text.trim_end());
                tracing::info!(plugin = %self.label, stream, dropped_bytes = dropped, "{text}");
            }
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// The types interface has no functions.
impl types::Host for HostState {}

impl log::Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        self.log_lines += 1;
        if self.log_lines > LOG_LINES_CAP {
            if self.log_lines == LOG_LINES_CAP + 1 {
                tracing::warn!(plugin = %self.label, "log limit of {LOG_LINES_CAP} lines per call reached; dropping the rest");
            }
            return;
        }
        let capped = cap(&message, LOG_LINE_CAP);
        let message = escape(&capped);
        let plugin = &*self.label;
        match level {
            Level::Debug => tracing::debug!(plugin, "{message}"),
            Level::Info => tracing::info!(plugin, "{message}"),
            Level::Warn => tracing::warn!(plugin, "{message}"),
            Level::Error => tracing::error!(plugin, "{message}"),
        }
    }
}

/// `text` cut to at most `limit` bytes (on a character boundary), with a
/// visible mark saying how much was cut: every string a plugin hands the
/// host (errors, log lines) goes through here.
pub fn cap(text: &str, limit: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= limit {
        return text.into();
    }
    let mut cut = limit;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… [truncated: {} more bytes]", &text[..cut], text.len() - cut).into()
}

/// `text` with line breaks and other control characters escaped, so what a
/// plugin writes stays one log line and cannot pass for another.
pub fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars()
        .flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] })
        .collect::<String>()
        .into()
}

/// A guest blocked in a host call (a sleep, a poll) until its call's time
/// was up; classified as the plugin running out of time.
#[derive(Debug)]
pub struct BlockedPastDeadline;

impl std::fmt::Display for BlockedPastDeadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("blocked in a host call (a sleep or a poll) until its time limit")
    }
}

impl std::error::Error for BlockedPastDeadline {}

/// `wasi:io/poll` with every wait bounded by the call's deadline.
pub struct BoundedPoll<'a> {
    table: &'a mut ResourceTable,
    deadline: Option<Instant>,
}

/// Links [`BoundedPoll`] in place of WASI's own `wasi:io/poll`.
pub struct BoundedPollData;

impl HasData for BoundedPollData {
    type Data<'a> = BoundedPoll<'a>;
}

impl HostState {
    /// The bounded `wasi:io/poll` of this instance.
    pub fn bounded_poll(&mut self) -> BoundedPoll<'_> {
        BoundedPoll { table: &mut self.table, deadline: self.deadline }
    }
}

/// Runs a host wait, giving up with [`BlockedPastDeadline`] at `deadline`.
fn bounded<T>(
    deadline: Option<Instant>,
    wait: impl std::future::Future<Output = wasmtime::Result<T>>,
) -> wasmtime::Result<T> {
    // Without a deadline (never the case for a call) the wait is refused
    // outright rather than left unbounded.
    let at = deadline.unwrap_or_else(Instant::now);
    wasmtime_wasi::runtime::in_tokio(async move {
        match tokio::time::timeout_at(at.into(), wait).await {
            Ok(result) => result,
            Err(_) => Err(wasmtime::Error::new(BlockedPastDeadline)),
        }
    })
}

impl sync_poll::Host for BoundedPoll<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        let table = &mut *self.table;
        bounded(self.deadline, async move { async_poll::Host::poll(table, pollables).await })
    }
}

impl sync_poll::HostPollable for BoundedPoll<'_> {
    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        let table = &mut *self.table;
        bounded(self.deadline, async move { async_poll::HostPollable::ready(table, pollable).await })
    }

    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        let table = &mut *self.table;
        bounded(self.deadline, async move { async_poll::HostPollable::block(table, pollable).await })
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        async_poll::HostPollable::drop(&mut *self.table, pollable)
    }
}

//! The guest's stdout and stderr: each line becomes a `tracing` event tagged with the
//! plugin's name, and the last lines of stderr are kept to explain a trap.
//!
//! Invariants: nothing a guest writes reaches the host's own stdio; a line longer than
//! [`MAX_LINE`] goes out in pieces of [`MAX_LINE`] bytes, so a guest can neither grow host
//! memory by writing without newlines nor log a longer line; lines are rate-limited per plugin together with its `log` import
//! ([`super::output_limit`]); at most [`KEPT_LINES`] stderr lines are kept per call (kept
//! whether or not the rate limit let them into the log, to explain a trap). This module
//! imports nothing of the runtime but the log target and the plugin's line budget.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

use super::callsites::TARGET;
use super::output_limit::GuestOutputLimit;

/// Lines of stderr kept per call to explain a trap.
pub(crate) const KEPT_LINES: usize = 8;

/// What the guest wrote to stderr during the current call, kept to explain a trap.
#[derive(Default)]
pub(crate) struct GuestStderr {
    /// The last few lines, oldest first.
    lines: std::collections::VecDeque<String>,
}

impl GuestStderr {
    /// Forgets the previous call's lines.
    pub fn clear(&mut self) {
        self.lines.clear();
    }

    fn push(&mut self, line: &str) {
        if self.lines.len() == KEPT_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line.to_owned());
    }

    /// The guest's explanation of a trap: a Rust panic's `panicked at` line and message
    /// when present, else the last line written; `None` if it wrote nothing.
    pub fn explanation(&self) -> Option<String> {
        if let Some(i) = self.lines.iter().rposition(|l| l.contains("panicked at")) {
            let text: Vec<&str> = self
                .lines
                .iter()
                .skip(i)
                .filter(|l| !l.starts_with("note: run with `RUST_BACKTRACE"))
                .map(String::as_str)
                .collect();
            return Some(text.join(" "));
        }
        self.lines.back().cloned()
    }
}

/// One guest output stream (stdout or stderr), turned into tracing lines.
pub(crate) struct GuestOutput {
    limit: Arc<GuestOutputLimit>,
    stream: &'static str,
    stderr: Option<Arc<Mutex<GuestStderr>>>,
}

impl GuestOutput {
    /// The plugin's stdout, within the plugin's line budget `limit`.
    pub fn stdout(limit: Arc<GuestOutputLimit>) -> Self {
        GuestOutput { limit, stream: "stdout", stderr: None }
    }

    /// The plugin's stderr, whose last lines are also kept in `kept`.
    pub fn stderr(limit: Arc<GuestOutputLimit>, kept: Arc<Mutex<GuestStderr>>) -> Self {
        GuestOutput { limit, stream: "stderr", stderr: Some(kept) }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(LineWriter {
            limit: self.limit.clone(),
            stream: self.stream,
            stderr: self.stderr.clone(),
            pending: Vec::new(),
        })
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        // Only WASI p2 is linked; p3 streams are never requested. A sink keeps the
        // contract without granting anything.
        Box::new(tokio::io::sink())
    }
}

/// Longest line: a longer one goes out in pieces of this size (a guest can't grow host
/// memory by writing without newlines).
pub(crate) const MAX_LINE: usize = 8 << 10;

struct LineWriter {
    limit: Arc<GuestOutputLimit>,
    stream: &'static str,
    stderr: Option<Arc<Mutex<GuestStderr>>>,
    pending: Vec<u8>,
}

impl LineWriter {
    fn emit(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches('\r');
        if text.is_empty() {
            return;
        }
        if tracing::enabled!(target: TARGET, tracing::Level::INFO) && self.limit.admit(self.stream) {
            tracing::info!(target: TARGET, plugin = %self.limit.plugin(), stream = self.stream, "{text}");
        }
        if let Some(s) = &self.stderr {
            s.lock().push(text);
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LineWriter {
    async fn ready(&mut self) {}
}

impl OutputStream for LineWriter {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        let mut rest = &bytes[..];
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            let mut line = std::mem::take(&mut self.pending);
            line.extend_from_slice(&rest[..i]);
            self.emit(&line);
            rest = &rest[i + 1..];
        }
        // A line longer than MAX_LINE goes out in pieces of MAX_LINE, whatever the size of
        // one write.
        while self.pending.len() + rest.len() >= MAX_LINE {
            let take = MAX_LINE - self.pending.len();
            let mut line = std::mem::take(&mut self.pending);
            line.extend_from_slice(&rest[..take]);
            self.emit(&line);
            rest = &rest[take..];
        }
        self.pending.extend_from_slice(rest);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(MAX_LINE)
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.emit(&line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::metrics::RuntimeMetrics;

    #[test]
    fn long_lines_go_out_in_pieces_and_stderr_keeps_the_last_lines() {
        let kept = Arc::new(Mutex::new(GuestStderr::default()));
        let limit = Arc::new(GuestOutputLimit::new("p".into(), 1_000, RuntimeMetrics::default()));
        let mut w = LineWriter { limit, stream: "stderr", stderr: Some(kept.clone()), pending: Vec::new() };
        w.write(Bytes::from(vec![b'x'; 3 * MAX_LINE + 10])).unwrap();
        assert_eq!(w.pending.len(), 10, "only the rest of the line waits");
        w.write(Bytes::from_static(b"yz\nlast\n")).unwrap();
        let lines: Vec<usize> = kept.lock().lines.iter().map(String::len).collect();
        assert_eq!(lines, [MAX_LINE, MAX_LINE, MAX_LINE, 12, 4]);
    }
}

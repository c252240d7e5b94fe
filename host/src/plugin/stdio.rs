//! The guest's stdout and stderr: each line becomes a `tracing` event tagged with the
//! plugin's name, and the last lines of stderr are kept to explain a trap.
//!
//! Invariants: nothing a guest writes reaches the host's own stdio; a line longer than
//! [`MAX_LINE`] is flushed as is, so a guest cannot grow host memory by writing without
//! newlines; at most [`KEPT_LINES`] stderr lines are kept per call. This module imports
//! nothing of the runtime but the log target.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

use super::callsites::TARGET;

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
    plugin: Arc<str>,
    stream: &'static str,
    stderr: Option<Arc<Mutex<GuestStderr>>>,
}

impl GuestOutput {
    /// The plugin's stdout.
    pub fn stdout(plugin: Arc<str>) -> Self {
        GuestOutput { plugin, stream: "stdout", stderr: None }
    }

    /// The plugin's stderr, whose last lines are also kept in `kept`.
    pub fn stderr(plugin: Arc<str>, kept: Arc<Mutex<GuestStderr>>) -> Self {
        GuestOutput { plugin, stream: "stderr", stderr: Some(kept) }
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
            plugin: self.plugin.clone(),
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

/// Longest line kept before it is flushed as is (a guest can't grow host memory by
/// writing without newlines).
pub(crate) const MAX_LINE: usize = 8 << 10;

struct LineWriter {
    plugin: Arc<str>,
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
        tracing::info!(target: TARGET, plugin = %self.plugin, stream = self.stream, "{text}");
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
        self.pending.extend_from_slice(rest);
        if self.pending.len() >= MAX_LINE {
            let line = std::mem::take(&mut self.pending);
            self.emit(&line);
        }
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

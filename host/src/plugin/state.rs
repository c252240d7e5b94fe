//! The data each plugin instance's `Store` carries, and what all instances of one plugin share.
//!
//! Invariants:
//! - The WASI context grants nothing: no preopened directories, no environment, no
//!   arguments, no network (TCP, UDP and name lookup off), no stdin. stdout and stderr
//!   become `tracing` lines tagged with the plugin's name; nothing reaches the host's stdio.
//!   What std itself reads stays available: random bytes (HashMap seeds) and the wall and
//!   monotonic clocks (status timestamps), both read-only.
//! - [`CallInfo`] describes the call in progress (export, request, deadline) so imports can
//!   tag logs and bound their own waiting; it is reset before every call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::wasmctrl::controller::types::Error as WitError;
use super::cache::CacheReader;
use super::client::KubeServices;
use super::engine::{PluginCallLabels, RuntimeMetrics};
use super::spec::{Gvk, PluginSpec};

/// What every instance of one plugin shares: its spec, caches and cluster access.
pub(crate) struct PluginContext {
    pub spec: PluginSpec,
    /// Short content hash of the `.wasm` (as `/plugins` shows it), for logs.
    pub version: String,
    pub caches: HashMap<Gvk, Arc<dyn CacheReader>>,
    pub kube: Option<Arc<KubeServices>>,
    pub metrics: RuntimeMetrics,
}

impl PluginContext {
    /// Refuses `kind` unless readable: counts and logs the refusal.
    pub fn check_read(&self, kind: &Gvk, call: &CallInfo, op: &'static str) -> Result<(), WitError> {
        if self.spec.permissions.can_read(kind) {
            return Ok(());
        }
        Err(self.forbidden(kind, call, op, "read"))
    }

    /// Refuses `kind` unless writable: counts and logs the refusal.
    pub fn check_write(&self, kind: &Gvk, call: &CallInfo, op: &'static str) -> Result<(), WitError> {
        if self.spec.permissions.can_write(kind) {
            return Ok(());
        }
        Err(self.forbidden(kind, call, op, "write"))
    }

    fn forbidden(&self, kind: &Gvk, call: &CallInfo, op: &'static str, verb: &str) -> WitError {
        self.metrics
            .forbidden
            .get_or_create(&PluginCallLabels { plugin: self.spec.name.clone(), call: op.to_owned() })
            .inc();
        tracing::warn!(
            plugin = %self.spec.name,
            request = call.request.as_deref().unwrap_or(""),
            kind = %kind,
            op,
            "plugin refused: kind not declared {verb}able"
        );
        let hint = if verb == "read" {
            "add it to for/owns/watches or permissions.read"
        } else {
            "add it to permissions.write"
        };
        WitError::Forbidden(format!(
            "plugin {} may not {verb} {kind}: {hint} in the plugin's TOML",
            self.spec.name
        ))
    }

    /// Refuses a guest-provided body larger than `max-output`.
    pub fn check_input_size(&self, len: usize, what: &str) -> Result<(), WitError> {
        let max = self.spec.limits.max_output;
        if len > max {
            return Err(WitError::Invalid(format!(
                "{what} is {len} bytes, over the plugin's max-output of {max}"
            )));
        }
        Ok(())
    }
}

/// The call in progress on an instance.
#[derive(Clone, Debug)]
pub(crate) struct CallInfo {
    /// The export being called (`reconcile`, `on-add`, ...).
    pub export: &'static str,
    /// `namespace/name` of the request being reconciled, if any.
    pub request: Option<String>,
    /// When the call's deadline expires.
    pub deadline: Instant,
}

/// The `T` of every plugin `Store`.
pub(crate) struct HostState {
    pub ctx: Arc<PluginContext>,
    pub call: CallInfo,
    pub limits: StoreLimits,
    wasi: WasiCtx,
    table: ResourceTable,
    /// The guest's last complete stderr line of the current call (a panic message).
    pub stderr: Arc<Mutex<GuestStderr>>,
}

impl HostState {
    pub fn new(ctx: Arc<PluginContext>) -> Self {
        let l = &ctx.spec.limits;
        let limits = StoreLimitsBuilder::new()
            .memory_size(l.memory)
            .table_elements(l.table_elements)
            .instances(l.instances)
            .tables(l.tables)
            .memories(l.memories)
            // A guest allocation failure is then a trap with a clear reason instead of
            // the guest's own `abort` (which reads as a bare `unreachable`).
            .trap_on_grow_failure(true)
            .build();
        let stderr = Arc::new(Mutex::new(GuestStderr::default()));
        let name: Arc<str> = ctx.spec.name.as_str().into();
        let wasi = WasiCtxBuilder::new()
            .stdout(GuestOutput { plugin: name.clone(), stream: "stdout", stderr: None })
            .stderr(GuestOutput { plugin: name, stream: "stderr", stderr: Some(stderr.clone()) })
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        HostState {
            ctx,
            call: CallInfo { export: "", request: None, deadline: Instant::now() },
            limits,
            wasi,
            table: ResourceTable::new(),
            stderr,
        }
    }

    pub fn plugin_name(&self) -> &str {
        &self.ctx.spec.name
    }

    /// The plugin's short version (for logs).
    pub fn plugin_version(&self) -> &str {
        &self.ctx.version
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// Lines of stderr kept per call to explain a trap.
const KEPT_LINES: usize = 8;

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
struct GuestOutput {
    plugin: Arc<str>,
    stream: &'static str,
    stderr: Option<Arc<Mutex<GuestStderr>>>,
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
const MAX_LINE: usize = 8 << 10;

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
        tracing::info!(target: "wasmctrl::plugin::guest", plugin = %self.plugin, stream = self.stream, "{text}");
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

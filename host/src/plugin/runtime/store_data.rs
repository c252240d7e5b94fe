//! The `T` of every plugin `Store`: a plain holder of each import's host context, the
//! call in progress, the store's limits and the WASI context.
//!
//! Layering: this module sits above the imports (`cache`, `client`, `events`, `log`,
//! `config`, [`wasi`](crate::plugin::imports::wasi)) and imports each one's context type;
//! none of them imports this module. The engine links each interface with a getter that
//! hands out only that interface's view of a [`HostState`] (as wasmtime's WASI host code
//! does), so an import can reach nothing but its own context and the call in progress.
//!
//! Invariants:
//! - What every instance of a plugin shares ([`PluginContexts`]) is built once per plugin;
//!   an instance's own state is its [`CallInfo`], limits, WASI context and stderr lines.
//! - The WASI context grants nothing beyond what [`wasi`](crate::plugin::imports::wasi)
//!   documents, and its resource table holds at most the plugin's `handles` limit of entries.
//! - [`CallInfo`] is reset by the runtime before every call.

use std::sync::Arc;

use parking_lot::Mutex;
use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::plugin::imports::cache::{CacheCtx, CacheCtxView};
use crate::plugin::imports::call::{CallInfo, Interrupts};
use crate::plugin::imports::client::{ClientCtx, ClientCtxView};
use crate::plugin::imports::config::{ConfigCtx, ConfigCtxView};
use crate::plugin::imports::events::{EventsCtx, EventsCtxView};
use crate::plugin::imports::log::{LogCtx, LogCtxView};
use crate::plugin::imports::output_limit::GuestOutputLimit;
use crate::plugin::imports::stdio::GuestStderr;
use crate::plugin::imports::wasi::PollView;
use crate::plugin::spec::SandboxLimits;

/// The import contexts of one plugin, shared by all its instances.
#[derive(Clone)]
pub(crate) struct PluginContexts {
    /// The plugin's line budget, shared by its `log` import and every instance's stdio.
    pub output: Arc<GuestOutputLimit>,
    pub limits: SandboxLimits,
    pub cache: Arc<CacheCtx>,
    pub client: Arc<ClientCtx>,
    pub events: Arc<EventsCtx>,
    pub log: Arc<LogCtx>,
    pub config: Arc<ConfigCtx>,
    /// What ends the plugin's calls besides their deadline (shutdown, lease loss).
    pub interrupts: Interrupts,
}

/// The `T` of every plugin `Store`.
pub(crate) struct HostState {
    pub call: CallInfo,
    pub limits: StoreLimits,
    pub interrupts: Interrupts,
    cache: Arc<CacheCtx>,
    client: Arc<ClientCtx>,
    events: Arc<EventsCtx>,
    log: Arc<LogCtx>,
    config: Arc<ConfigCtx>,
    wasi: WasiCtx,
    table: ResourceTable,
    /// The guest's last stderr lines of the current call (a panic message).
    pub stderr: Arc<Mutex<GuestStderr>>,
}

impl HostState {
    pub fn new(contexts: &PluginContexts) -> Self {
        let l = &contexts.limits;
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
        // Every WASI resource the guest holds is an entry here: bounded, so a guest cannot
        // make the host allocate without end by keeping them.
        let mut table = ResourceTable::new();
        table.set_max_capacity(l.handles);
        HostState {
            call: CallInfo::idle(),
            limits,
            interrupts: contexts.interrupts.clone(),
            cache: contexts.cache.clone(),
            client: contexts.client.clone(),
            events: contexts.events.clone(),
            log: contexts.log.clone(),
            config: contexts.config.clone(),
            wasi: crate::plugin::imports::wasi::context(contexts.output.clone(), stderr.clone()),
            table,
            stderr,
        }
    }

    /// The `cache` import's view.
    pub fn cache(&mut self) -> CacheCtxView<'_> {
        CacheCtxView { ctx: &self.cache, call: &self.call }
    }

    /// The `client` import's view.
    pub fn client(&mut self) -> ClientCtxView<'_> {
        ClientCtxView { ctx: &self.client, call: &self.call }
    }

    /// The `events` import's view.
    pub fn events(&mut self) -> EventsCtxView<'_> {
        EventsCtxView { ctx: &self.events, call: &self.call }
    }

    /// The `log` import's view.
    pub fn log(&mut self) -> LogCtxView<'_> {
        LogCtxView { ctx: &self.log, call: &self.call }
    }

    /// The `config` import's view.
    pub fn config(&mut self) -> ConfigCtxView<'_> {
        ConfigCtxView { ctx: &self.config }
    }

    /// `wasi:io/poll`'s view: the resource table, and what bounds its waits.
    pub fn poll(&mut self) -> PollView<'_> {
        PollView { table: &mut self.table, call: &self.call, interrupts: &self.interrupts }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

//! The WASI a plugin gets: which WASI 0.2 interfaces are linked, what each one grants,
//! and the refusal of a component that imports any other.
//!
//! Three sets, by unversioned interface name (a component built against any 0.2.x release
//! links against the host's, as wasmtime matches semver-compatible versions):
//! - [`GRANTED`]: what the standard libraries of Rust (`wasm32-wasip2`), componentize-js
//!   and componentize-py need and get — wall and monotonic clocks, random bytes, io streams
//!   and polling, stdin (always empty), stdout and stderr (lines into the host's log), exit,
//!   an empty environment with no arguments, and the terminal queries (never a terminal).
//! - [`DENIED_AT_CALL`]: what the JavaScript and Python runtimes import although a plugin
//!   needs nothing of it. It is linked so those components load, and grants nothing: the
//!   filesystem has no preopened directory (`get-directories` is empty, so no descriptor can
//!   ever be opened), creating a TCP or UDP socket fails with `access-denied`, and name
//!   lookup fails with `permanent-resolver-failure`.
//! - Every other `wasi:` interface (`wasi:http/*`, `wasi:keyvalue/*`, `wasi:cli/run` as an
//!   import, ...) is not linked: [`ungranted_imports`] names it and the component is refused
//!   by `wasmctrl check` and at load, before anything is instantiated.
//!
//! Invariants: [`add_to_linker`] links exactly `GRANTED` and `DENIED_AT_CALL` (keep the
//! lists and the calls in step: the lists decide what is refused), and [`context`] builds the one WASI context every instance gets: no preopens, no environment,
//! no arguments, no network.
//!
//! Waiting: the one WASI call that blocks is `wasi:io/poll` (`poll` and `pollable.block`,
//! behind every sleep: a monotonic-clock `subscribe-duration` or `subscribe-instant` is
//! waited for there). It is linked through [`PollView`], which waits only until the call's
//! deadline, the host's shutdown or the loss of the leader lease, then traps naming the
//! host call ([`super::call::Interrupts::block_on`]); epoch interruption alone cannot stop a
//! guest blocked in the host. The streams' blocking operations never wait here: stdin is
//! always at its end and stdout and stderr take every write at once (into the log).
//!
//! This module imports nothing of the runtime but [`super::stdio`], [`super::call`] and the
//! plugin's line budget ([`super::output_limit`]).

use std::sync::Arc;

use parking_lot::Mutex;
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::cli::{WasiCli, WasiCliView};
use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView};
use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings;
use wasmtime_wasi::p2::bindings::io::poll as async_poll;
use wasmtime_wasi::random::{WasiRandom, WasiRandomView};
use wasmtime_wasi::sockets::{WasiSockets, WasiSocketsView};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiView};

use super::call::{CallInfo, Interrupts};
use super::output_limit::GuestOutputLimit;
use super::stdio::{GuestOutput, GuestStderr};

/// WASI interfaces linked with a real (read-only or log-only) capability.
pub const GRANTED: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
];

/// WASI interfaces linked so that language runtimes importing them load, granting nothing.
pub const DENIED_AT_CALL: &[&str] = &[
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/ip-name-lookup",
];

/// `wasi:pkg/iface@1.2.3` without its version.
fn unversioned(name: &str) -> &str {
    name.split_once('@').map_or(name, |(n, _)| n)
}

/// Whether the host links `import` (a component import name).
fn is_linked(import: &str) -> bool {
    let name = unversioned(import);
    GRANTED.contains(&name) || DENIED_AT_CALL.contains(&name)
}

/// The `wasi:` imports among `imports` that the host does not link, in order.
pub fn ungranted_imports<'a>(imports: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    imports.into_iter().filter(|i| i.starts_with("wasi:") && !is_linked(i)).map(str::to_owned).collect()
}

/// Why a component importing `ungranted` is refused (the caller names the plugin or file).
pub fn refusal(ungranted: &[String]) -> String {
    format!(
        "imports {}, which the host does not grant: a plugin gets clocks, random, stdio, exit and io \
         streams (the filesystem and sockets only as interfaces that deny every call); build it without \
         that import",
        ungranted.join(", ")
    )
}

/// Links the WASI interfaces of [`GRANTED`] and [`DENIED_AT_CALL`] (synchronous
/// implementations of wasmtime-wasi, each through its own view of `T`'s WASI context;
/// `wasi:io/poll` through the deadline-aware [`PollView`] that `poll` gives).
pub(crate) fn add_to_linker<T: WasiView + 'static>(
    linker: &mut Linker<T>,
    poll: fn(&mut T) -> PollView<'_>,
) -> wasmtime::Result<()> {
    let l = linker;
    bindings::sync::io::error::add_to_linker::<T, HasTable>(l, |t| t.ctx().table)?;
    bindings::sync::io::poll::add_to_linker::<T, HasPoll>(l, poll)?;
    bindings::sync::io::streams::add_to_linker::<T, HasStreams>(l, |t| OffWorker(t.ctx().table))?;

    bindings::clocks::wall_clock::add_to_linker::<T, WasiClocks>(l, T::clocks)?;
    bindings::clocks::monotonic_clock::add_to_linker::<T, WasiClocks>(l, T::clocks)?;
    bindings::random::random::add_to_linker::<T, WasiRandom>(l, T::random)?;
    bindings::random::insecure::add_to_linker::<T, WasiRandom>(l, T::random)?;
    bindings::random::insecure_seed::add_to_linker::<T, WasiRandom>(l, T::random)?;

    bindings::cli::environment::add_to_linker::<T, WasiCli>(l, T::cli)?;
    bindings::cli::exit::add_to_linker::<T, WasiCli>(l, T::cli)?;
    bindings::cli::stdin::add_to_linker::<T, WasiCli>(l, T::cli)?;
    bindings::cli::stdout::add_to_linker::<T, WasiCli>(l, T::cli)?;
    bindings::cli::stderr::add_to_linker::<T, WasiCli>(l, T::cli)?;
    bindings::cli::terminal_input::add_to_linker::<T, WasiCli>(l, T::cli)?;
    bindings::cli::terminal_output::add_to_linker::<T, WasiCli>(l, T::cli)?;
    bindings::cli::terminal_stdin::add_to_linker::<T, WasiCli>(l, T::cli)?;
    bindings::cli::terminal_stdout::add_to_linker::<T, WasiCli>(l, T::cli)?;
    bindings::cli::terminal_stderr::add_to_linker::<T, WasiCli>(l, T::cli)?;

    // Granting nothing: no preopens, and the context disallows TCP, UDP and name lookup.
    bindings::filesystem::preopens::add_to_linker::<T, WasiFilesystem>(l, T::filesystem)?;
    bindings::sync::filesystem::types::add_to_linker::<T, WasiFilesystem>(l, T::filesystem)?;
    bindings::sockets::network::add_to_linker::<T, WasiSockets>(l, &Default::default(), T::sockets)?;
    bindings::sockets::instance_network::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    bindings::sync::sockets::tcp::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    bindings::sockets::tcp_create_socket::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    bindings::sync::sockets::udp::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    bindings::sync::sockets::udp_create_socket::add_to_linker::<T, HasUdpCreate>(l, |t| {
        OffWorker(t.sockets())
    })?;
    bindings::sockets::ip_name_lookup::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    Ok(())
}

/// The io interfaces' host: the store's resource table.
struct HasTable;

/// A host of wasmtime-wasi's synchronous bindings whose calls that wait do so off the
/// runtime's worker. Those calls enter a tokio runtime to wait (`in_tokio`), which panics
/// on a worker thread, where an admission call runs as a future (see
/// [`super::call::CallInfo::yields`]); each is made through [`blocking_wait`], and every
/// other call goes straight through. Used for `wasi:io/streams` (a guest's stdout and
/// stderr writes and the drop of a stream end there) and `wasi:sockets/udp-create-socket`
/// (refused, but after entering the runtime). Every other interface linked here either
/// never waits or takes a resource no plugin can ever hold (a descriptor, a socket).
struct OffWorker<H>(H);

/// `wasi:io/streams` on the store's resource table, waiting off the worker.
struct HasStreams;

impl HasData for HasStreams {
    type Data<'a> = OffWorker<&'a mut ResourceTable>;
}

/// `wasi:sockets/udp-create-socket`, refusing off the worker.
struct HasUdpCreate;

impl HasData for HasUdpCreate {
    type Data<'a> = OffWorker<wasmtime_wasi::sockets::WasiSocketsCtxView<'a>>;
}

mod off_worker {
    use wasmtime::component::Resource;
    use wasmtime_wasi::p2::bindings::sockets::network;
    use wasmtime_wasi::p2::bindings::sync::io::poll::Pollable;
    use wasmtime_wasi::p2::bindings::sync::io::streams::{
        self, Host, HostInputStream, HostOutputStream, InputStream, OutputStream,
    };
    use wasmtime_wasi::p2::bindings::sync::sockets::udp::IpAddressFamily;
    use wasmtime_wasi::p2::bindings::sync::sockets::udp_create_socket;
    use wasmtime_wasi::p2::{SocketError, SocketResult, StreamError, StreamResult, UdpSocket};
    use wasmtime_wasi::sockets::WasiSocketsCtxView;

    use super::OffWorker;
    use crate::plugin::imports::call::blocking_wait;

    type Table<'a> = wasmtime::component::ResourceTable;

    impl Host for OffWorker<&mut Table<'_>> {
        fn convert_stream_error(&mut self, err: StreamError) -> wasmtime::Result<streams::StreamError> {
            Host::convert_stream_error(self.0, err)
        }
    }

    impl HostOutputStream for OffWorker<&mut Table<'_>> {
        fn drop(&mut self, stream: Resource<OutputStream>) -> wasmtime::Result<()> {
            blocking_wait(|| HostOutputStream::drop(self.0, stream))
        }

        fn check_write(&mut self, stream: Resource<OutputStream>) -> StreamResult<u64> {
            HostOutputStream::check_write(self.0, stream)
        }

        fn write(&mut self, stream: Resource<OutputStream>, bytes: Vec<u8>) -> StreamResult<()> {
            HostOutputStream::write(self.0, stream, bytes)
        }

        fn blocking_write_and_flush(
            &mut self,
            stream: Resource<OutputStream>,
            bytes: Vec<u8>,
        ) -> StreamResult<()> {
            blocking_wait(|| HostOutputStream::blocking_write_and_flush(self.0, stream, bytes))
        }

        fn blocking_write_zeroes_and_flush(
            &mut self,
            stream: Resource<OutputStream>,
            len: u64,
        ) -> StreamResult<()> {
            blocking_wait(|| HostOutputStream::blocking_write_zeroes_and_flush(self.0, stream, len))
        }

        fn subscribe(&mut self, stream: Resource<OutputStream>) -> wasmtime::Result<Resource<Pollable>> {
            HostOutputStream::subscribe(self.0, stream)
        }

        fn write_zeroes(&mut self, stream: Resource<OutputStream>, len: u64) -> StreamResult<()> {
            HostOutputStream::write_zeroes(self.0, stream, len)
        }

        fn flush(&mut self, stream: Resource<OutputStream>) -> StreamResult<()> {
            HostOutputStream::flush(self.0, stream)
        }

        fn blocking_flush(&mut self, stream: Resource<OutputStream>) -> StreamResult<()> {
            blocking_wait(|| HostOutputStream::blocking_flush(self.0, stream))
        }

        fn splice(
            &mut self,
            dst: Resource<OutputStream>,
            src: Resource<InputStream>,
            len: u64,
        ) -> StreamResult<u64> {
            HostOutputStream::splice(self.0, dst, src, len)
        }

        fn blocking_splice(
            &mut self,
            dst: Resource<OutputStream>,
            src: Resource<InputStream>,
            len: u64,
        ) -> StreamResult<u64> {
            blocking_wait(|| HostOutputStream::blocking_splice(self.0, dst, src, len))
        }
    }

    impl HostInputStream for OffWorker<&mut Table<'_>> {
        fn drop(&mut self, stream: Resource<InputStream>) -> wasmtime::Result<()> {
            blocking_wait(|| HostInputStream::drop(self.0, stream))
        }

        fn read(&mut self, stream: Resource<InputStream>, len: u64) -> StreamResult<Vec<u8>> {
            HostInputStream::read(self.0, stream, len)
        }

        fn blocking_read(&mut self, stream: Resource<InputStream>, len: u64) -> StreamResult<Vec<u8>> {
            blocking_wait(|| HostInputStream::blocking_read(self.0, stream, len))
        }

        fn skip(&mut self, stream: Resource<InputStream>, len: u64) -> StreamResult<u64> {
            HostInputStream::skip(self.0, stream, len)
        }

        fn blocking_skip(&mut self, stream: Resource<InputStream>, len: u64) -> StreamResult<u64> {
            blocking_wait(|| HostInputStream::blocking_skip(self.0, stream, len))
        }

        fn subscribe(&mut self, stream: Resource<InputStream>) -> wasmtime::Result<Resource<Pollable>> {
            HostInputStream::subscribe(self.0, stream)
        }
    }

    // The error conversions `udp-create-socket` needs: `wasi:sockets/network`'s, as they are.
    impl network::Host for OffWorker<WasiSocketsCtxView<'_>> {
        fn convert_error_code(&mut self, error: SocketError) -> wasmtime::Result<network::ErrorCode> {
            network::Host::convert_error_code(&mut self.0, error)
        }

        fn network_error_code(
            &mut self,
            err: Resource<network::Error>,
        ) -> wasmtime::Result<Option<network::ErrorCode>> {
            network::Host::network_error_code(&mut self.0, err)
        }
    }

    impl network::HostNetwork for OffWorker<WasiSocketsCtxView<'_>> {
        fn drop(&mut self, this: Resource<network::Network>) -> wasmtime::Result<()> {
            network::HostNetwork::drop(&mut self.0, this)
        }
    }

    impl udp_create_socket::Host for OffWorker<WasiSocketsCtxView<'_>> {
        fn create_udp_socket(
            &mut self,
            address_family: IpAddressFamily,
        ) -> SocketResult<Resource<UdpSocket>> {
            blocking_wait(|| udp_create_socket::Host::create_udp_socket(&mut self.0, address_family))
        }
    }
}

impl HasData for HasTable {
    type Data<'a> = &'a mut ResourceTable;
}

/// `wasi:io/poll` of one instance: wasmtime-wasi's, on the instance's resource table, with
/// every wait bounded by the call in progress (see the module's description).
pub(crate) struct PollView<'a> {
    pub table: &'a mut ResourceTable,
    pub call: &'a CallInfo,
    pub interrupts: &'a Interrupts,
}

/// The poll interface's host: a [`PollView`].
struct HasPoll;

impl HasData for HasPoll {
    type Data<'a> = PollView<'a>;
}

impl bindings::sync::io::poll::Host for PollView<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        let table = &mut *self.table;
        self.interrupts.block_on("wasi:io/poll.poll", self.call.deadline, async move {
            async_poll::Host::poll(table, pollables).await
        })
    }
}

impl bindings::sync::io::poll::HostPollable for PollView<'_> {
    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        // Never waits: one look at the pollable.
        bindings::sync::io::poll::HostPollable::ready(&mut *self.table, pollable)
    }

    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        let table = &mut *self.table;
        self.interrupts.block_on("wasi:io/poll.pollable.block", self.call.deadline, async move {
            async_poll::HostPollable::block(table, pollable).await
        })
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        bindings::sync::io::poll::HostPollable::drop(&mut *self.table, pollable)
    }
}

/// The WASI context of one instance: stdout and stderr into the log within the plugin's
/// line budget `limit` (the last stderr lines also into `stderr`), nothing else.
pub(crate) fn context(limit: Arc<GuestOutputLimit>, stderr: Arc<Mutex<GuestStderr>>) -> WasiCtx {
    WasiCtxBuilder::new()
        .stdout(GuestOutput::stdout(limit.clone()))
        .stderr(GuestOutput::stderr(limit, stderr))
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_do_not_matter_and_others_are_ungranted() {
        let imports = [
            "wasi:io/streams@0.2.6",
            "wasi:filesystem/preopens@0.2.10",
            "wasi:sockets/tcp@0.2.9",
            "wasi:http/outgoing-handler@0.2.0",
            "wasmctrl:controller/cache@0.2.0",
            "wasi:keyvalue/store",
        ];
        assert_eq!(ungranted_imports(imports), ["wasi:http/outgoing-handler@0.2.0", "wasi:keyvalue/store"]);
        let why = refusal(&ungranted_imports(imports));
        assert!(why.contains("wasi:http/outgoing-handler@0.2.0, wasi:keyvalue/store"), "{why}");
    }
}

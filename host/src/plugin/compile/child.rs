//! Compiling a component in a child process: the host hands the `.wasm` to a program (the
//! `wasmctrl` binary's hidden `compile-component` command) on its stdin and reads the
//! compiled artifact from its stdout.
//!
//! Why: a compile in the host leaves memory behind. The optimising compiler's code in the
//! host binary stays resident once it has run, and the compile's heap fragments the
//! host's; the `many_plugins` benchmark's cold and warm rows (100 distinct plugins compiled
//! at start-up, or loaded from a warm compile cache) measure what is left. A child takes
//! what it used with it when it exits, and a compiler crash cannot take the host down.
//!
//! The component is a plugin author's: hostile input to the compiler. The child is where
//! what that input can make a compile do is bounded.
//!
//! Invariants:
//! - The child builds its engine from [`CompileSettings`], the compile-relevant part of
//!   the host's [`EngineConfig`], with the same function the host uses for its own
//!   engines.
//! - Its output is authenticated like a compile cache artifact: the host sends a fresh
//!   random key with each component (on stdin, never in the arguments or environment, which
//!   other local users can read) and takes the artifact only if it ends with the child's
//!   engine fingerprint and an HMAC-SHA256, under that key, of the fingerprint, the SHA-256
//!   of the component the host sent and the artifact. So the artifact is for this host's
//!   engine (the full fingerprint, not a short hash: a child of another wasmctrl build is
//!   refused), of these bytes, whole, and written by the process that read this request.
//!   The cache key never reaches the child.
//! - Bounds ([`CompileLimits`]): the child is killed (`SIGKILL` through a pidfd, so never
//!   another process that reused its pid) when it runs past the time limit or writes more
//!   than the output limit; its address space, CPU time, open files and core dumps are
//!   limited (`setrlimit`), it can create no file (`RLIMIT_FSIZE` 0), gains no privileges
//!   (`PR_SET_NO_NEW_PRIVS`), dies with the host (`PR_SET_PDEATHSIG`) and gets an empty
//!   environment. It is not a privilege boundary (it runs as the host's uid): it bounds the
//!   time, memory and output a component can make a compile take, and keeps a compiler
//!   crash out of the host.
//! - Outcomes ([`ChildFailure`]): a child that cannot run, or runs another build, is
//!   [`ChildFailure::Unavailable`]: the caller compiles in its own process. A component the
//!   compiler refuses is [`ChildFailure::DoesNotCompile`] (Winch refusing leaves it to
//!   Cranelift, in a child too). A component whose compile crashed the child, ran out of a
//!   limit or of time, is [`ChildFailure::Refused`]: the load fails with that reason and the
//!   component is never compiled in the host (what it did to the child it would do to the
//!   host).
//! - Both compilers run here: Cranelift for every optimised compile, Winch for tier-up's
//!   baseline code ([`CompileSettings::winch`]).

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wasmtime::{Engine, InstanceAllocationStrategy};

use super::compile_cache::EngineFingerprint;
use super::settings::{CompileLimits, EngineConfig, EngineTuning, wasm_config};
use crate::plugin::PluginError;

/// The hidden command of the `wasmctrl` binary that serves a compile.
pub const COMMAND: &str = "compile-component";

/// The child's exit status when the component itself does not compile.
pub const EXIT_DOES_NOT_COMPILE: i32 = 3;

/// What starts the host's request on the child's stdin.
const REQUEST_MAGIC: &[u8; 8] = b"wcc-req1";
/// What ends the child's output, between the fingerprint and the MAC.
const OUTPUT_MAGIC: &[u8; 8] = b"wcc-out1";
const KEY_LEN: usize = 32;
const MAC_LEN: usize = 32;
const FINGERPRINT_LEN: usize = 64;
const TRAILER_LEN: usize = FINGERPRINT_LEN + OUTPUT_MAGIC.len() + MAC_LEN;
/// What the MAC of the child's output covers first (a cache artifact's MAC has another).
const DOMAIN: &[u8] = b"wasmctrl compile-component output v1\0";
/// How much of the child's stderr is kept for an error message.
const STDERR_KEPT: usize = 16 << 10;

type HmacSha256 = Hmac<Sha256>;

/// What of an [`EngineConfig`] decides the compiled code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompileSettings {
    epoch_interruption: bool,
    max_wasm_stack: usize,
    memory_reservation: Option<u64>,
    memory_guard_size: Option<u64>,
    /// Winch (the baseline compiler of tier-up) instead of Cranelift.
    #[serde(default)]
    winch: bool,
    /// Cranelift's intra-module inlining ([`EngineTuning::inlining`]).
    #[serde(default)]
    inlining: bool,
}

impl CompileSettings {
    pub(crate) fn of(config: &EngineConfig) -> Self {
        CompileSettings {
            epoch_interruption: config.tuning.epoch_interruption,
            max_wasm_stack: config.max_wasm_stack,
            memory_reservation: config.tuning.memory_reservation,
            memory_guard_size: config.tuning.memory_guard_size,
            winch: false,
            inlining: config.tuning.inlining,
        }
    }

    /// The same settings for Winch, the baseline compiler.
    pub(crate) fn winch(&self) -> Self {
        CompileSettings { winch: true, ..self.clone() }
    }

    /// The engine a compile runs in: the host's configuration for these settings, without
    /// an instance pool (nothing runs in it).
    pub(crate) fn compile_engine(&self) -> Result<Engine, PluginError> {
        let config = EngineConfig {
            max_wasm_stack: self.max_wasm_stack,
            tuning: EngineTuning {
                memory_reservation: self.memory_reservation,
                memory_guard_size: self.memory_guard_size,
                epoch_interruption: self.epoch_interruption,
                inlining: self.inlining,
            },
            pooling: None,
            ..EngineConfig::default()
        };
        let mut wasm = wasm_config(&config);
        wasm.allocation_strategy(InstanceAllocationStrategy::OnDemand);
        if self.winch {
            wasm.strategy(wasmtime::Strategy::Winch);
        }
        Engine::new(&wasm).map_err(|e| PluginError::Engine(format!("{e:#}")))
    }
}

/// Whether `a` and `b` load each other's artifacts (their fingerprints agree).
pub(crate) fn compatible(a: &Engine, b: &Engine) -> bool {
    EngineFingerprint::of(a) == EngineFingerprint::of(b)
}

/// Why the child did not hand over an artifact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChildFailure {
    /// The program could not be used (not started, another build, unreadable output): the
    /// component may be compiled elsewhere.
    #[error("{0}")]
    Unavailable(String),
    /// The compiler refused the component (Winch may refuse what Cranelift compiles).
    #[error("{0}")]
    DoesNotCompile(String),
    /// The component's compile broke a limit or crashed the child: it must not be compiled
    /// anywhere else either.
    #[error("{0}")]
    Refused(String),
}

fn mac(key: &[u8], fingerprint: &[u8], wasm_hash: &[u8], artifact: &[u8]) -> HmacSha256 {
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(DOMAIN);
    for field in [fingerprint, wasm_hash] {
        mac.update(&(field.len() as u64).to_le_bytes());
        mac.update(field);
    }
    mac.update(artifact);
    mac
}

/// Compiles `wasm` by running `program compile-component SETTINGS` under `limits`; the
/// artifact, if the child compiled it for an engine of fingerprint `expected` and its
/// output authenticates.
pub(crate) fn compile_in_child(
    program: &Path,
    settings: &CompileSettings,
    expected: &EngineFingerprint,
    limits: &CompileLimits,
    wasm: &[u8],
) -> Result<Vec<u8>, ChildFailure> {
    let unavailable = |m: String| ChildFailure::Unavailable(m);
    let settings =
        serde_json::to_string(settings).map_err(|e| unavailable(format!("encoding the settings: {e}")))?;
    let mut key = [0u8; KEY_LEN];
    rand::TryRngCore::try_fill_bytes(&mut rand::rngs::OsRng, &mut key)
        .map_err(|e| unavailable(format!("drawing a key: {e}")))?;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from) as u64;
    let rlimits = ChildRlimits {
        memory: limits.memory,
        // A backstop to the wall-clock limit: the compile spreads over every core.
        cpu_seconds: limits.timeout.as_secs().saturating_add(1).saturating_mul(cpus).saturating_add(1),
    };
    let mut command = Command::new(program);
    command
        .arg(COMMAND)
        .arg(&settings)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the child between fork and exec, and calls only
    // `setrlimit` and `prctl`, which are async-signal-safe; it allocates nothing.
    unsafe { command.pre_exec(move || rlimits.apply()) };
    let mut child =
        command.spawn().map_err(|e| unavailable(format!("starting {}: {e}", program.display())))?;
    // Opened before anyone waits for the child: the pid cannot be reused while it is open.
    let pidfd = rustix::process::Pid::from_child(&child);
    let pidfd = rustix::process::pidfd_open(pidfd, rustix::process::PidfdFlags::empty());
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (Some(mut stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(unavailable("no pipes to the compile program".into()));
    };
    let mut request = Vec::with_capacity(REQUEST_MAGIC.len() + KEY_LEN + 8);
    request.extend_from_slice(REQUEST_MAGIC);
    request.extend_from_slice(&key);
    request.extend_from_slice(&(wasm.len() as u64).to_le_bytes());
    let max_read = limits.max_output.saturating_add(TRAILER_LEN as u64);
    let pidfd = pidfd.ok();
    let (output, status, written, stderr_text, killed_for) = std::thread::scope(|s| {
        let pidfd = pidfd.as_ref();
        // Each pipe has a thread of its own, so none can fill up and stall the child.
        let writer = s.spawn(move || stdin.write_all(&request).and_then(|()| stdin.write_all(wasm)));
        let reader = s.spawn(move || {
            let mut out = Vec::new();
            let read = stdout.take(max_read.saturating_add(1)).read_to_end(&mut out);
            let over = out.len() as u64 > max_read;
            if over {
                // It would block on the full pipe, or write on: stopped here.
                pidfd.inspect(|fd| kill(fd));
            }
            (out, read, over)
        });
        let errors = s.spawn(move || {
            let mut text = Vec::new();
            let _ = stderr.take(STDERR_KEPT as u64).read_to_end(&mut text);
            text
        });
        // Without a pidfd (a kernel before 5.3) the time limit rests on `RLIMIT_CPU`.
        let timed_out = pidfd.is_some_and(|fd| !wait_exit(fd, Instant::now() + limits.timeout));
        let status = child.wait();
        let (out, read, over) = reader.join().unwrap_or_else(|_| (Vec::new(), Ok(0), false));
        let written = writer.join().unwrap_or(Ok(()));
        let stderr_text = errors.join().unwrap_or_default();
        let killed_for = if over {
            Some(Killed::Output)
        } else if timed_out {
            Some(Killed::Timeout)
        } else {
            None
        };
        ((out, read), status, written, stderr_text, killed_for)
    });
    let stderr_text = String::from_utf8_lossy(&stderr_text).trim().to_owned();
    let status = status.map_err(|e| unavailable(format!("waiting for {}: {e}", program.display())))?;
    if let Some(reason) = killed_for {
        return Err(ChildFailure::Refused(match reason {
            Killed::Timeout => format!(
                "compiling took longer than the compile timeout of {:?}: the compile process was killed",
                limits.timeout
            ),
            Killed::Output => format!(
                "the compiled code is larger than the limit of {} bytes: the compile process was killed",
                limits.max_output
            ),
        }));
    }
    let (output, read) = output;
    if let Some(signal) = status.signal() {
        let what = match signal {
            libc::SIGXCPU => "it ran out of CPU time".to_owned(),
            libc::SIGKILL => "it was killed (out of memory, or by someone else)".to_owned(),
            libc::SIGABRT => format!(
                "it aborted (an allocation over its address-space limit of {} bytes, or a compiler error)",
                limits.memory
            ),
            libc::SIGSEGV | libc::SIGBUS => "it crashed".to_owned(),
            other => format!("it was stopped by signal {other}"),
        };
        return Err(ChildFailure::Refused(format!(
            "compiling this component broke the compile process: {what}{}",
            if stderr_text.is_empty() { String::new() } else { format!(": {stderr_text}") }
        )));
    }
    match status.code() {
        Some(0) => {}
        Some(EXIT_DOES_NOT_COMPILE) => {
            let reason = stderr_text.strip_prefix("error: ").unwrap_or(&stderr_text).to_owned();
            return Err(ChildFailure::DoesNotCompile(reason));
        }
        _ => {
            return Err(unavailable(format!("{} exited with {status}: {stderr_text}", program.display())));
        }
    }
    read.map_err(|e| unavailable(format!("reading the artifact: {e}")))?;
    // An output that authenticates answers the whole request (its MAC covers the hash of
    // what the child read), whatever became of the writes; one that does not says why.
    verify_output(output, &key, expected, wasm).map_err(|e| {
        let unsent =
            written.err().map(|w| format!(" (writing the component failed: {w})")).unwrap_or_default();
        unavailable(format!("{}: {e}{unsent}", program.display()))
    })
}

/// Why the host killed the child.
enum Killed {
    Timeout,
    Output,
}

/// Waits until the child behind `pidfd` exits, at most until `deadline`, then kills it.
/// Whether it exited by itself.
fn wait_exit(pidfd: &OwnedFd, deadline: Instant) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            kill(pidfd);
            return false;
        }
        let timeout = rustix::event::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            // Readable: the process exited.
            Ok(n) if n > 0 => return true,
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return true,
        }
    }
}

fn kill(pidfd: &OwnedFd) {
    let _ = rustix::process::pidfd_send_signal(pidfd.as_fd(), rustix::process::Signal::KILL);
}

/// The artifact in the child's `output`, once its trailer authenticates.
fn verify_output(
    mut output: Vec<u8>,
    key: &[u8],
    expected: &EngineFingerprint,
    wasm: &[u8],
) -> Result<Vec<u8>, String> {
    let Some(body_len) = output.len().checked_sub(TRAILER_LEN).filter(|n| *n > 0) else {
        return Err("no artifact in the output".to_owned());
    };
    let (body, trailer) = output.split_at(body_len);
    let (fingerprint, rest) = trailer.split_at(FINGERPRINT_LEN);
    let (magic, tag) = rest.split_at(OUTPUT_MAGIC.len());
    if magic != OUTPUT_MAGIC {
        return Err("its output does not end as a compile-component output does".to_owned());
    }
    if fingerprint != expected.as_str().as_bytes() {
        return Err(format!(
            "it compiles for another engine (fingerprint {}, this host {})",
            String::from_utf8_lossy(fingerprint),
            expected.as_str()
        ));
    }
    let wasm_hash = hex::encode(Sha256::digest(wasm));
    mac(key, fingerprint, wasm_hash.as_bytes(), body).verify_slice(tag).map_err(|_| {
        "its output fails authentication (not the answer to this request, or altered)".to_owned()
    })?;
    output.truncate(body_len);
    Ok(output)
}

/// Resource limits set in the child before it runs the compile program.
#[derive(Clone, Copy)]
struct ChildRlimits {
    memory: u64,
    cpu_seconds: u64,
}

impl ChildRlimits {
    /// Runs in the forked child: only async-signal-safe calls.
    fn apply(self) -> std::io::Result<()> {
        let set = |resource, value: u64| {
            let limit = libc::rlimit { rlim_cur: value as libc::rlim_t, rlim_max: value as libc::rlim_t };
            // SAFETY: `setrlimit` with a valid resource and a pointer to a live `rlimit`.
            if unsafe { libc::setrlimit(resource, &limit) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        set(libc::RLIMIT_AS, self.memory)?;
        set(libc::RLIMIT_CPU, self.cpu_seconds)?;
        set(libc::RLIMIT_FSIZE, 0)?;
        set(libc::RLIMIT_CORE, 0)?;
        set(libc::RLIMIT_NOFILE, 64)?;
        // SAFETY: `prctl` with these options takes plain integers.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Why [`serve_compile`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The component does not compile (exit [`EXIT_DOES_NOT_COMPILE`]).
    #[error("{0}")]
    DoesNotCompile(String),
    /// Anything else: bad settings or request, an engine that cannot be built, a broken pipe.
    #[error("{0}")]
    Other(String),
}

impl ServeError {
    /// The exit status the child reports this with.
    pub fn exit_code(&self) -> u8 {
        match self {
            ServeError::DoesNotCompile(_) => EXIT_DOES_NOT_COMPILE as u8,
            ServeError::Other(_) => 1,
        }
    }
}

/// The child's side: reads the host's request (key and component) from `input`, compiles
/// the component with `settings` (the JSON the host passed), writes the artifact, its
/// engine's fingerprint and the MAC (see the module's invariants) to `output`.
pub fn serve_compile(settings: &str, mut input: impl Read, mut output: impl Write) -> Result<(), ServeError> {
    let other = |m: String| ServeError::Other(m);
    let settings: CompileSettings =
        serde_json::from_str(settings).map_err(|e| other(format!("compile settings {settings:?}: {e}")))?;
    let engine = settings.compile_engine().map_err(|e| other(e.to_string()))?;
    let mut header = [0u8; REQUEST_MAGIC.len() + KEY_LEN + 8];
    input.read_exact(&mut header).map_err(|e| other(format!("reading the request: {e}")))?;
    let (magic, rest) = header.split_at(REQUEST_MAGIC.len());
    let (key, len) = rest.split_at(KEY_LEN);
    if magic != REQUEST_MAGIC {
        return Err(other("the request is not a compile-component request".to_owned()));
    }
    let len = u64::from_le_bytes(len.try_into().map_err(|_| other("short request".to_owned()))?);
    let mut wasm = Vec::new();
    input.take(len).read_to_end(&mut wasm).map_err(|e| other(format!("reading the component: {e}")))?;
    if wasm.len() as u64 != len {
        return Err(other(format!("the component ended after {} of {len} bytes", wasm.len())));
    }
    let artifact =
        engine.precompile_component(&wasm).map_err(|e| ServeError::DoesNotCompile(format!("{e:#}")))?;
    let fingerprint = EngineFingerprint::of(&engine);
    let wasm_hash = hex::encode(Sha256::digest(&wasm));
    let tag =
        mac(key, fingerprint.as_str().as_bytes(), wasm_hash.as_bytes(), &artifact).finalize().into_bytes();
    output
        .write_all(&artifact)
        .and_then(|()| output.write_all(fingerprint.as_str().as_bytes()))
        .and_then(|()| output.write_all(OUTPUT_MAGIC))
        .and_then(|()| output.write_all(&tag))
        .and_then(|()| output.flush())
        .map_err(|e| other(format!("writing the artifact: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(key: &[u8; KEY_LEN], wasm: &[u8]) -> Vec<u8> {
        let mut r = REQUEST_MAGIC.to_vec();
        r.extend_from_slice(key);
        r.extend_from_slice(&(wasm.len() as u64).to_le_bytes());
        r.extend_from_slice(wasm);
        r
    }

    #[test]
    fn the_childs_artifact_authenticates_and_loads_into_a_host_engine_of_the_same_settings() {
        let config = EngineConfig { pooling: None, ..EngineConfig::default() };
        let settings = CompileSettings::of(&config);
        let json = serde_json::to_string(&settings).unwrap();
        let wasm = wasmctrl_testkit::guests::wasm("test-plugin-panic");
        let key = [7u8; KEY_LEN];
        let mut out = Vec::new();
        serve_compile(&json, request(&key, &wasm).as_slice(), &mut out).unwrap();

        let host = Engine::new(&wasm_config(&config)).unwrap();
        let fingerprint = EngineFingerprint::of(&host);
        let artifact = verify_output(out.clone(), &key, &fingerprint, &wasm).unwrap();
        // SAFETY: an artifact `precompile_component` just produced.
        unsafe { wasmtime::component::Component::deserialize(&host, &artifact) }.unwrap();

        // Another key, other bytes, a changed artifact, another engine: refused.
        assert!(
            verify_output(out.clone(), &[8u8; KEY_LEN], &fingerprint, &wasm)
                .unwrap_err()
                .contains("authentication")
        );
        assert!(
            verify_output(out.clone(), &key, &fingerprint, b"other").unwrap_err().contains("authentication")
        );
        let mut altered = out.clone();
        altered[100] ^= 1;
        assert!(verify_output(altered, &key, &fingerprint, &wasm).unwrap_err().contains("authentication"));
        let other = CompileSettings { epoch_interruption: false, ..settings };
        let other = EngineFingerprint::of(&other.compile_engine().unwrap());
        assert!(verify_output(out, &key, &other, &wasm).unwrap_err().contains("another engine"));
    }

    #[test]
    fn a_component_that_does_not_compile_is_its_own_exit_status() {
        let json = serde_json::to_string(&CompileSettings::of(&EngineConfig::default())).unwrap();
        let err =
            serve_compile(&json, request(&[0; KEY_LEN], b"\0asm\x0d\0\x01\0junk").as_slice(), Vec::new())
                .unwrap_err();
        assert!(matches!(err, ServeError::DoesNotCompile(_)), "{err:?}");
        assert_eq!(i32::from(err.exit_code()), EXIT_DOES_NOT_COMPILE);
        let err = serve_compile(
            &json,
            &b"not a request at all....................................."[..],
            Vec::new(),
        )
        .unwrap_err();
        assert!(matches!(err, ServeError::Other(_)), "{err:?}");
    }

    #[test]
    fn a_program_that_cannot_run_fails_or_writes_nothing_is_unavailable() {
        let settings = CompileSettings::of(&EngineConfig::default());
        let fp = EngineFingerprint::from_text(&"0".repeat(64));
        let limits = CompileLimits::default();
        let missing = compile_in_child(Path::new("/nonexistent/wasmctrl"), &settings, &fp, &limits, b"");
        assert!(
            matches!(&missing, Err(ChildFailure::Unavailable(m)) if m.contains("starting /nonexistent/wasmctrl"))
        );
        let failing = compile_in_child(Path::new("/bin/false"), &settings, &fp, &limits, b"\0asm");
        assert!(
            matches!(&failing, Err(ChildFailure::Unavailable(m)) if m.contains("exited with")),
            "{failing:?}"
        );
        let silent = compile_in_child(Path::new("/bin/true"), &settings, &fp, &limits, b"");
        assert!(
            matches!(&silent, Err(ChildFailure::Unavailable(m)) if m.contains("no artifact")),
            "{silent:?}"
        );
    }
}

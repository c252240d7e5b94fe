//! The sandbox's runtime side, attacked: a plugin sleeping in WASI past its deadline, on
//! shutdown and on the loss of the leader lease; a plugin holding every instance it can;
//! compile cache artifacts tampered with, replayed or planted; a cache directory of
//! another user or open to others; compiles that run too long, write too much or run out of
//! memory. Each attack is refused with a clear error, and a well-behaved plugin in the same
//! host keeps getting instances and completing its calls.
//!
//! Needs the guests built: `cargo xtask build-guests`. The lease test runs on the dev
//! cluster or, with `WASMCTRL_TEST_BACKEND=real`, on a real kube-apiserver.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmctrl::cache::Writer;
use wasmctrl::controller::{Action, ReconcileError, Request};
use wasmctrl::plugin::{
    CacheReader, CompileLimits, EngineConfig, Gvk, Plugin, PluginEngine, PluginEnv, PluginSpec, PoolingLimits,
};
use wasmctrl_testkit::guests::wasm;

fn configmap() -> Gvk {
    Gvk::new("v1", "ConfigMap")
}

fn env() -> PluginEnv {
    let mut caches: HashMap<Gvk, Arc<dyn CacheReader>> = HashMap::new();
    caches.insert(configmap(), Arc::new(Writer::new().reader()));
    PluginEnv { caches, kube: None }
}

fn spec(name: &str, deadline: Duration) -> PluginSpec {
    let mut s = PluginSpec::new(name, configmap());
    s.limits.deadline = deadline;
    s
}

fn engine_with(config: EngineConfig) -> PluginEngine {
    PluginEngine::new(config, None).unwrap_or_else(|e| panic!("engine: {e}"))
}

fn engine() -> PluginEngine {
    engine_with(EngineConfig { epoch_tick: Duration::from_millis(2), ..EngineConfig::default() })
}

fn load(engine: &PluginEngine, crate_name: &str, spec: PluginSpec) -> Plugin {
    Plugin::load(engine, spec, &wasm(crate_name), env())
        .unwrap_or_else(|e| panic!("loading {crate_name}: {e}"))
}

fn req(name: &str) -> Request {
    Request { namespace: Some("default".into()), name: name.into() }
}

/// The reason of a call that must have trapped.
fn trap_reason(result: Result<Action, ReconcileError>) -> String {
    match result {
        Err(ReconcileError::Panic(reason)) => reason,
        other => panic!("expected the call to trap, got {other:?}"),
    }
}

/// Runs `attack` on a thread while a well-behaved plugin of the same engine completes calls;
/// returns what the attack returned once the bystander completed at least `calls` calls.
fn beside_a_bystander<R: Send>(engine: &PluginEngine, calls: usize, attack: impl FnOnce() -> R + Send) -> R {
    let bystander = load(engine, "test-plugin-panic", spec("bystander", Duration::from_secs(5)));
    std::thread::scope(|s| {
        let attacked = s.spawn(attack);
        for i in 0..calls {
            assert_eq!(bystander.reconcile_blocking(&req("fine")), Ok(Action::Done), "bystander call {i}");
        }
        attacked.join().unwrap_or_else(|_| panic!("the attacking call panicked the host thread"))
    })
}

// ---------------------------------------------------------------------------------------
// Deadlines reach into host calls

#[test]
fn a_guest_sleeping_in_wasi_is_ended_at_its_deadline_naming_the_host_call() {
    let engine = engine();
    let sleeper = load(&engine, "test-plugin-adv-sleeper", spec("sleeper", Duration::from_millis(300)));
    let started = Instant::now();
    let reason = beside_a_bystander(&engine, 20, || trap_reason(sleeper.reconcile_blocking(&req("sleep"))));
    assert!(
        reason.contains("deadline exceeded while blocked in wasi:io/poll"),
        "the trap names the host call: {reason}"
    );
    assert!(reason.contains("300ms"), "{reason}");
    assert!(started.elapsed() < Duration::from_secs(60), "ended at the deadline, not after the sleep");
    assert_eq!(sleeper.reconcile_blocking(&req("fine")), Ok(Action::Done), "a fresh instance serves");
}

#[test]
fn shutdown_ends_a_call_blocked_in_a_sleep() {
    let engine = engine();
    // A deadline far enough that only the shutdown can end the sleep in this test's time.
    let sleeper = load(&engine, "test-plugin-adv-sleeper", spec("sleeper", Duration::from_secs(600)));
    let reason = std::thread::scope(|s| {
        let call = s.spawn(|| trap_reason(sleeper.reconcile_blocking(&req("sleep"))));
        // The call holds its instance (whether it is in the sleep yet or about to be).
        while sleeper.pool_counts() != (0, 1) {
            std::thread::yield_now();
        }
        engine.shut_down_calls();
        call.join().unwrap_or_else(|_| panic!("panicked"))
    });
    assert!(reason.contains("the host is shutting down, while blocked in wasi:io/poll"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_leader_lease_ends_a_call_blocked_in_a_sleep() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::Api;
    use kube::api::PostParams;
    use tokio_util::sync::CancellationToken;
    use wasmctrl::controller::leader::{LeaderElectionConfig, LeaderElector};
    use wasmctrl::plugin::KubeServices;

    let cluster = wasmctrl_testkit::TestCluster::start().await.unwrap_or_else(|e| panic!("{e}"));
    let client = cluster.client();
    let ns = cluster.namespace().await.unwrap_or_else(|e| panic!("{e}"));
    let kube = KubeServices::new(client.clone(), tokio::runtime::Handle::current(), "sandbox-runtime");
    let engine = engine();
    let mut env = env();
    env.kube = Some(kube.clone());
    let sleeper = Plugin::load(
        &engine,
        spec("sleeper", Duration::from_secs(600)),
        &wasm("test-plugin-adv-sleeper"),
        env,
    )
    .unwrap_or_else(|e| panic!("{e}"));

    // A leader whose lease loss revokes the plugins' cluster access, as `wasmctrl run` does.
    let config = LeaderElectionConfig {
        lease_duration: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(4),
        retry_period: Duration::from_millis(500),
        ..LeaderElectionConfig::new(&ns, "sandbox-runtime", "replica-a")
    };
    let elector =
        Arc::new(LeaderElector::new(client.clone(), config).unwrap_or_else(|e| panic!("{e}")).on_lost({
            let kube = kube.clone();
            move || kube.revoke()
        }));
    let mut leading = elector.subscribe();
    let run = {
        let elector = elector.clone();
        tokio::spawn(
            async move { elector.run(CancellationToken::new(), |_| std::future::pending::<()>()).await },
        )
    };
    leading.wait_for(|l| *l).await.unwrap_or_else(|e| panic!("{e}"));

    let call = {
        let sleeper = sleeper.clone();
        tokio::task::spawn_blocking(move || trap_reason(sleeper.reconcile_blocking(&req("sleep"))))
    };
    // Someone else takes the lease (optimistic concurrency: retry on conflict).
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    loop {
        let mut lease = leases.get("sandbox-runtime").await.unwrap_or_else(|e| panic!("{e}"));
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some("intruder".into());
        }
        if leases.replace("sandbox-runtime", &PostParams::default(), &lease).await.is_ok() {
            break;
        }
    }
    let reason = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .unwrap_or_else(|_| panic!("the blocked call was not interrupted"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(reason.contains("lost its leader lease, while blocked in wasi:io/poll"), "{reason}");
    let ended = run.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(ended.is_err(), "{ended:?}");
}

// ---------------------------------------------------------------------------------------
// Instance slots are shared fairly

fn slots(instances: u32, per_plugin: u32) -> EngineConfig {
    EngineConfig {
        epoch_tick: Duration::from_millis(2),
        pooling: Some(PoolingLimits { instances, per_plugin, ..PoolingLimits::default() }),
        ..EngineConfig::default()
    }
}

#[test]
fn a_plugin_asking_for_more_instances_than_its_share_is_refused_at_load() {
    let engine = engine_with(slots(16, 4));
    let mut s = spec("greedy", Duration::from_secs(1));
    s.concurrency = 1024;
    let err = Plugin::load(&engine, s, &wasm("test-plugin-adv-slot-hog"), env()).unwrap_err().to_string();
    assert!(
        err.contains("plugin greedy: it needs 1025 instances")
            && err.contains("at most 4 of this host's 16 instance slots")
            && err.contains("concurrency to 3 or less"),
        "{err}"
    );
    assert_eq!(engine.instance_slot_counts(), Some((0, 0, 0)), "nothing of it stays reserved");
}

#[test]
fn plugins_holding_every_instance_they_may_do_not_starve_a_well_behaved_plugin() {
    // Two hogs of 4 instances each take all 8 slots; each loaded plugin's reserved slot
    // still gets a plugin loaded after them its instance, within the hogs' deadlines.
    let cache = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = engine_with(EngineConfig { cache_dir: Some(cache.path().to_owned()), ..slots(8, 4) });
    // Compiled now, so the bystander's later load is a cache read, well within the hogs' calls.
    engine.load_component(&wasm("test-plugin-panic")).unwrap_or_else(|e| panic!("{e}"));
    let hog = |name| {
        let mut s = spec(name, Duration::from_secs(4));
        s.concurrency = 3;
        load(&engine, "test-plugin-adv-slot-hog", s)
    };
    let (a, b) = (hog("hog-a"), hog("hog-b"));
    std::thread::scope(|s| {
        let calls: Vec<_> = [&a, &b]
            .into_iter()
            .flat_map(|p| (0..4).map(move |_| p))
            .map(|p| s.spawn(move || p.reconcile_blocking(&req("hog"))))
            .collect();
        // Every slot is taken by a hog call.
        let give_up = Instant::now() + Duration::from_secs(60);
        while engine.instance_slot_counts().map(|c| c.0) != Some(8) {
            assert!(
                Instant::now() < give_up,
                "the hogs never held every slot: {:?}",
                engine.instance_slot_counts()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // A well-behaved plugin loads and serves meanwhile: its first instance takes its
        // reserved slot as soon as a hog call ends, and no hog gets that slot back.
        let bystander = load(&engine, "test-plugin-panic", spec("bystander", Duration::from_secs(5)));
        for i in 0..20 {
            assert_eq!(bystander.reconcile_blocking(&req("fine")), Ok(Action::Done), "bystander call {i}");
        }
        for c in calls {
            match c.join().unwrap_or_else(|_| panic!("panicked")) {
                Err(ReconcileError::Panic(reason)) => assert!(reason.contains("deadline"), "{reason}"),
                other => panic!("a hog call ended as {other:?}"),
            }
        }
    });
    // The trapped instances gave their slots back; each hog keeps its reserved one.
    assert_eq!(engine.instance_slot_counts(), Some((0, 2, 2)));
}

// ---------------------------------------------------------------------------------------
// The compile cache loads only what this host wrote for that name

fn cached_engine(dir: &Path) -> PluginEngine {
    engine_with(EngineConfig { cache_dir: Some(dir.to_owned()), pooling: None, ..EngineConfig::default() })
}

fn artifact_of(dir: &Path, wasm_bytes: &[u8]) -> PathBuf {
    use sha2::Digest;
    let hash = hex::encode(sha2::Sha256::digest(wasm_bytes));
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&hash)))
        .unwrap_or_else(|| panic!("no artifact for {hash}"))
}

#[test]
fn a_tampered_replayed_or_planted_artifact_is_never_loaded_and_is_compiled_again() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (victim, other) = (wasm("test-plugin-panic"), wasm("test-plugin-adv-sleeper"));
    {
        let engine = cached_engine(dir.path());
        engine.load_component(&victim).unwrap_or_else(|e| panic!("{e}"));
        engine.load_component(&other).unwrap_or_else(|e| panic!("{e}"));
    }
    let victim_path = artifact_of(dir.path(), &victim);
    let other_path = artifact_of(dir.path(), &other);
    let attacks: [(&str, &dyn Fn()); 4] = [
        // Another plugin's valid artifact under the victim's name.
        ("mac", &|| {
            std::fs::copy(&other_path, &victim_path).unwrap_or_else(|e| panic!("{e}"));
        }),
        // Garbage.
        ("unauthenticated", &|| {
            std::fs::write(&victim_path, b"\x7fELF garbage").unwrap_or_else(|e| panic!("{e}"))
        }),
        // A symbolic link to the other plugin's artifact.
        ("not-regular", &|| {
            std::fs::remove_file(&victim_path).unwrap_or_else(|e| panic!("{e}"));
            std::os::unix::fs::symlink(&other_path, &victim_path).unwrap_or_else(|e| panic!("{e}"))
        }),
        // One byte of the genuine artifact changed.
        ("mac", &|| {
            let mut bytes = std::fs::read(&victim_path).unwrap_or_default();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
            std::fs::write(&victim_path, &bytes).unwrap_or_else(|e| panic!("{e}"));
        }),
    ];
    for (reason, attack) in attacks {
        // The genuine artifact is in place (stored by the setup or the previous round).
        attack();
        let engine = cached_engine(dir.path());
        let loaded = engine.load_component(&victim).unwrap_or_else(|e| panic!("{reason}: {e}"));
        assert!(!loaded.from_cache, "{reason}: the planted artifact was not loaded, the wasm was compiled");
        assert_eq!(engine.rejected_artifacts(reason), 1, "{reason}: counted");
        assert!(
            engine.load_component(&victim).unwrap_or_else(|e| panic!("{e}")).from_cache,
            "{reason}: replaced"
        );
        let plugin = Plugin::load(&engine, spec("victim", Duration::from_secs(5)), &victim, env())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plugin.reconcile_blocking(&req("fine")), Ok(Action::Done));
    }
    assert!(other_path.exists(), "the link's target was left alone");
}

#[test]
fn a_cache_directory_open_to_others_is_made_private_and_one_of_another_user_is_refused() {
    let base = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let open_dir = base.path().join("open");
    std::fs::create_dir(&open_dir).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777))
        .unwrap_or_else(|e| panic!("{e}"));
    let engine = cached_engine(&open_dir);
    assert_eq!(engine.compile_cache_refusal(), None);
    let mode = std::fs::metadata(&open_dir).unwrap_or_else(|e| panic!("{e}")).permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "group and other access removed before use");

    // SAFETY: `geteuid` reads the process's effective uid.
    let root = unsafe { libc::geteuid() } == 0;
    let theirs = if root {
        let d = base.path().join("theirs");
        std::fs::create_dir(&d).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap_or_else(|e| panic!("{e}"));
        d
    } else {
        PathBuf::from("/")
    };
    let engine = cached_engine(&theirs);
    let refusal = engine.compile_cache_refusal().unwrap_or_else(|| panic!("accepted {}", theirs.display()));
    assert!(refusal.contains("belongs to uid") && refusal.contains("not to this host's uid"), "{refusal}");
    // The host goes on, compiling every load.
    let plugin =
        Plugin::load(&engine, spec("uncached", Duration::from_secs(5)), &wasm("test-plugin-panic"), env())
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.reconcile_blocking(&req("fine")), Ok(Action::Done));
}

// ---------------------------------------------------------------------------------------
// The compile child is bounded, and what broke it is not compiled in the host

fn child_engine(dir: &Path, limits: CompileLimits) -> PluginEngine {
    engine_with(EngineConfig {
        cache_dir: Some(dir.to_owned()),
        pooling: None,
        compile_process: Some(PathBuf::from(env!("CARGO_BIN_EXE_wasmctrl"))),
        compile_limits: limits,
        ..EngineConfig::default()
    })
}

#[test]
fn with_tier_up_the_baseline_compile_runs_in_the_child_under_the_same_limits() {
    let tiered = |dir: &Path, limits| {
        engine_with(EngineConfig {
            cache_dir: Some(dir.to_owned()),
            pooling: None,
            tier_up: true,
            compile_process: Some(PathBuf::from(env!("CARGO_BIN_EXE_wasmctrl"))),
            compile_limits: limits,
            ..EngineConfig::default()
        })
    };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine =
        tiered(dir.path(), CompileLimits { timeout: Duration::from_millis(1), ..CompileLimits::default() });
    assert!(engine.tier_up_enabled());
    let err =
        Plugin::load(&engine, spec("tiered", Duration::from_secs(5)), &wasm("test-plugin-panic"), env())
            .unwrap_err()
            .to_string();
    assert!(err.contains("compile timeout"), "Winch ran in the child, killed at the limit: {err}");
    assert_eq!(engine.component_loads().baseline, 0);

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = tiered(dir.path(), CompileLimits::default());
    let plugin =
        Plugin::load(&engine, spec("tiered", Duration::from_secs(5)), &wasm("test-plugin-panic"), env())
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.tier(), wasmctrl::plugin::Tier::Baseline);
    assert_eq!(plugin.reconcile_blocking(&req("fine")), Ok(Action::Done));
    assert!(engine.wait_for_tier_ups(Duration::from_secs(120)), "the tier-up finished");
    assert_eq!(plugin.reconcile_blocking(&req("fine")), Ok(Action::Done));
    assert_eq!(plugin.tier(), wasmctrl::plugin::Tier::Optimized);
    assert_eq!(engine.component_loads().compiled_in_child, 1, "the tier-up compiled in the child too");
}

#[test]
fn a_compile_past_its_time_output_or_memory_limit_fails_the_load_and_is_not_compiled_in_the_host() {
    let cases = [
        (CompileLimits { timeout: Duration::from_millis(1), ..CompileLimits::default() }, "compile timeout"),
        (
            CompileLimits { max_output: 1024, ..CompileLimits::default() },
            "larger than the limit of 1024 bytes",
        ),
        (CompileLimits { memory: 32 << 20, ..CompileLimits::default() }, "broke the compile process"),
    ];
    for (limits, expected) in cases {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let engine = child_engine(dir.path(), limits);
        let err =
            Plugin::load(&engine, spec("bounded", Duration::from_secs(5)), &wasm("test-plugin-panic"), env())
                .unwrap_err()
                .to_string();
        assert!(err.contains(expected), "{expected}: {err}");
        let loads = engine.component_loads();
        assert_eq!((loads.compiled, loads.compiled_in_child), (0, 0), "{expected}: not compiled anywhere");
    }
    // Within the limits, the child compiles it.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = child_engine(dir.path(), CompileLimits::default());
    let plugin =
        Plugin::load(&engine, spec("bounded", Duration::from_secs(5)), &wasm("test-plugin-panic"), env())
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.reconcile_blocking(&req("fine")), Ok(Action::Done));
    assert_eq!(engine.component_loads().compiled_in_child, 1);
}

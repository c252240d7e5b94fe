//! Admission calls made from a task: on an idle instance they run in the task and yield at
//! each epoch tick, so a plugin that loops does not hold the runtime's worker; a call
//! abandoned half-way destroys its instance. (The webhook server's behaviour, traps and
//! failure policies included, is tested through HTTPS in `tests/admission.rs`.)

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::*;
use crate::plugin::EngineConfig;

fn wasm(crate_name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guests/target/wasm32-wasip2/release")
        .join(format!("{}.wasm", crate_name.replace('-', "_")));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask build-guests`", path.display()))
}

fn configmap() -> Gvk {
    Gvk::new("v1", "ConfigMap")
}

fn admission_plugin() -> Plugin {
    let config =
        EngineConfig { pooling: None, epoch_tick: Duration::from_millis(2), ..EngineConfig::default() };
    let engine = PluginEngine::new(config, None).unwrap_or_else(|e| panic!("engine: {e}"));
    let mut spec = PluginSpec::new("admit-in-task", configmap());
    spec.permissions = spec.permissions.clone().admitting([configmap()]);
    let env = PluginEnv { caches: HashMap::new(), kube: None };
    Plugin::load(&engine, spec, &wasm("test-plugin-admission"), env).unwrap_or_else(|e| panic!("load: {e}"))
}

/// A CREATE of a ConfigMap with `data`.
fn create(data: serde_json::Value) -> AdmissionInput {
    let object = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": "default"},
        "data": data,
    });
    AdmissionInput {
        uid: "uid-1".into(),
        kind: configmap(),
        resource: "configmaps".into(),
        sub_resource: None,
        name: "cm".into(),
        namespace: Some("default".into()),
        operation: AdmissionOperation::Create,
        user: AdmissionUser::default(),
        object: Some(serde_json::to_vec(&object).unwrap_or_default()),
        old_object: None,
        dry_run: false,
        options: None,
    }
}

/// Admits a fine request, so an instance is idle (made off the task, returned to the pool).
async fn warm(plugin: &Plugin) {
    let verdict = plugin
        .validate(create(serde_json::json!({"k": "v"})), Instant::now() + Duration::from_secs(30), None)
        .await;
    assert!(verdict.is_ok_and(|v| v.denial.is_none()), "a fine request is admitted");
    assert_eq!(plugin.pool_counts().0, 1, "one idle instance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_looping_call_in_a_task_leaves_the_worker_to_other_tasks() {
    let plugin = admission_plugin();
    warm(&plugin).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let call = tokio::spawn({
        let plugin = plugin.clone();
        async move { plugin.validate(create(serde_json::json!({"loop": "yes"})), deadline, None).await }
    });
    // The only worker runs the looping call; another task gets it at the call's next tick.
    let other = tokio::spawn(async {});
    other.await.expect("the other task ran");
    assert!(!call.is_finished(), "the other task ran while the call was still looping");
    match call.await.expect("call task") {
        Err(AdmitError::Call(CallError::Trap { reason, .. })) => {
            assert!(reason.contains("admission deadline"), "{reason}");
        }
        other => panic!("expected the deadline's trap, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_abandoned_half_way_destroys_its_instance() {
    let plugin = admission_plugin();
    warm(&plugin).await;
    let call = tokio::spawn({
        let plugin = plugin.clone();
        async move {
            plugin
                .validate(
                    create(serde_json::json!({"loop": "yes"})),
                    Instant::now() + Duration::from_secs(60),
                    None,
                )
                .await
        }
    });
    // Wait until the call holds the idle instance, then drop it at its next yield.
    while plugin.pool_counts().0 != 0 {
        tokio::task::yield_now().await;
    }
    call.abort();
    assert!(call.await.is_err_and(|e| e.is_cancelled()), "the call was cancelled");
    assert_eq!(plugin.pool_counts(), (0, 0), "the interrupted instance is destroyed, not returned");
    let after = plugin
        .validate(create(serde_json::json!({"k": "v"})), Instant::now() + Duration::from_secs(30), None)
        .await;
    assert!(after.is_ok_and(|v| v.denial.is_none()), "the next call gets a fresh instance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_calls_that_wait_work_from_a_call_in_a_task() {
    // stdout and stderr writes, a panic's message and a refused UDP socket all go through
    // WASI calls that wait in a runtime: from a call running on a worker they must wait off
    // it, not panic the host.
    let plugin = admission_plugin();
    let deadline = || Instant::now() + Duration::from_secs(30);
    for _ in 0..2 {
        // The first round makes the instance off the task, the second runs in it.
        let printed = plugin.validate(create(serde_json::json!({"print": "yes"})), deadline(), None).await;
        assert!(printed.is_ok_and(|v| v.denial.is_none()), "a plugin that prints is admitted");
        match plugin.validate(create(serde_json::json!({"udp": "yes"})), deadline(), None).await {
            Ok(GuestVerdict { denial: Some(d), .. }) => {
                assert!(d.message.starts_with("udp refused"), "{}", d.message)
            }
            other => panic!("expected the plugin's refusal, got {other:?}"),
        }
        assert_eq!(plugin.pool_counts().0, 1, "the instance is idle again");
    }
    match plugin.validate(create(serde_json::json!({"panic": "yes"})), deadline(), None).await {
        Err(AdmitError::Call(CallError::Trap { reason, .. })) => {
            assert!(reason.contains("admission panic on purpose"), "{reason}");
        }
        other => panic!("expected the panic's trap, got {other:?}"),
    }
}

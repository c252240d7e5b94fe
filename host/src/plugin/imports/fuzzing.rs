//! The host side of every plugin import (`cache`, `client`, `events`, `log`, `config`) driven
//! with arguments a guest chose, for the fuzz targets (`fuzz/`). Not part of the API (hidden
//! from the docs); re-exported by [`crate::fuzzing`].
//!
//! The harness is one plugin as the runtime builds it: `for` ConfigMaps, `owns` Pods,
//! `permissions.read` Namespaces, `permissions.write` ConfigMaps and Secrets (never readable),
//! a `max-output` of 64 KiB, caches of ConfigMaps (with a `by-app` label index), Pods and
//! Namespaces holding a few objects, and, when given one, cluster access. Each call goes
//! through the same host function a guest's call reaches; a `wasmtime` error (a trap the host
//! raised) is returned as `Err`: no input a guest can pass may make the host trap or panic
//! ([`import_calls`], the `wit_imports` target's check, run by the stable tests too).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::access::Access;
use super::cache::{CacheCtx, CacheCtxView, CacheReader};
use super::call::CallInfo;
use super::client::{ClientCtx, ClientCtxView};
use super::cluster::KubeServices;
use super::config::{ConfigCtx, ConfigCtxView};
use super::events::{EventsCtx, EventsCtxView};
use super::log::{LogCtx, LogCtxView};
use super::output_limit::GuestOutputLimit;
use crate::cache::{IndexFunc, IndexSpec, Writer};
use crate::object::{Object, Transform};
use crate::plugin::bindings::wasmctrl::controller::client::{
    ApplyOptions, DeleteOptions, Host as _, PatchBody, Propagation,
};
use crate::plugin::bindings::wasmctrl::controller::config::Host as _;
use crate::plugin::bindings::wasmctrl::controller::events::{Event, EventType, Host as _};
use crate::plugin::bindings::wasmctrl::controller::log::{Host as _, Level};
use crate::plugin::bindings::wasmctrl::controller::types::{Gvk as WitGvk, ObjectRef};
use crate::plugin::metrics::RuntimeMetrics;
use crate::plugin::spec::{Gvk, Permissions, SandboxLimits};

/// A kind as a guest names it: one the harness knows, or any other.
#[derive(Clone, Debug)]
#[cfg_attr(any(test, feature = "arbitrary"), derive(arbitrary::Arbitrary))]
pub enum Kind {
    ConfigMap,
    Pod,
    Namespace,
    Secret,
    Deployment,
    Other { api_version: String, kind: String },
}

impl Kind {
    fn wit(&self) -> WitGvk {
        let (api_version, kind) = match self {
            Kind::ConfigMap => ("v1", "ConfigMap"),
            Kind::Pod => ("v1", "Pod"),
            Kind::Namespace => ("v1", "Namespace"),
            Kind::Secret => ("v1", "Secret"),
            Kind::Deployment => ("apps/v1", "Deployment"),
            Kind::Other { api_version, kind } => (api_version.as_str(), kind.as_str()),
        };
        WitGvk { api_version: api_version.to_owned(), kind: kind.to_owned() }
    }
}

/// A patch body and how it is to be read.
#[derive(Clone, Debug)]
#[cfg_attr(any(test, feature = "arbitrary"), derive(arbitrary::Arbitrary))]
pub enum Patch {
    Merge(Vec<u8>),
    Json(Vec<u8>),
    Strategic(Vec<u8>),
}

/// One call of an import, with its arguments.
#[derive(Clone, Debug)]
#[cfg_attr(any(test, feature = "arbitrary"), derive(arbitrary::Arbitrary))]
pub enum ImportCall {
    CacheGet {
        kind: Kind,
        namespace: Option<String>,
        name: String,
    },
    CacheList {
        kind: Kind,
        namespace: Option<String>,
        label_selector: Option<String>,
    },
    CacheByIndex {
        kind: Kind,
        index: String,
        value: String,
    },
    ClientGet {
        kind: Kind,
        namespace: Option<String>,
        name: String,
    },
    ClientCreate {
        object: Vec<u8>,
    },
    ClientReplace {
        object: Vec<u8>,
    },
    ClientPatch {
        kind: Kind,
        namespace: Option<String>,
        name: String,
        patch: Patch,
        status: bool,
    },
    ClientApply {
        object: Vec<u8>,
        force: bool,
        dry_run: bool,
        field_manager: Option<String>,
    },
    ClientUpdateStatus {
        object: Vec<u8>,
    },
    ClientDelete {
        kind: Kind,
        namespace: Option<String>,
        name: String,
        uid: Option<String>,
        resource_version: Option<String>,
        propagation: Option<u8>,
    },
    EventsPublish {
        regarding: Kind,
        namespace: Option<String>,
        name: String,
        warning: bool,
        reason: String,
        action: String,
        note: String,
    },
    LogEnabled {
        level: u8,
    },
    Log {
        level: u8,
        message: String,
        fields: Vec<(String, String)>,
    },
    ConfigPluginName,
    ConfigSettings,
}

/// The largest body the harness's plugin may hand the host (its `max-output`).
pub const HARNESS_MAX_OUTPUT: usize = 64 << 10;

/// One plugin's import contexts (see the module doc).
pub struct ImportHarness {
    cache: CacheCtx,
    client: ClientCtx,
    events: EventsCtx,
    log: LogCtx,
    config: ConfigCtx,
}

impl ImportHarness {
    /// The harness; with `kube` (a client and a multi-threaded runtime for its requests) the
    /// `client` and `events` calls reach that cluster, else they fail as a host without
    /// cluster access fails them.
    pub fn new(kube: Option<(kube::Client, tokio::runtime::Handle)>) -> Self {
        let plugin = "fuzzed".to_owned();
        let config_map = Gvk::new("v1", "ConfigMap");
        let pod = Gvk::new("v1", "Pod");
        let namespace = Gvk::new("v1", "Namespace");
        let permissions = Permissions::new(
            [config_map.clone(), pod.clone()],
            [namespace.clone()],
            [config_map.clone(), Gvk::new("v1", "Secret")],
        );
        let limits = SandboxLimits { max_output: HARNESS_MAX_OUTPUT, ..SandboxLimits::default() };
        let metrics = RuntimeMetrics::default();
        let access = Arc::new(Access::new(plugin.clone(), permissions, &limits, metrics.clone()));
        let mut caches: HashMap<Gvk, Arc<dyn CacheReader>> = HashMap::new();
        caches.insert(config_map, cache_of("v1", "ConfigMap", &config_maps(), Some("app")));
        caches.insert(
            pod,
            cache_of("v1", "Pod", &[r#"{"metadata":{"name":"p","namespace":"default"},"spec":{}}"#], None),
        );
        caches.insert(
            namespace,
            cache_of(
                "v1",
                "Namespace",
                &[r#"{"metadata":{"name":"default"}}"#, r#"{"metadata":{"name":"team-a"}}"#],
                None,
            ),
        );
        let kube = kube.map(|(client, runtime)| KubeServices::new(client, runtime, "fuzzed-host"));
        ImportHarness {
            cache: CacheCtx { access: access.clone(), caches },
            client: ClientCtx {
                access: access.clone(),
                field_manager: format!("wasmctrl-{plugin}"),
                kube: kube.clone(),
            },
            events: EventsCtx { access, kube },
            log: LogCtx {
                plugin: plugin.clone(),
                version: "0123456789ab".to_owned(),
                limit: Arc::new(GuestOutputLimit::new(Arc::from(plugin.as_str()), 1_000, metrics)),
            },
            config: ConfigCtx { plugin, settings: Bytes::from_static(br#"{"fuzzed":true}"#) },
        }
    }

    /// Makes `call` as a guest's `reconcile` of `default/cm-0` would, with 2 s left of its
    /// deadline. `Ok`: what the guest got (rendered); `Err`: the host trapped.
    pub fn call(&self, call: ImportCall) -> Result<String, String> {
        let info = CallInfo {
            export: "reconcile",
            request: Some("default/cm-0".to_owned()),
            deadline: Instant::now() + Duration::from_secs(2),
            writes_refused: None,
            yields: false,
        };
        let mut cache = CacheCtxView { ctx: &self.cache, call: &info };
        let mut client = ClientCtxView { ctx: &self.client, call: &info };
        let mut events = EventsCtxView { ctx: &self.events, call: &info };
        let mut log = LogCtxView { ctx: &self.log, call: &info };
        let mut config = ConfigCtxView { ctx: &self.config };
        use crate::plugin::bindings::wasmctrl::controller::cache::Host as _;
        let shown = match call {
            ImportCall::CacheGet { kind, namespace, name } => {
                cache.get(kind.wit(), namespace, name).map(|r| format!("{r:?}"))
            }
            ImportCall::CacheList { kind, namespace, label_selector } => {
                cache.list(kind.wit(), namespace, label_selector).map(|r| format!("{r:?}"))
            }
            ImportCall::CacheByIndex { kind, index, value } => {
                cache.by_index(kind.wit(), index, value).map(|r| format!("{r:?}"))
            }
            ImportCall::ClientGet { kind, namespace, name } => {
                client.get(kind.wit(), namespace, name).map(|r| format!("{r:?}"))
            }
            ImportCall::ClientCreate { object } => client.create(object).map(|r| format!("{r:?}")),
            ImportCall::ClientReplace { object } => client.replace(object).map(|r| format!("{r:?}")),
            ImportCall::ClientPatch { kind, namespace, name, patch, status } => {
                let patch = match patch {
                    Patch::Merge(b) => PatchBody::Merge(b),
                    Patch::Json(b) => PatchBody::Json(b),
                    Patch::Strategic(b) => PatchBody::Strategic(b),
                };
                if status {
                    client.patch_status(kind.wit(), namespace, name, patch)
                } else {
                    client.patch(kind.wit(), namespace, name, patch)
                }
                .map(|r| format!("{r:?}"))
            }
            ImportCall::ClientApply { object, force, dry_run, field_manager } => {
                client.apply(object, ApplyOptions { force, dry_run, field_manager }).map(|r| format!("{r:?}"))
            }
            ImportCall::ClientUpdateStatus { object } => {
                client.update_status(object).map(|r| format!("{r:?}"))
            }
            ImportCall::ClientDelete { kind, namespace, name, uid, resource_version, propagation } => {
                let propagation = propagation.map(|p| match p % 3 {
                    0 => Propagation::Background,
                    1 => Propagation::Foreground,
                    _ => Propagation::Orphan,
                });
                client
                    .delete(kind.wit(), namespace, name, DeleteOptions { uid, resource_version, propagation })
                    .map(|r| format!("{r:?}"))
            }
            ImportCall::EventsPublish { regarding, namespace, name, warning, reason, action, note } => {
                let event = Event {
                    regarding: ObjectRef { kind: regarding.wit(), namespace, name },
                    type_: if warning { EventType::Warning } else { EventType::Normal },
                    reason,
                    action,
                    note,
                };
                events.publish(event).map(|r| format!("{r:?}"))
            }
            ImportCall::LogEnabled { level } => log.enabled(level_of(level)).map(|r| r.to_string()),
            ImportCall::Log { level, message, fields } => {
                log.log(level_of(level), message, fields).map(|()| String::new())
            }
            ImportCall::ConfigPluginName => config.plugin_name(),
            ImportCall::ConfigSettings => config.settings().map(|s| format!("{s:?}")),
        };
        shown.map_err(|trap| format!("{trap:?}"))
    }
}

/// The `wit_imports` target: the calls `data` decodes to (`arbitrary`, at most 8) made in
/// order through `harness`; a trap is a failure (the host side of an import returns an error
/// to the guest for anything it refuses).
#[cfg(any(test, feature = "arbitrary"))]
pub fn import_calls(harness: &ImportHarness, data: &[u8]) {
    let Ok(calls) = arbitrary::Arbitrary::arbitrary_take_rest(arbitrary::Unstructured::new(data)) else {
        return;
    };
    let calls: Vec<ImportCall> = calls;
    for call in calls.into_iter().take(8) {
        if let Err(trap) = harness.call(call.clone()) {
            panic!("{call:?} made the host trap: {trap}");
        }
    }
}

fn level_of(level: u8) -> Level {
    match level % 5 {
        0 => Level::Trace,
        1 => Level::Debug,
        2 => Level::Info,
        3 => Level::Warn,
        _ => Level::Error,
    }
}

fn config_maps() -> Vec<&'static str> {
    vec![
        r#"{"metadata":{"name":"cm-0","namespace":"default","labels":{"app":"web","tier":"a"}},"data":{"k":"v"}}"#,
        r#"{"metadata":{"name":"cm-1","namespace":"default","labels":{"app":"db"}},"data":{}}"#,
        r#"{"metadata":{"name":"cm-2","namespace":"team-a","labels":{"app":"web"},"annotations":{"a":"b"}}}"#,
    ]
}

/// A cache of `kind` holding `objects`, with a label index when `label` is given.
fn cache_of(api_version: &str, kind: &str, objects: &[&str], label: Option<&str>) -> Arc<dyn CacheReader> {
    let writer = Writer::new();
    if let Some(label) = label
        && let Ok(index) = IndexFunc::from_spec(IndexSpec::Label(label.to_owned()))
    {
        let _ = writer.add_indexers([(format!("by-{label}"), index)]);
    }
    writer.replace(
        objects
            .iter()
            .filter_map(|o| {
                Object::from_api_json(o.as_bytes(), Some((api_version, kind)), Transform::default()).ok()
            })
            .map(Arc::new),
    );
    Arc::new(writer.reader())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_reach_the_host_functions_with_the_plugin_grants() {
        let harness = ImportHarness::new(None);
        let got = |call| harness.call(call).unwrap_or_else(|trap| panic!("{trap}"));
        let listed = got(ImportCall::CacheList {
            kind: Kind::ConfigMap,
            namespace: Some("default".into()),
            label_selector: Some("app=web".into()),
        });
        assert!(listed.starts_with("Ok([") && listed.matches("], [").count() == 0, "one object: {listed}");
        let by_index = got(ImportCall::CacheByIndex {
            kind: Kind::ConfigMap,
            index: "by-app".into(),
            value: "web".into(),
        });
        assert!(by_index.starts_with("Ok([["), "{by_index}");
        let secret = got(ImportCall::CacheGet { kind: Kind::Secret, namespace: None, name: "s".into() });
        assert!(secret.starts_with("Err(Error::Forbidden("), "{secret}");
        let offline =
            got(ImportCall::ClientGet { kind: Kind::ConfigMap, namespace: None, name: "cm-0".into() });
        assert!(offline.starts_with("Err(Error::Unavailable("), "{offline}");
        assert_eq!(got(ImportCall::ConfigPluginName), "fuzzed");
        got(ImportCall::Log { level: 7, message: "m".into(), fields: vec![("k".into(), "v".into())] });
    }

    /// A harness whose `client` and `events` reach a dev cluster, as in the fuzz target; one
    /// for the whole test binary.
    fn with_cluster() -> &'static ImportHarness {
        struct World {
            harness: ImportHarness,
            _cluster: wasmctrl_devcluster::DevCluster,
            _runtime: tokio::runtime::Runtime,
        }
        static WORLD: std::sync::OnceLock<World> = std::sync::OnceLock::new();
        &WORLD
            .get_or_init(|| {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap_or_else(|e| panic!("{e}"));
                let cluster = runtime
                    .block_on(wasmctrl_devcluster::DevCluster::start(
                        wasmctrl_devcluster::DevClusterConfig {
                            seed: vec![
                                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm-0, namespace: default}\ndata: {k: v}\n"
                                    .into(),
                            ],
                            ..wasmctrl_devcluster::DevClusterConfig::plain_http()
                        },
                    ))
                    .unwrap_or_else(|e| panic!("{e}"));
                let client = {
                    let _in_runtime = runtime.enter();
                    cluster.client().unwrap_or_else(|e| panic!("{e}"))
                };
                let harness = ImportHarness::new(Some((client, runtime.handle().clone())));
                World { harness, _cluster: cluster, _runtime: runtime }
            })
            .harness
    }

    #[test]
    fn the_seeds_pass_the_fuzz_check_offline_and_against_a_cluster() {
        let offline = ImportHarness::new(None);
        for seed in crate::fuzzing::seeds("wit_imports") {
            import_calls(&offline, &seed);
            import_calls(with_cluster(), &seed);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        #[test]
        fn generated_calls_pass_the_fuzz_check(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            import_calls(with_cluster(), &data);
        }
    }
}

//! The `wit_imports` target: `wasmctrl::fuzzing::import_calls` under libFuzzer. The host side
//! of every plugin import (`cache`, `client`, `events`, `log`, `config`), called with whatever
//! arguments a guest may pass (`arbitrary`): kinds, namespaces, names, selectors, index names,
//! object and patch bodies, apply and delete options, events, log messages and fields. Each
//! call returns what a guest would get, never a panic and never a trap. `client` and `events`
//! reach a dev cluster running in this process, so bodies the host lets through are also read
//! by an API server. The stable tests run the same check on the seeds and generated inputs.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wasmctrl::fuzzing::{ImportHarness, import_calls};

struct World {
    harness: ImportHarness,
    // Kept alive for the harness: the runtime its requests run on and the cluster they reach.
    _cluster: wasmctrl_devcluster::DevCluster,
    _runtime: tokio::runtime::Runtime,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        // Guest log lines are formatted as the host formats them, into nothing.
        let _ = tracing_subscriber::fmt().with_max_level(tracing::Level::TRACE).with_writer(std::io::sink).try_init();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let cluster = runtime
            .block_on(wasmctrl_devcluster::DevCluster::start(wasmctrl_devcluster::DevClusterConfig {
                seed: vec![
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm-0, namespace: default, labels: {app: web}}\ndata: {k: v}\n".into(),
                ],
                ..wasmctrl_devcluster::DevClusterConfig::plain_http()
            }))
            .expect("the dev cluster starts");
        // The client's request buffer runs on the runtime.
        let client = {
            let _in_runtime = runtime.enter();
            cluster.client().expect("a client")
        };
        let harness = ImportHarness::new(Some((client, runtime.handle().clone())));
        World { harness, _cluster: cluster, _runtime: runtime }
    })
}

fuzz_target!(|data: &[u8]| import_calls(&world().harness, data));

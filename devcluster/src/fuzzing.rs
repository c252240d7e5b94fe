//! The dev cluster's HTTP handling driven in-process, for the `devcluster_http` fuzz target
//! (`fuzz/`) and the stable tests that run its check ([`http_requests`]) on its seeds and on
//! generated inputs: requests go through the same router, authentication and handlers as on
//! the network, without a socket. Not part of the API (hidden from the docs).
//!
//! Invariant checked: any sequence of requests gets responses (an object, a list, a watch's
//! events or a `Status`), never a panic, and a failure (4xx/5xx) with a body carries JSON.
//!
//! Each [`Harness`] has a store of its own, seeded with a few objects (a ConfigMap, a Secret,
//! a Deployment, a Pod and a CRD with one custom object), so a sequence of requests can read,
//! patch and delete them.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use futures::{FutureExt, StreamExt};
use hyper::service::Service;
use hyper_util::service::TowerToHyperService;

use crate::server::{self, AppState};
use crate::store::{Snapshot, Store};

/// The token requests must carry (or not, to exercise authentication).
pub const TOKEN: &str = "fuzz-token";

const SEED: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: cm, namespace: default, labels: {app: web}}
data: {k: v}
---
apiVersion: v1
kind: Secret
metadata: {name: s, namespace: default}
stringData: {password: p}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: nginx}]}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: default, labels: {app: web}}
spec: {containers: [{name: c, image: nginx}]}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
    subresources: {status: {}}
"#;

const WIDGET: &str =
    "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w, namespace: default}\nspec: {size: 1}\n";

/// A dev cluster's router over a store of its own.
pub struct Harness {
    service: TowerToHyperService<axum::Router>,
    runtime: tokio::runtime::Runtime,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    /// A fresh store with the seed objects, and the router over it.
    pub fn new() -> Self {
        // The seed is applied once and restored into each new store (much cheaper than
        // parsing and validating it again); it is fixed and valid, so a failure is a bug the
        // fuzz target reports.
        static SEEDED: OnceLock<Snapshot> = OnceLock::new();
        let seeded = SEEDED.get_or_init(|| {
            let store = Store::new(100);
            crate::apply_yaml_to(&store, SEED).unwrap_or_else(|e| panic!("seeding the fuzz harness: {e}"));
            crate::apply_yaml_to(&store, WIDGET).unwrap_or_else(|e| panic!("seeding the fuzz harness: {e}"));
            store.snapshot().unwrap_or_else(|e| panic!("seeding the fuzz harness: {e}"))
        });
        let store = Arc::new(Store::new(100));
        let copy = Snapshot { resource_version: seeded.resource_version, objects: seeded.objects.clone() };
        store.restore(copy).unwrap_or_else(|e| panic!("seeding the fuzz harness: {e}"));
        let state = Arc::new(AppState {
            #[cfg(feature = "faults")]
            faults: crate::faults::Faults::new(store.clone()),
            store,
            token: TOKEN.to_owned(),
            address: "127.0.0.1:6443".to_owned(),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime for the fuzz harness: {e}"));
        Harness { service: TowerToHyperService::new(server::router(state)), runtime }
    }

    /// Serves one request; returns its status code and as much of its body as is ready at
    /// once (a watch's body never ends: its first events are read, then it is dropped).
    pub fn request(&self, request: http::Request<Vec<u8>>) -> (u16, Vec<u8>) {
        self.runtime.block_on(async {
            let response = match self.service.call(request.map(Body::from)).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            let status = response.status().as_u16();
            let mut body = response.into_body().into_data_stream();
            let mut out = Vec::new();
            // What is ready, letting the handler's tasks run once when nothing is.
            let mut waited = false;
            loop {
                match body.next().now_or_never() {
                    Some(Some(Ok(data))) => out.extend_from_slice(&data),
                    Some(Some(Err(_)) | None) => break,
                    None if waited => break,
                    None => {
                        waited = true;
                        tokio::task::yield_now().await;
                    }
                }
            }
            (status, out)
        })
    }
}

/// The `devcluster_http` target: the requests of `data` (at most 16) served in order by a
/// fresh [`Harness`], each failure's body checked to be JSON.
///
/// Input: requests separated by a line `--`; each is `METHOD URI` on its first line, then
/// `Name: value` header lines up to an empty line, then the body. A request without an
/// `Authorization` header gets the harness's token.
pub fn http_requests(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let harness = Harness::new();
    for part in text.split("\n--\n").take(16) {
        let Some(request) = parse_request(part) else { continue };
        let (code, body) = harness.request(request);
        if code >= 400 && !body.is_empty() {
            assert!(
                serde_json::from_slice::<serde_json::Value>(&body).is_ok(),
                "a {code} answer that is not JSON: {:?}",
                String::from_utf8_lossy(&body)
            );
        }
    }
}

/// One request of [`http_requests`]' input; `None` when it is not one.
fn parse_request(text: &str) -> Option<http::Request<Vec<u8>>> {
    let (head, body) = text.split_once("\n\n").unwrap_or((text, ""));
    let mut lines = head.split('\n');
    let (method, uri) = lines.next()?.split_once(' ')?;
    let mut builder = http::Request::builder().method(method).uri(uri);
    let mut authorized = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        authorized |= name.eq_ignore_ascii_case("authorization");
        builder = builder.header(name, value.trim_start());
    }
    if !authorized {
        builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {TOKEN}"));
    }
    builder.body(body.as_bytes().to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn get(path: &str, token: Option<&str>) -> http::Request<Vec<u8>> {
        let mut request = http::Request::get(path);
        if let Some(token) = token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        request.body(Vec::new()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn requests_reach_the_seeded_store_through_authentication() {
        let harness = Harness::new();
        let (code, body) = harness.request(get("/api/v1/namespaces/default/configmaps/cm", Some(TOKEN)));
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
        assert!(String::from_utf8_lossy(&body).contains(r#""k":"v""#));
        let (code, _) =
            harness.request(get("/apis/example.com/v1/namespaces/default/widgets/w", Some(TOKEN)));
        assert_eq!(code, 200);
        assert_eq!(harness.request(get("/api/v1/namespaces/default/configmaps/cm", None)).0, 401);
        // A watch answers its first events and is left.
        let (code, body) = harness
            .request(get("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0", Some(TOKEN)));
        assert_eq!(code, 200);
        assert!(String::from_utf8_lossy(&body).contains("ADDED"), "{}", String::from_utf8_lossy(&body));
    }

    #[test]
    fn the_seeds_pass_the_fuzz_check() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/devcluster_http");
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut count = 0;
        for entry in entries {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            http_requests(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
            count += 1;
        }
        assert!(count > 0, "{} holds no seed", dir.display());
    }

    /// A request of the input format: a method, a path under the seeded objects with a query,
    /// maybe a content type, and a body.
    fn request_text() -> impl Strategy<Value = String> {
        let method = prop_oneof![
            Just("GET"),
            Just("POST"),
            Just("PUT"),
            Just("PATCH"),
            Just("DELETE"),
            Just("OPTIONS")
        ];
        let path = prop_oneof![
            Just("/api/v1/namespaces/default/configmaps"),
            Just("/api/v1/namespaces/default/configmaps/cm"),
            Just("/api/v1/namespaces/default/secrets/s"),
            Just("/apis/apps/v1/namespaces/default/deployments/d"),
            Just("/apis/example.com/v1/namespaces/default/widgets/w"),
            Just("/apis/example.com/v1/namespaces/default/widgets/w/status"),
            Just("/api/v1/pods"),
            Just("/apis"),
            Just("/api/v1/namespaces//configmaps/%zz"),
        ];
        let query = proptest::string::string_regex(
            "(\\?(watch=true|labelSelector=app%3Dweb|fieldSelector=metadata.name!%3D|limit=1|continue=x|resourceVersion=0|fieldManager=f|dryRun=All|force=true|[a-z]{1,6}=[a-z0-9%]{0,6})(&[a-z]{1,6}=[a-z0-9%]{0,4}){0,2})?",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let content_type = prop_oneof![
            Just(""),
            Just("\nContent-Type: application/json"),
            Just("\nContent-Type: application/merge-patch+json"),
            Just("\nContent-Type: application/json-patch+json"),
            Just("\nContent-Type: application/strategic-merge-patch+json"),
            Just("\nContent-Type: application/apply-patch+yaml"),
            Just("\nAuthorization: Bearer wrong"),
        ];
        let body = prop_oneof![
            Just(String::new()),
            Just(r#"{"data":{"k":null,"n":"1"}}"#.to_owned()),
            Just(r#"[{"op":"move","from":"/data/k","path":"/data/x/y"},{"op":"copy","from":"/x","path":"/y"}]"#.to_owned()),
            Just("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\ndata: {a: b}\n".to_owned()),
            proptest::string::string_regex(r#"[\[\]{}:,"a-z0-9/ ]{0,40}"#).unwrap_or_else(|e| panic!("{e}")),
        ];
        (method, path, query, content_type, body).prop_map(|(m, p, q, c, b)| format!("{m} {p}{q}{c}\n\n{b}"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn generated_requests_pass_the_fuzz_check(
            requests in proptest::collection::vec(request_text(), 1..4),
        ) {
            http_requests(requests.join("\n--\n").as_bytes());
        }

        #[test]
        fn any_bytes_pass_the_fuzz_check(data in proptest::collection::vec(any::<u8>(), 0..48)) {
            http_requests(&data);
        }
    }
}

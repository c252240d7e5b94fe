//! "Does the cluster already have what I want?" — a semantic subset check on JSON, so a
//! reconcile writes only when something differs.
//!
//! The API server adds defaults (`protocol: TCP`, `clusterIP`, `terminationMessagePath`)
//! and metadata (`uid`, `resourceVersion`, `managedFields`), so comparing whole objects
//! would see a difference on every pass; writing anyway would bump resourceVersions, send
//! update events and reconcile again forever. [`contains`] treats the desired object as a
//! pattern: every field it sets must be present and equal in the actual one.

use serde_json::Value;

use crate::kind::{parse_json, to_json};
use crate::{Error, Kind};

/// Whether `actual` contains everything `desired` sets.
///
/// - objects: each key of `desired` must match in `actual` (extra keys in `actual` are fine);
///   a `null` in `desired` requires the key to be absent or null;
/// - arrays: same length, and each element contains the desired one at the same index
///   (lists are ordered in Kubernetes: containers, ports, env);
/// - numbers compare by value (`1` equals `1.0`), other scalars by equality.
///
/// This is the `wasmctrl-json-subset` crate's check, the one `wasmctrl test` matches a
/// fixture's expectations with.
pub fn contains(actual: &Value, desired: &Value) -> bool {
    wasmctrl_json_subset::is_subset(desired, actual)
}

/// Whether `actual` lacks something `desired` sets, i.e. whether a write is needed.
pub fn needs_update<K: Kind>(actual: &K, desired: &K) -> Result<bool, Error> {
    let actual: Value = parse_json(&to_json(actual)?)?;
    let desired: Value = parse_json(&to_json(desired)?)?;
    Ok(!contains(&actual, &desired))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
    use serde_json::json;

    #[test]
    fn extra_fields_in_actual_are_fine() {
        let actual = json!({"metadata": {"name": "a", "uid": "u", "labels": {"x": "1", "y": "2"}}, "data": {"k": "v"}});
        assert!(contains(&actual, &json!({"metadata": {"name": "a", "labels": {"x": "1"}}})));
        assert!(!contains(&actual, &json!({"metadata": {"labels": {"x": "2"}}})));
        assert!(!contains(&actual, &json!({"data": {"other": "v"}})));
    }

    #[test]
    fn null_means_absent() {
        assert!(contains(&json!({"a": 1}), &json!({"b": null})));
        assert!(!contains(&json!({"a": 1}), &json!({"a": null})));
    }

    #[test]
    fn arrays_are_ordered_and_sized() {
        let actual = json!({"ports": [{"port": 80, "protocol": "TCP"}, {"port": 443, "protocol": "TCP"}]});
        assert!(contains(&actual, &json!({"ports": [{"port": 80}, {"port": 443}]})));
        assert!(!contains(&actual, &json!({"ports": [{"port": 443}, {"port": 80}]})));
        assert!(!contains(&actual, &json!({"ports": [{"port": 80}]})));
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(contains(&json!(1.0), &json!(1)));
        assert!(!contains(&json!(2), &json!(1)));
        assert!(!contains(&json!("1"), &json!(1)));
    }

    #[test]
    fn server_defaults_do_not_force_a_write() {
        let desired = Service {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(vec![ServicePort { port: 80, ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut actual = desired.clone();
        actual.metadata.uid = Some("u".into());
        let spec = actual.spec.as_mut().unwrap();
        spec.cluster_ip = Some("10.0.0.1".into());
        spec.ports.as_mut().unwrap()[0].protocol = Some("TCP".into());
        assert!(!needs_update(&actual, &desired).unwrap());
        actual.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 8080;
        assert!(needs_update(&actual, &desired).unwrap());
    }
}

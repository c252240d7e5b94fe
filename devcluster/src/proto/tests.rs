use std::collections::BTreeMap;

use k8s_pb::api::apps::v1 as apps;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

use super::*;

/// A body as client-go writes it: the magic, then the envelope around the message.
fn body(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let envelope = Unknown {
        type_meta: Some(TypeMeta { api_version: Some(api_version.into()), kind: Some(kind.into()) }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    [MAGIC.to_vec(), envelope.encode_to_vec()].concat()
}

/// ObjectMeta as Go encodes it: every non-pointer field written, empty or not.
fn meta(name: &str) -> meta::ObjectMeta {
    meta::ObjectMeta {
        name: Some(name.into()),
        generate_name: Some(String::new()),
        namespace: Some("default".into()),
        uid: Some(String::new()),
        resource_version: Some(String::new()),
        generation: Some(0),
        creation_timestamp: Some(meta::Time::default()),
        labels: BTreeMap::from([("app".into(), "web".into())]),
        ..Default::default()
    }
}

#[test]
fn a_deployment_reads_as_its_json_with_go_omitempty() {
    let container = core::Container {
        name: Some("nginx".into()),
        image: Some("nginx".into()),
        stdin: Some(false),
        resources: Some(core::ResourceRequirements::default()),
        ports: vec![core::ContainerPort { container_port: Some(80), ..Default::default() }],
        ..Default::default()
    };
    let volume = core::Volume {
        name: Some("scratch".into()),
        volume_source: Some(core::VolumeSource {
            empty_dir: Some(core::EmptyDirVolumeSource::default()),
            ..Default::default()
        }),
    };
    let deployment = apps::Deployment {
        metadata: Some(meta("web")),
        spec: Some(apps::DeploymentSpec {
            replicas: Some(2),
            selector: Some(meta::LabelSelector {
                match_labels: BTreeMap::from([("app".into(), "web".into())]),
                ..Default::default()
            }),
            template: Some(core::PodTemplateSpec {
                metadata: Some(meta::ObjectMeta {
                    labels: BTreeMap::from([("app".into(), "web".into())]),
                    ..Default::default()
                }),
                spec: Some(core::PodSpec {
                    containers: vec![container],
                    volumes: vec![volume],
                    ..Default::default()
                }),
            }),
            strategy: Some(apps::DeploymentStrategy {
                r#type: Some("RollingUpdate".into()),
                rolling_update: Some(apps::RollingUpdateDeployment {
                    max_surge: Some(IntOrString {
                        r#type: Some(1),
                        str_val: Some("25%".into()),
                        int_val: Some(0),
                    }),
                    max_unavailable: Some(IntOrString { r#type: Some(0), int_val: Some(1), str_val: None }),
                }),
            }),
            ..Default::default()
        }),
        status: Some(apps::DeploymentStatus::default()),
    };
    let v = decode(&body("apps/v1", "Deployment", deployment.encode_to_vec())).unwrap();
    assert_eq!(
        v,
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [{"name": "nginx", "image": "nginx", "resources": {}, "ports": [{"containerPort": 80}]}],
                        "volumes": [{"name": "scratch", "emptyDir": {}}],
                    },
                },
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
            },
            "status": {},
        })
    );
}

#[test]
fn secrets_keep_bytes_as_base64_and_empty_values() {
    let secret = core::Secret {
        metadata: Some(meta("s")),
        data: BTreeMap::from([("password".into(), b"hunter2".to_vec()), ("empty".into(), Vec::new())]),
        string_data: BTreeMap::from([("plain".into(), "text".into())]),
        r#type: Some("Opaque".into()),
        immutable: None,
    };
    let v = decode(&body("v1", "Secret", secret.encode_to_vec())).unwrap();
    assert_eq!(v["data"], json!({"password": "aHVudGVyMg==", "empty": ""}));
    assert_eq!(v["stringData"], json!({"plain": "text"}));
    assert_eq!(v["type"], "Opaque");
    let cm = core::ConfigMap {
        metadata: Some(meta("c")),
        data: BTreeMap::from([("k".into(), String::new())]),
        ..Default::default()
    };
    let v = decode(&body("v1", "ConfigMap", cm.encode_to_vec())).unwrap();
    assert_eq!(v["data"], json!({"k": ""}), "an empty value is data, not an omitted field");
}

#[test]
fn times_are_rfc3339_and_micro_times_carry_microseconds() {
    let event = k8s_pb::api::events::v1::Event {
        metadata: Some(meta("e")),
        event_time: Some(meta::MicroTime { seconds: Some(1_700_000_000), nanos: Some(123_456_789) }),
        deprecated_last_timestamp: Some(meta::Time { seconds: Some(1_700_000_000), nanos: Some(0) }),
        ..Default::default()
    };
    let v = decode(&body("events.k8s.io/v1", "Event", event.encode_to_vec())).unwrap();
    assert_eq!(v["eventTime"], "2023-11-14T22:13:20.123456Z");
    assert_eq!(v["deprecatedLastTimestamp"], "2023-11-14T22:13:20Z");
    assert!(v["metadata"].get("creationTimestamp").is_none(), "Go's zero time is left out");
}

#[test]
fn other_kinds_get_415_and_bad_bytes_400() {
    let unsupported = decode(&body("batch/v1", "Job", Vec::new())).unwrap_err();
    assert_eq!(unsupported.code, 415);
    let custom = decode(&body("example.com/v1", "Widget", Vec::new())).unwrap_err();
    assert_eq!(custom.code, 415);
    assert_eq!(decode(b"k8s\0\x0a\xff").unwrap_err().code, 400);
    assert_eq!(decode(b"{}").unwrap_err().code, 400);
    assert_eq!(decode(&body("v1", "ConfigMap", vec![0x0a, 0x05, 0x01])).unwrap_err().code, 400);
}

//! kube-rs against the dev cluster: every verb, watch resumption, 410, status, finalizers,
//! garbage collection, patches, server-side apply, CRDs, errors, faults, persistence, seeding.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::json;
use wasmctrl_devcluster::{DevCluster, DevClusterConfig, FaultRule};

use super::{cluster, cluster_with, code};

fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    }
}

fn labeled(mut c: ConfigMap, k: &str, v: &str) -> ConfigMap {
    c.metadata.labels = Some(BTreeMap::from([(k.to_string(), v.to_string())]));
    c
}

fn deployment(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "main", "image": "nginx:1"}]}}}
    }))
    .expect("valid deployment")
}

fn rv(meta: &ObjectMeta) -> u64 {
    meta.resource_version.as_deref().unwrap_or("0").parse().expect("numeric RV")
}

#[tokio::test]
async fn create_get_update_delete_over_tls() {
    let c = cluster().await;
    assert!(c.url().starts_with("https://127.0.0.1:"));
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    let created = api.create(&PostParams::default(), &cm("a", &[("k", "v")])).await.unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    // ConfigMaps carry no generation (only kinds whose strategy tracks spec changes do).
    assert_eq!(created.metadata.generation, None);
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));

    let (status, reason) = code(api.create(&PostParams::default(), &cm("a", &[])).await.unwrap_err());
    assert_eq!((status, reason.as_str()), (409, "AlreadyExists"));

    let got = api.get("a").await.unwrap();
    assert_eq!(got.metadata.resource_version, created.metadata.resource_version);

    // Optimistic concurrency: a stale RV is a 409 Conflict.
    let mut update = got.clone();
    update.data = Some(BTreeMap::from([("k".into(), "v2".into())]));
    let updated = api.replace("a", &PostParams::default(), &update).await.unwrap();
    assert!(rv(&updated.metadata) > rv(&got.metadata));
    assert_eq!(updated.metadata.generation, None);
    let (status, reason) = code(api.replace("a", &PostParams::default(), &update).await.unwrap_err());
    assert_eq!((status, reason.as_str()), (409, "Conflict"));

    // A no-op update keeps the resourceVersion.
    let same = api.replace("a", &PostParams::default(), &updated).await.unwrap();
    assert_eq!(same.metadata.resource_version, updated.metadata.resource_version);

    api.delete("a", &DeleteParams::default()).await.unwrap();
    let (status, reason) = code(api.get("a").await.unwrap_err());
    assert_eq!((status, reason.as_str()), (404, "NotFound"));
    c.shutdown().await;
}

#[tokio::test]
async fn generate_name_and_namespace_must_exist() {
    let c = cluster_with(|c| c.tls = false).await;
    let client = c.client().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut g = cm("", &[]);
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let a = api.create(&PostParams::default(), &g).await.unwrap();
    let b = api.create(&PostParams::default(), &g).await.unwrap();
    let (na, nb) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(na.starts_with("gen-") && na.len() == 9, "{na}");
    assert_ne!(na, nb);

    let missing: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    let (status, _) = code(missing.create(&PostParams::default(), &cm("x", &[])).await.unwrap_err());
    assert_eq!(status, 404);

    let mut nameless = cm("", &[]);
    nameless.metadata.name = None;
    let (status, reason) = code(api.create(&PostParams::default(), &nameless).await.unwrap_err());
    assert_eq!((status, reason.as_str()), (422, "Invalid"));
}

#[tokio::test]
async fn list_selectors_and_pagination() {
    let c = cluster_with(|c| c.tls = false).await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    for i in 0..25 {
        let tier = if i % 2 == 0 { "even" } else { "odd" };
        api.create(&PostParams::default(), &labeled(cm(&format!("cm-{i:02}"), &[]), "tier", tier))
            .await
            .unwrap();
    }
    let even = api.list(&ListParams::default().labels("tier=even")).await.unwrap();
    assert_eq!(even.items.len(), 13);
    let not_even = api.list(&ListParams::default().labels("tier!=even")).await.unwrap();
    assert_eq!(not_even.items.len(), 12);
    let set = api.list(&ListParams::default().labels("tier in (odd,none)")).await.unwrap();
    assert_eq!(set.items.len(), 12);
    let by_name = api.list(&ListParams::default().fields("metadata.name=cm-07")).await.unwrap();
    assert_eq!(by_name.items.len(), 1);

    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(10);
    let mut pages = 0;
    let first = api.list(&lp).await.unwrap();
    let first_rv = first.metadata.resource_version.clone();
    assert_eq!(first.metadata.remaining_item_count, Some(15));
    let mut page = first;
    loop {
        pages += 1;
        names.extend(page.items.iter().map(|c| c.metadata.name.clone().unwrap()));
        match page.metadata.continue_.clone().filter(|c| !c.is_empty()) {
            Some(token) => {
                lp = lp.continue_token(&token);
                page = api.list(&lp).await.unwrap();
                assert_eq!(page.metadata.resource_version, first_rv, "pages share the first page's RV");
            }
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..25).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(names, expected);

    // All-namespaces list includes other namespaces.
    let ns: Api<Namespace> = Api::all(c.client().unwrap());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "team-a"}})).unwrap(),
    )
    .await
    .unwrap();
    let other: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "team-a");
    other.create(&PostParams::default(), &cm("x", &[])).await.unwrap();
    let all: Api<ConfigMap> = Api::all(c.client().unwrap());
    assert_eq!(all.list(&ListParams::default()).await.unwrap().items.len(), 26);
    let not_default = all.list(&ListParams::default().fields("metadata.namespace!=default")).await.unwrap();
    assert_eq!(not_default.items.len(), 1);
}

#[tokio::test]
async fn watch_from_resource_version_sees_changes_in_order() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    api.create(&PostParams::default(), &cm("before", &[])).await.unwrap();
    let list = api.list(&ListParams::default()).await.unwrap();
    let start = list.metadata.resource_version.unwrap();
    api.create(&PostParams::default(), &cm("w", &[("a", "1")])).await.unwrap();
    api.patch("w", &PatchParams::default(), &Patch::Merge(json!({"data": {"a": "2"}}))).await.unwrap();
    api.delete("w", &DeleteParams::default()).await.unwrap();
    let stream = api.watch(&WatchParams::default().timeout(5), &start).await.unwrap();
    let events: Vec<_> = stream.take(3).try_collect().await.unwrap();
    let mut last = 0;
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| {
            let (k, o) = match e {
                WatchEvent::Added(o) => ("ADDED", o),
                WatchEvent::Modified(o) => ("MODIFIED", o),
                WatchEvent::Deleted(o) => ("DELETED", o),
                other => panic!("unexpected {other:?}"),
            };
            assert_eq!(o.metadata.name.as_deref(), Some("w"));
            let r = rv(&o.metadata);
            assert!(r > last, "RVs increase");
            last = r;
            k
        })
        .collect();
    assert_eq!(kinds, ["ADDED", "MODIFIED", "DELETED"]);

    // Label-selector transitions: an object that stops matching is DELETED for the watcher.
    let l = api.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    api.create(&PostParams::default(), &labeled(cm("sel", &[]), "x", "y")).await.unwrap();
    api.patch("sel", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "z"}}})))
        .await
        .unwrap();
    let stream = api.watch(&WatchParams::default().labels("x=y").timeout(5), &l).await.unwrap();
    let events: Vec<_> = stream.take(2).try_collect().await.unwrap();
    assert!(matches!(events[0], WatchEvent::Added(_)));
    assert!(matches!(events[1], WatchEvent::Deleted(_)));
}

#[tokio::test]
async fn watch_from_compacted_resource_version_is_410() {
    let c = cluster_with(|c| c.history_size = 5).await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    let start = api.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    for i in 0..10 {
        api.create(&PostParams::default(), &cm(&format!("c{i}"), &[])).await.unwrap();
    }
    let mut stream = api.watch(&WatchParams::default().timeout(5), &start).await.unwrap().boxed();
    match stream.try_next().await {
        Ok(Some(WatchEvent::Error(s))) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
    // A recent RV still works; compaction via the fault handle expires it.
    let recent = api.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    c.faults().compact_history();
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &(recent.parse::<u64>().unwrap() - 1).to_string())
        .await
        .unwrap()
        .boxed();
    assert!(matches!(stream.try_next().await, Ok(Some(WatchEvent::Error(s))) if s.code == 410));
    // Watching from the current RV after compaction is fine.
    let mut stream = api.watch(&WatchParams::default().timeout(5), &recent).await.unwrap().boxed();
    api.create(&PostParams::default(), &cm("after", &[])).await.unwrap();
    assert!(
        matches!(stream.try_next().await, Ok(Some(WatchEvent::Added(o))) if o.metadata.name.as_deref() == Some("after"))
    );
}

#[tokio::test]
async fn watcher_resumes_after_dropped_watch_and_relists_after_410() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    api.create(&PostParams::default(), &cm("one", &[])).await.unwrap();
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    // Initial list: Init, InitApply(one), InitDone.
    let mut seen = Vec::new();
    loop {
        match stream.try_next().await.unwrap().unwrap() {
            watcher::Event::InitApply(o) => seen.push(o.metadata.name.unwrap()),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(seen, ["one"]);
    c.faults().drop_watches();
    api.create(&PostParams::default(), &cm("two", &[])).await.unwrap();
    loop {
        if let watcher::Event::Apply(o) = stream.try_next().await.unwrap().unwrap() {
            assert_eq!(o.metadata.name.as_deref(), Some("two"));
            break;
        }
    }
    // While paused (the re-watch request waits), a change lands in-process and history is
    // compacted: the re-watch from the old RV gets 410 and the watcher relists.
    let faults = c.faults();
    faults.pause();
    faults.drop_watches();
    c.apply_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: three, namespace: default}\n").unwrap();
    faults.compact_history();
    faults.resume();
    let mut relisted = false;
    let mut saw_410 = false;
    loop {
        match stream.try_next().await {
            Ok(Some(watcher::Event::Init)) => relisted = true,
            Ok(Some(watcher::Event::InitApply(o))) if o.metadata.name.as_deref() == Some("three") => break,
            Ok(Some(watcher::Event::Apply(o))) if o.metadata.name.as_deref() == Some("three") => {
                panic!("expected a relist after 410, got a live event")
            }
            Ok(_) => {}
            Err(e) => saw_410 |= format!("{e:?}").contains("410"),
        }
    }
    assert!(relisted && saw_410);
}

#[tokio::test]
async fn streaming_list_sends_initial_events_and_end_bookmark() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    for n in ["a", "b"] {
        api.create(&PostParams::default(), &cm(n, &[])).await.unwrap();
    }
    let mut stream = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut seen = Vec::new();
    loop {
        match stream.try_next().await.unwrap().unwrap() {
            watcher::Event::InitApply(o) => seen.push(o.metadata.name.unwrap()),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    seen.sort();
    assert_eq!(seen, ["a", "b"]);
    api.create(&PostParams::default(), &cm("c", &[])).await.unwrap();
    loop {
        if let watcher::Event::Apply(o) = stream.try_next().await.unwrap().unwrap() {
            assert_eq!(o.metadata.name.as_deref(), Some("c"));
            break;
        }
    }
    // Bookmarks arrive on an idle watch that allows them.
    let rv_now = api.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut raw = api.watch(&WatchParams::default().timeout(10), &rv_now).await.unwrap().boxed();
    match raw.try_next().await.unwrap() {
        Some(WatchEvent::Bookmark(b)) => assert_eq!(b.metadata.resource_version, rv_now),
        other => panic!("expected a bookmark, got {other:?}"),
    }
}

#[tokio::test]
async fn status_subresource_and_generation() {
    let c = cluster().await;
    let api: Api<Deployment> = Api::namespaced(c.client().unwrap(), "default");
    let d = api.create(&PostParams::default(), &deployment("web", 1)).await.unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    let d = api
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 3}})))
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(2));
    let d = api
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 3, "observedGeneration": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(2), "status changes do not bump generation");
    assert_eq!(d.status.as_ref().and_then(|s| s.replicas), Some(3));
    // Status in a main-resource write is ignored.
    let d = api
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({"status": {"replicas": 9}})))
        .await
        .unwrap();
    assert_eq!(d.status.as_ref().and_then(|s| s.replicas), Some(3));
    assert_eq!(d.metadata.generation, Some(2));
    // Spec in a status write is ignored.
    let d = api
        .patch_status("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 7}})))
        .await
        .unwrap();
    assert_eq!(d.spec.replicas, Some(3));
    let got = api.get_status("web").await.unwrap();
    assert_eq!(got.status.and_then(|s| s.observed_generation), Some(2));
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    let mut f = cm("fin", &[]);
    f.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &f).await.unwrap();
    let start = api.get("fin").await.unwrap().metadata.resource_version.unwrap();
    let deleted = api.delete("fin", &DeleteParams::default()).await.unwrap();
    let pending = deleted.left().expect("object returned while deletion is pending");
    assert!(pending.metadata.deletion_timestamp.is_some());
    let still = api.get("fin").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    // Adding a finalizer while deleting is forbidden.
    let (status, _) = code(
        api.patch(
            "fin",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "new"]}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(status, 422);
    api.patch("fin", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    assert_eq!(code(api.get("fin").await.unwrap_err()).0, 404);
    let events: Vec<_> = api
        .watch(&WatchParams::default().timeout(5), &start)
        .await
        .unwrap()
        .take(2)
        .try_collect()
        .await
        .unwrap();
    assert!(matches!(&events[0], WatchEvent::Modified(o) if o.metadata.deletion_timestamp.is_some()));
    assert!(matches!(&events[1], WatchEvent::Deleted(_)));
}

fn owned_by(name: &str, owner: &ConfigMap, block: bool) -> ConfigMap {
    let mut c = cm(name, &[]);
    c.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.metadata.name.clone().unwrap(),
        uid: owner.metadata.uid.clone().unwrap(),
        block_owner_deletion: Some(block),
        controller: Some(true),
    }]);
    c
}

#[tokio::test]
async fn garbage_collection_background_foreground_orphan() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    let pp = PostParams::default();

    // Background: dependents go after the owner.
    let owner = api.create(&pp, &cm("bg-owner", &[])).await.unwrap();
    api.create(&pp, &owned_by("bg-dep", &owner, false)).await.unwrap();
    let grandchild_owner = api.get("bg-dep").await.unwrap();
    api.create(&pp, &owned_by("bg-grandchild", &grandchild_owner, false)).await.unwrap();
    api.delete("bg-owner", &DeleteParams::background()).await.unwrap();
    for n in ["bg-owner", "bg-dep", "bg-grandchild"] {
        assert_eq!(code(api.get(n).await.unwrap_err()).0, 404, "{n}");
    }

    // Foreground: the owner waits (foregroundDeletion finalizer) for a dependent held by a finalizer.
    let owner = api.create(&pp, &cm("fg-owner", &[])).await.unwrap();
    let mut dep = owned_by("fg-dep", &owner, true);
    dep.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&pp, &dep).await.unwrap();
    api.delete("fg-owner", &DeleteParams::foreground()).await.unwrap();
    let o = api.get("fg-owner").await.unwrap();
    assert!(o.metadata.deletion_timestamp.is_some());
    assert_eq!(o.metadata.finalizers, Some(vec!["foregroundDeletion".to_string()]));
    assert!(api.get("fg-dep").await.unwrap().metadata.deletion_timestamp.is_some());
    api.patch("fg-dep", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    assert_eq!(code(api.get("fg-dep").await.unwrap_err()).0, 404);
    assert_eq!(code(api.get("fg-owner").await.unwrap_err()).0, 404);

    // Orphan: dependents stay, without the owner reference.
    let owner = api.create(&pp, &cm("or-owner", &[])).await.unwrap();
    api.create(&pp, &owned_by("or-dep", &owner, false)).await.unwrap();
    api.delete("or-owner", &DeleteParams::orphan()).await.unwrap();
    assert_eq!(code(api.get("or-owner").await.unwrap_err()).0, 404);
    let dep = api.get("or-dep").await.unwrap();
    assert!(dep.metadata.owner_references.unwrap_or_default().is_empty());

    // With two owners, losing one only drops that reference.
    let a = api.create(&pp, &cm("two-a", &[])).await.unwrap();
    let b = api.create(&pp, &cm("two-b", &[])).await.unwrap();
    let mut dep = owned_by("two-dep", &a, false);
    let mut refs = dep.metadata.owner_references.take().unwrap();
    let mut second = owned_by("x", &b, false).metadata.owner_references.unwrap();
    // The API server accepts at most one controller reference.
    second[0].controller = Some(false);
    refs.extend(second);
    dep.metadata.owner_references = Some(refs);
    api.create(&pp, &dep).await.unwrap();
    api.delete("two-a", &DeleteParams::default()).await.unwrap();
    let dep = api.get("two-dep").await.unwrap();
    let refs = dep.metadata.owner_references.unwrap();
    assert_eq!(refs.len(), 1);
    assert_eq!(refs[0].name, "two-b");
}

#[tokio::test]
async fn delete_preconditions_and_deletecollection() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    let x = api.create(&PostParams::default(), &cm("pre", &[])).await.unwrap();
    let mut dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions { uid: Some("wrong".into()), resource_version: None }),
        ..Default::default()
    };
    assert_eq!(code(api.delete("pre", &dp).await.unwrap_err()).0, 409);
    dp.preconditions = Some(kube::api::Preconditions {
        uid: x.metadata.uid.clone(),
        resource_version: x.metadata.resource_version.clone(),
    });
    api.delete("pre", &dp).await.unwrap();

    for i in 0..6 {
        let tier = if i < 4 { "drop" } else { "keep" };
        api.create(&PostParams::default(), &labeled(cm(&format!("dc-{i}"), &[]), "tier", tier))
            .await
            .unwrap();
    }
    let deleted = api
        .delete_collection(&DeleteParams::default(), &ListParams::default().labels("tier=drop"))
        .await
        .unwrap();
    assert_eq!(deleted.left().map(|l| l.items.len()), Some(4));
    let left = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(left.items.len(), 2);
}

#[tokio::test]
async fn patch_types_merge_json_strategic() {
    let c = cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    cms.create(&PostParams::default(), &cm("p", &[("a", "1"), ("b", "2")])).await.unwrap();
    let p = cms
        .patch("p", &PatchParams::default(), &Patch::Merge(json!({"data": {"a": null, "c": "3"}})))
        .await
        .unwrap();
    assert_eq!(p.data.unwrap(), BTreeMap::from([("b".into(), "2".into()), ("c".into(), "3".into())]));
    let jp = serde_json::from_value(json!([{"op": "replace", "path": "/data/b", "value": "9"}])).unwrap();
    let p = cms.patch("p", &PatchParams::default(), &Patch::<()>::Json(jp)).await.unwrap();
    assert_eq!(p.data.unwrap()["b"], "9");
    // A failing JSON patch test op is 422 Invalid.
    let jp = serde_json::from_value(json!([{"op": "test", "path": "/data/b", "value": "0"}])).unwrap();
    assert_eq!(
        code(cms.patch("p", &PatchParams::default(), &Patch::<()>::Json(jp)).await.unwrap_err()).0,
        422
    );
    // A merge patch carrying a stale resourceVersion is a precondition: 409.
    let stale = json!({"metadata": {"resourceVersion": "1"}, "data": {"z": "z"}});
    assert_eq!(code(cms.patch("p", &PatchParams::default(), &Patch::Merge(stale)).await.unwrap_err()).0, 409);

    let deps: Api<Deployment> = Api::namespaced(c.client().unwrap(), "default");
    deps.create(&PostParams::default(), &deployment("sm", 1)).await.unwrap();
    let patch =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "image": "busybox"}]}}}});
    let d = deps.patch("sm", &PatchParams::default(), &Patch::Strategic(patch)).await.unwrap();
    let v = serde_json::to_value(&d).unwrap();
    let names: Vec<&str> = v["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["main", "sidecar"], "strategic merge merges containers by name");
}

#[tokio::test]
async fn server_side_apply_managers_conflicts_force() {
    let c = cluster().await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    let cfg = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "1", "b": "2"}});
    let o = api.patch("ssa", &PatchParams::apply("alice"), &Patch::Apply(&cfg)).await.unwrap();
    assert_eq!(o.data.as_ref().unwrap().len(), 2);
    let mf = o.metadata.managed_fields.unwrap();
    assert_eq!(mf[0].manager.as_deref(), Some("alice"));
    assert_eq!(mf[0].operation.as_deref(), Some("Apply"));

    // Bob applying a different value for alice's field conflicts.
    let bob =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "bob"}});
    let (status, reason) =
        code(api.patch("ssa", &PatchParams::apply("bob"), &Patch::Apply(&bob)).await.unwrap_err());
    assert_eq!((status, reason.as_str()), (409, "Conflict"));
    // Force takes it over.
    let o = api.patch("ssa", &PatchParams::apply("bob").force(), &Patch::Apply(&bob)).await.unwrap();
    assert_eq!(o.data.as_ref().unwrap()["a"], "bob");
    // Alice stops applying b: it is removed; a (now bob's) stays.
    let alice2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {}});
    let o = api.patch("ssa", &PatchParams::apply("alice"), &Patch::Apply(&alice2)).await.unwrap();
    assert_eq!(o.data.unwrap(), BTreeMap::from([("a".into(), "bob".into())]));
    // An update by another manager takes ownership of what it changed.
    api.patch("ssa", &PatchParams::default(), &Patch::Merge(json!({"data": {"a": "edited"}}))).await.unwrap();
    let (status, _) =
        code(api.patch("ssa", &PatchParams::apply("bob"), &Patch::Apply(&bob)).await.unwrap_err());
    assert_eq!(status, 409);
    // Apply creates missing objects.
    let new =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa-new"}, "data": {"x": "y"}});
    let o = api.patch("ssa-new", &PatchParams::apply("alice"), &Patch::Apply(&new)).await.unwrap();
    assert!(o.metadata.uid.is_some());
}

#[tokio::test]
async fn namespace_deletion_removes_content() {
    let c = cluster().await;
    let client = c.client().unwrap();
    let ns: Api<Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "gone"}})).unwrap(),
    )
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "gone");
    let mut held = cm("held", &[]);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    api.create(&PostParams::default(), &cm("free", &[])).await.unwrap();
    ns.delete("gone", &DeleteParams::default()).await.unwrap();
    let terminating = ns.get("gone").await.unwrap();
    assert_eq!(terminating.status.and_then(|s| s.phase).as_deref(), Some("Terminating"));
    assert_eq!(code(api.get("free").await.unwrap_err()).0, 404);
    let (status, _) = code(api.create(&PostParams::default(), &cm("late", &[])).await.unwrap_err());
    assert_eq!(status, 403, "no new content in a terminating namespace");
    api.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    assert_eq!(code(ns.get("gone").await.unwrap_err()).0, 404);
}

fn crd(scope: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": scope,
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wg"]},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn crd_serves_its_kind_until_deleted() {
    let c = cluster().await;
    let client = c.client().unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let created = crds.create(&PostParams::default(), &crd("Namespaced")).await.unwrap();
    let established = created
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    assert!(established);

    let gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
    let (ar, caps) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
    assert_eq!(ar.plural, "widgets");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let w: DynamicObject = serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 1}})).unwrap();
    widgets.create(&PostParams::default(), &w).await.unwrap();
    let w = widgets
        .patch("w1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 2}})))
        .await
        .unwrap();
    assert_eq!(w.metadata.generation, Some(2));
    let w = widgets
        .patch_status("w1", &PatchParams::default(), &Patch::Merge(json!({"status": {"ready": true}})))
        .await
        .unwrap();
    assert_eq!(w.metadata.generation, Some(2));
    assert_eq!(w.data["status"]["ready"], true);
    assert_eq!(widgets.list(&ListParams::default()).await.unwrap().items.len(), 1);

    crds.delete("widgets.example.com", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(crds.get("widgets.example.com").await.unwrap_err()).0, 404);
    assert_eq!(code(widgets.list(&ListParams::default()).await.unwrap_err()).0, 404);

    // A cluster-scoped CRD.
    crds.create(&PostParams::default(), &crd("Cluster")).await.unwrap();
    let cluster_widgets: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    cluster_widgets.create(&PostParams::default(), &w_named("cw")).await.unwrap();
    let got = cluster_widgets.get("cw").await.unwrap();
    assert!(got.metadata.namespace.is_none());
}

fn w_named(name: &str) -> DynamicObject {
    serde_json::from_value(
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}}),
    )
    .unwrap()
}

#[tokio::test]
async fn bad_token_is_unauthorized() {
    let c = cluster().await;
    let mut config = c.kube_config();
    config.auth_info.token = Some("wrong".to_string().into());
    let client = kube::Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let (status, reason) = code(api.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((status, reason.as_str()), (401, "Unauthorized"));
}

#[tokio::test]
async fn injected_errors_and_retry_after() {
    let c = cluster().await;
    let mut config = c.kube_config();
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let faults = c.faults();
    faults.inject(FaultRule::error("/api/v1/namespaces/default/configmaps", 500).times(1));
    assert_eq!(code(api.list(&ListParams::default()).await.unwrap_err()).0, 500);
    api.list(&ListParams::default()).await.unwrap();

    faults.inject(FaultRule::too_many_requests("/api/v1/namespaces/default/configmaps", 7).times(1));
    let url = format!("{}/api/v1/namespaces/default/configmaps", c.url());
    let req = http::Request::get(url).body(Vec::new()).unwrap();
    let raw = kube::Client::try_from(c.kube_config()).unwrap();
    let mut cfg = c.kube_config();
    cfg.default_retry = false;
    let raw_client = kube::Client::try_from(cfg).unwrap();
    let _ = raw;
    let resp = raw_client.send(req.map(Into::into)).await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers().get("retry-after").unwrap(), "7");

    // Latency applies to matching paths only; pause stalls until resume.
    faults.pause();
    let api2 = api.clone();
    let pending = tokio::spawn(async move { api2.list(&ListParams::default()).await.map(|l| l.items.len()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!pending.is_finished(), "requests wait while paused");
    faults.resume();
    assert_eq!(pending.await.unwrap().unwrap(), 0);
    faults.inject(
        FaultRule::latency("/api/v1/namespaces/default/configmaps", Duration::from_millis(10)).times(1),
    );
    api.list(&ListParams::default()).await.unwrap();
}

#[tokio::test]
async fn persistence_and_seed() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let seed = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: seeded\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: s1\n  namespace: seeded\ndata:\n  k: v\n---\n";
    let c = DevCluster::start(DevClusterConfig {
        seed: vec![seed.into()],
        state_file: Some(state.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "seeded");
    let s1 = api.get("s1").await.unwrap();
    assert_eq!(s1.data.unwrap()["k"], "v");
    let mine = api.create(&PostParams::default(), &cm("mine", &[])).await.unwrap();
    let rv_before = c.resource_version();
    c.shutdown().await;
    assert!(state.exists());

    let c = DevCluster::start(DevClusterConfig { state_file: Some(state.clone()), ..Default::default() })
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "seeded");
    let again = api.get("mine").await.unwrap();
    assert_eq!(again.metadata.uid, mine.metadata.uid);
    assert!(c.resource_version() >= rv_before);
    // New writes continue the RV sequence.
    let n = api.create(&PostParams::default(), &cm("next", &[])).await.unwrap();
    assert!(rv(&n.metadata) > rv_before);
    // apply_yaml replaces existing objects.
    c.apply_yaml(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: s1, namespace: seeded}\ndata: {k: changed}\n",
    )
    .unwrap();
    assert_eq!(api.get("s1").await.unwrap().data.unwrap()["k"], "changed");
    assert!(c.apply_yaml("apiVersion: v9\nkind: Nope\nmetadata: {name: x}\n").is_err());
}

#[tokio::test]
async fn discovery_lists_builtins() {
    let c = cluster().await;
    let client = c.client().unwrap();
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    let mut kinds: Vec<String> = discovery
        .groups()
        .flat_map(|g| {
            g.recommended_resources().into_iter().map(|(ar, _)| format!("{}/{}", ar.api_version, ar.kind))
        })
        .collect();
    kinds.sort();
    for k in [
        "v1/ConfigMap",
        "v1/Namespace",
        "v1/Secret",
        "v1/Pod",
        "v1/Service",
        "v1/Event",
        "apps/v1/Deployment",
        "coordination.k8s.io/v1/Lease",
        "events.k8s.io/v1/Event",
        "apiextensions.k8s.io/v1/CustomResourceDefinition",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} in {kinds:?}");
    }
    let v = client.apiserver_version().await.unwrap();
    assert_eq!(v.major, "1");
}

#[tokio::test]
async fn crd_versions_share_storage() {
    let c = cluster_with(|c| c.tls = false).await;
    let client = c.client().unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut def = serde_json::to_value(crd("Namespaced")).unwrap();
    def["spec"]["versions"] = json!([
        {"name": "v1beta1", "served": true, "storage": false, "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
        {"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
    ]);
    crds.create(&PostParams::default(), &serde_json::from_value(def).unwrap()).await.unwrap();
    let beta = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1beta1", "Widget"),
        "widgets",
    );
    let v1 =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Widget"), "widgets");
    let beta_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &beta);
    let v1_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &v1);
    let mut w = w_named("multi");
    w.types = Some(kube::api::TypeMeta { api_version: "example.com/v1beta1".into(), kind: "Widget".into() });
    let created = beta_api.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(created.types.unwrap().api_version, "example.com/v1beta1");
    let read = v1_api.get("multi").await.unwrap();
    assert_eq!(read.types.unwrap().api_version, "example.com/v1");
    // No status subresource on this CRD: /status is not served.
    assert_eq!(code(v1_api.get_status("multi").await.unwrap_err()).0, 404);
}

#[tokio::test]
async fn metadata_only_reads_and_resource_version_semantics() {
    let c = cluster_with(|c| c.tls = false).await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    api.create(&PostParams::default(), &labeled(cm("m", &[("big", "data")]), "a", "b")).await.unwrap();
    let meta = api.get_metadata("m").await.unwrap();
    assert_eq!(meta.metadata.labels.unwrap()["a"], "b");
    let list = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let current = list.metadata.resource_version.unwrap();
    // Exact match on the current RV works; an older one is gone; a future one is too large.
    let exact = ListParams::default().at(&current).matching(kube::api::VersionMatch::Exact);
    assert_eq!(api.list(&exact).await.unwrap().items.len(), 1);
    let old = ListParams::default().at("1").matching(kube::api::VersionMatch::Exact);
    assert_eq!(code(api.list(&old).await.unwrap_err()).0, 410);
    let future = (current.parse::<u64>().unwrap() + 1000).to_string();
    let mut config = c.kube_config();
    config.default_retry = false;
    let no_retry: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    let ahead = ListParams::default().at(&future).matching(kube::api::VersionMatch::NotOlderThan);
    assert_eq!(code(no_retry.list(&ahead).await.unwrap_err()).0, 504);
    // A continue token may not be combined with a resourceVersion.
    let bad = ListParams {
        continue_token: Some("x".into()),
        resource_version: Some("5".into()),
        ..Default::default()
    };
    assert_eq!(code(api.list(&bad).await.unwrap_err()).0, 400);
}

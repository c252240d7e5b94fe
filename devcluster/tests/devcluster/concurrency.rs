//! Concurrency: 8 writers update shared objects with optimistic concurrency (conflicts are
//! retried); independent watchers must see every committed change exactly once, in
//! resourceVersion order. The update count per writer is `DEVCLUSTER_UPDATES` (default 250,
//! so the test takes a few seconds in a debug build; the 5,000 works too).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};

use super::{cluster_with, code};

const WRITERS: usize = 8;
const OBJECTS: usize = 4;
const WATCHERS: usize = 3;

fn updates_per_writer() -> usize {
    std::env::var("DEVCLUSTER_UPDATES").ok().and_then(|v| v.parse().ok()).unwrap_or(250)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_with_conflicts_and_exactly_once_ordered_watch() {
    let n = updates_per_writer();
    let c = cluster_with(|c| {
        c.tls = false;
        c.history_size = WRITERS * n + 100;
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    for i in 0..OBJECTS {
        let cm: ConfigMap = serde_json::from_value(
            serde_json::json!({"metadata": {"name": format!("shared-{i}")}, "data": {"count": "0"}}),
        )
        .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let start = api.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let total = WRITERS * n;

    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        let api = api.clone();
        let start = start.clone();
        watchers.push(tokio::spawn(async move {
            let mut seen: Vec<(u64, String, u64)> = Vec::with_capacity(total);
            let mut stream = api.watch(&WatchParams::default().timeout(290), &start).await.unwrap().boxed();
            while seen.len() < total {
                match stream.next().await {
                    Some(Ok(WatchEvent::Modified(o))) => {
                        let rv: u64 = o.metadata.resource_version.unwrap().parse().unwrap();
                        let count: u64 = o.data.unwrap()["count"].parse().unwrap();
                        seen.push((rv, o.metadata.name.unwrap(), count));
                    }
                    Some(Ok(WatchEvent::Bookmark(_))) => {}
                    other => panic!("unexpected watch item {other:?}"),
                }
            }
            seen
        }));
    }

    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let api = api.clone();
        writers.push(tokio::spawn(async move {
            let mut committed = Vec::with_capacity(n);
            let mut conflicts = 0usize;
            for u in 0..n {
                let name = format!("shared-{}", (w + u) % OBJECTS);
                loop {
                    let mut cm = api.get(&name).await.unwrap();
                    let data = cm.data.get_or_insert_with(BTreeMap::new);
                    let next = data["count"].parse::<u64>().unwrap() + 1;
                    data.insert("count".into(), next.to_string());
                    match api.replace(&name, &PostParams::default(), &cm).await {
                        Ok(o) => {
                            committed.push((
                                o.metadata.resource_version.unwrap().parse::<u64>().unwrap(),
                                name.clone(),
                                next,
                            ));
                            break;
                        }
                        Err(e) => {
                            let (status, _) = code(e);
                            assert_eq!(status, 409);
                            conflicts += 1;
                        }
                    }
                }
            }
            (committed, conflicts)
        }));
    }
    let mut committed = Vec::new();
    let mut conflicts = 0;
    for w in writers {
        let (c, k) = w.await.unwrap();
        committed.extend(c);
        conflicts += k;
    }
    committed.sort();
    assert_eq!(committed.len(), total);
    // Every commit has a distinct RV and each object's counter went up by one per commit.
    committed.windows(2).for_each(|w| assert!(w[0].0 < w[1].0));
    let mut finals: BTreeMap<String, u64> = BTreeMap::new();
    for (_, name, count) in &committed {
        let prev = finals.insert(name.clone(), *count).unwrap_or(0);
        assert_eq!(*count, prev + 1, "{name}: lost update");
    }
    eprintln!("{total} updates committed with {conflicts} conflicts retried");

    for w in watchers {
        let seen = tokio::time::timeout(Duration::from_secs(120), w).await.expect("watchers finish").unwrap();
        assert_eq!(seen, committed, "a watcher saw exactly the committed changes, once each, in RV order");
    }
}

//! Test helpers of the FIFO's tests: a store to feed, objects, and a compact pop.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Delta, DeltaFifo, DeltaType, KnownObjects, PopOutcome};
use crate::object::{DeletedObject, Object};

/// The store a FIFO feeds, as the FIFO sees it: a key → object map.
#[derive(Default)]
pub(super) struct MapStore(pub(super) Mutex<BTreeMap<String, Arc<Object>>>);

impl MapStore {
    pub(super) fn upsert(&self, obj: Arc<Object>) {
        self.0.lock().insert(obj.key().to_owned(), obj);
    }
    pub(super) fn delete(&self, key: &str) {
        self.0.lock().remove(key);
    }
}

impl KnownObjects for MapStore {
    fn known_keys(&self) -> Vec<String> {
        self.0.lock().keys().cloned().collect()
    }
    fn known_object(&self, key: &str) -> Option<Arc<Object>> {
        self.0.lock().get(key).cloned()
    }
}

pub(super) fn obj(name: &str, rv: u64) -> Arc<Object> {
    let json = format!(r#"{{"metadata":{{"name":"{name}","resourceVersion":"{rv}"}}}}"#);
    Arc::new(Object::from_json(json.into()).unwrap())
}

pub(super) fn store(objs: &[Arc<Object>]) -> (Arc<MapStore>, Arc<dyn KnownObjects>) {
    let s = Arc::new(MapStore::default());
    for o in objs {
        s.upsert(o.clone());
    }
    let known: Arc<dyn KnownObjects> = s.clone();
    (s, known)
}

/// Pops one key, returning it and a compact description of its deltas.
pub(super) async fn pop(f: &DeltaFifo) -> (String, Vec<(DeltaType, String, bool)>) {
    let mut out = None;
    f.pop(|k, d, _| {
        let desc = d
            .iter()
            .map(|d| {
                let tomb = matches!(d, Delta::Deleted(x) if x.is_final_state_unknown());
                (d.delta_type(), d.object().resource_version().to_owned(), tomb)
            })
            .collect();
        out = Some((k.to_owned(), desc));
        PopOutcome::Processed
    })
    .await
    .unwrap();
    out.unwrap()
}

pub(super) fn known(o: &Arc<Object>) -> DeletedObject {
    DeletedObject::Known(o.clone())
}

//! Deletion, finalizers and garbage collection.
//!
//! Invariants:
//! - An object with finalizers (including `orphan` and `foregroundDeletion` added for the
//!   propagation policy), a namespace with content and a CRD with instances are only marked
//!   (deletionTimestamp set, MODIFIED); the object goes (DELETED) once nothing blocks it.
//! - Every deletion or marking queues a `GcItem`; the queue is run to completion by the store
//!   before it releases its lock, so callers never see a half-collected state.
//! - A dependent is deleted only when none of its owners is left; while another owner lives
//!   only the reference to the gone owner is removed.
//! - Once a CRD is gone, its resource is no longer served.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use super::{EventType, Inner, ObjKey, ObjMeta, Subresource, WriteOpts, crd_gr, decode, namespaces_gr};
use crate::error::ApiError;
use crate::resources::{GroupResource, crd_resource};
use crate::util::{meta_mut, meta_str, now_rfc3339};

/// DeleteOptions that matter here.
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    /// `propagationPolicy`: Orphan, Background or Foreground.
    pub propagation: Option<String>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// dryRun=All.
    pub dry_run: bool,
}

/// Work the garbage collector still has to do after a write.
#[derive(Debug, Clone)]
pub(super) enum GcItem {
    /// An object went away: its dependents may be orphaned, its foreground owners unblocked.
    Gone { gr: GroupResource, meta: Arc<ObjMeta> },
    /// An object entered (or is in) deletion: orphan / foreground / namespace / CRD handling.
    Deleting { gr: GroupResource, key: ObjKey },
}

impl Inner {
    /// Namespaces with content and CRDs with instances stay until those are gone.
    pub(super) fn blocks_deletion(&self, gr: &GroupResource, obj: &Value) -> bool {
        let name = meta_str(obj, "name");
        if *gr == namespaces_gr() {
            return self.buckets.values().any(|b| {
                b.info.namespaced
                    && b.objects
                        .range::<ObjKey, _>((name.to_string(), String::new())..)
                        .next()
                        .is_some_and(|(k, _)| k.0 == name)
            });
        }
        if *gr == crd_gr()
            && let Ok(info) = crd_resource(obj)
        {
            return self.buckets.get(&info.gr).is_some_and(|b| !b.objects.is_empty());
        }
        false
    }

    pub(super) fn delete(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        opts: &DeleteOpts,
    ) -> Result<Bytes, ApiError> {
        let info = self.bucket(gr)?.info.clone();
        let cur = self
            .bucket(gr)?
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&gr.group, &gr.resource, &key.1))?;
        if let Some(uid) = &opts.uid
            && *uid != cur.meta.uid
        {
            return Err(ApiError::conflict(
                &gr.group,
                &gr.resource,
                &key.1,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    cur.meta.uid
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && *rv != cur.meta.rv.to_string()
        {
            return Err(ApiError::conflict(
                &gr.group,
                &gr.resource,
                &key.1,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    cur.meta.rv
                ),
            ));
        }
        let mut obj = decode(&cur.json)?;
        let mut fins = cur.meta.finalizers.clone();
        match opts.propagation.as_deref() {
            None | Some("Background") => {}
            Some("Orphan") => {
                if !fins.iter().any(|f| f == "orphan") {
                    fins.push("orphan".into());
                }
            }
            Some("Foreground") => {
                if !fins.iter().any(|f| f == "foregroundDeletion") {
                    fins.push("foregroundDeletion".into());
                }
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    &gr.group,
                    &info.kind,
                    &key.1,
                    format!(
                        "propagationPolicy: Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
                    ),
                ));
            }
        }
        let blocked = !fins.is_empty() || self.blocks_deletion(gr, &obj);
        if opts.dry_run {
            return Ok(cur.json.clone());
        }
        if blocked {
            if cur.meta.deleting && fins == cur.meta.finalizers {
                self.gc.push(GcItem::Deleting { gr: gr.clone(), key: key.clone() });
                return Ok(cur.json.clone());
            }
            let m = meta_mut(&mut obj);
            if !cur.meta.deleting {
                m.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            if fins.is_empty() {
                m.remove("finalizers");
            } else {
                m.insert("finalizers".into(), json!(fins));
            }
            if *gr == namespaces_gr() {
                obj["status"] = json!({"phase": "Terminating"});
            }
            let out = self.commit(gr, obj, EventType::Modified, Some(&cur))?;
            self.gc.push(GcItem::Deleting { gr: gr.clone(), key: key.clone() });
            return Ok(out);
        }
        let out = self.commit(gr, obj, EventType::Deleted, Some(&cur))?;
        let meta = Arc::new(ObjMeta::from_value(&decode(&out)?));
        self.gc.push(GcItem::Gone { gr: gr.clone(), meta });
        Ok(out)
    }

    /// Rewrites one object in place through `f` (used by the garbage collector).
    fn rewrite(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        f: impl FnOnce(&mut Value),
    ) -> Result<(), ApiError> {
        let Some(cur) = self.buckets.get(gr).and_then(|b| b.objects.get(key)).cloned() else {
            return Ok(());
        };
        let old = decode(&cur.json)?;
        let mut new = old.clone();
        f(&mut new);
        if new != old {
            self.update(gr, key, &cur, old, new, Subresource::Main, &WriteOpts::default())?;
        }
        Ok(())
    }

    fn remove_finalizer(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        finalizer: &str,
    ) -> Result<(), ApiError> {
        self.rewrite(gr, key, |o| {
            if let Some(a) = o.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
                a.retain(|f| f.as_str() != Some(finalizer));
                if a.is_empty()
                    && let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut)
                {
                    m.remove("finalizers");
                }
            }
        })
    }

    fn remove_owner_ref(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        owner_uid: &str,
    ) -> Result<(), ApiError> {
        self.rewrite(gr, key, |o| {
            if let Some(a) = o.pointer_mut("/metadata/ownerReferences").and_then(Value::as_array_mut) {
                a.retain(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid));
                if a.is_empty()
                    && let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut)
                {
                    m.remove("ownerReferences");
                }
            }
        })
    }

    /// Runs the garbage collector until it has nothing left to do. Errors inside are logged:
    /// the write that triggered collection has already been committed.
    pub(super) fn run_gc(&mut self) {
        let mut guard = 0usize;
        while let Some(item) = self.gc.pop() {
            guard += 1;
            if guard > 1_000_000 {
                tracing::error!("garbage collector did not converge; giving up on this pass");
                self.gc.clear();
                break;
            }
            if let Err(error) = self.gc_step(item) {
                tracing::warn!(%error, "garbage collection step failed");
            }
        }
    }

    fn gc_step(&mut self, item: GcItem) -> Result<(), ApiError> {
        match item {
            GcItem::Gone { gr, meta } => {
                // Dependents of the deleted object: delete when no owner remains, else drop the ref.
                let deps: Vec<_> =
                    self.dependents.get(&meta.uid).map(|s| s.iter().cloned().collect()).unwrap_or_default();
                for (dgr, dkey) in deps {
                    let Some(dep) = self.buckets.get(&dgr).and_then(|b| b.objects.get(&dkey)).cloned() else {
                        continue;
                    };
                    let live_owner =
                        dep.meta.owners.iter().any(|o| *o != meta.uid && self.uids.contains_key(o));
                    if live_owner {
                        self.remove_owner_ref(&dgr, &dkey, &meta.uid)?;
                    } else if !dep.meta.deleting {
                        self.delete(&dgr, &dkey, &DeleteOpts::default())?;
                    }
                }
                // Owners waiting for their dependents (foreground) may now be done.
                for owner in &meta.owners {
                    if let Some((ogr, okey)) = self.uids.get(owner).cloned() {
                        self.gc.push(GcItem::Deleting { gr: ogr, key: okey });
                    }
                }
                // A terminating namespace / CRD may now be empty.
                if !meta.namespace.is_empty() {
                    self.gc.push(GcItem::Deleting {
                        gr: namespaces_gr(),
                        key: (String::new(), meta.namespace.clone()),
                    });
                }
                if let Some(b) = self.buckets.get(&gr)
                    && b.info.custom
                {
                    let crd_name = format!("{}.{}", gr.resource, gr.group);
                    self.gc.push(GcItem::Deleting { gr: crd_gr(), key: (String::new(), crd_name) });
                }
                let served = self
                    .registry
                    .all()
                    .find(|i| i.custom && format!("{}.{}", i.gr.resource, i.gr.group) == meta.name)
                    .map(|i| i.gr.clone());
                if gr == crd_gr()
                    && let Some(served) = served
                {
                    self.registry.remove(&served);
                    self.buckets.remove(&served);
                }
            }
            GcItem::Deleting { gr, key } => {
                let Some(cur) = self.buckets.get(&gr).and_then(|b| b.objects.get(&key)).cloned() else {
                    return Ok(());
                };
                if !cur.meta.deleting {
                    return Ok(());
                }
                let uid = cur.meta.uid.clone();
                let deps: Vec<_> =
                    self.dependents.get(&uid).map(|s| s.iter().cloned().collect()).unwrap_or_default();
                if cur.meta.finalizers.iter().any(|f| f == "orphan") {
                    for (dgr, dkey) in &deps {
                        self.remove_owner_ref(dgr, dkey, &uid)?;
                    }
                    return self.remove_finalizer(&gr, &key, "orphan");
                }
                if cur.meta.finalizers.iter().any(|f| f == "foregroundDeletion") {
                    if deps.is_empty() {
                        return self.remove_finalizer(&gr, &key, "foregroundDeletion");
                    }
                    for (dgr, dkey) in deps {
                        let Some(dep) = self.buckets.get(&dgr).and_then(|b| b.objects.get(&dkey)).cloned()
                        else {
                            continue;
                        };
                        if dep.meta.deleting {
                            continue;
                        }
                        let has_deps = self.dependents.contains_key(&dep.meta.uid);
                        let propagation = has_deps.then(|| "Foreground".to_string());
                        self.delete(&dgr, &dkey, &DeleteOpts { propagation, ..Default::default() })?;
                    }
                    return Ok(());
                }
                if gr == namespaces_gr() {
                    let ns = key.1.clone();
                    let mut content = Vec::new();
                    for (bgr, b) in &self.buckets {
                        if !b.info.namespaced {
                            continue;
                        }
                        for (k, s) in b.objects.range::<ObjKey, _>((ns.clone(), String::new())..) {
                            if k.0 != ns {
                                break;
                            }
                            if !s.meta.deleting {
                                content.push((bgr.clone(), k.clone()));
                            }
                        }
                    }
                    for (cgr, ckey) in content {
                        match self.delete(&cgr, &ckey, &DeleteOpts::default()) {
                            Ok(_) => {}
                            Err(e) if e.code == 404 => {}
                            Err(e) => return Err(e),
                        }
                    }
                } else if gr == crd_gr() {
                    let obj = decode(&cur.json)?;
                    if let Ok(info) = crd_resource(&obj) {
                        let keys: Vec<ObjKey> = self
                            .buckets
                            .get(&info.gr)
                            .map(|b| {
                                b.objects
                                    .iter()
                                    .filter(|(_, s)| !s.meta.deleting)
                                    .map(|(k, _)| k.clone())
                                    .collect()
                            })
                            .unwrap_or_default();
                        for k in keys {
                            self.delete(&info.gr, &k, &DeleteOpts::default())?;
                        }
                    }
                }
                // Finish deletion when nothing blocks it any more.
                let Some(cur) = self.buckets.get(&gr).and_then(|b| b.objects.get(&key)).cloned() else {
                    return Ok(());
                };
                let obj = decode(&cur.json)?;
                if cur.meta.finalizers.is_empty() && !self.blocks_deletion(&gr, &obj) {
                    let out = self.commit(&gr, obj, EventType::Deleted, Some(&cur))?;
                    let meta = Arc::new(ObjMeta::from_value(&decode(&out)?));
                    self.gc.push(GcItem::Gone { gr, meta });
                }
            }
        }
        Ok(())
    }
}

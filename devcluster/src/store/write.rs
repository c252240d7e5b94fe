//! Create and update: validate, default, then one commit.
//!
//! Invariants:
//! - Every check runs before `Inner::commit`, so a rejected write takes no RV and changes
//!   nothing; a dry run stops right before the commit.
//! - An update keeps what the client may not change (name, namespace, uid, creation and
//!   deletion timestamps, generation); `generation` grows only when the spec part changes.
//! - A no-op update commits nothing and keeps the resourceVersion.
//! - An update that removes the last finalizer of an object being deleted deletes it (and
//!   queues the garbage collector), as the API server does.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use super::delete::GcItem;
use super::validate::{
    check_kind, default_object, fold_string_data, set_crd_status, spec_part, tracks_generation,
    validate_owner_references,
};
use super::{
    EventType, Inner, ObjKey, ObjMeta, Stored, Subresource, WriteOpts, crd_gr, decode, encode, finalizers,
    namespaces_gr,
};
use crate::error::ApiError;
use crate::managed;
use crate::resources::GroupResource;
use crate::util::{meta_mut, meta_str, new_uid, now_rfc3339, random_suffix};
use wasmctrl_selectors::{is_dns_label, is_dns_subdomain};

impl Inner {
    pub(super) fn create(
        &mut self,
        gr: &GroupResource,
        ns: &str,
        mut obj: Value,
        opts: &WriteOpts,
    ) -> Result<Bytes, ApiError> {
        let info = self.bucket(gr)?.info.clone();
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body of the request must be a JSON object"));
        }
        check_kind(&obj, &info)?;
        validate_owner_references(gr, &info, meta_str(&obj, "name"), &obj)?;
        obj["apiVersion"] = Value::String(info.api_version(info.storage_version()));
        obj["kind"] = Value::String(info.kind.clone());
        let meta = meta_mut(&mut obj);
        let mut name = meta.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        if name.is_empty() {
            match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => {
                    name = format!("{prefix}{}", random_suffix());
                    meta.insert("name".into(), Value::String(name.clone()));
                }
                _ => {
                    return Err(ApiError::invalid(
                        &gr.group,
                        &info.kind,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            }
        }
        // Namespaces are RFC 1123 labels, other built-in objects RFC 1123 subdomains (each
        // dot-separated part a label), as the API server's name validation has them; custom
        // resources are not checked beyond being present.
        let (name_ok, rule) = if gr == &namespaces_gr() {
            (
                is_dns_label(&name),
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
            )
        } else {
            (
                is_dns_subdomain(&name) || info.custom && !name.is_empty(),
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            )
        };
        if !name_ok {
            return Err(ApiError::invalid(
                &gr.group,
                &info.kind,
                &name,
                format!("metadata.name: Invalid value: \"{name}\": {rule}"),
            ));
        }
        if info.namespaced {
            let body_ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta.insert("namespace".into(), Value::String(ns.into()));
        } else {
            meta.remove("namespace");
        }
        for k in ["deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"] {
            meta.remove(k);
        }
        meta.insert("uid".into(), Value::String(new_uid()));
        meta.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
        if tracks_generation(gr, &info) {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
        if info.namespaced {
            self.check_namespace(ns)?;
        }
        let key = (if info.namespaced { ns.to_string() } else { String::new() }, name.clone());
        if self.bucket(gr)?.objects.contains_key(&key) {
            return Err(ApiError::already_exists(&gr.group, &gr.resource, &name));
        }
        if info.status_subresource && info.custom {
            // CRDs with a status subresource ignore status on create.
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        default_object(gr, &mut obj, &name);
        fold_string_data(gr, &mut obj);
        if *gr == crd_gr() {
            let new_info = self.validate_crd(&obj, &name)?;
            set_crd_status(&mut obj, &new_info);
            if !opts.dry_run {
                self.register(new_info);
            }
        }
        if let Some(manager) = &opts.manager {
            managed::record_update(None, &mut obj, manager, &info.api_version(info.storage_version()));
        }
        if opts.dry_run {
            return encode(&obj);
        }
        self.commit(gr, obj, EventType::Added, None)
    }
    #[allow(clippy::too_many_arguments)]
    pub(super) fn update(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        cur: &Stored,
        old: Value,
        new: Value,
        sub: Subresource,
        opts: &WriteOpts,
    ) -> Result<Bytes, ApiError> {
        let info = self.bucket(gr)?.info.clone();
        let name = key.1.as_str();
        if !new.is_object() {
            return Err(ApiError::bad_request("the body of the request must be a JSON object"));
        }
        check_kind(&new, &info)?;
        let new_name = meta_str(&new, "name");
        if !new_name.is_empty() && new_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({new_name}) does not match the name on the URL ({name})"
            )));
        }
        let new_ns = meta_str(&new, "namespace");
        if info.namespaced && !new_ns.is_empty() && new_ns != key.0 {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let want_rv = meta_str(&new, "resourceVersion");
        if !want_rv.is_empty() && want_rv != cur.meta.rv.to_string() {
            return Err(ApiError::conflict(
                &gr.group,
                &gr.resource,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let new_uid = meta_str(&new, "uid");
        if !new_uid.is_empty() && new_uid != cur.meta.uid {
            return Err(ApiError::conflict(
                &gr.group,
                &gr.resource,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {new_uid}, UID in object meta: {}",
                    cur.meta.uid
                ),
            ));
        }
        // Build the object that will be stored.
        let mut obj = match sub {
            Subresource::Status => {
                let mut o = old.clone();
                match new.get("status") {
                    Some(s) => o["status"] = s.clone(),
                    None => {
                        if let Some(m) = o.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                o
            }
            Subresource::Main => {
                let mut o = new;
                if info.status_subresource {
                    match old.get("status") {
                        Some(s) => o["status"] = s.clone(),
                        None => {
                            if let Some(m) = o.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                o
            }
        };
        obj["apiVersion"] = Value::String(info.api_version(info.storage_version()));
        obj["kind"] = Value::String(info.kind.clone());
        fold_string_data(gr, &mut obj);
        {
            let old_meta = old.get("metadata").cloned().unwrap_or_default();
            let m = meta_mut(&mut obj);
            for k in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old_meta.get(k) {
                    Some(v) => {
                        m.insert(k.into(), v.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
            m.remove("resourceVersion");
            if sub == Subresource::Status {
                // Status writes cannot change metadata except managedFields.
            }
        }
        if cur.meta.deleting {
            let old_f = &cur.meta.finalizers;
            if let Some(added) = finalizers(&obj).into_iter().find(|f| !old_f.contains(f)) {
                return Err(ApiError::invalid(
                    &gr.group,
                    &info.kind,
                    name,
                    format!(
                        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers [\"{added}\"]"
                    ),
                ));
            }
        }
        validate_owner_references(gr, &info, name, &obj)?;
        if tracks_generation(gr, &info)
            && spec_part(&old, info.status_subresource) != spec_part(&obj, info.status_subresource)
        {
            let g = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
            meta_mut(&mut obj).insert("generation".into(), json!(g + 1));
        }
        if *gr == crd_gr() {
            let new_info = self.validate_crd(&obj, name)?;
            if obj.get("status").is_none() {
                set_crd_status(&mut obj, &new_info);
            }
            if !opts.dry_run && !cur.meta.deleting {
                self.register(new_info);
            }
        }
        if let Some(manager) = &opts.manager {
            managed::record_update(Some(&old), &mut obj, manager, &info.api_version(info.storage_version()));
        }
        // Compare without resourceVersion: a no-op write changes nothing and keeps the RV.
        let mut old_cmp = old;
        meta_mut(&mut old_cmp).remove("resourceVersion");
        if old_cmp == obj {
            return Ok(cur.json.clone());
        }
        if opts.dry_run {
            meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(cur.meta.rv.to_string()));
            return encode(&obj);
        }
        if cur.meta.deleting && finalizers(&obj).is_empty() && !self.blocks_deletion(gr, &obj) {
            let out = self.commit(gr, obj, EventType::Deleted, Some(cur))?;
            let meta = Arc::new(ObjMeta::from_value(&decode(&out)?));
            self.gc.push(GcItem::Gone { gr: gr.clone(), meta });
            return Ok(out);
        }
        let out = self.commit(gr, obj, EventType::Modified, Some(cur))?;
        if cur.meta.deleting {
            self.gc.push(GcItem::Deleting { gr: gr.clone(), key: key.clone() });
        }
        Ok(out)
    }
}

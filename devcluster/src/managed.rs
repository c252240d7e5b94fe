//! Field ownership (`metadata.managedFields`, FieldsV1) and server-side apply.
//!
//! Model: a field set is the set of leaf paths a manager owns. Paths are sequences of
//! FieldsV1 segments: `f:<field>` for map/struct members, `k:{"name":"x"}` for members of
//! lists whose items all carry a string `name` (merged by name), and `.` for "the list item
//! itself". Other lists, scalars and empty maps are leaves (atomic).
//!
//! Rules kept (the common cases of Kubernetes' structured-merge-diff):
//! - create/update/patch by manager M: M takes the leaves whose values changed; other
//!   managers lose them. Unchanged writes leave managedFields untouched.
//! - apply by M: a leaf of the applied config owned by another manager with a different
//!   live value is a conflict (409) unless `force`, which transfers it to M. Leaves M owned
//!   before and no longer applies are removed from the object unless another manager owns them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::util::now_rfc3339;

type Path = Vec<String>;
type FieldSet = BTreeSet<Path>;

/// Fields of the object that nobody manages (identity and server-owned metadata).
fn skipped(path: &[String]) -> bool {
    match path {
        [a] => a == "f:apiVersion" || a == "f:kind",
        [m, f, ..] if m == "f:metadata" => matches!(
            f.as_str(),
            "f:name"
                | "f:namespace"
                | "f:uid"
                | "f:resourceVersion"
                | "f:generation"
                | "f:creationTimestamp"
                | "f:deletionTimestamp"
                | "f:deletionGracePeriodSeconds"
                | "f:managedFields"
                | "f:selfLink"
        ),
        _ => false,
    }
}

fn item_key(item: &Value) -> Option<String> {
    let name = item.as_object()?.get("name")?.as_str()?;
    Some(format!("k:{}", json!({ "name": name })))
}

fn keyed_list(a: &[Value]) -> bool {
    !a.is_empty() && a.iter().all(|i| item_key(i).is_some())
}

/// The leaf paths of `v`.
fn fields_of(v: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    let mut path = Vec::new();
    walk(v, &mut path, &mut out);
    out.retain(|p| !skipped(p));
    out
}

fn walk(v: &Value, path: &mut Path, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                path.push(format!("f:{k}"));
                walk(child, path, out);
                path.pop();
            }
        }
        Value::Array(a) if keyed_list(a) => {
            for item in a {
                if let Some(k) = item_key(item) {
                    path.push(k);
                    path.push(".".into());
                    out.insert(path.clone());
                    path.pop();
                    walk(item, path, out);
                    path.pop();
                }
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// The value at `path` (a `.` segment resolves to the item itself).
fn lookup<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for seg in path {
        if seg == "." {
            continue;
        }
        if let Some(f) = seg.strip_prefix("f:") {
            cur = cur.as_object()?.get(f)?;
        } else if let Some(k) = seg.strip_prefix("k:") {
            let key: Value = serde_json::from_str(k).ok()?;
            let name = key.get("name")?.as_str()?;
            cur = cur.as_array()?.iter().find(|i| i.get("name").and_then(Value::as_str) == Some(name))?;
        } else {
            return None;
        }
    }
    Some(cur)
}

/// Removes the field at `path` from `v` (for `.`: the whole list item).
fn remove(v: &mut Value, path: &[String]) {
    let (last, parent_path) = match path.split_last() {
        Some((l, p)) if l == "." => match p.split_last() {
            Some((item, pp)) => (item, pp),
            None => return,
        },
        Some((l, p)) => (l, p),
        None => return,
    };
    let mut cur = v;
    for seg in parent_path {
        let next = if let Some(f) = seg.strip_prefix("f:") {
            cur.as_object_mut().and_then(|m| m.get_mut(f))
        } else if let Some(k) = seg.strip_prefix("k:") {
            let name = serde_json::from_str::<Value>(k)
                .ok()
                .and_then(|k| k.get("name").and_then(Value::as_str).map(str::to_string));
            cur.as_array_mut()
                .and_then(|a| a.iter_mut().find(|i| i.get("name").and_then(Value::as_str) == name.as_deref()))
        } else {
            None
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(k) = last.strip_prefix("k:")
        && let Ok(key) = serde_json::from_str::<Value>(k)
        && let Some(a) = cur.as_array_mut()
    {
        let name = key.get("name").and_then(Value::as_str);
        a.retain(|i| i.get("name").and_then(Value::as_str) != name);
    }
}

/// FieldsV1 JSON for a set of leaf paths.
fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for seg in path {
            let next = cur.entry(seg.clone()).or_insert_with(|| json!({}));
            match next.as_object_mut() {
                Some(m) => cur = m,
                None => break,
            }
        }
    }
    Value::Object(root)
}

/// Leaf paths of a FieldsV1 tree.
fn from_fields_v1(v: &Value) -> FieldSet {
    fn go(v: &Value, path: &mut Path, out: &mut FieldSet) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, child) in m {
                    path.push(k.clone());
                    go(child, path, out);
                    path.pop();
                }
            }
            _ => {
                if !path.is_empty() {
                    out.insert(path.clone());
                }
            }
        }
    }
    let mut out = FieldSet::new();
    go(v, &mut Vec::new(), &mut out);
    out
}

/// One managedFields entry.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    fields: FieldSet,
}

fn read_entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|e| {
                    Some(Entry {
                        manager: e.get("manager")?.as_str()?.to_string(),
                        operation: e.get("operation").and_then(Value::as_str).unwrap_or("Update").into(),
                        api_version: e.get("apiVersion").and_then(Value::as_str).unwrap_or("").into(),
                        time: e.get("time").and_then(Value::as_str).unwrap_or("").into(),
                        fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            })
        })
        .collect();
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            m.remove("managedFields");
        } else {
            m.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Records a non-apply write by `manager`: it takes ownership of every leaf whose value
/// changed between `old` and `new` (all leaves on create).
pub fn record_update(old: Option<&Value>, new: &mut Value, manager: &str, api_version: &str) {
    let mut entries = match old {
        Some(o) => read_entries(o),
        None => Vec::new(),
    };
    // The client may not rewrite managedFields by sending them; keep the stored ones.
    let new_fields = fields_of(new);
    let changed: FieldSet =
        new_fields.iter().filter(|p| old.is_none_or(|o| lookup(o, p) != lookup(new, p))).cloned().collect();
    // Fields removed by this write are no longer owned by anyone.
    let removed: FieldSet = old
        .map(|o| fields_of(o).into_iter().filter(|p| lookup(new, p).is_none()).collect())
        .unwrap_or_default();
    if changed.is_empty() && removed.is_empty() {
        write_entries(new, &entries);
        return;
    }
    for e in &mut entries {
        e.fields.retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    match entries.iter_mut().find(|e| e.manager == manager && e.operation == "Update") {
        Some(e) => {
            e.fields.extend(changed);
            e.time = now_rfc3339();
            e.api_version = api_version.into();
        }
        None => entries.push(Entry {
            manager: manager.into(),
            operation: "Update".into(),
            api_version: api_version.into(),
            time: now_rfc3339(),
            fields: changed,
        }),
    }
    write_entries(new, &entries);
}

fn path_string(p: &[String]) -> String {
    let mut s = String::new();
    for seg in p {
        if let Some(f) = seg.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = seg.strip_prefix("k:")
            && let Ok(key) = serde_json::from_str::<Value>(k)
            && let Some(n) = key.get("name").and_then(Value::as_str)
        {
            s.push_str(&format!("[name=\"{n}\"]"));
        }
    }
    s
}

/// Deep-merges the applied configuration into the live object: maps recursively, lists of
/// named items by name, everything else replaced.
fn merge_into(live: &mut Value, applied: &Value) {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, av) in a {
                match l.get_mut(k) {
                    Some(lv) if lv.is_object() && av.is_object() => merge_into(lv, av),
                    Some(lv) if lv.is_array() && av.as_array().is_some_and(|x| keyed_list(x)) => {
                        merge_into(lv, av)
                    }
                    _ => {
                        l.insert(k.clone(), av.clone());
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(a)) if keyed_list(a) && l.iter().all(|i| item_key(i).is_some()) => {
            for ai in a {
                let name = ai.get("name").and_then(Value::as_str);
                match l.iter_mut().find(|li| li.get("name").and_then(Value::as_str) == name) {
                    Some(li) => merge_into(li, ai),
                    None => l.push(ai.clone()),
                }
            }
        }
        (l, a) => *l = a.clone(),
    }
}

/// Server-side apply of `applied` by `manager` onto `live` (None: create). Returns the new
/// object with managedFields updated, or a 409 listing the conflicting fields.
pub fn apply(
    live: Option<Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    ignore_status: bool,
) -> Result<Value, ApiError> {
    let mut applied = applied.clone();
    if let Some(m) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    if ignore_status && let Some(m) = applied.as_object_mut() {
        m.remove("status");
    }
    let applied_fields = fields_of(&applied);
    let Some(mut live) = live else {
        let entries = vec![Entry {
            manager: manager.into(),
            operation: "Apply".into(),
            api_version: api_version.into(),
            time: now_rfc3339(),
            fields: applied_fields,
        }];
        write_entries(&mut applied, &entries);
        return Ok(applied);
    };
    let mut entries = read_entries(&live);
    // Conflicts: leaves another manager owns whose live value differs from the applied one.
    let mut conflicts: BTreeMap<String, Vec<Path>> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.manager != manager) {
        for p in e.fields.intersection(&applied_fields) {
            if p.last().is_some_and(|s| s == ".") {
                continue;
            }
            if lookup(&live, p) != lookup(&applied, p) {
                conflicts.entry(e.manager.clone()).or_default().push(p.clone());
            }
        }
    }
    if !conflicts.is_empty() && !force {
        let n: usize = conflicts.values().map(Vec::len).sum();
        let mut causes = Vec::new();
        let mut lines = Vec::new();
        for (m, paths) in &conflicts {
            for p in paths {
                let field = path_string(p);
                lines.push(format!("conflict with \"{m}\": {field}"));
                causes.push(json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\""), "field": field}));
            }
        }
        let plural = if n == 1 { "conflict" } else { "conflicts" };
        let mut err = ApiError::conflict("", "", "", "");
        err.message = format!("Apply failed with {n} {plural}: {}", lines.join("\n"));
        err.details = Some(json!({ "causes": causes }));
        return Err(err);
    }
    for e in entries.iter_mut().filter(|e| e.manager != manager) {
        e.fields.retain(|p| {
            p.last().is_some_and(|s| s == ".")
                || lookup(&live, p) == lookup(&applied, p)
                || !applied_fields.contains(p)
        });
    }
    // Leaves this manager applied before but no longer does, and nobody else owns, go away.
    let previous: FieldSet = entries
        .iter()
        .filter(|e| e.manager == manager && e.operation == "Apply")
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    let others: FieldSet = entries
        .iter()
        .filter(|e| !(e.manager == manager && e.operation == "Apply"))
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    let dropped: Vec<&Path> = previous.difference(&applied_fields).filter(|p| !others.contains(*p)).collect();
    for p in dropped.iter().filter(|p| p.last().is_none_or(|s| s != ".")) {
        remove(&mut live, p);
    }
    for p in dropped.iter().filter(|p| p.last().is_some_and(|s| s == ".")) {
        let item = &p[..p.len() - 1];
        if !others.iter().any(|o| o.starts_with(item)) {
            remove(&mut live, p);
        }
    }
    merge_into(&mut live, &applied);
    entries.retain(|e| !(e.manager == manager && e.operation == "Apply"));
    entries.push(Entry {
        manager: manager.into(),
        operation: "Apply".into(),
        api_version: api_version.into(),
        time: now_rfc3339(),
        fields: applied_fields,
    });
    write_entries(&mut live, &entries);
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn managers(obj: &Value) -> Vec<String> {
        read_entries(obj).into_iter().map(|e| format!("{}:{}", e.manager, e.operation)).collect()
    }

    #[test]
    fn apply_creates_then_merges_and_prunes() {
        let a1 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "1", "b": "2"}});
        let o = apply(None, &a1, "m1", false, "v1", false).unwrap();
        assert_eq!(managers(&o), vec!["m1:Apply"]);
        let a2 =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "1"}});
        let o = apply(Some(o), &a2, "m1", false, "v1", false).unwrap();
        assert_eq!(o["data"], json!({"a": "1"}), "b was pruned");
    }

    #[test]
    fn apply_conflicts_and_force() {
        let a1 = json!({"metadata": {"name": "x"}, "data": {"a": "1"}});
        let o = apply(None, &a1, "m1", false, "v1", false).unwrap();
        let a2 = json!({"metadata": {"name": "x"}, "data": {"a": "2", "c": "3"}});
        let err = apply(Some(o.clone()), &a2, "m2", false, "v1", false).unwrap_err();
        assert_eq!(err.code, 409);
        assert!(err.message.contains("conflict with \"m1\": .data.a"), "{}", err.message);
        // Same value: shared ownership, no conflict.
        let a3 = json!({"metadata": {"name": "x"}, "data": {"a": "1", "c": "3"}});
        assert!(apply(Some(o.clone()), &a3, "m2", false, "v1", false).is_ok());
        let forced = apply(Some(o), &a2, "m2", true, "v1", false).unwrap();
        assert_eq!(forced["data"], json!({"a": "2", "c": "3"}));
        let m1 = read_entries(&forced).into_iter().find(|e| e.manager == "m1");
        assert!(m1.is_none(), "m1 lost its only field");
    }

    #[test]
    fn update_takes_changed_fields() {
        let a1 = json!({"metadata": {"name": "x"}, "data": {"a": "1", "b": "1"}});
        let old = apply(None, &a1, "m1", false, "v1", false).unwrap();
        let mut new = old.clone();
        new["data"]["a"] = json!("9");
        record_update(Some(&old), &mut new, "editor", "v1");
        let e = read_entries(&new);
        let editor = e.iter().find(|e| e.manager == "editor").unwrap();
        assert!(editor.fields.contains(&vec!["f:data".to_string(), "f:a".to_string()]));
        let m1 = e.iter().find(|e| e.manager == "m1").unwrap();
        assert!(!m1.fields.contains(&vec!["f:data".to_string(), "f:a".to_string()]));
        // Apply by m1 of a=1 now conflicts with editor.
        assert_eq!(apply(Some(new), &a1, "m1", false, "v1", false).unwrap_err().code, 409);
    }

    #[test]
    fn named_lists_merge_by_name() {
        let a1 = json!({"spec": {"containers": [{"name": "a", "image": "x"}]}});
        let o = apply(None, &a1, "m1", false, "v1", false).unwrap();
        let a2 = json!({"spec": {"containers": [{"name": "b", "image": "y"}]}});
        let o = apply(Some(o), &a2, "m2", false, "v1", false).unwrap();
        assert_eq!(o["spec"]["containers"].as_array().unwrap().len(), 2);
        let fv1 = to_fields_v1(&fields_of(&a1));
        assert_eq!(from_fields_v1(&fv1), fields_of(&a1));
    }
}

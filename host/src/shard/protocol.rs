//! What replicas of one ring agree on through the API server: the names, labels and
//! annotations of the Leases, and the label on sharded objects (label mode).
//!
//! Invariants: every encoding here is read back by a `decode_*` function that never
//! panic on what another replica (or a person with `kubectl`) wrote; an annotation that does
//! not parse reads as absent, which never lets a replica take more than it would otherwise
//! (an unreadable acknowledgement counts as none; an unreadable assignment is not acted on).

use std::collections::BTreeSet;

use super::handover::{Assignment, Members};

/// Label on every Lease of a ring: its name.
pub const RING_LABEL: &str = "wasmctrl.dev/ring";
/// Label on every Lease of a ring: `shard` or `assignment`.
pub const ROLE_LABEL: &str = "wasmctrl.dev/ring-role";
pub const ROLE_SHARD: &str = "shard";
pub const ROLE_ASSIGNMENT: &str = "assignment";

/// Shard Lease: the shard's name (the Lease name carries the ring as a prefix).
pub const SHARD_ANNOTATION: &str = "wasmctrl.dev/shard";
/// Shard Lease: the highest epoch this shard has acknowledged.
pub const ACKED_ANNOTATION: &str = "wasmctrl.dev/acked-epoch";
/// Shard Lease (label mode): the scopes whose objects it wants labelled, as JSON.
pub const SCOPES_ANNOTATION: &str = "wasmctrl.dev/label-scopes";

/// Assignment Lease: the epoch published last.
pub const EPOCH_ANNOTATION: &str = "wasmctrl.dev/epoch";
/// Assignment Lease: the shards of that epoch as `name=identity`, comma-separated, sorted.
pub const MEMBERS_ANNOTATION: &str = "wasmctrl.dev/members";
/// Assignment Lease: the shards of the epoch before, likewise.
pub const PREVIOUS_ANNOTATION: &str = "wasmctrl.dev/previous-members";

/// The label (label mode) naming the shard an object is assigned to.
pub fn object_label(ring: &str) -> String {
    format!("shard.wasmctrl.dev/{ring}")
}

/// The shard Lease of `shard` in `ring`.
pub fn shard_lease_name(ring: &str, shard: &str) -> String {
    format!("{ring}-shard-{shard}")
}

/// The Lease of the assignment role of `ring`.
pub fn assignment_lease_name(ring: &str) -> String {
    format!("{ring}-assignment")
}

/// The longest shard name: it is a label value (63) inside a Lease name.
pub const MAX_SHARD_NAME: usize = 63;

/// Checks a shard name: a DNS subdomain of at most 63 characters (so it is also a valid
/// label value and fits a Lease name).
pub fn check_shard_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_SHARD_NAME || !wasmctrl_selectors::is_dns_subdomain(name) {
        return Err(format!(
            "shard name `{name}` must be at most {MAX_SHARD_NAME} lowercase letters, digits, `-` and `.`, \
             starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

fn encode_members(members: &Members) -> String {
    members.iter().map(|(name, identity)| format!("{name}={identity}")).collect::<Vec<_>>().join(",")
}

/// `None` if any entry is not `name=identity`.
fn decode_members(text: &str) -> Option<Members> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            let (name, identity) = entry.split_once('=')?;
            (!name.is_empty() && !identity.is_empty()).then(|| (name.to_owned(), identity.to_owned()))
        })
        .collect()
}

/// The annotations publishing `assignment`.
pub fn encode_assignment(assignment: &Assignment) -> [(&'static str, String); 3] {
    [
        (EPOCH_ANNOTATION, assignment.epoch.to_string()),
        (MEMBERS_ANNOTATION, encode_members(&assignment.members)),
        (PREVIOUS_ANNOTATION, encode_members(&assignment.previous)),
    ]
}

/// The assignment published in `annotations`, if there is a readable one.
pub fn decode_assignment(annotations: &std::collections::BTreeMap<String, String>) -> Option<Assignment> {
    let epoch: u64 = annotations.get(EPOCH_ANNOTATION)?.trim().parse().ok().filter(|e| *e > 0)?;
    let members = decode_members(annotations.get(MEMBERS_ANNOTATION)?)?;
    let previous = match annotations.get(PREVIOUS_ANNOTATION) {
        Some(text) => decode_members(text)?,
        None => Members::new(),
    };
    Some(Assignment { epoch, members, previous })
}

/// An acknowledged epoch as written in a shard Lease.
pub fn decode_acked(annotations: &std::collections::BTreeMap<String, String>) -> Option<u64> {
    annotations.get(ACKED_ANNOTATION)?.trim().parse().ok()
}

/// One scope whose objects a label-mode replica wants labelled: a kind in a namespace (or
/// all), with the selectors of the plugin's `for` source.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelScope {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<String>,
}

impl std::fmt::Display for LabelScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.api_version, self.kind)?;
        if let Some(ns) = &self.namespace {
            write!(f, " ns={ns}")?;
        }
        if let Some(l) = &self.label_selector {
            write!(f, " labels={l}")?;
        }
        if let Some(x) = &self.field_selector {
            write!(f, " fields={x}")?;
        }
        Ok(())
    }
}

pub fn encode_scopes(scopes: &BTreeSet<LabelScope>) -> String {
    serde_json::to_string(scopes).unwrap_or_else(|_| "[]".into())
}

pub fn decode_scopes(annotations: &std::collections::BTreeMap<String, String>) -> Vec<LabelScope> {
    annotations.get(SCOPES_ANNOTATION).and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn assignments_round_trip_and_garbage_reads_as_none() {
        let a = Assignment {
            epoch: 7,
            members: [("b", "b_2_ff"), ("a", "a_1_0e")].map(|(n, i)| (n.to_owned(), i.to_owned())).into(),
            previous: [("a", "a_1_0e")].map(|(n, i)| (n.to_owned(), i.to_owned())).into(),
        };
        let annotations: BTreeMap<String, String> =
            encode_assignment(&a).into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        assert_eq!(annotations[MEMBERS_ANNOTATION], "a=a_1_0e,b=b_2_ff");
        assert_eq!(decode_assignment(&annotations), Some(a));
        for (key, value) in [
            (EPOCH_ANNOTATION, "x"),
            (EPOCH_ANNOTATION, "0"),
            (EPOCH_ANNOTATION, "-1"),
            (MEMBERS_ANNOTATION, "a,b"),
            (PREVIOUS_ANNOTATION, "a="),
        ] {
            let mut bad = annotations.clone();
            bad.insert(key.into(), value.into());
            assert_eq!(decode_assignment(&bad), None, "{value}");
        }
        let mut no_members = annotations.clone();
        no_members.remove(MEMBERS_ANNOTATION);
        assert_eq!(decode_assignment(&no_members), None);
        assert_eq!(decode_acked(&BTreeMap::from([(ACKED_ANNOTATION.into(), "nope".into())])), None);
        assert_eq!(decode_acked(&BTreeMap::from([(ACKED_ANNOTATION.into(), "12".into())])), Some(12));
    }

    #[test]
    fn scopes_round_trip() {
        let scopes: BTreeSet<LabelScope> = [LabelScope {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("team-a".into()),
            label_selector: Some("mirror=true".into()),
            field_selector: None,
        }]
        .into();
        let text = encode_scopes(&scopes);
        let back = decode_scopes(&BTreeMap::from([(SCOPES_ANNOTATION.into(), text)]));
        assert_eq!(back, scopes.into_iter().collect::<Vec<_>>());
        assert!(decode_scopes(&BTreeMap::from([(SCOPES_ANNOTATION.into(), "{".into())])).is_empty());
    }

    #[test]
    fn shard_names_fit_labels_and_lease_names() {
        assert!(check_shard_name("wasmctrl-7d9f8b6c4-x2k8q").is_ok());
        assert!(check_shard_name("replica.1").is_ok());
        for bad in ["", "Upper", "under_score", "-lead", &"a".repeat(64)] {
            assert!(check_shard_name(bad).is_err(), "{bad}");
        }
    }
}

//! `[sharding]` of the host TOML, checked: replicas share the keys of every plugin on a
//! consistent-hash ring whose members are the live shard Leases (see `docs/sharding.md`).
//!
//! Invariants of a [`ShardingConfig`]: the ring name is a DNS label (it becomes the name
//! part of a label key, and a prefix of Lease names); the Lease timings satisfy client-go's
//! ordering (lease-duration > renew-deadline > 1.2 × retry-period), on which the hand-over
//! argument rests; sharding and `[leader-election]` are not both on (the ring replaces the
//! one leader: every replica works, each on its own keys).

use std::time::Duration;

use wasmctrl_selectors::is_dns_label;

use super::schema::{ShardingMode, ShardingToml};
use crate::config::source::PathSeg;

/// Points each replica has on the ring unless `virtual-nodes` says otherwise. A replica's
/// share of the ring is the sum of the arcs ending at its points; with `v` points each, a
/// share's relative spread is about `1/sqrt(v)`, so at this many the shares of three
/// replicas stay well within 20 % of each other (the ring's proptest checks that).
pub const DEFAULT_VIRTUAL_NODES: u32 = 2048;

/// The most points a replica may have (the ring holds `replicas × virtual-nodes` points).
const MAX_VIRTUAL_NODES: u32 = 65_536;

/// `[sharding]`, checked. Only present when enabled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardingConfig {
    /// The ring: the `wasmctrl.dev/ring` label of its Leases, and the name part of the
    /// object label `shard.wasmctrl.dev/<ring>` in label mode.
    pub ring: String,
    /// Namespace of the shard Leases and the assignment Lease.
    pub namespace: String,
    pub mode: ShardingMode,
    pub virtual_nodes: u32,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// One problem: the field path, whether to point at the key, the message, a hint.
type Report<'a> = &'a mut dyn FnMut(&[PathSeg], bool, String, Option<&str>);

pub(super) fn resolve(file: &ShardingToml, leader_election: bool, err: Report<'_>) -> Option<ShardingConfig> {
    let path = |k: &str| [PathSeg::Key("sharding".into()), PathSeg::Key(k.into())];
    let ring = file.ring.clone().unwrap_or_else(|| "wasmctrl".into());
    if !is_dns_label(&ring) {
        err(
            &path("ring"),
            false,
            format!("`{ring}` is not a valid ring name"),
            Some("use lowercase letters, digits and `-`, at most 63 characters"),
        );
    }
    let namespace = file.namespace.clone().unwrap_or_else(|| "default".into());
    if !is_dns_label(&namespace) {
        err(&path("namespace"), false, format!("`{namespace}` is not a valid namespace name"), None);
    }
    let virtual_nodes = file.virtual_nodes.unwrap_or(DEFAULT_VIRTUAL_NODES);
    if virtual_nodes == 0 || virtual_nodes > MAX_VIRTUAL_NODES {
        err(
            &path("virtual-nodes"),
            false,
            format!("virtual-nodes must be between 1 and {MAX_VIRTUAL_NODES}"),
            Some("a few thousand keep the replicas' shares within a few percent of each other"),
        );
    }
    let lease_duration = file.lease_duration.map_or(Duration::from_secs(15), |d| d.0);
    let renew_deadline = file.renew_deadline.map_or(Duration::from_secs(10), |d| d.0);
    let retry_period = file.retry_period.map_or(Duration::from_secs(2), |d| d.0);
    if lease_duration <= renew_deadline {
        err(
            &path("lease-duration"),
            false,
            "lease-duration must be longer than renew-deadline".into(),
            Some("a replica stops working at renew-deadline, the others take over after lease-duration"),
        );
    }
    if renew_deadline.as_millis() * 10 <= retry_period.as_millis() * 12 {
        err(
            &path("renew-deadline"),
            false,
            "renew-deadline must be longer than 1.2 × retry-period".into(),
            None,
        );
    }
    if retry_period.is_zero() {
        err(&path("retry-period"), false, "retry-period must be more than 0".into(), None);
    }
    let enabled = file.enabled.unwrap_or(false);
    if enabled && leader_election {
        err(
            &path("enabled"),
            false,
            "sharding and leader election cannot both be enabled".into(),
            Some("with sharding every replica works, each on its own keys; turn `[leader-election]` off"),
        );
    }
    enabled.then(|| ShardingConfig {
        ring,
        namespace,
        mode: file.mode.unwrap_or_default(),
        virtual_nodes: virtual_nodes.clamp(1, MAX_VIRTUAL_NODES),
        lease_duration,
        renew_deadline,
        retry_period,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::HostConfig;

    fn parse(text: &str) -> Result<HostConfig, String> {
        HostConfig::parse(Path::new("/etc/wasmctrl/wasmctrl.toml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn off_by_default_and_defaults_when_on() {
        assert_eq!(parse("").unwrap().sharding, None);
        assert_eq!(parse("[sharding]\nring = \"x\"\n").unwrap().sharding, None, "enabled defaults to false");
        let s = parse("[sharding]\nenabled = true\n").unwrap().sharding.unwrap();
        assert_eq!(
            s,
            ShardingConfig {
                ring: "wasmctrl".into(),
                namespace: "default".into(),
                mode: ShardingMode::Label,
                virtual_nodes: DEFAULT_VIRTUAL_NODES,
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            }
        );
    }

    #[test]
    fn every_key_is_read() {
        let s = parse(
            "[sharding]\nenabled = true\nring = \"web\"\nnamespace = \"ops\"\nmode = \"no-write\"\n\
             virtual-nodes = 64\nlease-duration = \"9s\"\nrenew-deadline = \"6s\"\nretry-period = \"1s\"\n",
        )
        .unwrap()
        .sharding
        .unwrap();
        assert_eq!((s.ring.as_str(), s.namespace.as_str()), ("web", "ops"));
        assert_eq!(s.mode, ShardingMode::NoWrite);
        assert_eq!(s.virtual_nodes, 64);
        assert_eq!(
            (s.lease_duration, s.renew_deadline, s.retry_period),
            (Duration::from_secs(9), Duration::from_secs(6), Duration::from_secs(1))
        );
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            ("ring = \"Web_Ring\"", "sharding.ring", "not a valid ring name"),
            ("namespace = \"a.b\"", "sharding.namespace", "not a valid namespace"),
            ("virtual-nodes = 0", "sharding.virtual-nodes", "between 1 and"),
            ("lease-duration = \"5s\"", "sharding.lease-duration", "longer than renew-deadline"),
            ("renew-deadline = \"2s\"", "sharding.renew-deadline", "1.2 × retry-period"),
            ("mode = \"labels\"", "sharding.mode", "did you mean \"label\""),
            ("vnodes = 3", "sharding.vnodes", "unknown key"),
        ];
        for (line, field, message) in cases {
            let e = parse(&format!("[sharding]\nenabled = true\n{line}\n")).unwrap_err();
            assert!(e.contains(&format!("`{field}`")), "{line}: {e}");
            assert!(e.contains(message), "{line}: {e}");
            assert!(e.contains("wasmctrl.toml:3:"), "{line}: the error points at line 3: {e}");
        }
    }

    #[test]
    fn sharding_and_leader_election_exclude_each_other() {
        let e = parse("[leader-election]\nenabled = true\n[sharding]\nenabled = true\n").unwrap_err();
        assert!(e.contains("`sharding.enabled`") && e.contains("cannot both be enabled"), "{e}");
    }
}

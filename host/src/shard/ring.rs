//! The consistent-hash ring: which replica owns a key, for one set of members.
//!
//! Each member has `virtual_nodes` points on a ring of 2^64 positions; a key belongs to the
//! member of the first point at or after the key's own position (wrapping around). A member
//! that joins takes over only the arcs that end at its points, so about 1/N of the keys move,
//! all of them to it; one that leaves hands only its own keys to the others. With many
//! points per member the arcs even out, so the members' shares are close to equal.
//!
//! Invariants: positions are SHA-256 (the first 8 bytes, big-endian) of `"<member>#<i>"` for
//! points and of the key for keys, so every replica — whatever its build, platform or
//! version — computes the same owner for the same members and key (a different hash would
//! let two replicas own one key: it is part of the protocol and must never change); points
//! that collide are ordered by member name, so the ring depends only on the set of members.

use std::sync::Arc;

use sha2::{Digest, Sha256};

/// A ring over a fixed set of members. Cheap to share (`Arc` inside); immutable.
#[derive(Clone)]
pub struct Ring {
    inner: Arc<Inner>,
}

struct Inner {
    /// Sorted member names; points refer to them by index.
    members: Vec<String>,
    /// (position, member index), sorted by position then member name.
    points: Vec<(u64, u32)>,
    virtual_nodes: u32,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("members", &self.inner.members)
            .field("virtual_nodes", &self.inner.virtual_nodes)
            .finish()
    }
}

/// The ring position of a key (or of a point's label).
pub fn position(bytes: &[u8]) -> u64 {
    let digest = Sha256::digest(bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

impl Ring {
    /// A ring over `members` (duplicates count once) with `virtual_nodes` points each (at
    /// least one).
    pub fn new<I, S>(members: I, virtual_nodes: u32) -> Ring
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut members: Vec<String> = members.into_iter().map(Into::into).collect();
        members.sort();
        members.dedup();
        let virtual_nodes = virtual_nodes.max(1);
        let mut points = Vec::with_capacity(members.len() * virtual_nodes as usize);
        let mut label = String::new();
        for (index, member) in members.iter().enumerate() {
            // Member indexes fit: a ring has far fewer members than u32::MAX.
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            for point in 0..virtual_nodes {
                label.clear();
                label.push_str(member);
                label.push('#');
                label.push_str(&point.to_string());
                points.push((position(label.as_bytes()), index));
            }
        }
        // Member indexes follow the sorted names, so (position, index) orders collisions
        // by name.
        points.sort_unstable();
        Ring { inner: Arc::new(Inner { members, points, virtual_nodes }) }
    }

    /// The members, sorted.
    pub fn members(&self) -> &[String] {
        &self.inner.members
    }

    pub fn virtual_nodes(&self) -> u32 {
        self.inner.virtual_nodes
    }

    pub fn is_empty(&self) -> bool {
        self.inner.members.is_empty()
    }

    /// The member owning `key`, or `None` on an empty ring.
    pub fn owner(&self, key: &str) -> Option<&str> {
        self.owner_at(position(key.as_bytes()))
    }

    /// The member owning the key at ring position `at` (see [`position`]).
    pub fn owner_at(&self, at: u64) -> Option<&str> {
        let points = &self.inner.points;
        if points.is_empty() {
            return None;
        }
        let i = points.partition_point(|(p, _)| *p < at);
        let (_, member) = points.get(i).unwrap_or(&points[0]);
        self.inner.members.get(*member as usize).map(String::as_str)
    }

    /// Whether `member` owns `key`.
    pub fn is_owner(&self, key: &str, member: &str) -> bool {
        self.owner(key) == Some(member)
    }

    /// Each member's share of the ring (fractions summing to 1), in member order: the exact
    /// fraction of all key positions it owns.
    pub fn shares(&self) -> Vec<(String, f64)> {
        let points = &self.inner.points;
        let mut arcs = vec![0u128; self.inner.members.len()];
        if let (Some(first), Some(last)) = (points.first(), points.last()) {
            // The first point owns the wrap-around arc: (last, 2^64) and [0, first].
            arcs[first.1 as usize] += (1u128 << 64) - u128::from(last.0) + u128::from(first.0);
            for pair in points.windows(2) {
                arcs[pair[1].1 as usize] += u128::from(pair[1].0 - pair[0].0);
            }
        }
        let total = (1u128 << 64) as f64;
        self.inner.members.iter().cloned().zip(arcs.into_iter().map(|a| a as f64 / total)).collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::config::DEFAULT_VIRTUAL_NODES;

    /// Replica names as Kubernetes makes them: a Deployment's pods (`name-<hash>-<suffix>`).
    fn replica() -> impl Strategy<Value = String> {
        ("[a-z]{3,10}", "[a-z0-9]{9,10}", "[a-z0-9]{5}").prop_map(|(a, b, c)| format!("{a}-{b}-{c}"))
    }

    fn replicas(n: usize) -> impl Strategy<Value = Vec<String>> {
        proptest::collection::btree_set(replica(), n).prop_map(|s| s.into_iter().collect())
    }

    #[test]
    fn empty_ring_owns_nothing_and_one_member_owns_everything() {
        assert_eq!(Ring::new(Vec::<String>::new(), 8).owner("a/b"), None);
        let ring = Ring::new(["only"], 8);
        for key in ["a/b", "c", "zz/top"] {
            assert_eq!(ring.owner(key), Some("only"));
        }
        assert_eq!(ring.shares(), vec![("only".to_owned(), 1.0)]);
    }

    #[test]
    fn positions_are_sha256_and_fixed() {
        // Part of the protocol between replicas of any version: pinned.
        assert_eq!(position(b"default/app-config"), 0xdf04_66e1_8872_d8c6);
        let ring = Ring::new(["a", "b", "c"], 16);
        let owners: Vec<_> =
            ["k1", "k2", "k3", "k4", "k5", "k6"].iter().map(|k| ring.owner(k).unwrap()).collect();
        assert_eq!(owners, ["b", "c", "b", "c", "c", "a"]);
    }

    #[test]
    fn the_order_members_are_given_in_does_not_matter() {
        let a = Ring::new(["x", "y", "z"], 32);
        let b = Ring::new(["z", "x", "y", "x"], 32);
        for i in 0..500 {
            let key = format!("ns/{i}");
            assert_eq!(a.owner(&key), b.owner(&key));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// At the default number of points, three replicas' shares are within 20 % of each
        /// other (largest / smallest ≤ 1.2), whatever the replicas are called.
        #[test]
        fn three_replicas_share_within_twenty_percent(names in replicas(3)) {
            let ring = Ring::new(&names, DEFAULT_VIRTUAL_NODES);
            let shares: Vec<f64> = ring.shares().into_iter().map(|(_, s)| s).collect();
            let (min, max) = shares.iter().fold((1.0f64, 0.0f64), |(lo, hi), s| (lo.min(*s), hi.max(*s)));
            prop_assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            prop_assert!(max / min <= 1.2, "shares {shares:?}");
        }

        /// A joining replica takes keys only for itself, and about 1/N of them; the others
        /// keep every other key.
        #[test]
        fn a_join_moves_only_keys_to_the_newcomer(names in replicas(4), keys in proptest::collection::vec("[a-z0-9-]{1,20}/[a-z0-9.-]{1,30}", 2000)) {
            let before = Ring::new(&names[..3], DEFAULT_VIRTUAL_NODES);
            let after = Ring::new(&names, DEFAULT_VIRTUAL_NODES);
            let newcomer = names[3].as_str();
            let mut moved = 0usize;
            for key in &keys {
                let (b, a) = (before.owner(key).unwrap(), after.owner(key).unwrap());
                if b != a {
                    prop_assert_eq!(a, newcomer, "{} moved between two old members", key);
                    moved += 1;
                }
            }
            let fraction = moved as f64 / keys.len() as f64;
            // Expected 1/4; the newcomer's share of the ring is within ±20 % of that, and
            // 2,000 keys add a few percent of sampling noise.
            prop_assert!((0.16..=0.34).contains(&fraction), "{fraction}");
            let exact = after.shares().into_iter().find(|(m, _)| m == newcomer).unwrap().1;
            prop_assert!((exact - 0.25).abs() <= 0.25 * 0.2, "the newcomer's share {exact}");
        }

        /// A leaving replica's keys go to the others; nobody else's key moves.
        #[test]
        fn a_leave_moves_only_the_leavers_keys(names in replicas(3), keys in proptest::collection::vec("[a-z0-9/-]{1,40}", 2000)) {
            let before = Ring::new(&names, DEFAULT_VIRTUAL_NODES);
            let after = Ring::new(&names[1..], DEFAULT_VIRTUAL_NODES);
            let leaver = names[0].as_str();
            for key in &keys {
                let (b, a) = (before.owner(key).unwrap(), after.owner(key).unwrap());
                if b != leaver {
                    prop_assert_eq!(a, b, "{} moved though its owner stayed", key);
                }
                prop_assert_ne!(a, leaver);
            }
        }
    }
}

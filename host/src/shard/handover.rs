//! The hand-over protocol as pure state machines: what a replica may work on, and when the
//! assignment role may publish the next ring.
//!
//! A *replica* here is one incarnation: a shard name and the holder identity its process
//! uses for the shard Lease (a restarted replica with the same name is a new replica, which
//! takes the Lease over only once the old one released it or it ran out). The ring hashes
//! names; membership and acknowledgements are per identity.
//!
//! The assignment role publishes *assignments*: epoch `n`, its members `M(n)` and the
//! members of the epoch before, `M(n-1)`. A replica that sees epoch `n`:
//! 1. **releases**: from that instant it starts no reconcile of a key whose owner in `n` is
//!    someone else, waits for the ones in flight, then **acknowledges** `n` in its shard Lease;
//! 2. **completes** `n` once every other member of `M(n-1) ∪ M(n)` has acknowledged `n` (or
//!    at least `n`) or has stopped; only then does it start on the keys it gains in `n`.
//!
//! The assignment role publishes `n+1` only when every member of `M(n-1) ∪ M(n)` has
//! acknowledged `n` or stopped ([`next_assignment`]).
//!
//! Invariant (the reason for all of the above; `docs/sharding.md` has the full argument): at
//! every instant the keys that live replicas work on are disjoint. A replica works only on
//! keys it owns in *every* epoch it holds — the one it completed, the one it acknowledged and
//! the one it is releasing for ([`Holding::owns`]) — and it owns keys in an epoch only if that
//! epoch names *its* identity; owners in one epoch are unique; a replica that completed `n`
//! knows every replica that could still hold one of its keys (an owner in `n-1`) has let go.
//!
//! A replica that has completed nothing works on nothing: a new or restarted replica starts
//! empty-handed, and a replica's view never goes back to an older epoch.

use std::collections::BTreeMap;

use super::ring::{Ring, position};

/// The members of an epoch: shard name → the identity holding its Lease.
pub type Members = BTreeMap<String, String>;

/// One published assignment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// Counts up from 1; each publication is the previous one plus one.
    pub epoch: u64,
    /// The ring of this epoch.
    pub members: Members,
    /// The members of epoch `epoch - 1` (empty for epoch 1).
    pub previous: Members,
}

impl Assignment {
    /// Every replica (name, identity) that may hold a key of this epoch or of the one before.
    pub fn involved(&self) -> impl Iterator<Item = (&String, &String)> {
        self.previous.iter().chain(self.members.iter().filter(|(n, i)| self.previous.get(*n) != Some(*i)))
    }
}

/// An assignment with its ring.
#[derive(Clone, Debug)]
pub struct View {
    pub assignment: Assignment,
    pub ring: Ring,
}

impl View {
    pub fn new(assignment: Assignment, virtual_nodes: u32) -> View {
        let ring = Ring::new(assignment.members.keys().cloned(), virtual_nodes);
        View { assignment, ring }
    }

    pub fn epoch(&self) -> u64 {
        self.assignment.epoch
    }
}

/// What a replica knows about another from its shard Lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    /// The highest epoch it has acknowledged.
    pub acked: Option<u64>,
    /// It cannot be working on anything: its Lease was released or taken over by another
    /// identity, or was not renewed for a whole lease duration as this replica saw it (it
    /// stopped itself before that).
    pub stopped: bool,
}

impl Peer {
    /// Whether it has let go of everything it does not own in `epoch`.
    pub fn done_with(&self, epoch: u64) -> bool {
        self.stopped || self.acked.is_some_and(|a| a >= epoch)
    }
}

/// An epoch held by one replica: the view, and whether it names this replica's identity.
#[derive(Clone, Debug)]
pub struct Held {
    pub view: View,
    pub mine: bool,
}

impl Held {
    fn epoch(&self) -> u64 {
        self.view.epoch()
    }
}

/// The epochs a replica holds, which together decide what it may work on.
#[derive(Clone, Debug, Default)]
pub struct Holding {
    /// The latest epoch completed: its keys (and only those) may have been gained.
    pub completed: Option<Held>,
    /// The latest epoch acknowledged (at or after `completed`).
    pub acked: Option<Held>,
    /// An epoch seen but not yet acknowledged: its losses are being released.
    pub releasing: Option<Held>,
}

impl Holding {
    /// Whether shard `me` may work on `key`: it has completed an epoch, and owns the key in
    /// every epoch it holds, each of which names its identity.
    pub fn owns(&self, me: &str, key: &str) -> bool {
        self.owns_in(&[self.acked.as_ref(), self.releasing.as_ref()], me, key)
    }

    /// Whether shard `me` owned `key` before the epoch it is releasing (it owns it in the
    /// epochs it completed and acknowledged).
    pub fn owned_before_release(&self, me: &str, key: &str) -> bool {
        self.owns_in(&[self.acked.as_ref()], me, key)
    }

    /// Whether `me` owns `key` in the completed epoch and in each of `also`.
    fn owns_in(&self, also: &[Option<&Held>], me: &str, key: &str) -> bool {
        let Some(completed) = &self.completed else { return false };
        let held = || std::iter::once(completed).chain(also.iter().flatten().copied());
        if !held().all(|h| h.mine) {
            return false;
        }
        let at = position(key.as_bytes());
        held().all(|h| h.view.ring.owner_at(at) == Some(me))
    }

    /// The newest epoch held.
    pub fn newest(&self) -> Option<u64> {
        [&self.completed, &self.acked, &self.releasing].into_iter().flatten().map(Held::epoch).max()
    }
}

/// What a completion changed: keys owned after but not before were gained.
#[derive(Clone, Debug)]
pub struct Completion {
    pub before: Holding,
    pub after: Holding,
}

impl Completion {
    /// The epoch completed.
    pub fn epoch(&self) -> u64 {
        self.after.completed.as_ref().map_or(0, Held::epoch)
    }

    /// The assignment completed.
    pub fn assignment(&self) -> Option<&Assignment> {
        self.after.completed.as_ref().map(|h| &h.view.assignment)
    }

    /// Whether `me` gained `key`.
    pub fn gained(&self, me: &str, key: &str) -> bool {
        self.after.owns(me, key) && !self.before.owns(me, key)
    }

    /// Whether `me` gained `key` in the epoch completed but is already releasing it: a newer
    /// epoch, published before this one completed here, gives it to another replica. That
    /// replica may have started after a delete of the key, which only `me` saw (and kept
    /// while the key was elsewhere): `me` reconciles it before it acknowledges the newer
    /// epoch.
    pub fn passed_through(&self, me: &str, key: &str) -> bool {
        self.after.owned_before_release(me, key)
            && !self.after.owns(me, key)
            && !self.before.owns_in(&[], me, key)
    }
}

/// One replica's side of the protocol.
#[derive(Clone, Debug)]
pub struct HandOver {
    me: String,
    identity: String,
    virtual_nodes: u32,
    holding: Holding,
}

impl HandOver {
    /// Shard `me` held by `identity`, holding nothing yet.
    pub fn new(me: impl Into<String>, identity: impl Into<String>, virtual_nodes: u32) -> HandOver {
        HandOver { me: me.into(), identity: identity.into(), virtual_nodes, holding: Holding::default() }
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn holding(&self) -> &Holding {
        &self.holding
    }

    /// Whether this replica may work on `key` now.
    pub fn owns(&self, key: &str) -> bool {
        self.holding.owns(&self.me, key)
    }

    /// Whether `key` is one this replica is releasing: owned before the epoch it releases,
    /// not in it.
    pub fn losing(&self, key: &str) -> bool {
        self.holding.releasing.is_some()
            && !self.owns(key)
            && self.holding.owned_before_release(&self.me, key)
    }

    /// A published assignment was seen. If it is newer than anything held, its losses are
    /// released from now on ([`owns`](Self::owns) already says so) and its epoch is returned:
    /// acknowledge it with [`acknowledged`](Self::acknowledged) once no reconcile of a key
    /// this replica no longer owns is in flight.
    pub fn publish(&mut self, assignment: Assignment) -> Option<u64> {
        if self.holding.newest().is_some_and(|n| n >= assignment.epoch) {
            return None;
        }
        let epoch = assignment.epoch;
        let mine = assignment.members.get(&self.me) == Some(&self.identity);
        self.holding.releasing = Some(Held { view: View::new(assignment, self.virtual_nodes), mine });
        Some(epoch)
    }

    /// The epoch being released, if any.
    pub fn releasing(&self) -> Option<u64> {
        self.holding.releasing.as_ref().map(Held::epoch)
    }

    /// The epoch acknowledged last, if any.
    pub fn acked(&self) -> Option<u64> {
        self.holding.acked.as_ref().map(Held::epoch)
    }

    /// The epoch completed last, if any.
    pub fn completed(&self) -> Option<u64> {
        self.holding.completed.as_ref().map(Held::epoch)
    }

    /// `epoch`'s release is done and its acknowledgement is being published. Returns
    /// whether it was the epoch being released.
    pub fn acknowledged(&mut self, epoch: u64) -> bool {
        if self.releasing() != Some(epoch) {
            return false;
        }
        self.holding.acked = self.holding.releasing.take();
        true
    }

    /// Completes the acknowledged epoch if every other replica involved in it is done with
    /// it (`peer` answers for any shard name and identity); returns what changed.
    pub fn try_complete(&mut self, peer: &dyn Fn(&str, &str) -> Peer) -> Option<Completion> {
        let acked = self.holding.acked.as_ref()?;
        if self.completed().is_some_and(|c| c >= acked.epoch()) {
            return None;
        }
        let epoch = acked.epoch();
        let ready = acked
            .view
            .assignment
            .involved()
            .filter(|(name, identity)| !(**name == self.me && **identity == self.identity))
            .all(|(name, identity)| peer(name, identity).done_with(epoch));
        if !ready {
            return None;
        }
        let before = self.holding.clone();
        self.holding.completed = Some(acked.clone());
        Some(Completion { before, after: self.holding.clone() })
    }
}

/// The assignment role's rule: the assignment to publish after `current`, given the shards
/// whose Leases are live now (name → holder identity), or `None` (nothing changed, or
/// `current` is not finished: a replica involved in it has neither acknowledged it nor
/// stopped).
pub fn next_assignment(
    current: Option<&Assignment>,
    live: &Members,
    peer: &dyn Fn(&str, &str) -> Peer,
) -> Option<Assignment> {
    if live.is_empty() {
        return None;
    }
    let Some(current) = current else {
        return Some(Assignment { epoch: 1, members: live.clone(), previous: Members::new() });
    };
    if &current.members == live {
        return None;
    }
    if !current.involved().all(|(name, identity)| peer(name, identity).done_with(current.epoch)) {
        return None;
    }
    Some(Assignment { epoch: current.epoch + 1, members: live.clone(), previous: current.members.clone() })
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashSet};

    use proptest::prelude::*;

    use super::*;

    /// Members named `names`, each held by identity `<name>@0`.
    fn members(names: &[&str]) -> Members {
        names.iter().map(|n| ((*n).to_owned(), format!("{n}@0"))).collect()
    }

    fn assignment(epoch: u64, now: &[&str], previous: &[&str]) -> Assignment {
        Assignment { epoch, members: members(now), previous: members(previous) }
    }

    fn replica(name: &str) -> HandOver {
        HandOver::new(name, format!("{name}@0"), 16)
    }

    fn keys() -> Vec<String> {
        (0..300).map(|i| format!("ns/k{i}")).collect()
    }

    /// A peer table: (name, identity) → what its Lease says; anything else is unknown.
    fn table(entries: &[(&str, &str, Option<u64>, bool)]) -> impl Fn(&str, &str) -> Peer + use<> {
        let t: BTreeMap<(String, String), Peer> = entries
            .iter()
            .map(|(n, i, acked, stopped)| {
                (((*n).to_owned(), (*i).to_owned()), Peer { acked: *acked, stopped: *stopped })
            })
            .collect();
        move |n: &str, i: &str| t.get(&(n.to_owned(), i.to_owned())).copied().unwrap_or_default()
    }

    #[test]
    fn a_new_replica_owns_nothing_until_it_completes() {
        let mut a = replica("a");
        assert!(keys().iter().all(|k| !a.owns(k)));
        assert_eq!(a.publish(assignment(1, &["a"], &[])), Some(1));
        assert!(keys().iter().all(|k| !a.owns(k)), "releasing is not owning");
        assert!(a.acknowledged(1));
        assert!(keys().iter().all(|k| !a.owns(k)), "acknowledging is not owning");
        let done = a.try_complete(&|_, _| Peer::default()).expect("alone: nobody to wait for");
        assert_eq!(done.epoch(), 1);
        assert!(keys().iter().all(|k| a.owns(k) && done.gained("a", k)));
    }

    #[test]
    fn completion_waits_for_every_involved_replica() {
        let mut c = replica("c");
        c.publish(assignment(4, &["a", "b", "c"], &["a", "b", "d"]));
        c.acknowledged(4);
        let peers =
            [("a", "a@0", Some(4), false), ("b", "b@0", Some(3), false), ("d", "d@0", Some(3), false)];
        assert!(c.try_complete(&table(&peers)).is_none(), "b and d have not acknowledged 4");
        let peers =
            [("a", "a@0", Some(4), false), ("b", "b@0", Some(5), false), ("d", "d@0", Some(3), false)];
        assert!(c.try_complete(&table(&peers)).is_none(), "d (leaving) still holds its keys");
        let peers = [("a", "a@0", Some(4), false), ("b", "b@0", Some(5), false), ("d", "d@0", Some(3), true)];
        assert!(c.try_complete(&table(&peers)).is_some(), "d stopped");
        assert_eq!(c.completed(), Some(4));
        assert!(c.try_complete(&table(&peers)).is_none(), "completes once");
    }

    #[test]
    fn losses_stop_at_once_gains_wait_for_completion() {
        let mut a = replica("a");
        a.publish(assignment(1, &["a"], &[]));
        a.acknowledged(1);
        a.try_complete(&|_, _| Peer::default()).unwrap();
        let all = keys();
        assert!(all.iter().all(|k| a.owns(k)));
        // b joins: a's losses are released as soon as epoch 2 is seen.
        a.publish(assignment(2, &["a", "b"], &["a"]));
        let ring2 = Ring::new(["a", "b"], 16);
        for k in &all {
            assert_eq!(a.owns(k), ring2.is_owner(k, "a"), "{k}");
        }
        let mut b = replica("b");
        b.publish(assignment(2, &["a", "b"], &["a"]));
        b.acknowledged(2);
        assert!(b.try_complete(&table(&[("a", "a@0", Some(1), false)])).is_none());
        assert!(all.iter().all(|k| !b.owns(k)));
        a.acknowledged(2);
        let both = table(&[("a", "a@0", Some(2), false), ("b", "b@0", Some(2), false)]);
        let gained = b.try_complete(&both).unwrap();
        for k in &all {
            assert_eq!(b.owns(k), ring2.is_owner(k, "b"));
            assert_eq!(gained.gained("b", k), ring2.is_owner(k, "b"));
        }
        assert!(
            a.try_complete(&both).is_some_and(|c| all.iter().all(|k| !c.gained("a", k))),
            "a gains nothing"
        );
    }

    /// A rolling restart of `a`: epoch 2 gives a's keys to b, epoch 3 (a's new incarnation
    /// back) takes them from b again, and b sees 3 before it completed 2. Completing 2 then
    /// gains b nothing for good, but every key it passes through — b is losing those, so a
    /// delete b kept for one is reconciled by b before it acknowledges 3.
    #[test]
    fn keys_gained_and_lost_at_once_pass_through() {
        let mut b = replica("b");
        b.publish(assignment(1, &["a", "b"], &[]));
        b.acknowledged(1);
        b.try_complete(&table(&[("a", "a@0", Some(1), false)])).unwrap();
        b.publish(assignment(2, &["b"], &["a", "b"]));
        b.acknowledged(2);
        let mut three = assignment(3, &["a", "b"], &["b"]);
        three.members.insert("a".into(), "a@1".into());
        b.publish(three);
        let done = b.try_complete(&table(&[("a", "a@0", Some(1), true)])).expect("a stopped");
        assert_eq!(done.epoch(), 2);
        let ring = Ring::new(["a", "b"], 16);
        let mut passed = 0;
        for k in &keys() {
            let a_s = ring.is_owner(k, "a");
            assert!(!done.gained("b", k), "{k}: b keeps nothing new past epoch 3");
            assert_eq!(done.passed_through("b", k), a_s, "{k}");
            assert_eq!(b.losing(k), a_s, "{k}: b releases what it passed through");
            passed += usize::from(a_s);
        }
        assert!(passed > 0);
    }

    /// A restarted replica (same name, new identity) owns nothing in an epoch that names its
    /// previous incarnation, even once everyone is done with that epoch.
    #[test]
    fn an_epoch_naming_a_previous_incarnation_gives_nothing() {
        let mut again = HandOver::new("b", "b@1", 16);
        again.publish(assignment(7, &["a", "b"], &["a", "b"]));
        again.acknowledged(7);
        let done = again
            .try_complete(&table(&[("a", "a@0", Some(8), false), ("b", "b@0", None, true)]))
            .expect("nothing to wait for");
        assert!(keys().iter().all(|k| !again.owns(k) && !done.gained("b", k)));
        // The epoch naming it: it waits for its previous incarnation to have stopped.
        let mut next = assignment(9, &["a", "b"], &["a"]);
        next.members.insert("b".into(), "b@1".into());
        next.previous.insert("b".into(), "b@0".into());
        again.publish(next);
        again.acknowledged(9);
        assert!(
            again.try_complete(&table(&[("a", "a@0", Some(9), false), ("b", "b@0", None, false)])).is_none()
        );
        let done =
            again.try_complete(&table(&[("a", "a@0", Some(9), false), ("b", "b@0", None, true)])).unwrap();
        let ring = Ring::new(["a", "b"], 16);
        assert!(keys().iter().all(|k| done.gained("b", k) == ring.is_owner(k, "b")));
    }

    #[test]
    fn old_or_repeated_assignments_are_ignored() {
        let mut a = replica("a");
        assert_eq!(a.publish(assignment(3, &["a"], &[])), Some(3));
        assert_eq!(a.publish(assignment(3, &["a"], &[])), None);
        assert_eq!(a.publish(assignment(2, &["a", "b"], &["a"])), None);
        assert!(!a.acknowledged(2));
        assert!(a.acknowledged(3));
        assert_eq!(a.publish(assignment(3, &["a"], &[])), None, "acknowledged already");
    }

    #[test]
    fn the_assigner_publishes_only_changes_of_finished_epochs() {
        let live = members(&["a", "b"]);
        let first = next_assignment(None, &live, &|_, _| Peer::default()).unwrap();
        assert_eq!(first, assignment(1, &["a", "b"], &[]));
        assert_eq!(next_assignment(Some(&first), &live, &|_, _| Peer::default()), None, "no change");
        let grown = members(&["a", "b", "c"]);
        let a_only = table(&[("a", "a@0", Some(1), false), ("b", "b@0", None, false)]);
        assert_eq!(next_assignment(Some(&first), &grown, &a_only), None, "b has not acknowledged 1");
        let b_dead = table(&[("a", "a@0", Some(1), false), ("b", "b@0", None, true)]);
        let next = next_assignment(Some(&first), &members(&["a", "c"]), &b_dead).unwrap();
        assert_eq!(next, assignment(2, &["a", "c"], &["a", "b"]));
        // A restart (same name, new identity) is a change of membership.
        let mut restarted = members(&["a", "c"]);
        restarted.insert("c".into(), "c@1".into());
        let done =
            table(&[("a", "a@0", Some(2), false), ("b", "b@0", None, true), ("c", "c@0", Some(2), false)]);
        let after = next_assignment(Some(&next), &restarted, &done).unwrap();
        assert_eq!(after.members["c"], "c@1");
        assert_eq!(next_assignment(Some(&next), &Members::new(), &|_, _| Peer::default()), None);
    }

    // -----------------------------------------------------------------------------------
    // The invariant, under every interleaving: a model of the whole system.

    /// One replica (incarnation) of the model.
    struct Replica {
        name: String,
        identity: String,
        protocol: HandOver,
        /// Keys it is reconciling now.
        working: HashSet<usize>,
        /// What its Lease says.
        published_ack: Option<u64>,
        alive: bool,
        /// Graceful leave: stopped working, Lease released.
        released: bool,
    }

    impl Replica {
        fn new(slot: usize, incarnation: usize) -> Replica {
            let (name, identity) = (format!("r{slot}"), format!("r{slot}@{incarnation}"));
            Replica {
                protocol: HandOver::new(name.clone(), identity.clone(), 8),
                name,
                identity,
                working: HashSet::new(),
                published_ack: None,
                alive: true,
                released: false,
            }
        }

        fn live(&self) -> bool {
            self.alive && !self.released
        }
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// The assigner recomputes from the live Leases and publishes if it may.
        Assign,
        /// The latest incarnation of slot `i` sees the assignment published `back`
        /// publications ago (0: the latest; more: a stale view, as after a restart).
        See(usize, usize),
        /// ... finishes its release (only once nothing it lost is in flight) and publishes
        /// the acknowledgement.
        Ack(usize),
        /// ... tries to complete.
        Complete(usize),
        /// ... sees the latest assignment, acknowledges and completes if it may, at once.
        Eager(usize),
        /// ... starts reconciling key `k` (only if it owns it).
        Start(usize, usize),
        /// ... finishes the `n`-th (mod its count) key it is reconciling.
        Finish(usize, usize),
        /// ... dies (kill -9, or fenced itself after a partition).
        Die(usize),
        /// ... leaves gracefully.
        Leave(usize),
        /// ... is replaced by a new incarnation of the same name (after a graceful leave, or
        /// once its Lease ran out after a crash).
        Restart(usize, bool),
        /// A replica with a new name joins.
        Join,
    }

    /// Keys the model works on (few, so replicas collide on them often).
    const MODEL_KEYS: usize = 24;
    /// Names the model has at most (joins stop there).
    const MAX_SLOTS: usize = 5;

    fn step() -> impl Strategy<Value = Step> {
        let i = 0..MAX_SLOTS;
        prop_oneof![
            4 => Just(Step::Assign),
            2 => (i.clone(), 0..3usize).prop_map(|(i, back)| Step::See(i, back)),
            2 => i.clone().prop_map(Step::Ack),
            2 => i.clone().prop_map(Step::Complete),
            6 => i.clone().prop_map(Step::Eager),
            12 => (i.clone(), 0..MODEL_KEYS).prop_map(|(i, k)| Step::Start(i, k)),
            2 => (i.clone(), 0..MODEL_KEYS).prop_map(|(i, k)| Step::Finish(i, k)),
            1 => i.clone().prop_map(Step::Die),
            1 => i.clone().prop_map(Step::Leave),
            2 => (i, any::<bool>()).prop_map(|(i, crash)| Step::Restart(i, crash)),
            2 => Just(Step::Join),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        /// No key is ever worked on by two replicas at once, and work goes on: after the
        /// steps, once every replica has seen, acknowledged and completed, every key has an
        /// owner among the live replicas.
        #[test]
        fn no_key_is_held_twice(steps in proptest::collection::vec(step(), 1..400)) {
            run_model(&steps).map_err(proptest::test_runner::TestCaseError::fail)?;
        }
    }

    /// A fourth replica joins while the others work on every key they own: it must not
    /// start on a key it gains before that key's owner let go of it.
    #[test]
    fn a_joiner_waits_for_the_owners_to_let_go() {
        let mut steps = vec![Step::Assign];
        steps.extend((0..3).flat_map(|i| [Step::See(i, 0), Step::Ack(i)]));
        steps.extend((0..3).map(Step::Complete));
        steps.extend((0..3).flat_map(|i| (0..MODEL_KEYS).map(move |k| Step::Start(i, k))));
        steps.extend([Step::Join, Step::Assign, Step::See(3, 0), Step::Ack(3), Step::Complete(3)]);
        steps.extend((0..MODEL_KEYS).map(|k| Step::Start(3, k)));
        assert_eq!(run_model(&steps), Ok(()));
    }

    /// A replica restarts under the same name while its old epoch is still published, the
    /// others move on without it, and the new incarnation first sees the old epoch: it must
    /// not take the keys the old epoch gave its previous incarnation.
    #[test]
    fn a_restarted_replica_does_not_take_its_previous_incarnations_keys() {
        let mut steps = vec![Step::Assign];
        steps.extend((0..3).flat_map(|i| [Step::See(i, 0), Step::Ack(i), Step::Complete(i)]));
        steps.extend([Step::Leave(2), Step::Assign]);
        steps.extend((0..2).flat_map(|i| [Step::See(i, 0), Step::Ack(i), Step::Complete(i)]));
        steps.extend((0..2).flat_map(|i| (0..MODEL_KEYS).map(move |k| Step::Start(i, k))));
        steps.extend([Step::Restart(2, false), Step::See(2, 1), Step::Ack(2), Step::Complete(2)]);
        steps.extend((0..MODEL_KEYS).map(|k| Step::Start(2, k)));
        assert_eq!(run_model(&steps), Ok(()));
    }

    /// The latest incarnation of slot `i`, if it exists.
    fn latest(replicas: &mut [Replica], i: usize) -> Option<&mut Replica> {
        let name = format!("r{i}");
        replicas.iter_mut().rev().find(|r| r.name == name)
    }

    /// Runs the model through `steps`; the first broken invariant is the error.
    fn run_model(steps: &[Step]) -> Result<(), String> {
        let keys = keys();
        let mut replicas: Vec<Replica> = (0..3).map(|i| Replica::new(i, 0)).collect();
        let mut history: Vec<Assignment> = Vec::new();
        let peer_of = |replicas: &Vec<Replica>| {
            let t: BTreeMap<(String, String), Peer> = replicas
                .iter()
                .map(|r| {
                    (
                        (r.name.clone(), r.identity.clone()),
                        Peer { acked: r.published_ack, stopped: !r.live() },
                    )
                })
                .collect();
            move |n: &str, i: &str| {
                t.get(&(n.to_owned(), i.to_owned())).copied().unwrap_or(Peer { acked: None, stopped: true })
            }
        };
        let live_of = |replicas: &Vec<Replica>| -> Members {
            replicas.iter().filter(|r| r.live()).map(|r| (r.name.clone(), r.identity.clone())).collect()
        };
        for step in steps.iter().cloned() {
            match step {
                Step::Assign => {
                    let peer = peer_of(&replicas);
                    if let Some(next) = next_assignment(history.last(), &live_of(&replicas), &peer) {
                        history.push(next);
                    }
                }
                Step::See(i, back) => {
                    let seen = history.len().checked_sub(1 + back).and_then(|at| history.get(at)).cloned();
                    if let (Some(r), Some(a)) = (latest(&mut replicas, i), seen)
                        && r.live()
                    {
                        r.protocol.publish(a);
                    }
                }
                Step::Ack(i) => {
                    if let Some(r) = latest(&mut replicas, i) {
                        let clear = r.working.iter().all(|k| r.protocol.owns(&keys[*k]));
                        if r.live()
                            && clear
                            && let Some(n) = r.protocol.releasing()
                        {
                            r.protocol.acknowledged(n);
                            r.published_ack = Some(n);
                        }
                    }
                }
                Step::Complete(i) => {
                    let peer = peer_of(&replicas);
                    if let Some(r) = latest(&mut replicas, i)
                        && r.live()
                    {
                        r.protocol.try_complete(&peer);
                    }
                }
                Step::Eager(i) => {
                    let last = history.last().cloned();
                    if let (Some(r), Some(a)) = (latest(&mut replicas, i), last)
                        && r.live()
                    {
                        r.protocol.publish(a);
                        let clear = r.working.iter().all(|k| r.protocol.owns(&keys[*k]));
                        if clear && let Some(n) = r.protocol.releasing() {
                            r.protocol.acknowledged(n);
                            r.published_ack = Some(n);
                        }
                    }
                    let peer = peer_of(&replicas);
                    if let Some(r) = latest(&mut replicas, i)
                        && r.live()
                    {
                        r.protocol.try_complete(&peer);
                    }
                }
                Step::Start(i, k) => {
                    if let Some(r) = latest(&mut replicas, i)
                        && r.live()
                        && r.protocol.owns(&keys[k])
                    {
                        r.working.insert(k);
                    }
                }
                Step::Finish(i, n) => {
                    if let Some(r) = latest(&mut replicas, i) {
                        let mut working: Vec<usize> = r.working.iter().copied().collect();
                        working.sort_unstable();
                        if !working.is_empty() {
                            r.working.remove(&working[n % working.len()]);
                        }
                    }
                }
                Step::Die(i) => {
                    if let Some(r) = latest(&mut replicas, i) {
                        r.alive = false;
                        r.working.clear();
                    }
                }
                Step::Leave(i) => {
                    if let Some(r) = latest(&mut replicas, i) {
                        r.released = true;
                        r.working.clear();
                    }
                }
                Step::Restart(i, crash) => {
                    let incarnation = replicas.iter().filter(|r| r.name == format!("r{i}")).count();
                    if let Some(r) = latest(&mut replicas, i) {
                        if crash {
                            r.alive = false;
                        } else {
                            r.released = true;
                        }
                        r.working.clear();
                        replicas.push(Replica::new(i, incarnation));
                    }
                }
                Step::Join => {
                    let slots: BTreeSet<&str> = replicas.iter().map(|r| r.name.as_str()).collect();
                    if slots.len() < MAX_SLOTS {
                        let slot = slots.len();
                        replicas.push(Replica::new(slot, 0));
                    }
                }
            }
            for (k, key) in keys.iter().enumerate().take(MODEL_KEYS) {
                let holders: Vec<&str> =
                    replicas.iter().filter(|r| r.working.contains(&k)).map(|r| r.identity.as_str()).collect();
                if holders.len() > 1 {
                    return Err(format!("{key} held by {holders:?} after {step:?}"));
                }
            }
        }
        // Quiesce: finish all work, then run the protocol to a fixed point.
        for r in &mut replicas {
            r.working.clear();
        }
        for _ in 0..20 {
            let peer = peer_of(&replicas);
            if let Some(next) = next_assignment(history.last(), &live_of(&replicas), &peer) {
                history.push(next);
            }
            for r in replicas.iter_mut().filter(|r| r.live()) {
                if let Some(a) = history.last() {
                    r.protocol.publish(a.clone());
                }
                if let Some(n) = r.protocol.releasing() {
                    r.protocol.acknowledged(n);
                    r.published_ack = Some(n);
                }
            }
            let peer = peer_of(&replicas);
            for r in replicas.iter_mut().filter(|r| r.live()) {
                r.protocol.try_complete(&peer);
            }
        }
        let live: Vec<&Replica> = replicas.iter().filter(|r| r.live()).collect();
        if !live.is_empty() {
            for key in &keys {
                let owners = live.iter().filter(|r| r.protocol.owns(key)).count();
                if owners != 1 {
                    return Err(format!("{key} has {owners} owners after quiescence"));
                }
            }
        }
        Ok(())
    }
}

//! The hand-over protocol as pure state machines: what a replica may work on, and when the
//! assignment role may publish the next ring.
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
//! the one it is releasing for ([`Holding::owns`]) — and owners in one epoch are unique; a
//! replica that completed `n` knows every replica that could still hold one of its keys (an
//! owner in `n-1`) has let go of it.
//!
//! A replica that has completed nothing works on nothing: a new or restarted replica starts
//! empty-handed, and a replica's view never goes back to an older epoch.

use std::collections::BTreeSet;

use super::ring::{Ring, position};

/// One published assignment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// Counts up from 1; each publication is the previous one plus one.
    pub epoch: u64,
    /// The ring of this epoch: shard names.
    pub members: BTreeSet<String>,
    /// The members of epoch `epoch - 1` (empty for epoch 1).
    pub previous: BTreeSet<String>,
}

impl Assignment {
    /// Everyone who may hold a key of this epoch or of the one before.
    pub fn involved(&self) -> impl Iterator<Item = &String> {
        self.previous.union(&self.members)
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
        let ring = Ring::new(assignment.members.iter().cloned(), virtual_nodes);
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
    /// It cannot be working on anything: its Lease was released, or was not renewed for a
    /// whole lease duration as this replica saw it (it stopped itself before that).
    pub stopped: bool,
}

impl Peer {
    /// Whether it has let go of everything it does not own in `epoch`.
    pub fn done_with(&self, epoch: u64) -> bool {
        self.stopped || self.acked.is_some_and(|a| a >= epoch)
    }
}

/// The epochs a replica holds, which together decide what it may work on.
#[derive(Clone, Debug, Default)]
pub struct Holding {
    /// The latest epoch completed: its keys (and only those) may have been gained.
    pub completed: Option<View>,
    /// The latest epoch acknowledged (at or after `completed`).
    pub acked: Option<View>,
    /// An epoch seen but not yet acknowledged: its losses are being released.
    pub releasing: Option<View>,
}

impl Holding {
    /// Whether `me` may work on `key`: it owns it in every epoch it holds, and has completed
    /// one.
    pub fn owns(&self, me: &str, key: &str) -> bool {
        let Some(completed) = &self.completed else { return false };
        let at = position(key.as_bytes());
        [Some(completed), self.acked.as_ref(), self.releasing.as_ref()]
            .into_iter()
            .flatten()
            .all(|view| view.ring.owner_at(at) == Some(me))
    }

    /// The newest epoch held.
    pub fn newest(&self) -> Option<u64> {
        [&self.completed, &self.acked, &self.releasing].into_iter().flatten().map(View::epoch).max()
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
        self.after.completed.as_ref().map_or(0, View::epoch)
    }

    /// Whether `me` gained `key`.
    pub fn gained(&self, me: &str, key: &str) -> bool {
        self.after.owns(me, key) && !self.before.owns(me, key)
    }
}

/// One replica's side of the protocol.
#[derive(Clone, Debug)]
pub struct HandOver {
    me: String,
    virtual_nodes: u32,
    holding: Holding,
}

impl HandOver {
    /// A replica called `me` that holds nothing yet.
    pub fn new(me: impl Into<String>, virtual_nodes: u32) -> HandOver {
        HandOver { me: me.into(), virtual_nodes, holding: Holding::default() }
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    pub fn holding(&self) -> &Holding {
        &self.holding
    }

    /// Whether this replica may work on `key` now.
    pub fn owns(&self, key: &str) -> bool {
        self.holding.owns(&self.me, key)
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
        self.holding.releasing = Some(View::new(assignment, self.virtual_nodes));
        Some(epoch)
    }

    /// The epoch being released, if any.
    pub fn releasing(&self) -> Option<u64> {
        self.holding.releasing.as_ref().map(View::epoch)
    }

    /// The epoch acknowledged last, if any.
    pub fn acked(&self) -> Option<u64> {
        self.holding.acked.as_ref().map(View::epoch)
    }

    /// The epoch completed last, if any.
    pub fn completed(&self) -> Option<u64> {
        self.holding.completed.as_ref().map(View::epoch)
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
    /// it (`peer` answers for any shard name); returns what changed.
    pub fn try_complete(&mut self, peer: &dyn Fn(&str) -> Peer) -> Option<Completion> {
        let acked = self.holding.acked.as_ref()?;
        if self.completed().is_some_and(|c| c >= acked.epoch()) {
            return None;
        }
        let epoch = acked.epoch();
        let ready = acked.assignment.involved().filter(|s| **s != self.me).all(|s| peer(s).done_with(epoch));
        if !ready {
            return None;
        }
        let before = self.holding.clone();
        self.holding.completed = Some(acked.clone());
        Some(Completion { before, after: self.holding.clone() })
    }

    /// The members of the epoch this replica works in (the last completed), if any.
    pub fn members(&self) -> Option<&BTreeSet<String>> {
        self.holding.completed.as_ref().map(|v| &v.assignment.members)
    }
}

/// The assignment role's rule: the assignment to publish after `current`, given the shards
/// whose Leases are live now, or `None` (nothing changed, or `current` is not finished: a
/// replica involved in it has neither acknowledged it nor stopped).
pub fn next_assignment(
    current: Option<&Assignment>,
    live: &BTreeSet<String>,
    peer: &dyn Fn(&str) -> Peer,
) -> Option<Assignment> {
    if live.is_empty() {
        return None;
    }
    let Some(current) = current else {
        return Some(Assignment { epoch: 1, members: live.clone(), previous: BTreeSet::new() });
    };
    if &current.members == live {
        return None;
    }
    if !current.involved().all(|s| peer(s).done_with(current.epoch)) {
        return None;
    }
    Some(Assignment { epoch: current.epoch + 1, members: live.clone(), previous: current.members.clone() })
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    fn assignment(epoch: u64, members: &[&str], previous: &[&str]) -> Assignment {
        Assignment { epoch, members: set(members), previous: set(previous) }
    }

    const KEYS: usize = 300;

    fn keys() -> Vec<String> {
        (0..KEYS).map(|i| format!("ns/k{i}")).collect()
    }

    #[test]
    fn a_new_replica_owns_nothing_until_it_completes() {
        let mut a = HandOver::new("a", 16);
        assert!(keys().iter().all(|k| !a.owns(k)));
        assert_eq!(a.publish(assignment(1, &["a"], &[])), Some(1));
        assert!(keys().iter().all(|k| !a.owns(k)), "releasing is not owning");
        assert!(a.acknowledged(1));
        assert!(keys().iter().all(|k| !a.owns(k)), "acknowledging is not owning");
        let done = a.try_complete(&|_| Peer::default()).expect("alone: nobody to wait for");
        assert_eq!(done.epoch(), 1);
        assert!(keys().iter().all(|k| a.owns(k) && done.gained("a", k)));
    }

    #[test]
    fn completion_waits_for_every_involved_replica() {
        let mut c = HandOver::new("c", 16);
        c.publish(assignment(4, &["a", "b", "c"], &["a", "b", "d"]));
        c.acknowledged(4);
        let peers: BTreeMap<&'static str, Peer> = BTreeMap::from([
            ("a", Peer { acked: Some(4), stopped: false }),
            ("b", Peer { acked: Some(3), stopped: false }),
            ("d", Peer { acked: Some(3), stopped: false }),
        ]);
        fn view(p: &BTreeMap<&'static str, Peer>) -> impl Fn(&str) -> Peer + use<> {
            let p = p.clone();
            move |s: &str| p.get(s).copied().unwrap_or_default()
        }
        assert!(c.try_complete(&view(&peers)).is_none(), "b and d have not acknowledged 4");
        let mut peers2 = peers.clone();
        peers2.insert("b", Peer { acked: Some(5), stopped: false });
        assert!(c.try_complete(&view(&peers2)).is_none(), "d (leaving) still holds its keys");
        peers2.insert("d", Peer { acked: Some(3), stopped: true });
        assert!(c.try_complete(&view(&peers2)).is_some(), "d stopped");
        assert_eq!(c.completed(), Some(4));
        assert!(c.try_complete(&view(&peers2)).is_none(), "completes once");
    }

    #[test]
    fn losses_stop_at_once_gains_wait_for_completion() {
        let mut a = HandOver::new("a", 16);
        a.publish(assignment(1, &["a"], &[]));
        a.acknowledged(1);
        a.try_complete(&|_| Peer::default()).unwrap();
        let all = keys();
        assert!(all.iter().all(|k| a.owns(k)));
        // b joins: a's losses are released as soon as epoch 2 is seen.
        a.publish(assignment(2, &["a", "b"], &["a"]));
        let ring2 = Ring::new(["a", "b"], 16);
        for k in &all {
            assert_eq!(a.owns(k), ring2.is_owner(k, "a"), "{k}");
        }
        let mut b = HandOver::new("b", 16);
        b.publish(assignment(2, &["a", "b"], &["a"]));
        b.acknowledged(2);
        let a_not_acked = |s: &str| Peer { acked: Some(if s == "a" { 1 } else { 2 }), stopped: false };
        assert!(b.try_complete(&a_not_acked).is_none());
        assert!(all.iter().all(|k| !b.owns(k)));
        a.acknowledged(2);
        let both = |_: &str| Peer { acked: Some(2), stopped: false };
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

    #[test]
    fn old_or_repeated_assignments_are_ignored() {
        let mut a = HandOver::new("a", 16);
        assert_eq!(a.publish(assignment(3, &["a"], &[])), Some(3));
        assert_eq!(a.publish(assignment(3, &["a"], &[])), None);
        assert_eq!(a.publish(assignment(2, &["a", "b"], &["a"])), None);
        assert!(!a.acknowledged(2));
        assert!(a.acknowledged(3));
        assert_eq!(a.publish(assignment(3, &["a"], &[])), None, "acknowledged already");
    }

    #[test]
    fn the_assigner_publishes_only_changes_of_finished_epochs() {
        let live = set(&["a", "b"]);
        let first = next_assignment(None, &live, &|_| Peer::default()).unwrap();
        assert_eq!(first, assignment(1, &["a", "b"], &[]));
        assert_eq!(next_assignment(Some(&first), &live, &|_| Peer::default()), None, "no change");
        let grown = set(&["a", "b", "c"]);
        let a_only = |s: &str| Peer { acked: (s == "a").then_some(1), stopped: false };
        assert_eq!(next_assignment(Some(&first), &grown, &a_only), None, "b has not acknowledged 1");
        let b_dead = |s: &str| Peer { acked: (s == "a").then_some(1), stopped: s == "b" };
        let next = next_assignment(Some(&first), &set(&["a", "c"]), &b_dead).unwrap();
        assert_eq!(next, assignment(2, &["a", "c"], &["a", "b"]));
        assert_eq!(next_assignment(Some(&next), &BTreeSet::new(), &|_| Peer::default()), None);
    }

    // -----------------------------------------------------------------------------------
    // The invariant, under every interleaving: a model of the whole system.

    /// One replica of the model.
    struct Replica {
        protocol: HandOver,
        /// Keys it is reconciling now.
        working: HashSet<usize>,
        /// What its Lease says.
        published_ack: Option<u64>,
        alive: bool,
        /// Graceful leave: stopped working, Lease released.
        released: bool,
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// The assigner recomputes from the live Leases and publishes if it may.
        Assign,
        /// Replica `i` sees the latest assignment.
        See(usize),
        /// Replica `i` finishes its release (only once nothing it lost is in flight) and
        /// publishes the acknowledgement.
        Ack(usize),
        /// Replica `i` tries to complete.
        Complete(usize),
        /// Replica `i` sees, acknowledges (if it may) and completes (if it may) at once.
        Eager(usize),
        /// Replica `i` starts reconciling key `k` (only if it owns it).
        Start(usize, usize),
        /// Replica `i` finishes the `n`-th (mod its count) key it is reconciling.
        Finish(usize, usize),
        /// Replica `i` dies (kill -9, or fenced itself after a partition).
        Die(usize),
        /// Replica `i` leaves gracefully.
        Leave(usize),
        /// A new replica joins.
        Join,
    }

    /// Keys the model works on (few, so replicas collide on them often).
    const MODEL_KEYS: usize = 24;
    /// Replicas the model has at most (joins stop there).
    const MAX_REPLICAS: usize = 5;

    fn step() -> impl Strategy<Value = Step> {
        let i = 0..MAX_REPLICAS;
        prop_oneof![
            4 => Just(Step::Assign),
            2 => i.clone().prop_map(Step::See),
            2 => i.clone().prop_map(Step::Ack),
            2 => i.clone().prop_map(Step::Complete),
            6 => i.clone().prop_map(Step::Eager),
            12 => (i.clone(), 0..MODEL_KEYS).prop_map(|(i, k)| Step::Start(i, k)),
            2 => (i.clone(), 0..MODEL_KEYS).prop_map(|(i, k)| Step::Finish(i, k)),
            1 => i.clone().prop_map(Step::Die),
            1 => i.prop_map(Step::Leave),
            2 => Just(Step::Join),
        ]
    }

    fn name(i: usize) -> String {
        format!("r{i}")
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
        steps.extend((0..3).flat_map(|i| [Step::See(i), Step::Ack(i)]));
        steps.extend((0..3).map(Step::Complete));
        steps.extend((0..3).flat_map(|i| (0..MODEL_KEYS).map(move |k| Step::Start(i, k))));
        steps.extend([Step::Join, Step::Assign, Step::See(3), Step::Ack(3), Step::Complete(3)]);
        steps.extend((0..MODEL_KEYS).map(|k| Step::Start(3, k)));
        assert_eq!(run_model(&steps), Ok(()));
    }

    /// Runs the model through `steps`; the first broken invariant is the error.
    fn run_model(steps: &[Step]) -> Result<(), String> {
        let keys = keys();
        let mut replicas: Vec<Replica> = (0..3)
            .map(|i| Replica {
                protocol: HandOver::new(name(i), 8),
                working: HashSet::new(),
                published_ack: None,
                alive: true,
                released: false,
            })
            .collect();
        let mut published: Option<Assignment> = None;
        let peer_of = |replicas: &Vec<Replica>| {
            let table: BTreeMap<String, Peer> = replicas
                .iter()
                .enumerate()
                .map(|(i, r)| (name(i), Peer { acked: r.published_ack, stopped: !r.alive || r.released }))
                .collect();
            move |s: &str| table.get(s).copied().unwrap_or(Peer { acked: None, stopped: true })
        };
        for step in steps.iter().cloned() {
            match step {
                Step::Assign => {
                    let live: BTreeSet<String> = replicas
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| r.alive && !r.released)
                        .map(|(i, _)| name(i))
                        .collect();
                    let peer = peer_of(&replicas);
                    if let Some(next) = next_assignment(published.as_ref(), &live, &peer) {
                        published = Some(next);
                    }
                }
                Step::See(i) => {
                    if let (Some(r), Some(a)) = (replicas.get_mut(i), &published) {
                        if r.alive && !r.released {
                            r.protocol.publish(a.clone());
                        }
                    }
                }
                Step::Ack(i) => {
                    if let Some(r) = replicas.get_mut(i) {
                        let clear = r.working.iter().all(|k| r.protocol.owns(&keys[*k]));
                        if r.alive
                            && !r.released
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
                    if let Some(r) = replicas.get_mut(i)
                        && r.alive
                        && !r.released
                    {
                        r.protocol.try_complete(&peer);
                    }
                }
                Step::Eager(i) => {
                    if let (Some(r), Some(a)) = (replicas.get_mut(i), &published)
                        && r.alive
                        && !r.released
                    {
                        r.protocol.publish(a.clone());
                        let clear = r.working.iter().all(|k| r.protocol.owns(&keys[*k]));
                        if clear && let Some(n) = r.protocol.releasing() {
                            r.protocol.acknowledged(n);
                            r.published_ack = Some(n);
                        }
                    }
                    let peer = peer_of(&replicas);
                    if let Some(r) = replicas.get_mut(i)
                        && r.alive
                        && !r.released
                    {
                        r.protocol.try_complete(&peer);
                    }
                }
                Step::Start(i, k) => {
                    if let Some(r) = replicas.get_mut(i) {
                        if r.alive && !r.released && r.protocol.owns(&keys[k]) {
                            r.working.insert(k);
                        }
                    }
                }
                Step::Finish(i, n) => {
                    if let Some(r) = replicas.get_mut(i) {
                        let mut working: Vec<usize> = r.working.iter().copied().collect();
                        working.sort_unstable();
                        if !working.is_empty() {
                            r.working.remove(&working[n % working.len()]);
                        }
                    }
                }
                Step::Die(i) => {
                    if let Some(r) = replicas.get_mut(i) {
                        r.alive = false;
                        r.working.clear();
                    }
                }
                Step::Leave(i) => {
                    if let Some(r) = replicas.get_mut(i) {
                        r.released = true;
                        r.working.clear();
                    }
                }
                Step::Join => {
                    if replicas.len() < MAX_REPLICAS {
                        let i = replicas.len();
                        replicas.push(Replica {
                            protocol: HandOver::new(name(i), 8),
                            working: HashSet::new(),
                            published_ack: None,
                            alive: true,
                            released: false,
                        });
                    }
                }
            }
            for k in 0..MODEL_KEYS {
                let holders: Vec<usize> = replicas
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.working.contains(&k))
                    .map(|(i, _)| i)
                    .collect();
                if holders.len() > 1 {
                    return Err(format!("{} held by {:?} after {:?}", keys[k], holders, step));
                }
            }
        }
        // Quiesce: finish all work, then run the protocol to a fixed point.
        for r in &mut replicas {
            r.working.clear();
        }
        for _ in 0..20 {
            let live: BTreeSet<String> = replicas
                .iter()
                .enumerate()
                .filter(|(_, r)| r.alive && !r.released)
                .map(|(i, _)| name(i))
                .collect();
            let peer = peer_of(&replicas);
            if let Some(next) = next_assignment(published.as_ref(), &live, &peer) {
                published = Some(next);
            }
            for r in replicas.iter_mut().filter(|r| r.alive && !r.released) {
                if let Some(a) = &published {
                    r.protocol.publish(a.clone());
                }
                if let Some(n) = r.protocol.releasing() {
                    r.protocol.acknowledged(n);
                    r.published_ack = Some(n);
                }
            }
            let peer = peer_of(&replicas);
            for r in replicas.iter_mut().filter(|r| r.alive && !r.released) {
                r.protocol.try_complete(&peer);
            }
        }
        let live: Vec<&Replica> = replicas.iter().filter(|r| r.alive && !r.released).collect();
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

//! The changes a [`DeltaFifo`](super::DeltaFifo) queues per key ("deltas", client-go's
//! `Delta` and `DeltaType`), and how two of them collapse.
//!
//! Invariant: deltas of one key stay in arrival order (oldest first), and the last two are
//! never both `Deleted` ([`dedup_deltas`] collapses them, keeping the one that is not a
//! tombstone).

use std::sync::Arc;

use crate::object::{DeletedObject, Object};

/// One change to one object.
#[derive(Debug, Clone)]
pub enum Delta {
    /// Created (watch ADDED).
    Added(Arc<Object>),
    /// Changed (watch MODIFIED).
    Updated(Arc<Object>),
    /// Deleted (watch DELETED), or found missing on relist (a tombstone).
    Deleted(DeletedObject),
    /// Listed by a relist (`replace`).
    Replaced(Arc<Object>),
    /// Re-delivered by a periodic resync.
    Sync(Arc<Object>),
}

/// The kind of a [`Delta`], without its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeltaType {
    Added,
    Updated,
    Deleted,
    Replaced,
    Sync,
}

impl Delta {
    /// The delta's kind.
    pub fn delta_type(&self) -> DeltaType {
        match self {
            Delta::Added(_) => DeltaType::Added,
            Delta::Updated(_) => DeltaType::Updated,
            Delta::Deleted(_) => DeltaType::Deleted,
            Delta::Replaced(_) => DeltaType::Replaced,
            Delta::Sync(_) => DeltaType::Sync,
        }
    }

    /// The object the delta carries (a tombstone's last known state for relist deletes).
    pub fn object(&self) -> &Arc<Object> {
        match self {
            Delta::Added(o) | Delta::Updated(o) | Delta::Replaced(o) | Delta::Sync(o) => o,
            Delta::Deleted(d) => d.object(),
        }
    }

    /// The key the delta is for (a tombstone carries its own key).
    pub fn key(&self) -> &str {
        match self {
            Delta::Deleted(d) => d.key(),
            other => other.object().key(),
        }
    }
}

/// A key's pending deltas, oldest first.
pub type Deltas = Vec<Delta>;

/// Collapses two trailing `Deleted` deltas into one, keeping the more informative: the older
/// one unless it is a `FinalStateUnknown` tombstone (client-go `dedupDeltas`/`isDeletionDup`).
pub(super) fn dedup_deltas(deltas: &mut Deltas) {
    let n = deltas.len();
    if n < 2 {
        return;
    }
    let (Delta::Deleted(older), Delta::Deleted(_)) = (&deltas[n - 2], &deltas[n - 1]) else { return };
    if older.is_final_state_unknown() {
        deltas.remove(n - 2);
    } else {
        deltas.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::fifo::DeltaFifo;

    // TestDeltaFIFO_DeleteDedup (dedupDeltas / isDeletionDup)
    #[tokio::test]
    async fn delta_fifo_dedups_consecutive_deletes() {
        let f = DeltaFifo::new(None);
        let a = obj("foo", 1);
        f.add(a.clone());
        f.delete(known(&obj("foo", 2)));
        f.delete(known(&obj("foo", 3)));
        let d = f.deltas_of("foo").unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[1].object().resource_version(), "2", "older delete kept when it is not a tombstone");

        // Older is a tombstone, newer is a real delete: keep the newer.
        let f = DeltaFifo::new(None);
        f.add(a.clone());
        f.delete(DeletedObject::FinalStateUnknown { key: "foo".into(), last_known: obj("foo", 4) });
        f.delete(known(&obj("foo", 5)));
        let d = f.deltas_of("foo").unwrap();
        assert_eq!(d.len(), 2);
        assert!(matches!(&d[1], Delta::Deleted(DeletedObject::Known(o)) if o.resource_version() == "5"));

        // A non-delete in between prevents collapsing.
        let f = DeltaFifo::new(None);
        f.add(a.clone());
        f.delete(known(&obj("foo", 6)));
        f.add(obj("foo", 7));
        f.delete(known(&obj("foo", 8)));
        assert_eq!(f.deltas_of("foo").unwrap().len(), 4);
    }
}

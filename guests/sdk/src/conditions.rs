//! Status conditions (`status.conditions[]`, `metav1.Condition`), with apimachinery's
//! `meta.SetStatusCondition` semantics: `lastTransitionTime` changes only when `status`
//! changes, and reason, message and observedGeneration are updated in place.
//!
//! Time is explicit: [`set`] takes `now` (see [`time`] for where time comes
//! from); [`set_now`] reads the clock itself.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::time;

/// A condition's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `"True"`.
    True,
    /// `"False"`.
    False,
    /// `"Unknown"`.
    Unknown,
}

impl Status {
    /// The string Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

impl From<bool> for Status {
    fn from(value: bool) -> Self {
        if value { Status::True } else { Status::False }
    }
}

/// A condition with an unset `lastTransitionTime` (filled in by [`set`]).
pub fn new(
    type_: &str,
    status: impl Into<Status>,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.into().as_str().to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation,
        last_transition_time: time::unset(),
    }
}

/// The condition of type `type_`.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether condition `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Whether condition `type_` is present with status `False`.
pub fn is_false(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "False")
}

/// Sets `condition` in `conditions`; returns whether anything changed.
///
/// - A new type is appended; its `lastTransitionTime` is the one it carries or, if unset, `now`.
/// - An existing type whose status changes gets the new status and a new
///   `lastTransitionTime` (the one it carries or, if unset, `now`).
/// - Otherwise `lastTransitionTime` is kept, and reason, message and observedGeneration
///   are updated.
pub fn set(conditions: &mut Vec<Condition>, mut condition: Condition, now: &Time) -> bool {
    let transition_time = if time::is_unset(&condition.last_transition_time) {
        now.clone()
    } else {
        condition.last_transition_time.clone()
    };
    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == condition.type_) else {
        condition.last_transition_time = transition_time;
        conditions.push(condition);
        return true;
    };
    let mut changed = false;
    if existing.status != condition.status {
        existing.status = condition.status;
        existing.last_transition_time = transition_time;
        changed = true;
    }
    if existing.reason != condition.reason {
        existing.reason = condition.reason;
        changed = true;
    }
    if existing.message != condition.message {
        existing.message = condition.message;
        changed = true;
    }
    if existing.observed_generation != condition.observed_generation {
        existing.observed_generation = condition.observed_generation;
        changed = true;
    }
    changed
}

/// [`set`] with `now` read from the clock ([`time::now`]).
pub fn set_now(conditions: &mut Vec<Condition>, condition: Condition) -> bool {
    set(conditions, condition, &time::now())
}

/// Removes condition `type_`; returns whether it was there.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::new(secs, 0).unwrap())
    }

    #[test]
    fn new_condition_gets_now() {
        let mut c = Vec::new();
        assert!(set(&mut c, new("Ready", true, "Ok", "fine", Some(1)), &at(100)));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].status, "True");
        assert_eq!(c[0].last_transition_time, at(100));
        assert!(is_true(&c, "Ready"));
        assert!(!is_false(&c, "Ready"));
    }

    #[test]
    fn explicit_transition_time_wins_over_now() {
        let mut c = Vec::new();
        let mut cond = new("Ready", false, "Wait", "", None);
        cond.last_transition_time = at(50);
        set(&mut c, cond, &at(100));
        assert_eq!(c[0].last_transition_time, at(50));
    }

    #[test]
    fn same_status_keeps_transition_time_but_updates_reason() {
        let mut c = Vec::new();
        set(&mut c, new("Ready", true, "Ok", "a", Some(1)), &at(100));
        assert!(set(&mut c, new("Ready", true, "StillOk", "b", Some(2)), &at(200)));
        assert_eq!(c[0].last_transition_time, at(100));
        assert_eq!(
            (c[0].reason.as_str(), c[0].message.as_str(), c[0].observed_generation),
            ("StillOk", "b", Some(2))
        );
        // Nothing differs: no change reported (so callers can skip a status write).
        assert!(!set(&mut c, new("Ready", true, "StillOk", "b", Some(2)), &at(300)));
        assert_eq!(c[0].last_transition_time, at(100));
    }

    #[test]
    fn status_change_moves_transition_time() {
        let mut c = Vec::new();
        set(&mut c, new("Ready", true, "Ok", "", None), &at(100));
        assert!(set(&mut c, new("Ready", Status::Unknown, "Lost", "", None), &at(200)));
        assert_eq!(c[0].status, "Unknown");
        assert_eq!(c[0].last_transition_time, at(200));
    }

    #[test]
    fn types_are_independent_and_removable() {
        let mut c = Vec::new();
        set(&mut c, new("Ready", true, "Ok", "", None), &at(1));
        set(&mut c, new("Available", false, "NoPods", "", None), &at(2));
        assert_eq!(c.len(), 2);
        assert!(is_false(&c, "Available"));
        assert!(remove(&mut c, "Ready"));
        assert!(!remove(&mut c, "Ready"));
        assert!(find(&c, "Ready").is_none());
        assert_eq!(find(&c, "Available").unwrap().reason, "NoPods");
    }
}

//! tracing callsites for guest log lines, whose field names are known only at run time.
//!
//! tracing describes every event by `&'static` [`Metadata`] whose [`FieldSet`] holds
//! `&'static str` names, so a guest's `log(level, message, [(key, value)])` cannot become an
//! event with one field per key by the usual macros. Here each distinct (level, field names)
//! combination gets one callsite, built once and leaked, and registered with tracing like a
//! macro's; later lines with the same shape reuse it. Subscribers see ordinary events: the
//! text format prints `key="value"`, `--log-format json` gives each key its own member.
//!
//! Invariants:
//! - Leaking is bounded: at most [`MAX_NAMES`] distinct names of at most [`MAX_NAME_LEN`]
//!   bytes, and at most [`MAX_CALLSITES`] callsites, for the life of the process (all plugins
//!   together). Names are restricted to `[A-Za-z0-9_.-]`.
//! - When a bound is reached (or a name is unusable), [`intern`] returns `None` and the caller
//!   logs the fields as one string instead; nothing is dropped and nothing grows further.

use std::collections::HashMap;
use std::sync::{LazyLock, OnceLock};

use parking_lot::Mutex;
use tracing::Metadata;
use tracing_core::callsite::{Callsite, Identifier};
use tracing_core::field::FieldSet;
use tracing_core::metadata::Kind;
use tracing_core::subscriber::Interest;

/// The target of every guest log line (the `log` import's and the guest's stdio).
pub(crate) const TARGET: &str = "wasmctrl::plugin::guest";

/// Distinct field names interned, at most.
pub(crate) const MAX_NAMES: usize = 4096;
/// Longest usable field name.
pub(crate) const MAX_NAME_LEN: usize = 64;
/// Distinct (level, names) callsites, at most.
pub(crate) const MAX_CALLSITES: usize = 1024;

/// A callsite whose metadata is set once, right after it is leaked (the metadata must name
/// the callsite itself, so it cannot be built first).
struct GuestCallsite {
    meta: OnceLock<Metadata<'static>>,
}

/// Stands in for a callsite's metadata in the instant before it is set; never registered.
static UNSET: GuestCallsite = GuestCallsite { meta: OnceLock::new() };
static UNSET_META: Metadata<'static> = Metadata::new(
    "guest log",
    TARGET,
    tracing::Level::INFO,
    None,
    None,
    None,
    FieldSet::new(&[], Identifier(&UNSET)),
    Kind::EVENT,
);

impl Callsite for GuestCallsite {
    // Interest is not cached: `emit` asks the dispatcher whether each event is enabled.
    fn set_interest(&self, _interest: Interest) {}

    fn metadata(&self) -> &Metadata<'_> {
        self.meta.get().unwrap_or(&UNSET_META)
    }
}

#[derive(Default)]
struct Interner {
    names: HashMap<String, &'static str>,
    callsites: HashMap<(u8, Vec<&'static str>), &'static Metadata<'static>>,
}

static INTERNER: LazyLock<Mutex<Interner>> = LazyLock::new(Mutex::default);

fn level_index(level: tracing::Level) -> u8 {
    match level {
        tracing::Level::TRACE => 0,
        tracing::Level::DEBUG => 1,
        tracing::Level::INFO => 2,
        tracing::Level::WARN => 3,
        _ => 4,
    }
}

/// Whether `name` may become a field name.
pub(crate) fn usable_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The metadata of an event at `level` with exactly these fields (in order), or `None` when
/// a bound is reached or a name is unusable.
pub(crate) fn intern(level: tracing::Level, names: &[&str]) -> Option<&'static Metadata<'static>> {
    let mut interner = INTERNER.lock();
    let mut key_names = Vec::with_capacity(names.len());
    for name in names {
        if let Some(n) = interner.names.get(*name) {
            key_names.push(*n);
            continue;
        }
        if !usable_name(name) || interner.names.len() >= MAX_NAMES {
            return None;
        }
        let leaked: &'static str = Box::leak((*name).to_owned().into_boxed_str());
        interner.names.insert((*name).to_owned(), leaked);
        key_names.push(leaked);
    }
    let key = (level_index(level), key_names);
    if let Some(meta) = interner.callsites.get(&key) {
        return Some(meta);
    }
    if interner.callsites.len() >= MAX_CALLSITES {
        return None;
    }
    let fields: &'static [&'static str] = Box::leak(key.1.clone().into_boxed_slice());
    let callsite: &'static GuestCallsite = Box::leak(Box::new(GuestCallsite { meta: OnceLock::new() }));
    let meta = Metadata::new(
        "guest log",
        TARGET,
        level,
        None,
        None,
        None,
        FieldSet::new(fields, Identifier(callsite)),
        Kind::EVENT,
    );
    let _ = callsite.meta.set(meta);
    tracing_core::callsite::register(callsite);
    let meta: &'static Metadata<'static> = callsite.meta.get().unwrap_or(&UNSET_META);
    interner.callsites.insert(key, meta);
    Some(meta)
}

/// Emits an event with `meta` (from [`intern`]) and one value per field, in order.
pub(crate) fn emit(meta: &'static Metadata<'static>, values: &[&str]) {
    let fields = meta.fields();
    let values: Vec<Option<&dyn tracing::Value>> =
        values.iter().map(|v| Some(v as &dyn tracing::Value)).collect();
    if values.len() != fields.len() {
        return;
    }
    tracing::dispatcher::get_default(|dispatch| {
        if dispatch.enabled(meta) {
            dispatch.event(&tracing::Event::new(meta, &fields.value_set_all(&values)));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_shape_reuses_one_callsite_and_bad_names_are_refused() {
        let a = intern(tracing::Level::INFO, &["message", "copies", "namespace"]).unwrap();
        let b = intern(tracing::Level::INFO, &["message", "copies", "namespace"]).unwrap();
        assert!(std::ptr::eq(a, b));
        let c = intern(tracing::Level::WARN, &["message", "copies", "namespace"]).unwrap();
        assert!(!std::ptr::eq(a, c));
        assert_eq!(
            a.fields().iter().map(|f| f.name()).collect::<Vec<_>>(),
            ["message", "copies", "namespace"]
        );
        assert!(intern(tracing::Level::INFO, &["message", "white space"]).is_none());
        assert!(intern(tracing::Level::INFO, &["message", &"x".repeat(MAX_NAME_LEN + 1)]).is_none());
    }
}

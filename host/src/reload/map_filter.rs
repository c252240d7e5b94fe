//! The plugin's `map` and `filter` exports as the controller's [`Mapper`] and [`Filter`],
//! and a watch source's predicates (the built-in ones its TOML turns on, then `filter`).
//!
//! Invariants: handlers do not call a version directly but through the plugin's
//! [`VersionSlot`], shared by every generation's handlers (and kept across controller
//! restarts): the `map` and `filter` they call are always the current version's, so
//! handlers outlive swaps, and calls of two versions never overlap (see `slot`).

use std::sync::Arc;

use kube::core::GroupVersionKind;

use super::predicates::builtin_predicates;
use super::slot::VersionSlot;
use crate::config::Predicates;
use crate::controller::handler::Mapper;
use crate::controller::predicate::{Filter, FilterEvent, FilterPredicate, Predicate};
use crate::controller::{HotSwap, Request};
use crate::object::Object;
use crate::plugin::{FilterInput, Gvk};

/// `apps/v1` + `Deployment` as kube's type.
pub(super) fn kube_gvk(kind: &Gvk) -> GroupVersionKind {
    GroupVersionKind::gvk(kind.group(), kind.version(), &kind.kind)
}

/// Kube's type as `apps/v1` + `Deployment`.
fn gvk_of(kind: &GroupVersionKind) -> Gvk {
    let api_version =
        if kind.group.is_empty() { kind.version.clone() } else { format!("{}/{}", kind.group, kind.version) };
    Gvk::new(api_version, kind.kind.clone())
}

/// The plugin's `map` export as the controller's [`Mapper`].
pub(super) struct PluginMapper(pub(super) VersionSlot);

impl Mapper for PluginMapper {
    fn map(&self, kind: &GroupVersionKind, obj: &Arc<Object>) -> Vec<Request> {
        self.0.call(|p| p.map(&gvk_of(kind), obj))
    }
}

/// The plugin's `filter` export as the controller's [`Filter`].
struct PluginFilter(VersionSlot);

impl Filter for PluginFilter {
    fn filter(&self, kind: &GroupVersionKind, event: FilterEvent<'_>) -> bool {
        let input = match event {
            FilterEvent::Create(o) => FilterInput::Create(o.json()),
            FilterEvent::Update { old, new } => FilterInput::Update(old.json(), new.json()),
            FilterEvent::Delete(d) => FilterInput::Delete(d.object().json()),
        };
        self.0.call(|p| p.filter(&gvk_of(kind), input))
    }
}

/// A source's predicates: the built-in ones its TOML turns on, then the plugin's `filter`.
pub(super) fn predicates(
    p: &Predicates,
    kind: &Gvk,
    plugin: &VersionSlot,
) -> Result<Vec<Arc<dyn Predicate>>, String> {
    let mut out = builtin_predicates(p).map_err(|e| e.to_string())?;
    if p.filter {
        let slot: HotSwap<dyn Filter> = HotSwap::new(Arc::new(PluginFilter(plugin.clone())));
        out.push(Arc::new(FilterPredicate::new(kube_gvk(kind), slot)));
    }
    Ok(out)
}

//! The event hooks of a plugin: `on-add`, `on-update`, `on-delete`, `map` and `filter`.
//! A child of `runtime::plugin`: the calls use its instance pool, limits and trap handling
//! like every other export.
//!
//! Invariants:
//! - An object handed to a hook, `map` or `filter` is what the plugin may see of it
//!   ([`Access::guest_view`]): whole if its kind is readable, else its metadata only; one
//!   outside the plugin's namespaces is not handed over at all (the hook is not called,
//!   `map` maps it to nothing, `filter` drops it).
//! - Requests `map` returns outside the plugin's namespaces are dropped (and logged), and
//!   what it returns is bounded by the plugin's `max-output`.

use super::{CallError, Plugin, check_output};
use crate::controller::Request;
use crate::plugin::bindings::exports::wasmctrl::controller::reconciler::FilterEvent;
use crate::plugin::bindings::wasmctrl::controller::types::Gvk as WitGvk;
use crate::plugin::imports::access::GuestView;
use crate::plugin::spec::Gvk;

impl Plugin {
    /// Calls `on-add` with what the plugin may see of `object` (nothing when it is outside
    /// the plugin's namespaces: the hook is not called). Blocking.
    pub fn on_add_blocking(&self, kind: &Gvk, object: &[u8], in_initial_list: bool) -> Result<(), CallError> {
        let view = self.inner.access().guest_view(kind, object);
        let Some(object) = view.bytes() else { return Ok(()) };
        let kind = wit_gvk(kind);
        self.inner.call("on-add", None, |inst| {
            inst.bindings.wasmctrl_controller_reconciler().call_on_add(
                &mut inst.store,
                &kind,
                &object.to_vec(),
                in_initial_list,
            )
        })
    }

    /// Calls `on-update` (see [`on_add_blocking`](Self::on_add_blocking)). Blocking.
    pub fn on_update_blocking(&self, kind: &Gvk, old: &[u8], new: &[u8]) -> Result<(), CallError> {
        let access = self.inner.access();
        let (old, new) = (access.guest_view(kind, old), access.guest_view(kind, new));
        let (Some(old), Some(new)) = (old.bytes(), new.bytes()) else { return Ok(()) };
        let kind = wit_gvk(kind);
        self.inner.call("on-update", None, |inst| {
            inst.bindings.wasmctrl_controller_reconciler().call_on_update(
                &mut inst.store,
                &kind,
                &old.to_vec(),
                &new.to_vec(),
            )
        })
    }

    /// Calls `on-delete` (see [`on_add_blocking`](Self::on_add_blocking)). Blocking.
    pub fn on_delete_blocking(
        &self,
        kind: &Gvk,
        object: &[u8],
        final_state_unknown: bool,
    ) -> Result<(), CallError> {
        let view = self.inner.access().guest_view(kind, object);
        let Some(object) = view.bytes() else { return Ok(()) };
        let kind = wit_gvk(kind);
        self.inner.call("on-delete", None, |inst| {
            inst.bindings.wasmctrl_controller_reconciler().call_on_delete(
                &mut inst.store,
                &kind,
                &object.to_vec(),
                final_state_unknown,
            )
        })
    }

    /// Calls `map` with what the plugin may see of `object`; an object outside the plugin's
    /// namespaces maps to nothing, and so does a returned request outside them. Blocking.
    pub fn map_blocking(&self, kind: &Gvk, object: &[u8]) -> Result<Vec<Request>, CallError> {
        let access = self.inner.access();
        let view = access.guest_view(kind, object);
        let Some(object) = view.bytes() else { return Ok(Vec::new()) };
        let wit_kind = wit_gvk(kind);
        let max = self.inner.spec.limits.max_output;
        let requests = self.inner.call("map", None, |inst| {
            let list = inst.bindings.wasmctrl_controller_reconciler().call_map(
                &mut inst.store,
                &wit_kind,
                &object.to_vec(),
            )?;
            // Per request: the two strings plus the fixed part of its canonical-ABI layout.
            let size: usize =
                list.iter().map(|r| 20 + r.name.len() + r.namespace.as_ref().map_or(0, String::len)).sum();
            check_output(size, max)?;
            Ok(list)
        })?;
        let (kept, outside): (Vec<_>, Vec<_>) =
            requests.into_iter().partition(|r| access.in_scope(r.namespace.as_deref()));
        if !outside.is_empty() {
            tracing::warn!(plugin = %self.name(), version = %self.short_version(), kind = %kind, dropped = outside.len(), "map returned requests outside the plugin's namespaces; they were dropped");
        }
        Ok(kept.into_iter().map(|r| Request { namespace: r.namespace, name: r.name }).collect())
    }

    /// Calls `filter` with what the plugin may see of the event's objects; an event about
    /// an object outside the plugin's namespaces is dropped without asking. Blocking.
    pub fn filter_blocking(&self, kind: &Gvk, event: FilterInput<'_>) -> Result<bool, CallError> {
        let access = self.inner.access();
        let view = |json| access.guest_view(kind, json);
        let owned = |v: &GuestView<'_>| v.bytes().map(<[u8]>::to_vec);
        let event = match event {
            FilterInput::Create(o) => owned(&view(o)).map(FilterEvent::Create),
            FilterInput::Update(old, new) => match (owned(&view(old)), owned(&view(new))) {
                (Some(old), Some(new)) => Some(FilterEvent::Update((old, new))),
                _ => None,
            },
            FilterInput::Delete(o) => owned(&view(o)).map(FilterEvent::Delete),
        };
        let Some(event) = event else { return Ok(false) };
        let kind = wit_gvk(kind);
        self.inner.call("filter", None, |inst| {
            inst.bindings.wasmctrl_controller_reconciler().call_filter(&mut inst.store, &kind, &event)
        })
    }
}

/// The event a `filter` call is about, as JSON.
#[derive(Clone, Copy, Debug)]
pub enum FilterInput<'a> {
    Create(&'a [u8]),
    Update(&'a [u8], &'a [u8]),
    Delete(&'a [u8]),
}

pub(super) fn wit_gvk(kind: &Gvk) -> WitGvk {
    WitGvk { api_version: kind.api_version.clone(), kind: kind.kind.clone() }
}

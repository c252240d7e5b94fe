//! Captures the guest log lines the host emits (target `wasmctrl::plugin::guest`) for tests
//! that read what a plugin logged.
//!
//! A guest line's context is split between the event and its enclosing spans: each guest
//! field is a field of the event, while `plugin`, `version` and `request` are left off the
//! event when a span (the controller's `reconcile` span, the plugin's call span) already
//! says them. This layer keeps every span's fields and hands each guest event to its sink
//! with the fields of all its spans, outermost first, overridden by the event's own.

use std::collections::HashMap;

use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// One field map: name → value as rendered (strings without quotes).
#[derive(Clone, Debug, Default)]
pub struct Fields(pub HashMap<&'static str, String>);

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
}

impl Fields {
    /// The plugin that logged: its `plugin` field, else the controller it runs as.
    pub fn plugin(&self) -> String {
        self.0.get("plugin").or_else(|| self.0.get("controller")).cloned().unwrap_or_default()
    }

    /// The guest's own fields, rendered as the host's text format does (`k="v" k2="v2"`).
    pub fn guest_fields(&self) -> String {
        const CONTEXT: [&str; 7] =
            ["message", "plugin", "version", "request", "export", "controller", "fields"];
        let mut own: Vec<(&str, &String)> =
            self.0.iter().filter(|(k, _)| !CONTEXT.contains(k)).map(|(k, v)| (*k, v)).collect();
        own.sort();
        let mut out: Vec<String> = own.into_iter().map(|(k, v)| format!("{k}={v:?}")).collect();
        // Fields the host could not make event fields arrive already rendered.
        if let Some(rest) = self.0.get("fields") {
            out.push(rest.clone());
        }
        out.join(" ")
    }
}

/// The layer: calls `sink` with the merged fields of every guest log event, while still
/// inside the call that logged (so the order seen is the order of the calls).
pub struct GuestLogLayer<F>(pub F);

impl<S, F> Layer<S> for GuestLogLayer<F>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    F: Fn(Fields) + Send + Sync + 'static,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != "wasmctrl::plugin::guest" {
            return;
        }
        let mut all = Fields::default();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(fields) = span.extensions().get::<Fields>() {
                    all.0.extend(fields.0.iter().map(|(k, v)| (*k, v.clone())));
                }
            }
        }
        event.record(&mut all);
        (self.0)(all);
    }
}

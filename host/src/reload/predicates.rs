//! The event predicates a watch source's TOML asks for (`[for.predicates]`,
//! `[[owns]]`/`[[watches]]` `predicates`), built in one place for the running host and for
//! `wasmctrl test`.
//!
//! Invariants: the reload wiring and the fixture runner build a source's predicates with
//! [`builtin_predicates`] only, so `wasmctrl test` drops and passes the events the host
//! does, in the same order. The plugin's `filter` export is not built here (the wiring calls
//! it through the version slot, the fixture runner on its own instance); both ask it only
//! about an event every built-in predicate passed.

use std::sync::Arc;

use crate::cache::{LabelSelector, SelectorError};
use crate::config::Predicates;
use crate::controller::predicate::{
    AnnotationPresent, AnnotationsChanged, GenerationChanged, LabelSelectorPredicate, LabelsChanged,
    Predicate, ResourceVersionChanged,
};

/// The built-in predicates `p` turns on, in the order the host evaluates them: generation,
/// resourceVersion, labels and annotations changed, the label selector, the annotation.
/// Fails only on a label selector that does not parse (the configuration check refuses
/// those first).
pub(crate) fn builtin_predicates(p: &Predicates) -> Result<Vec<Arc<dyn Predicate>>, SelectorError> {
    let mut out: Vec<Arc<dyn Predicate>> = Vec::new();
    if p.generation_changed {
        out.push(Arc::new(GenerationChanged));
    }
    if p.resource_version_changed {
        out.push(Arc::new(ResourceVersionChanged));
    }
    if p.labels_changed {
        out.push(Arc::new(LabelsChanged));
    }
    if p.annotations_changed {
        out.push(Arc::new(AnnotationsChanged));
    }
    if let Some(sel) = &p.label_selector {
        out.push(Arc::new(LabelSelectorPredicate(LabelSelector::parse(sel)?)));
    }
    if let Some(key) = &p.annotation_present {
        out.push(Arc::new(AnnotationPresent(key.clone())));
    }
    Ok(out)
}

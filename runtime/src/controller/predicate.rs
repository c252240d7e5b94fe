//! Predicates: which notifications reach a controller's queue (controller-runtime's
//! `predicate` package).
//!
//! A [`Predicate`] answers per event kind (create, update, delete); an event is enqueued only
//! if every predicate of its source passes. Built-ins mirror controller-runtime:
//! [`GenerationChanged`] (status-only writes never reconcile), [`ResourceVersionChanged`]
//! (drops resyncs), [`LabelsChanged`], [`AnnotationsChanged`], [`LabelSelectorPredicate`],
//! [`AnnotationPresent`], and [`And`] / [`Or`] / [`Not`]. [`FilterPredicate`] asks a
//! [`Filter`] hook (a Wasm plugin's `filter` export) and can be hot-swapped.
//!
//! Predicates run on the informer's listener task: they must be quick and must not block.

use std::sync::Arc;

use kube::core::GroupVersionKind;

use super::HotSwap;
use crate::cache::LabelSelector;
use crate::object::{DeletedObject, Object};

/// Decides whether an event is enqueued. Each method defaults to `true`.
pub trait Predicate: Send + Sync + 'static {
    /// An added object (also the synthetic adds of an initial list).
    fn create(&self, _obj: &Arc<Object>) -> bool {
        true
    }
    /// A changed object, a resync, or an unchanged object re-delivered by a relist
    /// (`old` and `new` with the same resourceVersion).
    fn update(&self, _old: &Arc<Object>, _new: &Arc<Object>) -> bool {
        true
    }
    /// A deleted object or tombstone.
    fn delete(&self, _obj: &DeletedObject) -> bool {
        true
    }
}

/// Passes updates whose `metadata.generation` changed; create and delete pass.
///
/// Objects without a generation (ConfigMaps, most core kinds) never change it, so with this
/// predicate their updates are all dropped, as in controller-runtime.
#[derive(Clone, Copy, Debug, Default)]
pub struct GenerationChanged;

impl Predicate for GenerationChanged {
    fn update(&self, old: &Arc<Object>, new: &Arc<Object>) -> bool {
        old.generation() != new.generation()
    }
}

/// Passes updates whose `metadata.resourceVersion` changed (drops resyncs and the updates a
/// relist re-delivers for unchanged objects).
#[derive(Clone, Copy, Debug, Default)]
pub struct ResourceVersionChanged;

impl Predicate for ResourceVersionChanged {
    fn update(&self, old: &Arc<Object>, new: &Arc<Object>) -> bool {
        old.resource_version() != new.resource_version()
    }
}

/// Passes updates whose labels changed.
#[derive(Clone, Copy, Debug, Default)]
pub struct LabelsChanged;

impl Predicate for LabelsChanged {
    fn update(&self, old: &Arc<Object>, new: &Arc<Object>) -> bool {
        !old.labels().eq(new.labels())
    }
}

/// Passes updates whose annotations changed.
#[derive(Clone, Copy, Debug, Default)]
pub struct AnnotationsChanged;

impl Predicate for AnnotationsChanged {
    fn update(&self, old: &Arc<Object>, new: &Arc<Object>) -> bool {
        !old.annotations().eq(new.annotations())
    }
}

/// Passes objects whose labels match a selector (for updates: the new object; for deletes:
/// the last known state).
#[derive(Clone, Debug)]
pub struct LabelSelectorPredicate(pub LabelSelector);

impl Predicate for LabelSelectorPredicate {
    fn create(&self, obj: &Arc<Object>) -> bool {
        self.0.matches(obj)
    }
    fn update(&self, _old: &Arc<Object>, new: &Arc<Object>) -> bool {
        self.0.matches(new)
    }
    fn delete(&self, obj: &DeletedObject) -> bool {
        self.0.matches(obj.object())
    }
}

/// Passes objects carrying an annotation key (for updates: the new object).
#[derive(Clone, Debug)]
pub struct AnnotationPresent(pub String);

impl Predicate for AnnotationPresent {
    fn create(&self, obj: &Arc<Object>) -> bool {
        obj.annotation(&self.0).is_some()
    }
    fn update(&self, _old: &Arc<Object>, new: &Arc<Object>) -> bool {
        new.annotation(&self.0).is_some()
    }
    fn delete(&self, obj: &DeletedObject) -> bool {
        obj.object().annotation(&self.0).is_some()
    }
}

/// Passes when every inner predicate passes (an empty `And` passes everything).
#[derive(Clone, Default)]
pub struct And(pub Vec<Arc<dyn Predicate>>);

impl Predicate for And {
    fn create(&self, obj: &Arc<Object>) -> bool {
        self.0.iter().all(|p| p.create(obj))
    }
    fn update(&self, old: &Arc<Object>, new: &Arc<Object>) -> bool {
        self.0.iter().all(|p| p.update(old, new))
    }
    fn delete(&self, obj: &DeletedObject) -> bool {
        self.0.iter().all(|p| p.delete(obj))
    }
}

/// Passes when any inner predicate passes (an empty `Or` passes nothing).
#[derive(Clone, Default)]
pub struct Or(pub Vec<Arc<dyn Predicate>>);

impl Predicate for Or {
    fn create(&self, obj: &Arc<Object>) -> bool {
        self.0.iter().any(|p| p.create(obj))
    }
    fn update(&self, old: &Arc<Object>, new: &Arc<Object>) -> bool {
        self.0.iter().any(|p| p.update(old, new))
    }
    fn delete(&self, obj: &DeletedObject) -> bool {
        self.0.iter().any(|p| p.delete(obj))
    }
}

/// Passes when the inner predicate does not.
#[derive(Clone)]
pub struct Not(pub Arc<dyn Predicate>);

impl Predicate for Not {
    fn create(&self, obj: &Arc<Object>) -> bool {
        !self.0.create(obj)
    }
    fn update(&self, old: &Arc<Object>, new: &Arc<Object>) -> bool {
        !self.0.update(old, new)
    }
    fn delete(&self, obj: &DeletedObject) -> bool {
        !self.0.delete(obj)
    }
}

/// The event a [`Filter`] is asked about.
#[derive(Clone, Copy, Debug)]
pub enum FilterEvent<'a> {
    Create(&'a Arc<Object>),
    Update { old: &'a Arc<Object>, new: &'a Arc<Object> },
    Delete(&'a DeletedObject),
}

/// A user-defined predicate hook, told the kind of the object (a Wasm plugin's `filter`
/// export implements it). `false` drops the event.
pub trait Filter: Send + Sync + 'static {
    fn filter(&self, kind: &GroupVersionKind, event: FilterEvent<'_>) -> bool;
}

impl<F> Filter for F
where
    F: Fn(&GroupVersionKind, FilterEvent<'_>) -> bool + Send + Sync + 'static,
{
    fn filter(&self, kind: &GroupVersionKind, event: FilterEvent<'_>) -> bool {
        self(kind, event)
    }
}

/// A [`Predicate`] that asks the current [`Filter`] of a hot-swappable slot.
#[derive(Clone)]
pub struct FilterPredicate {
    kind: GroupVersionKind,
    filter: HotSwap<dyn Filter>,
}

impl FilterPredicate {
    /// Asks `filter` about events of objects of `kind`.
    pub fn new(kind: GroupVersionKind, filter: HotSwap<dyn Filter>) -> Self {
        FilterPredicate { kind, filter }
    }
}

impl Predicate for FilterPredicate {
    fn create(&self, obj: &Arc<Object>) -> bool {
        self.filter.load().filter(&self.kind, FilterEvent::Create(obj))
    }
    fn update(&self, old: &Arc<Object>, new: &Arc<Object>) -> bool {
        self.filter.load().filter(&self.kind, FilterEvent::Update { old, new })
    }
    fn delete(&self, obj: &DeletedObject) -> bool {
        self.filter.load().filter(&self.kind, FilterEvent::Delete(obj))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(json: &str) -> Arc<Object> {
        Arc::new(Object::from_json(json.as_bytes().to_vec().into()).unwrap())
    }

    fn with(rv: &str, generation: i64, labels: &str, annotations: &str) -> Arc<Object> {
        obj(&format!(
            r#"{{"metadata":{{"name":"a","namespace":"ns","resourceVersion":"{rv}","generation":{generation},"labels":{{{labels}}},"annotations":{{{annotations}}}}}}}"#
        ))
    }

    #[test]
    fn generation_changed_ignores_status_only_updates() {
        let p = GenerationChanged;
        let a = with("1", 1, "", "");
        assert!(!p.update(&a, &with("2", 1, "", "")));
        assert!(p.update(&a, &with("3", 2, "", "")));
        assert!(p.create(&a));
        assert!(p.delete(&DeletedObject::Known(a)));
    }

    #[test]
    fn resource_version_changed_drops_resyncs() {
        let p = ResourceVersionChanged;
        let a = with("1", 1, "", "");
        assert!(!p.update(&a, &a.clone()));
        assert!(p.update(&a, &with("2", 1, "", "")));
    }

    #[test]
    fn labels_and_annotations_changed() {
        let a = with("1", 1, r#""x":"1""#, r#""n":"1""#);
        let relabelled = with("2", 1, r#""x":"2""#, r#""n":"1""#);
        let reannotated = with("2", 1, r#""x":"1""#, r#""n":"2""#);
        assert!(LabelsChanged.update(&a, &relabelled));
        assert!(!LabelsChanged.update(&a, &reannotated));
        assert!(AnnotationsChanged.update(&a, &reannotated));
        assert!(!AnnotationsChanged.update(&a, &relabelled));
    }

    #[test]
    fn label_selector_checks_new_object_and_tombstones() {
        let p = LabelSelectorPredicate(LabelSelector::parse("tier=web").unwrap());
        let web = with("1", 1, r#""tier":"web""#, "");
        let db = with("2", 1, r#""tier":"db""#, "");
        assert!(p.create(&web));
        assert!(!p.create(&db));
        assert!(p.update(&db, &web));
        assert!(!p.update(&web, &db));
        let tomb = DeletedObject::FinalStateUnknown { key: "ns/a".into(), last_known: web };
        assert!(p.delete(&tomb));
    }

    #[test]
    fn annotation_present() {
        let p = AnnotationPresent("example.com/managed".into());
        assert!(p.create(&with("1", 1, "", r#""example.com/managed":"""#)));
        assert!(!p.create(&with("1", 1, "", r#""other":"""#)));
    }

    #[test]
    fn combinators() {
        let a = with("1", 1, "", "");
        let b = with("2", 2, "", "");
        let gen_: Arc<dyn Predicate> = Arc::new(GenerationChanged);
        let rv: Arc<dyn Predicate> = Arc::new(ResourceVersionChanged);
        let same_gen = with("2", 1, "", "");
        assert!(And(vec![gen_.clone(), rv.clone()]).update(&a, &b));
        assert!(!And(vec![gen_.clone(), rv.clone()]).update(&a, &same_gen));
        assert!(Or(vec![gen_.clone(), rv.clone()]).update(&a, &same_gen));
        assert!(!Or(vec![]).create(&a));
        assert!(And(vec![]).create(&a));
        assert!(Not(gen_.clone()).update(&a, &same_gen));
        assert!(!Not(gen_).create(&a));
    }

    #[test]
    fn filter_predicate_follows_swaps() {
        let kind = GroupVersionKind::gvk("", "v1", "ConfigMap");
        let slot: HotSwap<dyn Filter> = HotSwap::new(Arc::new(|k: &GroupVersionKind, e: FilterEvent<'_>| {
            k.kind == "ConfigMap" && matches!(e, FilterEvent::Create(_))
        }));
        let p = FilterPredicate::new(kind, slot.clone());
        let a = with("1", 1, "", "");
        assert!(p.create(&a));
        assert!(!p.update(&a, &a));
        slot.store(Arc::new(|_: &GroupVersionKind, _: FilterEvent<'_>| false));
        assert!(!p.create(&a));
    }
}

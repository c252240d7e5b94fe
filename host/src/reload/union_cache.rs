//! One kind's cache as a plugin sees it when the kind is watched through several informers
//! (e.g. `[for]` and `[[watches]]` name the same kind with different selectors): the union of
//! their caches.
//!
//! Invariants:
//! - every object any member holds is visible, once: a key held by several members is
//!   answered with the newest copy (the greater resourceVersion when both are integers, as
//!   API servers' are; otherwise the first member's);
//! - `list` and `by_index` return objects in key order;
//! - an index is usable if at least one member has it; members without it contribute
//!   nothing to that lookup;
//! - a bounded read ([`ListBound`]) bounds each member's walk and then the union, so no
//!   member is walked past the bound.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::object::Object;
use crate::plugin::imports::cache::{BoundedCollector, CacheReadError, CacheReader, ListBound};

/// The union of several caches of one kind.
pub struct UnionCache {
    members: Vec<Arc<dyn CacheReader>>,
}

impl UnionCache {
    /// A reader over every cache of `members` (in order of preference for equal copies).
    pub fn new(members: Vec<Arc<dyn CacheReader>>) -> Self {
        Self { members }
    }

    fn merge(lists: impl IntoIterator<Item = Vec<Arc<Object>>>) -> Vec<Arc<Object>> {
        let mut by_key: BTreeMap<String, Arc<Object>> = BTreeMap::new();
        for obj in lists.into_iter().flatten() {
            match by_key.get(obj.key()) {
                Some(held) if !newer(&obj, held) => {}
                _ => {
                    by_key.insert(obj.key().to_owned(), obj);
                }
            }
        }
        by_key.into_values().collect()
    }
}

/// Whether `a` is a strictly newer copy of the same object than `b`.
fn newer(a: &Object, b: &Object) -> bool {
    match (a.resource_version().parse::<u64>(), b.resource_version().parse::<u64>()) {
        (Ok(a), Ok(b)) => a > b,
        _ => false,
    }
}

impl CacheReader for UnionCache {
    fn get(&self, key: &str) -> Option<Arc<Object>> {
        let mut best: Option<Arc<Object>> = None;
        for obj in self.members.iter().filter_map(|m| m.get(key)) {
            if best.as_ref().is_none_or(|b| newer(&obj, b)) {
                best = Some(obj);
            }
        }
        best
    }

    fn list(
        &self,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError> {
        let lists =
            self.members.iter().map(|m| m.list(namespace, label_selector)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self::merge(lists))
    }

    fn by_index(&self, index: &str, value: &str) -> Result<Vec<Arc<Object>>, CacheReadError> {
        self.by_index_with(|m| m.by_index(index, value))
    }

    fn list_bounded(
        &self,
        namespace: Option<&str>,
        label_selector: Option<&str>,
        bound: &ListBound<'_>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError> {
        let lists = self
            .members
            .iter()
            .map(|m| m.list_bounded(namespace, label_selector, bound))
            .collect::<Result<Vec<_>, _>>()?;
        BoundedCollector::collect(bound, Self::merge(lists))
    }

    fn by_index_bounded(
        &self,
        index: &str,
        value: &str,
        bound: &ListBound<'_>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError> {
        BoundedCollector::collect(bound, self.by_index_with(|m| m.by_index_bounded(index, value, bound))?)
    }
}

impl UnionCache {
    /// Merges what `lookup` finds in each member that has the index.
    fn by_index_with(
        &self,
        lookup: impl Fn(&Arc<dyn CacheReader>) -> Result<Vec<Arc<Object>>, CacheReadError>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError> {
        let mut lists = Vec::new();
        let mut unknown = None;
        for m in &self.members {
            match lookup(m) {
                Ok(list) => lists.push(list),
                Err(e @ CacheReadError::UnknownIndex(_)) => unknown = Some(e),
                Err(e) => return Err(e),
            }
        }
        match (lists.is_empty(), unknown) {
            (true, Some(e)) => Err(e),
            _ => Ok(Self::merge(lists)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{IndexFunc, Writer};

    fn cm(name: &str, rv: u64, app: &str) -> Arc<Object> {
        let json = format!(
            r#"{{"metadata":{{"namespace":"ns","name":"{name}","resourceVersion":"{rv}","labels":{{"app":"{app}"}}}}}}"#
        );
        Arc::new(Object::from_json(json.into()).unwrap())
    }

    fn cache(objects: &[Arc<Object>], indexed: bool) -> Arc<dyn CacheReader> {
        let idx = Writer::new();
        if indexed {
            idx.add_indexers([(
                "by-app".to_owned(),
                IndexFunc::custom(|o: &Object| {
                    o.label("app").map(|v| vec![v.to_owned()]).unwrap_or_default()
                }),
            )])
            .unwrap();
        }
        for o in objects {
            idx.upsert(o.clone());
        }
        Arc::new(idx.reader())
    }

    fn names(list: Vec<Arc<Object>>) -> Vec<(String, String)> {
        list.iter().map(|o| (o.name().to_owned(), o.resource_version().to_owned())).collect()
    }

    #[test]
    fn union_sees_every_member_once_newest_first() {
        let u = UnionCache::new(vec![
            cache(&[cm("a", 1, "x"), cm("both", 5, "x")], true),
            cache(&[cm("b", 2, "y"), cm("both", 7, "y")], false),
        ]);
        assert_eq!(
            names(u.list(Some("ns"), None).unwrap()),
            [("a".into(), "1".into()), ("b".into(), "2".into()), ("both".into(), "7".into())]
        );
        assert_eq!(u.get("ns/both").unwrap().resource_version(), "7");
        assert_eq!(u.get("ns/b").unwrap().resource_version(), "2");
        assert!(u.get("ns/none").is_none());
        assert_eq!(
            names(u.list(None, Some("app=y")).unwrap()),
            [("b".into(), "2".into()), ("both".into(), "7".into())]
        );
        // Only the first member has the index: it answers alone.
        assert_eq!(
            names(u.by_index("by-app", "x").unwrap()),
            [("a".into(), "1".into()), ("both".into(), "5".into())]
        );
        assert!(matches!(u.by_index("nope", "x"), Err(CacheReadError::UnknownIndex(_))));
        assert!(matches!(u.list(None, Some("a in")), Err(CacheReadError::InvalidSelector { .. })));
        // Bounded: the union is bounded, not only each member.
        let all = |_: &Object| true;
        let wide = ListBound { max_bytes: 1 << 20, keep: &all };
        assert_eq!(u.list_bounded(None, None, &wide).unwrap().len(), 3);
        let size = cm("a", 1, "x").json().len();
        let two = ListBound { max_bytes: size * 2 + 2, keep: &all };
        assert!(matches!(u.list_bounded(None, None, &two), Err(CacheReadError::TooLarge { .. })));
        let not_b = |o: &Object| o.name() != "b";
        let scoped = ListBound { max_bytes: 1 << 20, keep: &not_b };
        assert_eq!(names(u.list_bounded(None, None, &scoped).unwrap()).len(), 2);
        assert_eq!(names(u.by_index_bounded("by-app", "x", &scoped).unwrap()).len(), 2);
    }
}

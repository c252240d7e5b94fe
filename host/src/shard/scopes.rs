//! Label mode, the replica's half: a plugin's `for` source is narrowed to the objects
//! labelled with this shard's name, and each such scope has a [`Directory`] of every object
//! in it, whoever it is assigned to.
//!
//! Invariants: a scope's narrowing is exactly one label requirement appended to the
//! source's own selector (`<selector>,shard.wasmctrl.dev/<ring>=<shard>`), so the scope is
//! recovered from the narrowed source by removing it; one directory per scope, shared by
//! every plugin of that scope and by the assignment role, stopped when the last user lets
//! go; the scopes this replica uses are published in its shard Lease (the assignment role
//! labels what the live replicas ask for).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::directory::Directory;
use super::lease::LeaseHandle;
use super::protocol::{self, LabelScope};
use crate::config::WatchSource;
use crate::source::Discovery;

/// The label-mode scopes of one replica.
pub struct Scopes {
    client: kube::Client,
    discovery: Discovery,
    label_key: String,
    shard: String,
    lease: LeaseHandle,
    directories: Mutex<HashMap<LabelScope, Weak<Directory>>>,
    /// The scopes in use, by user (a plugin gate), to publish.
    users: Mutex<Vec<(Weak<()>, LabelScope)>>,
}

impl std::fmt::Debug for Scopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scopes").field("label_key", &self.label_key).field("shard", &self.shard).finish()
    }
}

impl Scopes {
    pub fn new(
        client: kube::Client,
        discovery: Discovery,
        label_key: String,
        shard: String,
        lease: LeaseHandle,
    ) -> Arc<Scopes> {
        Arc::new(Scopes {
            client,
            discovery,
            label_key,
            shard,
            lease,
            directories: Mutex::new(HashMap::new()),
            users: Mutex::new(Vec::new()),
        })
    }

    /// The label requirement that narrows a source to this shard's objects.
    fn requirement(&self) -> String {
        format!("{}={}", self.label_key, self.shard)
    }

    /// Narrows `source` to the objects labelled with this shard.
    pub fn narrow(&self, source: &mut WatchSource) {
        let mine = self.requirement();
        source.label_selector = Some(match source.label_selector.as_deref().map(str::trim) {
            Some(own) if !own.is_empty() => format!("{own},{mine}"),
            _ => mine,
        });
    }

    /// The scope of a source narrowed by [`narrow`](Self::narrow) (or of one not narrowed).
    pub fn scope_of(&self, source: &WatchSource) -> LabelScope {
        let mine = self.requirement();
        let selector = source.label_selector.as_deref().and_then(|s| {
            let own = s.strip_suffix(&mine).map_or(s, |rest| rest.strip_suffix(',').unwrap_or(rest));
            (!own.trim().is_empty()).then(|| own.to_owned())
        });
        LabelScope {
            api_version: source.kind.api_version.clone(),
            kind: source.kind.kind.clone(),
            namespace: source.namespace.clone(),
            label_selector: selector,
            field_selector: source.field_selector.clone(),
        }
    }

    /// The directory of `scope`, started if nobody follows it yet.
    pub fn directory(&self, scope: &LabelScope) -> Arc<Directory> {
        let mut dirs = self.directories.lock();
        if let Some(d) = dirs.get(scope).and_then(Weak::upgrade) {
            return d;
        }
        dirs.retain(|_, w| w.strong_count() > 0);
        let d = Directory::start(
            self.client.clone(),
            self.discovery.clone(),
            scope.clone(),
            self.label_key.clone(),
        );
        dirs.insert(scope.clone(), Arc::downgrade(&d));
        d
    }

    /// Records that `user` (alive while its token is) uses `scope`, and publishes the scopes.
    pub fn use_scope(&self, user: &Arc<()>, scope: LabelScope) {
        {
            let mut users = self.users.lock();
            users.retain(|(u, _)| u.strong_count() > 0 && !std::ptr::eq(u.as_ptr(), Arc::as_ptr(user)));
            users.push((Arc::downgrade(user), scope));
        }
        self.publish();
    }

    /// Publishes the scopes in use in the shard Lease.
    pub fn publish(&self) {
        let scopes: BTreeSet<LabelScope> = {
            let mut users = self.users.lock();
            users.retain(|(u, _)| u.strong_count() > 0);
            users.iter().map(|(_, s)| s.clone()).collect()
        };
        self.lease.set_scopes(protocol::encode_scopes(&scopes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Predicates, WatchSource};
    use crate::object::Transform;
    use crate::plugin::Gvk;

    fn source(selector: Option<&str>) -> WatchSource {
        WatchSource {
            kind: Gvk::new("v1", "ConfigMap"),
            namespace: Some("team-a".into()),
            label_selector: selector.map(str::to_owned),
            field_selector: None,
            indexes: Default::default(),
            predicates: Predicates::default(),
            transform: Transform::default(),
        }
    }

    #[tokio::test]
    async fn narrowing_appends_one_requirement_and_is_undone_exactly() {
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
        let (_lease, handle) = super::super::lease::ShardLease::new(
            client.clone(),
            super::super::lease::LeaseSettings {
                namespace: "default".into(),
                name: "r-shard-a".into(),
                ring: "r".into(),
                shard: "a".into(),
                identity: "a_1".into(),
                lease_duration: std::time::Duration::from_secs(15),
                renew_deadline: std::time::Duration::from_secs(10),
                retry_period: std::time::Duration::from_secs(2),
            },
        );
        let scopes = Scopes::new(
            client.clone(),
            Discovery::new(client),
            "shard.wasmctrl.dev/r".into(),
            "a".into(),
            handle,
        );
        for own in [None, Some("mirror=true"), Some("tier in (a,b),x")] {
            let mut s = source(own);
            scopes.narrow(&mut s);
            let expected = match own {
                Some(o) => format!("{o},shard.wasmctrl.dev/r=a"),
                None => "shard.wasmctrl.dev/r=a".to_owned(),
            };
            assert_eq!(s.label_selector.as_deref(), Some(expected.as_str()));
            crate::cache::LabelSelector::parse(&expected).expect("a valid selector");
            let scope = scopes.scope_of(&s);
            assert_eq!(scope.label_selector.as_deref(), own);
            assert_eq!(scope.namespace.as_deref(), Some("team-a"));
            assert_eq!(scopes.scope_of(&source(own)), scope, "a source not narrowed has the same scope");
        }
    }
}

//! Test plugin: a validating and mutating webhook on ConfigMaps, driven by the object's
//! `data` so one component covers every case of `host/tests/admission.rs`:
//!
//! - `deny: <message>` is refused with that message (403); `invalid` with 422;
//! - `panic` traps, `loop` runs until the call's deadline;
//! - `print` writes a line to stdout and one to stderr, then goes on; `udp` tries to open
//!   a UDP socket and is refused with the error it gets;
//! - `write` tries to create a ConfigMap `<name>-side-effect` and is refused with the
//!   error when the host refuses the write;
//! - `unique: <value>` is refused when another cached ConfigMap of the namespace has the
//!   same `unique` value (admission reads the informer cache);
//! - every validation warns `validated by <stamp>`, every mutation labels `stamp=<stamp>`
//!   and warns `mutated by <stamp>` (`stamp` comes from `[settings]`), and a dry run
//!   warns `dry run`;
//! - a ConfigMap labelled `protected` cannot be deleted.

use serde::Deserialize;
use wasmctrl_guest::k8s_openapi::api::core::v1::ConfigMap;
use wasmctrl_guest::prelude::*;

#[derive(Deserialize)]
struct Admit {
    #[serde(default)]
    stamp: String,
}

impl Plugin for Admit {
    type For = ConfigMap;

    fn init(settings: Settings) -> Result<Self, InitError> {
        Ok(settings.parse()?)
    }

    fn reconcile(&self, _: Target<ConfigMap>) -> Result<Action, ReconcileError> {
        Ok(Action::Done)
    }
}

impl Admit {
    fn check(&self, request: &AdmissionRequest, cm: &ConfigMap) -> Result<(), Denied> {
        request.warn(format!("validated by {}", self.stamp));
        if request.dry_run {
            request.warn("dry run");
        }
        // Borrowed, not cloned: the admission benchmark's native handler reads the same map
        // without copying it, and the two sides must do the same work.
        let no_data = std::collections::BTreeMap::new();
        let data = cm.data.as_ref().unwrap_or(&no_data);
        if let Some(message) = data.get("deny") {
            return Err(Denied::new(message.clone()));
        }
        if data.contains_key("invalid") {
            return Err(Denied::invalid("data.invalid is not allowed"));
        }
        if data.contains_key("panic") {
            panic!("admission panic on purpose");
        }
        if data.contains_key("print") {
            println!("admission print to stdout");
            eprintln!("admission print to stderr");
        }
        if data.contains_key("udp") {
            return match std::net::UdpSocket::bind("127.0.0.1:0") {
                Ok(_) => Err(Denied::new("a UDP socket was opened")),
                Err(e) => Err(Denied::new(format!("udp refused: {e}"))),
            };
        }
        if data.contains_key("loop") {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        if data.contains_key("write") {
            let mut side = ConfigMap::default();
            side.metadata.name = Some(format!("{}-side-effect", request.name));
            side.metadata.namespace = request.namespace.clone();
            if let Err(e) = client::create(&side) {
                return Err(Denied::new(format!("write refused: {e}")));
            }
        }
        if let Some(value) = data.get("unique") {
            let namespace = request.namespace.as_deref();
            for other in cache::list::<ConfigMap>(namespace, None)? {
                let taken = other.data.as_ref().and_then(|d| d.get("unique")) == Some(value);
                if taken && other.name() != cm.name() {
                    return Err(Denied::new(format!("unique value {value} is taken by {}", other.key())));
                }
            }
        }
        Ok(())
    }
}

impl Validate for Admit {
    fn validate_create(&self, request: &AdmissionRequest, cm: &ConfigMap) -> Result<(), Denied> {
        self.check(request, cm)
    }

    fn validate_update(
        &self,
        request: &AdmissionRequest,
        _old: &ConfigMap,
        cm: &ConfigMap,
    ) -> Result<(), Denied> {
        self.check(request, cm)
    }

    fn validate_delete(&self, _: &AdmissionRequest, old: &ConfigMap) -> Result<(), Denied> {
        if old.metadata.labels.as_ref().is_some_and(|l| l.contains_key("protected")) {
            return Err(Denied::new(format!("{} is protected", old.key())));
        }
        Ok(())
    }
}

impl Mutate for Admit {
    fn mutate(&self, request: &AdmissionRequest, cm: &mut ConfigMap) -> Result<(), Denied> {
        if cm.data.as_ref().is_some_and(|d| d.contains_key("mutate-panic")) {
            panic!("mutation panic on purpose");
        }
        cm.metadata.labels.get_or_insert_with(Default::default).insert("stamp".into(), self.stamp.clone());
        request.warn(format!("mutated by {}", self.stamp));
        Ok(())
    }
}

wasmctrl_guest::export_plugin!(Admit, admission = [validate, mutate]);

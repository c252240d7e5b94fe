//! Admission calls into a plugin: the `validator` and `mutator` exports that
//! `wasmctrl:controller@0.2.1` adds. A child of `runtime::plugin`: the calls use its instance
//! pool, limits and trap handling like every other export.
//!
//! Invariants:
//! - Whether a plugin admits is read from its component's exports, once per compiled code
//!   (see [`super::super::admission_exports`]).
//! - A request reaches the guest only when its kind is one the plugin admits
//!   ([`crate::plugin::spec::Permissions::can_admit`]: a kind of its `[[admission]]`
//!   sections, a Secret only with `permissions.read`) and its namespace is one of the
//!   plugin's; otherwise it is refused before an instance is taken.
//! - Each call runs under the deadline its caller gives (the webhook's budget) and the
//!   plugin's memory limits; a trap fails that call only and discards its instance.
//! - A call given a reason to refuse writes (a webhook without side effects, or a dry run)
//!   cannot write: every `client` write and Event of that call is refused.
//! - What the guest returns (message, warnings and patch together) is bounded by the
//!   plugin's `max-output`; more is a sandbox violation, reported like a trap.

use std::time::Instant;

use super::super::admission_exports::AdmissionExports;
use super::{CallError, Instance, Plugin, check_output};
use crate::plugin::bindings::admission::{
    AdmissionRequest as WitRequest, Operation as WitOperation, UserInfo as WitUser, Verdict as WitVerdict,
};
use crate::plugin::bindings::wasmctrl::controller::types::Gvk as WitGvk;
use crate::plugin::runtime::pool::Lease;
use crate::plugin::spec::Gvk;

/// The operation an admission request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmissionOperation {
    Create,
    Update,
    Delete,
    Connect,
}

/// Who sent an admission request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdmissionUser {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: Vec<(String, Vec<String>)>,
}

/// An admission request as a plugin receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionInput {
    pub uid: String,
    /// The kind of `object` and `old_object`.
    pub kind: Gvk,
    /// Plural resource name.
    pub resource: String,
    pub sub_resource: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
    pub operation: AdmissionOperation,
    pub user: AdmissionUser,
    /// JSON of the object being admitted.
    pub object: Option<Vec<u8>>,
    /// JSON of the stored object (update, delete).
    pub old_object: Option<Vec<u8>>,
    pub dry_run: bool,
    /// JSON of the operation's options.
    pub options: Option<Vec<u8>>,
}

impl AdmissionInput {
    /// `namespace/name` (or `name`), as logs show requests.
    pub fn key(&self) -> String {
        match &self.namespace {
            Some(ns) if !ns.is_empty() => format!("{ns}/{}", self.name),
            _ => self.name.clone(),
        }
    }

    fn into_wit(self) -> WitRequest {
        WitRequest {
            uid: self.uid,
            kind: WitGvk { api_version: self.kind.api_version, kind: self.kind.kind },
            resource: self.resource,
            sub_resource: self.sub_resource,
            name: self.name,
            namespace: self.namespace,
            operation: match self.operation {
                AdmissionOperation::Create => WitOperation::Create,
                AdmissionOperation::Update => WitOperation::Update,
                AdmissionOperation::Delete => WitOperation::Delete,
                AdmissionOperation::Connect => WitOperation::Connect,
            },
            user_info: WitUser {
                username: self.user.username,
                uid: self.user.uid,
                groups: self.user.groups,
                extra: self.user.extra,
            },
            object: self.object,
            old_object: self.old_object,
            dry_run: self.dry_run,
            options: self.options,
        }
    }
}

/// Why a plugin refused a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestDenial {
    pub message: String,
    /// HTTP status code for the client (403 when `None`).
    pub code: Option<u16>,
}

/// A plugin's answer to an admission request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuestVerdict {
    /// `None`: admitted.
    pub denial: Option<GuestDenial>,
    pub warnings: Vec<String>,
}

impl GuestVerdict {
    fn from_wit(v: WitVerdict) -> Self {
        GuestVerdict {
            denial: v.denial.map(|d| GuestDenial { message: d.message, code: d.code }),
            warnings: v.warnings,
        }
    }

    /// Bytes the guest handed over in this verdict.
    fn size(&self) -> usize {
        self.denial.as_ref().map_or(0, |d| d.message.len())
            + self.warnings.iter().map(String::len).sum::<usize>()
    }
}

/// A plugin's answer to a mutating admission request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuestMutation {
    pub verdict: GuestVerdict,
    /// RFC 6902 JSON patch on the request's object, as the guest returned it (unchecked).
    pub patch: Option<Vec<u8>>,
}

/// Why an admission call did not produce an answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// The component does not export the interface this call needs.
    #[error("plugin {plugin} does not export `{interface}` (its build has no {what})")]
    NotExported { plugin: String, interface: &'static str, what: &'static str },
    /// The request is for a kind the plugin may not receive.
    #[error("plugin {plugin} may not admit {kind}: {hint}")]
    Forbidden { plugin: String, kind: Gvk, hint: &'static str },
    /// The call failed (trap, deadline, `init`, no instance in time).
    #[error(transparent)]
    Call(#[from] CallError),
}

/// An admission call cut at its deadline: the webhook's budget, not the plugin's
/// reconcile `deadline`, so the trap says which.
#[derive(Debug, thiserror::Error)]
#[error("the admission deadline passed (the webhook's timeout less the host's margin for its own answer)")]
struct AdmissionDeadline;

fn name_deadline(e: wasmtime::Error) -> wasmtime::Error {
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => wasmtime::Error::new(AdmissionDeadline),
        _ => e,
    }
}

/// Where an admission call from a task runs.
// A value of one call's stack frame, moved once: the size of the lease's instance costs
// nothing here, and boxing it would cost an allocation per call.
#[allow(clippy::large_enum_variant)]
enum InTask<'a> {
    /// On this idle instance, in the task.
    Ready(Lease<'a, Instance>, WitRequest),
    /// On a blocking thread (no instance idle, or a current-thread runtime).
    OffThread(AdmissionInput),
}

/// The `validate` call on `inst` (readied for it), its output bounded by `max`.
async fn validate_on(
    inst: &mut Instance,
    request: &WitRequest,
    writes_refused: Option<String>,
    max: usize,
) -> wasmtime::Result<GuestVerdict> {
    inst.store.data_mut().call.writes_refused = writes_refused;
    let Some(validator) = inst.admission.validator.as_ref() else {
        return Err(wasmtime::format_err!("the instance has no `validator` export"));
    };
    let verdict = GuestVerdict::from_wit(
        validator.call_validate(&mut inst.store, request).await.map_err(name_deadline)?,
    );
    check_output(verdict.size(), max)?;
    Ok(verdict)
}

/// The `mutate` call on `inst` (readied for it), its output bounded by `max`.
async fn mutate_on(
    inst: &mut Instance,
    request: &WitRequest,
    writes_refused: Option<String>,
    max: usize,
) -> wasmtime::Result<GuestMutation> {
    inst.store.data_mut().call.writes_refused = writes_refused;
    let Some(mutator) = inst.admission.mutator.as_ref() else {
        return Err(wasmtime::format_err!("the instance has no `mutator` export"));
    };
    let m = mutator.call_mutate(&mut inst.store, request).await.map_err(name_deadline)?;
    let mutation = GuestMutation { verdict: GuestVerdict::from_wit(m.verdict), patch: m.patch };
    check_output(mutation.verdict.size() + mutation.patch.as_ref().map_or(0, Vec::len), max)?;
    Ok(mutation)
}

impl Plugin {
    /// Which admission exports the plugin's component has.
    pub fn admission_exports(&self) -> AdmissionExports {
        self.inner.code.admission()
    }

    /// Calls `validate` with `input`, to finish by `deadline`. `writes_refused`: why this
    /// call may not write, if it may not.
    ///
    /// On a multi-threaded runtime, with an instance idle, the call runs in the calling
    /// task, yielding at each epoch tick (no hop to another thread); otherwise it is made
    /// on a blocking thread ([`Plugin::validate_blocking`]).
    pub async fn validate(
        &self,
        input: AdmissionInput,
        deadline: Instant,
        writes_refused: Option<String>,
    ) -> Result<GuestVerdict, AdmitError> {
        match self.admit_in_task(input, "validate", deadline)? {
            InTask::Ready(mut lease, request) => {
                let result =
                    validate_on(lease.get(), &request, writes_refused, self.inner.spec.limits.max_output)
                        .await;
                Ok(self.inner.end("validate", &mut lease, result)?)
            }
            InTask::OffThread(input) => {
                let plugin = self.clone();
                self.off_thread(move || plugin.validate_blocking(input, deadline, writes_refused)).await
            }
        }
    }

    /// Calls `mutate` with `input`, to finish by `deadline`, the way [`Plugin::validate`]
    /// calls `validate`. The patch is returned as the guest wrote it: the caller checks it.
    pub async fn mutate(
        &self,
        input: AdmissionInput,
        deadline: Instant,
        writes_refused: Option<String>,
    ) -> Result<GuestMutation, AdmitError> {
        match self.admit_in_task(input, "mutate", deadline)? {
            InTask::Ready(mut lease, request) => {
                let result =
                    mutate_on(lease.get(), &request, writes_refused, self.inner.spec.limits.max_output).await;
                Ok(self.inner.end("mutate", &mut lease, result)?)
            }
            InTask::OffThread(input) => {
                let plugin = self.clone();
                self.off_thread(move || plugin.mutate_blocking(input, deadline, writes_refused)).await
            }
        }
    }

    /// How an admission call of `export` runs from a task, once checked: on an idle
    /// instance in the task (on a multi-threaded runtime only: a host call may block the
    /// task's thread, which `block_in_place` allows there), or off the task's thread.
    fn admit_in_task(
        &self,
        input: AdmissionInput,
        export: &'static str,
        deadline: Instant,
    ) -> Result<InTask<'_>, AdmitError> {
        let (exported, interface, what) = match export {
            "validate" => (self.admission_exports().validate, "validator", "Validate"),
            _ => (self.admission_exports().mutate, "mutator", "Mutate"),
        };
        self.check_admitted(&input, exported, interface, what)?;
        let flavor = tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor());
        if flavor.ok() != Some(tokio::runtime::RuntimeFlavor::MultiThread) {
            return Ok(InTask::OffThread(input));
        }
        Ok(match self.inner.checkout_idle_for_async(export, Some(input.key()), deadline) {
            Some(lease) => InTask::Ready(lease, input.into_wit()),
            None => InTask::OffThread(input),
        })
    }

    /// Runs the blocking call `call` on the runtime's blocking pool (inline outside a
    /// runtime).
    async fn off_thread<R: Send + 'static>(
        &self,
        call: impl FnOnce() -> Result<R, AdmitError> + Send + 'static,
    ) -> Result<R, AdmitError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return call();
        }
        tokio::task::spawn_blocking(call).await.unwrap_or_else(|e| {
            Err(AdmitError::Call(CallError::Busy {
                plugin: self.inner.spec.name.clone(),
                reason: format!("the admission call did not complete: {e}"),
            }))
        })
    }

    /// Calls `validate` with `input`, to finish by `deadline`. `writes_refused`: why this
    /// call may not write, if it may not. Blocking.
    pub fn validate_blocking(
        &self,
        input: AdmissionInput,
        deadline: Instant,
        writes_refused: Option<String>,
    ) -> Result<GuestVerdict, AdmitError> {
        self.check_admitted(&input, self.admission_exports().validate, "validator", "Validate")?;
        let key = input.key();
        let request = input.into_wit();
        let max = self.inner.spec.limits.max_output;
        let verdict = self.inner.call_until("validate", Some(key), deadline, move |inst| {
            futures::executor::block_on(validate_on(inst, &request, writes_refused, max))
        })?;
        Ok(verdict)
    }

    /// Calls `mutate` with `input`, to finish by `deadline`. `writes_refused` as for
    /// [`Plugin::validate_blocking`]. The patch is returned as the guest wrote it: the
    /// caller checks it. Blocking.
    pub fn mutate_blocking(
        &self,
        input: AdmissionInput,
        deadline: Instant,
        writes_refused: Option<String>,
    ) -> Result<GuestMutation, AdmitError> {
        self.check_admitted(&input, self.admission_exports().mutate, "mutator", "Mutate")?;
        let key = input.key();
        let request = input.into_wit();
        let max = self.inner.spec.limits.max_output;
        let mutation = self.inner.call_until("mutate", Some(key), deadline, move |inst| {
            futures::executor::block_on(mutate_on(inst, &request, writes_refused, max))
        })?;
        Ok(mutation)
    }

    fn check_admitted(
        &self,
        input: &AdmissionInput,
        exported: bool,
        interface: &'static str,
        what: &'static str,
    ) -> Result<(), AdmitError> {
        let plugin = || self.inner.spec.name.clone();
        let kind = &input.kind;
        if !exported {
            return Err(AdmitError::NotExported { plugin: plugin(), interface, what });
        }
        let permissions = &self.inner.spec.permissions;
        if !permissions.can_admit(kind) {
            let hint = if kind.is_secret() && permissions.lists_admitted(kind) {
                "admitting Secrets also needs v1/Secret in permissions.read"
            } else {
                "the plugin's [[admission]] sections do not name this kind"
            };
            tracing::warn!(plugin = %plugin(), %kind, "admission request refused: kind not admitted");
            return Err(AdmitError::Forbidden { plugin: plugin(), kind: kind.clone(), hint });
        }
        if !permissions.in_scope(input.namespace.as_deref()) {
            // The webhook configuration keeps the API server from sending these; a review
            // that comes anyway (a stale or hand-made configuration) is not handed over.
            tracing::warn!(plugin = %plugin(), %kind, namespace = input.namespace.as_deref().unwrap_or(""),
                "admission request refused: namespace outside the plugin's namespaces");
            return Err(AdmitError::Forbidden {
                plugin: plugin(),
                kind: kind.clone(),
                hint: "the object's namespace is not one of the plugin's namespaces",
            });
        }
        Ok(())
    }
}

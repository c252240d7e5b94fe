//! One plugin version's admission: its `[[admission]]` rules and the calls into its
//! `validate` / `mutate` exports, answered as the rule's failure policy says when the
//! plugin cannot answer.
//!
//! Invariants:
//! - A review reaches the plugin only when it fits the rule it was posted to: one of the
//!   rule's kinds and operations (the API server matched it; the host checks anyway, it
//!   trusts nothing that reaches its port), and a kind the plugin may admit.
//! - Every review gets an answer: the plugin's, or — on a trap, a deadline, an `init` that
//!   fails, no instance in time, a patch that is not a JSON patch or does not apply, a
//!   request the plugin may not receive — the failure policy's: `Fail` refuses with code 500
//!   and a message naming the plugin, its version and the cause; `Ignore` admits with that
//!   message as a warning.
//! - One review is one call into one version (the one this handler holds).
//! - The plugin call has the rule's budget ([`AdmissionRule::call_budget`]) from the moment
//!   the review arrived. It runs in the review's task when an instance is idle, yielding to
//!   the server's other tasks at each epoch tick, and on a blocking thread otherwise
//!   ([`Plugin::validate`]).

use std::time::Instant;

use kube::core::DynamicObject;
use kube::core::admission::AdmissionRequest;

use super::review::{Answer, check_patch, denial_code, request_gvk, to_input};
use super::rules::{AdmissionRule, FailurePolicy, Operation, WebhookType};
use crate::plugin::{AdmitError, CallError, GuestVerdict, Plugin};

/// How a review was answered (`wasmctrl_admission_answers_total{answer}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Denied,
    Patched,
    /// The plugin could not answer; the failure policy refused the request.
    FailedClosed,
    /// The plugin could not answer; the failure policy admitted the request.
    FailedOpen,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::Patched => "patched",
            Outcome::FailedClosed => "failed-closed",
            Outcome::FailedOpen => "failed-open",
        }
    }
}

/// The admission side of one running plugin version.
pub struct PluginAdmission {
    plugin: Plugin,
    rules: Vec<AdmissionRule>,
}

impl std::fmt::Debug for PluginAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginAdmission")
            .field("plugin", &self.plugin.name())
            .field("version", &self.plugin.short_version())
            .field("rules", &self.rules.len())
            .finish()
    }
}

/// Why the plugin gave no usable answer.
struct Failure {
    message: String,
    trapped: bool,
}

impl PluginAdmission {
    pub fn new(plugin: Plugin, rules: Vec<AdmissionRule>) -> Self {
        PluginAdmission { plugin, rules }
    }

    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    pub fn rules(&self) -> &[AdmissionRule] {
        &self.rules
    }

    /// The rule named `name`.
    pub fn rule(&self, name: &str) -> Option<&AdmissionRule> {
        self.rules.iter().find(|r| r.name == name)
    }

    /// Answers `request`, posted to `rule` at `arrived`; the outcome and whether the
    /// plugin trapped.
    pub async fn admit(
        &self,
        rule: &AdmissionRule,
        request: &AdmissionRequest<DynamicObject>,
        arrived: Instant,
    ) -> (Answer, Outcome, bool) {
        match self.call(rule, request, arrived).await {
            Ok((answer, outcome)) => (answer, outcome, false),
            Err(failure) => {
                let (answer, outcome) = self.fail(rule, request, &failure.message);
                (answer, outcome, failure.trapped)
            }
        }
    }

    async fn call(
        &self,
        rule: &AdmissionRule,
        request: &AdmissionRequest<DynamicObject>,
        arrived: Instant,
    ) -> Result<(Answer, Outcome), Failure> {
        let refuse = |message: String| Failure { message, trapped: false };
        let kind = request_gvk(request);
        if !rule.kinds.contains(&kind) {
            return Err(refuse(format!(
                "webhook {} admits {}, not {kind}",
                rule.name,
                rule.kinds.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            )));
        }
        let operation = match request.operation {
            kube::core::admission::Operation::Create => Some(Operation::Create),
            kube::core::admission::Operation::Update => Some(Operation::Update),
            kube::core::admission::Operation::Delete => Some(Operation::Delete),
            kube::core::admission::Operation::Connect => None,
        };
        if !operation.is_some_and(|o| rule.operations.contains(&o)) {
            return Err(refuse(format!("webhook {} is not for {:?} requests", rule.name, request.operation)));
        }
        let input = to_input(request).map_err(|e| refuse(e.to_string()))?;
        let deadline = arrived + rule.call_budget();
        let writes_refused = rule.side_effects.writes_refused(request.dry_run).map(str::to_owned);
        let webhook_type = rule.webhook_type;
        let called = match webhook_type {
            WebhookType::Validating => {
                self.plugin.validate(input, deadline, writes_refused).await.map(|v| (v, None))
            }
            WebhookType::Mutating => {
                self.plugin.mutate(input, deadline, writes_refused).await.map(|m| (m.verdict, m.patch))
            }
        };
        let (verdict, patch) = match called {
            Ok(answer) => answer,
            Err(e) => {
                let trapped = matches!(e, AdmitError::Call(CallError::Trap { .. }));
                return Err(Failure { message: e.to_string(), trapped });
            }
        };
        let GuestVerdict { denial, warnings } = verdict;
        if let Some(denial) = denial {
            let code = denial_code(denial.code);
            return Ok((Answer::deny(request, code, &denial.message).warn(warnings), Outcome::Denied));
        }
        match patch.filter(|p| !is_empty_patch(p)) {
            None => Ok((Answer::allow(request).warn(warnings), Outcome::Allowed)),
            Some(patch) => {
                let checked = check_patch(&patch, request.object.as_ref()).map_err(|why| {
                    refuse(format!("plugin {} returned an unusable patch: {why}", self.plugin.name()))
                })?;
                let answer = Answer::allow(request)
                    .patch(checked)
                    .map_err(|e| refuse(format!("encoding the patch: {e}")))?;
                Ok((answer.warn(warnings), Outcome::Patched))
            }
        }
    }

    /// The failure policy's answer when the plugin could not give one.
    fn fail(
        &self,
        rule: &AdmissionRule,
        request: &AdmissionRequest<DynamicObject>,
        cause: &str,
    ) -> (Answer, Outcome) {
        let plugin = self.plugin.name();
        let version = self.plugin.short_version();
        let message = format!(
            "admission plugin {plugin} (version {version}) could not answer (webhook {}, failure policy {}, timeout {}s): {cause}",
            rule.name,
            rule.failure_policy.as_str(),
            rule.timeout_seconds(),
        );
        tracing::warn!(plugin, %version, webhook = %rule.name, uid = %request.uid, request = %request_key(request), %cause,
            failure_policy = rule.failure_policy.as_str(), "admission call failed; answering as the failure policy says");
        match rule.failure_policy {
            FailurePolicy::Fail => (Answer::deny(request, 500, &message), Outcome::FailedClosed),
            FailurePolicy::Ignore => (Answer::allow(request).warn(vec![message]), Outcome::FailedOpen),
        }
    }
}

/// `namespace/name` of a request's object, for logs.
pub fn request_key(request: &AdmissionRequest<DynamicObject>) -> String {
    match request.namespace.as_deref().filter(|n| !n.is_empty()) {
        Some(ns) => format!("{ns}/{}", request.name),
        None => request.name.clone(),
    }
}

/// `[]` (or whitespace around it): a patch that changes nothing.
fn is_empty_patch(patch: &[u8]) -> bool {
    let trimmed: Vec<u8> = patch.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
    trimmed == b"[]"
}

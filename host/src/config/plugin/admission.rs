//! A plugin TOML's `[[admission]]` sections: the file form ([`AdmissionToml`]) and its
//! check into [`AdmissionRule`]s (one webhook each).
//!
//! Invariants: every problem is collected and placed at its field; a section names at least
//! one kind (the `[for]` kind when it names none) and one operation; its name is a DNS label
//! unique in the plugin (default `validate` or `mutate`); a Secret is admitted only with
//! `v1/Secret` in `permissions.read`; `reinvocation` only on a mutating section; the timeout
//! is whole seconds from 1 to 30, as the API server takes it. A plugin limited to namespaces
//! (`permissions.namespaces`) is sent reviews from those namespaces only: each webhook's
//! `namespaceSelector` also requires `kubernetes.io/metadata.name` to be one of them.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmctrl_selectors::is_dns_label;

use crate::admission::rules::{
    self, AdmissionRule, FailurePolicy, Operation, Reinvocation, SideEffects, WebhookType,
};
use crate::config::error::{ConfigError, ConfigErrors};
use crate::config::kinds::{check_api_version, check_kind_name};
use crate::config::source::{PathSeg, SourceMap};
use crate::config::units::DurationValue;
use crate::plugin::spec::Gvk;

/// `[[admission]]`: one validating or mutating webhook the plugin answers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AdmissionToml {
    /// Names the webhook (its path, `/admission/<plugin>/<name>`). Default `validate` or `mutate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A mutating webhook (the plugin's `mutate`) rather than a validating one (`validate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutating: Option<bool>,
    /// `"<apiVersion>/<Kind>"`; default: the `[for]` kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    /// `"CREATE"`, `"UPDATE"`, `"DELETE"` or `"*"`; default `["CREATE", "UPDATE"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operations: Option<Vec<OperationToml>>,
    /// Label selector on the namespace of the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<String>,
    /// Label selector on the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_selector: Option<String>,
    /// What the API server (and the host) do when the plugin cannot answer. Default `Fail`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicyToml>,
    /// The API server's timeout for one call; whole seconds, 1s–30s. Default `10s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationValue>,
    /// `None` (default): the plugin may not write while admitting; `NoneOnDryRun`: it may,
    /// except for dry-run requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_effects: Option<SideEffectsToml>,
    /// Mutating only: `Never` (default) or `IfNeeded` (called again after later mutations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reinvocation: Option<ReinvocationToml>,
}

/// An operation as the API server spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperationToml {
    #[serde(rename = "CREATE")]
    Create,
    #[serde(rename = "UPDATE")]
    Update,
    #[serde(rename = "DELETE")]
    Delete,
    #[serde(rename = "*")]
    All,
}

/// `failurePolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailurePolicyToml {
    Fail,
    Ignore,
}

/// `sideEffects` (the two values `admissionregistration.k8s.io/v1` accepts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SideEffectsToml {
    None,
    NoneOnDryRun,
}

/// `reinvocationPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReinvocationToml {
    Never,
    IfNeeded,
}

fn key(k: &str) -> PathSeg {
    PathSeg::Key(k.to_owned())
}

/// The label every namespace carries with its own name (set by the API server).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// `selector` (a section's `namespace-selector`) narrowed to `namespaces` when the plugin is
/// limited to them (requirements joined by `,` all hold).
fn within_namespaces(selector: Option<&str>, namespaces: Option<&[String]>) -> Option<String> {
    let selector = selector.filter(|t| !t.trim().is_empty());
    let Some(namespaces) = namespaces else {
        return selector.map(str::to_owned);
    };
    let scope = format!("{NAMESPACE_NAME_LABEL} in ({})", namespaces.join(","));
    Some(match selector {
        Some(s) => format!("{s},{scope}"),
        None => scope,
    })
}

/// Checks the sections. `for_kind`: the default kind; `read`: `permissions.read`;
/// `namespaces`: the plugin's namespaces (`None`: every namespace).
pub(super) fn resolve(
    map: &SourceMap<'_>,
    errors: &mut ConfigErrors,
    sections: &[AdmissionToml],
    for_kind: &Gvk,
    read: &[Gvk],
    namespaces: Option<&[String]>,
) -> Vec<AdmissionRule> {
    let mut rules: Vec<AdmissionRule> = Vec::new();
    for (i, s) in sections.iter().enumerate() {
        let at = |k: &str| vec![key("admission"), PathSeg::Index(i), key(k)];
        let mut err = |path: Vec<PathSeg>, message: String, hint: Option<&str>| {
            let mut e: ConfigError = map.error_for(&path, false, message);
            e.hint = hint.map(str::to_owned);
            errors.push(e);
        };
        let webhook_type =
            if s.mutating.unwrap_or(false) { WebhookType::Mutating } else { WebhookType::Validating };
        let name = s.name.clone().unwrap_or_else(|| webhook_type.verb().to_owned());
        if !is_dns_label(&name) {
            err(
                at("name"),
                format!("`{name}` is not a valid webhook name: lowercase letters, digits and `-`"),
                None,
            );
        } else if let Some(j) = rules.iter().position(|r| r.name == name) {
            let field = if s.name.is_some() { at("name") } else { vec![key("admission"), PathSeg::Index(i)] };
            err(
                field,
                format!("webhook `{name}` is already `admission[{j}]`"),
                Some("give each `[[admission]]` section its own `name`"),
            );
        }

        let mut kinds = Vec::new();
        for (k, text) in s.kinds.iter().enumerate() {
            let path = vec![key("admission"), PathSeg::Index(i), key("kinds"), PathSeg::Index(k)];
            let Some(g) = Gvk::parse(text) else {
                err(
                    path,
                    format!("`{text}` is not a kind: expected `<apiVersion>/<Kind>`"),
                    Some("e.g. `v1/ConfigMap` or `example.com/v1/Website`"),
                );
                continue;
            };
            if let Err(e) = check_api_version(&g.api_version) {
                err(path, e, None);
                continue;
            }
            if let Err((e, hint)) = check_kind_name(&g.kind) {
                err(path, e, hint.as_deref());
                continue;
            }
            if kinds.contains(&g) {
                err(path, format!("`{g}` is listed twice"), None);
                continue;
            }
            if g.is_secret() && !read.contains(&g) {
                err(
                    path,
                    "admitting Secrets gives the plugin their contents: it needs `v1/Secret` in `permissions.read`".into(),
                    Some("add \"v1/Secret\" to [permissions] read, or admit another kind"),
                );
                continue;
            }
            kinds.push(g);
        }
        if s.kinds.is_empty() {
            kinds.push(for_kind.clone());
            if for_kind.is_secret() && !read.contains(for_kind) {
                err(
                    vec![key("admission"), PathSeg::Index(i)],
                    "admitting Secrets (the `[for]` kind) needs `v1/Secret` in `permissions.read`".into(),
                    None,
                );
            }
        }

        let operations = match &s.operations {
            None => vec![Operation::Create, Operation::Update],
            Some(list) if list.is_empty() => {
                err(
                    at("operations"),
                    "a webhook needs at least one operation".into(),
                    Some("e.g. [\"CREATE\", \"UPDATE\"]"),
                );
                vec![Operation::Create, Operation::Update]
            }
            Some(list) => {
                let mut ops: Vec<Operation> = list
                    .iter()
                    .flat_map(|o| match o {
                        OperationToml::Create => vec![Operation::Create],
                        OperationToml::Update => vec![Operation::Update],
                        OperationToml::Delete => vec![Operation::Delete],
                        OperationToml::All => Operation::ALL.to_vec(),
                    })
                    .collect();
                ops.sort();
                ops.dedup();
                ops
            }
        };

        for (field, selector) in
            [("namespace-selector", &s.namespace_selector), ("object-selector", &s.object_selector)]
        {
            if let Some(text) = selector
                && let Err(e) = rules::to_label_selector(text)
            {
                err(at(field), e.to_string(), None);
            }
        }

        let timeout = match s.timeout {
            None => rules::DEFAULT_TIMEOUT,
            Some(t)
                if t.0 < Duration::from_secs(1) || t.0 > rules::MAX_TIMEOUT || t.0.subsec_nanos() != 0 =>
            {
                err(
                    at("timeout"),
                    format!(
                        "timeout `{t}` is not whole seconds from 1s to 30s (the API server's timeoutSeconds)"
                    ),
                    None,
                );
                rules::DEFAULT_TIMEOUT
            }
            Some(t) => t.0,
        };
        let reinvocation = match (s.reinvocation, webhook_type) {
            (Some(_), WebhookType::Validating) => {
                err(
                    at("reinvocation"),
                    "`reinvocation` applies to mutating webhooks only".into(),
                    Some("set `mutating = true`, or remove `reinvocation`"),
                );
                Reinvocation::Never
            }
            (Some(ReinvocationToml::IfNeeded), WebhookType::Mutating) => Reinvocation::IfNeeded,
            _ => Reinvocation::Never,
        };
        rules.push(AdmissionRule {
            name,
            webhook_type,
            kinds,
            operations,
            namespace_selector: within_namespaces(s.namespace_selector.as_deref(), namespaces),
            object_selector: s.object_selector.clone().filter(|t| !t.trim().is_empty()),
            failure_policy: match s.failure_policy {
                Some(FailurePolicyToml::Ignore) => FailurePolicy::Ignore,
                _ => FailurePolicy::Fail,
            },
            timeout,
            side_effects: match s.side_effects {
                Some(SideEffectsToml::NoneOnDryRun) => SideEffects::NoneOnDryRun,
                _ => SideEffects::None,
            },
            reinvocation,
        });
    }
    rules
}

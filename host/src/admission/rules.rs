//! What one `[[admission]]` section of a plugin TOML asks for, checked ([`AdmissionRule`]):
//! the webhook the API server calls, and how the host answers when the plugin cannot.
//!
//! Invariants: a rule names at least one kind and one operation; its selectors are label
//! selectors that a webhook configuration can express (no `>`/`<`); its timeout is within
//! what the API server accepts (1 to 30 seconds); its name is a DNS label, unique among the
//! plugin's rules. The config resolver builds rules only in this shape.

use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use wasmctrl_selectors::{LabelSelector, Operator};

use crate::plugin::Gvk;

/// Whether the plugin validates or mutates in a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WebhookType {
    /// A validating webhook: the plugin's `validate` export.
    Validating,
    /// A mutating webhook: the plugin's `mutate` export.
    Mutating,
}

impl WebhookType {
    /// `validate` or `mutate`: the export called, and the default rule name.
    pub fn verb(self) -> &'static str {
        match self {
            WebhookType::Validating => "validate",
            WebhookType::Mutating => "mutate",
        }
    }
}

/// An operation a webhook is called for (`CREATE`, `UPDATE`, `DELETE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    /// Every operation a rule can name.
    pub const ALL: [Operation; 3] = [Operation::Create, Operation::Update, Operation::Delete];

    /// The API server's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }

    /// Parses the API server's spelling.
    pub fn parse(text: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.as_str() == text)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the API server (and the host, for what it can tell) does when the plugin cannot
/// answer: a trap, a timeout, a plugin that is not running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    /// Refuse the request (the API server's default).
    #[default]
    Fail,
    /// Admit the request as if the webhook had not been called.
    Ignore,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

/// Whether calling the webhook has side effects (`sideEffects`): the host enforces it by
/// refusing the plugin's writes during the calls that may have none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SideEffects {
    /// No side effects at all: the plugin may not write during an admission call.
    #[default]
    None,
    /// Side effects except on dry-run requests: the plugin may write, unless the request
    /// is a dry run.
    NoneOnDryRun,
}

impl SideEffects {
    pub fn as_str(self) -> &'static str {
        match self {
            SideEffects::None => "None",
            SideEffects::NoneOnDryRun => "NoneOnDryRun",
        }
    }

    /// Why a call for a request (`dry_run` or not) may not write, if it may not.
    pub fn writes_refused(self, dry_run: bool) -> Option<&'static str> {
        match (self, dry_run) {
            (SideEffects::None, _) => Some("its [[admission]] section declares side-effects = \"None\""),
            (SideEffects::NoneOnDryRun, true) => Some(
                "the request is a dry run and its [[admission]] section declares side-effects = \"NoneOnDryRun\"",
            ),
            (SideEffects::NoneOnDryRun, false) => None,
        }
    }
}

/// Whether a mutating webhook is called again after later mutations (`reinvocationPolicy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reinvocation {
    #[default]
    Never,
    IfNeeded,
}

impl Reinvocation {
    pub fn as_str(self) -> &'static str {
        match self {
            Reinvocation::Never => "Never",
            Reinvocation::IfNeeded => "IfNeeded",
        }
    }
}

/// A kind a rule admits, with the resource the API server names it by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AdmittedKind {
    pub kind: Gvk,
    /// Plural resource (`websites`), from discovery (or guessed offline).
    pub plural: String,
    /// Whether objects of the kind live in namespaces (a namespace selector applies).
    pub namespaced: bool,
}

/// One `[[admission]]` section, checked: one webhook.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AdmissionRule {
    /// A DNS label, unique in the plugin: the webhook's path is `/admission/<plugin>/<name>`.
    pub name: String,
    pub webhook_type: WebhookType,
    /// The kinds it admits (the `[for]` kind unless the section names others).
    pub kinds: Vec<Gvk>,
    pub operations: Vec<Operation>,
    /// Label selector on the object's namespace (as written, checked).
    pub namespace_selector: Option<String>,
    /// Label selector on the object (as written, checked).
    pub object_selector: Option<String>,
    pub failure_policy: FailurePolicy,
    /// The API server's timeout for one call (`timeoutSeconds`, whole seconds 1–30).
    pub timeout: Duration,
    pub side_effects: SideEffects,
    pub reinvocation: Reinvocation,
}

/// The longest `timeout` the API server accepts.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30);

/// The default `timeout` (the API server's).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl AdmissionRule {
    /// The path the webhook is served at for `plugin`.
    pub fn path(&self, plugin: &str) -> String {
        format!("/admission/{plugin}/{}", self.name)
    }

    /// The webhook's name in its configuration (`<rule>.<plugin>.wasmctrl.dev`, a qualified name
    /// of at least three segments, as the API server requires).
    pub fn webhook_name(&self, plugin: &str) -> String {
        format!("{}.{plugin}.wasmctrl.dev", self.name)
    }

    /// How long the plugin may take for one request: the webhook's timeout less a margin
    /// (a fifth, at most a second), so the host's own answer — the failure policy's, naming
    /// the cause — reaches the API server before the API server gives up on its own.
    pub fn call_budget(&self) -> Duration {
        self.timeout - (self.timeout / 5).min(Duration::from_secs(1))
    }

    /// The webhook's timeout in whole seconds, as the configuration holds it.
    pub fn timeout_seconds(&self) -> i32 {
        i32::try_from(self.timeout.as_secs()).unwrap_or(30).clamp(1, 30)
    }
}

/// Why a label selector cannot go into a webhook configuration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorNotExpressible(String);

/// A label selector as a webhook configuration's `namespaceSelector` / `objectSelector`.
/// `>` and `<` have no `metav1.LabelSelector` form and are refused.
pub fn to_label_selector(text: &str) -> Result<meta::LabelSelector, SelectorNotExpressible> {
    let parsed = LabelSelector::parse(text).map_err(|e| SelectorNotExpressible(e.to_string()))?;
    let mut expressions = Vec::new();
    for r in parsed.requirements() {
        let operator = match r.operator() {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
            Operator::GreaterThan | Operator::LessThan => {
                return Err(SelectorNotExpressible(format!(
                    "`{}` compares with `>`/`<`, which a webhook's selector cannot express (only =, !=, in, notin, exists)",
                    r.key()
                )));
            }
        };
        let values: Vec<String> = r.values().map(str::to_owned).collect();
        expressions.push(meta::LabelSelectorRequirement {
            key: r.key().to_owned(),
            operator: operator.to_owned(),
            values: (!values.is_empty()).then_some(values),
        });
    }
    Ok(meta::LabelSelector {
        match_expressions: (!expressions.is_empty()).then_some(expressions),
        match_labels: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(timeout: u64) -> AdmissionRule {
        AdmissionRule {
            name: "validate".into(),
            webhook_type: WebhookType::Validating,
            kinds: vec![Gvk::new("v1", "ConfigMap")],
            operations: vec![Operation::Create],
            namespace_selector: None,
            object_selector: None,
            failure_policy: FailurePolicy::Fail,
            timeout: Duration::from_secs(timeout),
            side_effects: SideEffects::None,
            reinvocation: Reinvocation::Never,
        }
    }

    #[test]
    fn the_plugin_is_cut_before_the_api_server_gives_up() {
        assert_eq!(rule(10).call_budget(), Duration::from_secs(9));
        assert_eq!(rule(1).call_budget(), Duration::from_millis(800));
        assert_eq!(rule(30).call_budget(), Duration::from_secs(29));
        assert_eq!(rule(10).path("web"), "/admission/web/validate");
        assert_eq!(rule(10).webhook_name("web"), "validate.web.wasmctrl.dev");
    }

    #[test]
    fn selectors_become_match_expressions_and_comparisons_are_refused() {
        let s = to_label_selector("env in (prod,staging),!legacy,team=a").unwrap();
        let e = s.match_expressions.unwrap();
        let shown: Vec<(String, String, Option<Vec<String>>)> =
            e.into_iter().map(|r| (r.key, r.operator, r.values)).collect();
        assert_eq!(
            shown,
            [
                ("env".to_owned(), "In".to_owned(), Some(vec!["prod".to_owned(), "staging".to_owned()])),
                ("legacy".to_owned(), "DoesNotExist".to_owned(), None),
                ("team".to_owned(), "In".to_owned(), Some(vec!["a".to_owned()])),
            ]
        );
        assert!(to_label_selector("tier>3").unwrap_err().to_string().contains("cannot express"));
        assert!(to_label_selector("a=(").is_err());
    }

    #[test]
    fn only_none_side_effects_refuse_writes_on_every_call() {
        assert!(SideEffects::None.writes_refused(false).is_some());
        assert!(SideEffects::NoneOnDryRun.writes_refused(true).is_some());
        assert!(SideEffects::NoneOnDryRun.writes_refused(false).is_none());
    }
}

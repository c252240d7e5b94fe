//! Configuration: golden tests of every class of error message (file, line, column, field,
//! hint), round-trips of the documented examples, `wasmctrl check` and `wasmctrl rbac`.

use std::path::Path;

use wasmctrl::config::*;

/// The rendered errors of `text` as a plugin TOML (`plugin`) or a host TOML (`host`).
fn errors(which: &str, text: &str) -> String {
    let result = if which == "plugin" {
        PluginConfig::parse(Path::new("plugins/mirror.toml"), text, &PluginDefaults::default()).map(|_| ())
    } else {
        HostConfig::parse(Path::new("etc/wasmctrl.toml"), text).map(|_| ())
    };
    match result {
        Ok(()) => "OK".into(),
        Err(e) => e.to_string(),
    }
}

/// Invalid TOML syntax: toml's message, at the place it points to.
#[test]
fn error_syntax_error() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for
api-version = "v1"
"#
        ),
        r#"error: plugins/mirror.toml:1:5: invalid TOML: unclosed table, expected `]`
  |
1 | [for
  |     ^"#
    );
}

/// A misspelt key: named with its table, and the closest allowed key as a hint.
#[test]
fn error_unknown_key_suggests_the_closest() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
kind = "ConfigMap"
lable-selector = "mirror=true"
"#
        ),
        r#"error: plugins/mirror.toml:4:1: `for.lable-selector`: unknown key `lable-selector` in table `for`
  |
4 | lable-selector = "mirror=true"
  | ^^^^^^^^^^^^^^
  |
  = hint: did you mean `label-selector`?"#
    );
}

/// The field path of a key in a `[a.b]` sub-table.
#[test]
fn error_unknown_key_in_sub_table() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
kind = "ConfigMap"
[for.predicates]
generaton-changed = true
"#
        ),
        r#"error: plugins/mirror.toml:5:1: `for.predicates.generaton-changed`: unknown key `generaton-changed` in table `for.predicates`
  |
5 | generaton-changed = true
  | ^^^^^^^^^^^^^^^^^
  |
  = hint: did you mean `generation-changed`?"#
    );
}

/// The field path of a key in an `[[array]]` element.
#[test]
fn error_unknown_key_in_array_of_tables() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
kind = "ConfigMap"
[[owns]]
api-version = "v1"
kind = "Secret"
namspace = "x"
"#
        ),
        r#"error: plugins/mirror.toml:7:1: `owns[0].namspace`: unknown key `namspace` in table `owns[0]`
  |
7 | namspace = "x"
  | ^^^^^^^^
  |
  = hint: did you mean `namespace`?"#
    );
}

/// A key nothing resembles: the hint lists the allowed keys.
#[test]
fn error_unknown_key_without_close_match_lists_allowed_keys() {
    assert_eq!(
        errors(
            "plugin",
            r#"frobnicate = 1
[for]
api-version = "v1"
kind = "ConfigMap"
"#
        ),
        r#"error: plugins/mirror.toml:1:1: `frobnicate`: unknown key `frobnicate` in the top level
  |
1 | frobnicate = 1
  | ^^^^^^^^^^
  |
  = hint: allowed keys: name, wasm, verify-key, concurrency, resync, deadline, memory, max-output, log-lines-per-second, field-manager, for, owns, watches, permissions, transform, admission, settings"#
    );
}

/// A missing required key, at its table.
#[test]
fn error_missing_required_key() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
"#
        ),
        r#"error: plugins/mirror.toml:1:1: `for.kind`: missing required key `kind` in table `for`
  |
1 | [for]
  | ^^^^^"#
    );
}

/// A missing `[for]` table.
#[test]
fn error_missing_for_table() {
    assert_eq!(
        errors(
            "plugin",
            r#"concurrency = 2
"#
        ),
        r#"error: plugins/mirror.toml:1:1: `for`: missing required key `for` in the top level
  |
1 | concurrency = 2
  | ^
  |
  = hint: add a `[for]` table with the `api-version` and `kind` to reconcile"#
    );
}

/// A value of the wrong type.
#[test]
fn error_wrong_type() {
    assert_eq!(
        errors(
            "plugin",
            r#"concurrency = "two"
[for]
api-version = "v1"
kind = "ConfigMap"
"#
        ),
        r#"error: plugins/mirror.toml:1:15: `concurrency`: expected a whole number, found string "two"
  |
1 | concurrency = "two"
  |               ^^^^^"#
    );
}

/// A duration with an unknown unit.
#[test]
fn error_invalid_duration() {
    assert_eq!(
        errors(
            "plugin",
            r#"deadline = "5 seconds"
[for]
api-version = "v1"
kind = "ConfigMap"
"#
        ),
        r#"error: plugins/mirror.toml:1:12: `deadline`: unknown duration unit `seconds` in `5 seconds`: write a number followed by a unit: "500ms", "5s", "10m", "1h" or a sum like "1m30s"
  |
1 | deadline = "5 seconds"
  |            ^^^^^^^^^^^"#
    );
}

/// A bare number as a duration.
#[test]
fn error_duration_without_unit() {
    assert_eq!(
        errors(
            "plugin",
            r#"resync = 30
[for]
api-version = "v1"
kind = "ConfigMap"
"#
        ),
        r#"error: plugins/mirror.toml:1:10: `resync`: a duration needs a unit: write "30s" or "30ms", not 30
  |
1 | resync = 30
  |          ^^"#
    );
}

/// A size with an unknown unit.
#[test]
fn error_invalid_size() {
    assert_eq!(
        errors(
            "plugin",
            r#"memory = "64mb"
[for]
api-version = "v1"
kind = "ConfigMap"
"#
        ),
        r#"error: plugins/mirror.toml:1:10: `memory`: unknown size unit `mb` in `64mb`: write bytes as an integer or with a unit: "512KiB", "64MiB", "1GiB"
  |
1 | memory = "64mb"
  |          ^^^^^^"#
    );
}

/// Limits out of range; both reported.
#[test]
fn error_limit_out_of_range() {
    assert_eq!(
        errors(
            "plugin",
            r#"concurrency = 0
memory = "64KiB"
log-lines-per-second = 0
[for]
api-version = "v1"
kind = "ConfigMap"
"#
        ),
        r#"error: plugins/mirror.toml:1:15: `concurrency`: concurrency must be at least 1
  |
1 | concurrency = 0
  |               ^
error: plugins/mirror.toml:2:10: `memory`: memory `64KiB` is below the minimum, 1MiB
  |
2 | memory = "64KiB"
  |          ^^^^^^^
error: plugins/mirror.toml:3:24: `log-lines-per-second`: log-lines-per-second must be at least 1
  |
3 | log-lines-per-second = 0
  |                        ^"#
    );
}

/// A concurrency needing more instances than a plugin may hold on the host is refused
/// where it is written (`wasmctrl check` and the loader both resolve the TOML this way).
#[test]
fn error_concurrency_over_the_instance_share() {
    assert_eq!(
        errors(
            "plugin",
            r#"concurrency = 1000
[for]
api-version = "v1"
kind = "ConfigMap"
"#
        ),
        r#"error: plugins/mirror.toml:1:15: `concurrency`: concurrency 1000 needs 1001 instances, more than the 32 a plugin may hold on this host
  |
1 | concurrency = 1000
  |               ^^^^
  |
  = hint: use concurrency 31 or less, or raise max-instances-per-plugin (and instance-slots) in the host TOML"#
    );
    assert_eq!(
        errors("host", "instance-slots = 8\nmax-instances-per-plugin = 16\ncompile-timeout = \"0s\"\n"),
        r#"error: etc/wasmctrl.toml:2:28: `max-instances-per-plugin`: max-instances-per-plugin 16 is outside 2..=8 (instance-slots)
  |
2 | max-instances-per-plugin = 16
  |                            ^^
  |
  = hint: a plugin needs two instances: one for reconciles, one for hook calls
error: etc/wasmctrl.toml:3:19: `compile-timeout`: compile-timeout must be more than 0
  |
3 | compile-timeout = "0s"
  |                   ^^^^"#
    );
}

/// A kind not written as in manifests.
#[test]
fn error_kind_in_wrong_case() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
kind = "configmap"
"#
        ),
        r#"error: plugins/mirror.toml:3:8: `for.kind`: `configmap` is not a kind name
  |
3 | kind = "configmap"
  |        ^^^^^^^^^^^
  |
  = hint: kinds are written as in manifests: `ConfigMap`"#
    );
}

/// An apiVersion without a version.
#[test]
fn error_invalid_api_version() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "apps"
kind = "Deployment"
"#
        ),
        r#"error: plugins/mirror.toml:2:15: `for.api-version`: `apps` is not an apiVersion: write `v1` for the core group or `<group>/<version>` such as `apps/v1`
  |
2 | api-version = "apps"
  |               ^^^^^^
  |
  = hint: `Deployment` is in `apps/v1`"#
    );
}

/// A permission missing its apiVersion: the hint knows built-in kinds' groups.
#[test]
fn error_permission_without_api_version() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
kind = "ConfigMap"
[permissions]
write = ["v1/ConfigMap", "Deployment"]
"#
        ),
        r#"error: plugins/mirror.toml:5:26: `permissions.write[1]`: `Deployment` is not a kind: expected `<apiVersion>/<Kind>`
  |
5 | write = ["v1/ConfigMap", "Deployment"]
  |                          ^^^^^^^^^^^^
  |
  = hint: write `apps/v1/Deployment`"#
    );
}

/// A resource name (`secrets`) where a kind belongs.
#[test]
fn error_permission_with_resource_name() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
kind = "ConfigMap"
[permissions]
read = ["v1/secrets"]
"#
        ),
        r#"error: plugins/mirror.toml:5:9: `permissions.read[0]`: `secrets` is not a kind name
  |
5 | read = ["v1/secrets"]
  |         ^^^^^^^^^^^^
  |
  = hint: use the kind, `v1/Secret`, not the resource name"#
    );
}

/// A label selector the cache's parser refuses.
#[test]
fn error_invalid_label_selector() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
kind = "ConfigMap"
label-selector = "app in web"
"#
        ),
        r#"error: plugins/mirror.toml:4:18: `for.label-selector`: invalid label selector "app in web": expected '(' after set operator for "app"
  |
4 | label-selector = "app in web"
  |                  ^^^^^^^^^^^^"#
    );
}

/// A field selector without an operator.
#[test]
fn error_invalid_field_selector() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
kind = "ConfigMap"
field-selector = "metadata.name"
"#
        ),
        r#"error: plugins/mirror.toml:4:18: `for.field-selector`: `metadata.name` in field selector `metadata.name` has no operator (`=`, `==` or `!=`)
  |
4 | field-selector = "metadata.name"
  |                  ^^^^^^^^^^^^^^^"#
    );
}

/// An index must have exactly one source.
#[test]
fn error_index_with_two_sources() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
kind = "Pod"
[for.indexes]
by-node = { field = "spec.nodeName", label = "x" }
"#
        ),
        r#"error: plugins/mirror.toml:5:11: `for.indexes.by-node`: index `by-node` must have exactly one of `field`, `label`, `annotation`, `owner`; it has 2
  |
5 | by-node = { field = "spec.nodeName", label = "x" }
  |           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  |
  = hint: e.g. `by-node = { field = "spec.nodeName" }`"#
    );
}

/// An index field path the cache refuses.
#[test]
fn error_index_with_bad_field_path() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
kind = "Pod"
[for.indexes]
by-node = { field = "spec..nodeName" }
"#
        ),
        r#"error: plugins/mirror.toml:5:21: `for.indexes.by-node.field`: invalid field path "spec..nodeName": empty segment
  |
5 | by-node = { field = "spec..nodeName" }
  |                     ^^^^^^^^^^^^^^^^
  |
  = hint: write a dotted path like `spec.nodeName`; bracket segments holding dots: `metadata.labels['app.kubernetes.io/name']`"#
    );
}

/// The same kind twice in `[[owns]]`.
#[test]
fn error_duplicate_owns() {
    assert_eq!(
        errors(
            "plugin",
            r#"[for]
api-version = "v1"
kind = "Pod"
[[owns]]
api-version = "v1"
kind = "ConfigMap"
[[owns]]
api-version = "v1"
kind = "ConfigMap"
"#
        ),
        r#"error: plugins/mirror.toml:9:8: `owns[1].kind`: `v1/ConfigMap` is already listed as `owns[0]`
  |
9 | kind = "ConfigMap"
  |        ^^^^^^^^^^^
  |
  = hint: merge the two entries (one informer per kind and namespace)"#
    );
}

/// A plugin name that cannot name metrics and field managers.
#[test]
fn error_invalid_plugin_name() {
    assert_eq!(
        errors(
            "plugin",
            r#"name = "My_Plugin"
[for]
api-version = "v1"
kind = "ConfigMap"
"#
        ),
        r#"error: plugins/mirror.toml:1:8: `name`: `My_Plugin` is not a valid plugin name: a plugin name must be lowercase letters, digits and `-` (at most 63), as it names metrics and the field manager
  |
1 | name = "My_Plugin"
  |        ^^^^^^^^^^^"#
    );
}

/// An unknown enum value, with the closest one as a hint.
#[test]
fn error_unknown_enum_value() {
    assert_eq!(
        errors(
            "host",
            r#"[cluster]
mode = "embeded"
"#
        ),
        r#"error: etc/wasmctrl.toml:2:8: `cluster.mode`: unknown value "embeded"; expected one of: "embedded", "kubeconfig", "in-cluster"
  |
2 | mode = "embeded"
  |        ^^^^^^^^^
  |
  = hint: did you mean "embedded"?"#
    );
}

/// A cluster key that does not apply to the chosen mode.
#[test]
fn error_key_not_for_this_mode() {
    assert_eq!(
        errors(
            "host",
            r#"[cluster]
mode = "kubeconfig"
seed = ["a.yaml"]
"#
        ),
        r#"error: etc/wasmctrl.toml:3:1: `cluster.seed`: `seed` does not apply to mode = "kubeconfig"
  |
3 | seed = ["a.yaml"]
  | ^^^^
  |
  = hint: `seed` is used with mode = "embedded""#
    );
}

/// Leader-election timings out of client-go's order.
#[test]
fn error_leader_election_timings() {
    assert_eq!(
        errors(
            "host",
            r#"[leader-election]
enabled = true
lease-duration = "5s"
"#
        ),
        r#"error: etc/wasmctrl.toml:3:18: `leader-election.lease-duration`: lease-duration must be longer than renew-deadline
  |
3 | lease-duration = "5s"
  |                  ^^^^"#
    );
}

/// A server address that is not `ip:port`.
#[test]
fn error_bad_address() {
    assert_eq!(
        errors(
            "host",
            r#"[server]
address = "localhost"
"#
        ),
        r#"error: etc/wasmctrl.toml:2:11: `server.address`: `localhost` is not an address
  |
2 | address = "localhost"
  |           ^^^^^^^^^^^
  |
  = hint: write `host:port` with an IP address, e.g. "127.0.0.1:9090" or "0.0.0.0:9090""#
    );
}

/// A misspelt host TOML key.
#[test]
fn error_unknown_host_key() {
    assert_eq!(
        errors(
            "host",
            r#"plugin-dir = "x"
"#
        ),
        r#"error: etc/wasmctrl.toml:1:1: `plugin-dir`: unknown key `plugin-dir` in the top level
  |
1 | plugin-dir = "x"
  | ^^^^^^^^^^
  |
  = hint: did you mean `plugins-dir`?"#
    );
}

/// Several problems in one file are all reported, in file order.
#[test]
fn every_semantic_error_is_reported() {
    let text = "concurrency = 0\n[for]\napi-version = \"v1\"\nkind = \"configmap\"\nlabel-selector = \"a in b\"\n[permissions]\nwrite = [\"Deployment\"]\n";
    let errors = PluginConfig::parse(Path::new("p.toml"), text, &PluginDefaults::default()).unwrap_err();
    let fields: Vec<_> = errors.iter().map(|e| e.field.clone().unwrap_or_default()).collect();
    assert_eq!(fields, ["concurrency", "for.kind", "for.label-selector", "permissions.write[0]"]);
    let lines: Vec<_> = errors.iter().map(|e| e.location.map(|l| l.line)).collect();
    assert_eq!(lines, [Some(1), Some(4), Some(5), Some(7)]);
}

/// A kind the cluster does not serve is an error at its place in the file, with the
/// closest served kind as a hint (here the offline catalog stands in for discovery).
#[test]
fn error_unknown_kind_from_discovery() {
    let text = "[for]\napi-version = \"v1\"\nkind = \"ConfigMapp\"\n[[watches]]\napi-version = \"apps/v1beta9\"\nkind = \"Deployment\"\n[permissions]\nread = [\"example.com/v1/Website\"]\n";
    let p = PluginConfig::parse(Path::new("plugins/mirror.toml"), text, &PluginDefaults::default()).unwrap();
    assert_eq!(
        p.check_kinds(&BuiltinKinds).unwrap_err().to_string(),
        r#"error: plugins/mirror.toml:3:8: `for.kind`: the cluster serves no kind `ConfigMapp` in `v1`
  |
3 | kind = "ConfigMapp"
  |        ^^^^^^^^^^^^
  |
  = hint: did you mean `ConfigMap`?
error: plugins/mirror.toml:6:8: `watches[0].kind`: the cluster does not serve `apps/v1beta9`
  |
6 | kind = "Deployment"
  |        ^^^^^^^^^^^^
  |
  = hint: `Deployment` is in `apps/v1`"#
    );
}

/// `[[watches]]` and `filter = true` need the plugin's `map` / `filter` hooks.
#[test]
fn error_hooks_the_plugin_does_not_declare() {
    let text = "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[for.predicates]\nfilter = true\n[[watches]]\napi-version = \"v1\"\nkind = \"Namespace\"\n";
    let p = PluginConfig::parse(Path::new("plugins/mirror.toml"), text, &PluginDefaults::default()).unwrap();
    assert!(p.check_hooks(true, true).is_ok());
    assert_eq!(
        p.check_hooks(false, false).unwrap_err().to_string(),
        r#"error: plugins/mirror.toml:6:1: `watches[0]`: `[[watches]]` needs the plugin to export `map`, and it does not
  |
6 | [[watches]]
  | ^^^^^^^^^^^
  |
  = hint: implement `map` in the plugin, or remove `[[watches]]`
error: plugins/mirror.toml:5:10: `for.predicates.filter`: `filter = true` needs the plugin to export `filter`, and it does not
  |
5 | filter = true
  |          ^^^^
  |
  = hint: implement `filter` in the plugin, or remove this predicate"#
    );
}

/// Watching Secrets hands them to the plugin: without `permissions.read` it is an error at
/// the field that watches them, with the fix as a hint.
#[test]
fn error_watched_secret_without_read() {
    assert_eq!(
        errors(
            "plugin",
            "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[[watches]]\napi-version = \"v1\"\nkind = \"Secret\"\n"
        ),
        r#"error: plugins/mirror.toml:6:8: `watches[0].kind`: `[[watches]]` watches `v1/Secret`, which hands every Secret it sees (its data included) to the plugin, but `permissions.read` does not list `v1/Secret`
  |
6 | kind = "Secret"
  |        ^^^^^^^^
  |
  = hint: add `read = ["v1/Secret"]` to `[permissions]` if the plugin is to read Secrets"#
    );
    let for_secret = errors("plugin", "[for]\napi-version = \"v1\"\nkind = \"Secret\"\n");
    assert!(
        for_secret.contains("plugins/mirror.toml:3:8: `for.kind`: `[for]` watches `v1/Secret`"),
        "{for_secret}"
    );
    let owns = errors(
        "plugin",
        "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[[owns]]\napi-version = \"v1\"\nkind = \"Secret\"\n",
    );
    assert!(owns.contains("`owns[0].kind`"), "{owns}");
    let granted = "[for]\napi-version = \"v1\"\nkind = \"Secret\"\n[permissions]\nread = [\"v1/Secret\"]\n";
    assert_eq!(errors("plugin", granted), "OK");
}

/// `permissions.namespaces`: valid names, `*` alone, every source's namespace in the list.
#[test]
fn error_namespaces() {
    let text = "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"a\"\n[[watches]]\napi-version = \"v1\"\nkind = \"Pod\"\nnamespace = \"c\"\n[permissions]\nnamespaces = [\"a\", \"B\", \"a\", \"*\"]\n";
    let out = errors("plugin", text);
    assert!(
        out.contains(
            "plugins/mirror.toml:10:20: `permissions.namespaces[1]`: `B` is not a valid namespace name"
        ),
        "{out}"
    );
    assert!(out.contains("`permissions.namespaces[2]`: `a` is listed twice"), "{out}");
    assert!(
        out.contains("`permissions.namespaces[3]`: `*` (every namespace) is given with other namespaces"),
        "{out}"
    );
    let outside = "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"a\"\n[[watches]]\napi-version = \"v1\"\nkind = \"Pod\"\nnamespace = \"c\"\n[permissions]\nnamespaces = [\"a\", \"b\"]\n";
    let out = errors("plugin", outside);
    assert!(out.contains("plugins/mirror.toml:8:13: `watches[0].namespace`: `c` is not one of `permissions.namespaces` (a, b)"), "{out}");
    assert!(out.contains("hint: add `c` to `permissions.namespaces`"), "{out}");
    let empty =
        errors("plugin", "[for]\napi-version = \"v1\"\nkind = \"Pod\"\n[permissions]\nnamespaces = []\n");
    assert!(empty.contains("`permissions.namespaces`: `namespaces` is empty"), "{empty}");
    let bad_manager =
        errors("plugin", "field-manager = \"a\\nb\"\n[for]\napi-version = \"v1\"\nkind = \"Pod\"\n");
    assert!(
        bad_manager.contains("`field-manager`: a field manager must be 1 to 128 printable ASCII characters"),
        "{bad_manager}"
    );
}

/// The namespaces a plugin works in: listed, derived from `[for]`, or every namespace.
#[test]
fn a_namespace_limited_plugin_admits_only_in_its_namespaces() {
    let parse = |text: &str| {
        PluginConfig::parse(Path::new("plugins/p.toml"), text, &PluginDefaults::default()).unwrap()
    };
    let limited = parse(
        "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"team-a\"\n[[admission]]\nname = \"plain\"\n[[admission]]\nname = \"labelled\"\nnamespace-selector = \"env=prod\"\n",
    );
    let selectors: Vec<_> = limited.admission.iter().map(|r| r.namespace_selector.clone()).collect();
    assert_eq!(
        selectors,
        [
            Some("kubernetes.io/metadata.name in (team-a)".to_owned()),
            Some("env=prod,kubernetes.io/metadata.name in (team-a)".to_owned()),
        ]
    );
    let everywhere = parse("[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[[admission]]\n");
    assert_eq!(everywhere.admission[0].namespace_selector, None);
}

#[test]
fn namespaces_are_listed_derived_from_for_or_everywhere() {
    let parse = |text: &str| {
        PluginConfig::parse(Path::new("plugins/p.toml"), text, &PluginDefaults::default()).unwrap()
    };
    let everywhere = parse("[for]\napi-version = \"v1\"\nkind = \"Pod\"\n");
    assert_eq!(everywhere.namespaces, None);
    let derived = parse(
        "[for]\napi-version = \"v1\"\nkind = \"Pod\"\nnamespace = \"b\"\n[[watches]]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"a\"\n[[watches]]\napi-version = \"v1\"\nkind = \"Node\"\n",
    );
    assert_eq!(derived.namespaces, Some(vec!["a".to_owned(), "b".to_owned()]));
    let spec = derived.to_plugin_spec();
    assert!(spec.permissions.in_scope(Some("a")) && !spec.permissions.in_scope(Some("c")));
    let listed = parse(
        "[for]\napi-version = \"v1\"\nkind = \"Pod\"\nnamespace = \"b\"\n[permissions]\nnamespaces = [\"b\", \"x\"]\n",
    );
    assert_eq!(listed.namespaces, Some(vec!["b".to_owned(), "x".to_owned()]));
    let star = parse(
        "[for]\napi-version = \"v1\"\nkind = \"Pod\"\nnamespace = \"b\"\n[permissions]\nnamespaces = [\"*\"]\n",
    );
    assert_eq!(star.namespaces, None);
    assert!(star.to_plugin_spec().permissions.in_scope(Some("anywhere")));
    // A cluster-scoped source (Node) watches no namespace: no error; a namespaced one does.
    derived.check_kinds(&BuiltinKinds).unwrap();
    let wide = parse(
        "[for]\napi-version = \"v1\"\nkind = \"Pod\"\nnamespace = \"b\"\n[[watches]]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[permissions]\nwrite = [\"v1/Namespace\", \"v1/Pod\"]\n",
    );
    let out = wide.check_kinds(&BuiltinKinds).unwrap_err().to_string();
    assert!(out.contains("plugins/p.toml:7:8: `watches[0].kind`: `v1/ConfigMap` is watched in every namespace, but the plugin works only in b"), "{out}");
    assert!(out.contains("`permissions.write[0]`: `v1/Namespace` is cluster-scoped"), "{out}");
    assert!(!out.contains("permissions.write[1]"), "{out}");
    star.check_kinds(&BuiltinKinds).unwrap();
}

/// The ```toml blocks of docs/configuration.md: each parses, and its file form serializes
/// back to TOML that parses to the same configuration.
#[test]
fn documented_examples_round_trip() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
    let blocks: Vec<&str> = doc.split("```toml\n").skip(1).filter_map(|b| b.split("```").next()).collect();
    assert!(blocks.len() >= 3, "expected host and plugin examples, found {}", blocks.len());
    let (mut hosts, mut plugins) = (0, 0);
    for block in blocks {
        if block.contains("[for]") {
            plugins += 1;
            let path = root.join("docs/plugins/configmap-mirror.toml");
            let a = PluginConfig::parse(&path, block, &PluginDefaults::default())
                .unwrap_or_else(|e| panic!("{e}"));
            let text = toml::to_string(&a.file).unwrap();
            let b = PluginConfig::parse(&path, &text, &PluginDefaults::default())
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(a, b, "{text}");
            assert_eq!(a.file, b.file);
            assert_eq!(a.settings, b.settings);
        } else {
            hosts += 1;
            let path = root.join("docs/wasmctrl.toml");
            let a = HostConfig::parse(&path, block).unwrap_or_else(|e| panic!("{e}"));
            let text = toml::to_string(&a.file).unwrap();
            let b = HostConfig::parse(&path, &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(a, b, "{text}");
        }
    }
    assert_eq!((hosts, plugins), (2, 2));
}

/// The documented plugin example resolves as documented.
#[test]
fn documented_plugin_example_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
    let block = doc
        .split("```toml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains("[for]"))
        .unwrap();
    let p = PluginConfig::parse(Path::new("/p/plugins/anything.toml"), block, &PluginDefaults::default())
        .unwrap();
    assert_eq!(p.name, "configmap-mirror");
    assert_eq!(p.wasm_path, Path::new("/p/plugins/configmap-mirror.wasm"));
    assert_eq!(p.concurrency, 2);
    assert_eq!(p.resync, Some(std::time::Duration::from_secs(600)));
    assert_eq!(p.memory, 64 << 20);
    assert_eq!(p.for_source.namespace.as_deref(), Some("default"));
    assert_eq!(p.for_source.indexes.len(), 4);
    assert!(p.for_source.predicates.generation_changed && p.for_source.predicates.filter);
    assert_eq!(p.read, [wasmctrl::plugin::Gvk::new("v1", "Secret")]);
    assert_eq!(p.settings, serde_json::json!({ "namespaces": ["team-a", "team-b"] }));
    assert_eq!(p.namespaces, Some(vec!["default".to_owned(), "team-a".to_owned(), "team-b".to_owned()]));
    p.check_kinds(&BuiltinKinds).unwrap_or_else(|e| panic!("{e}"));
    let spec = p.to_plugin_spec();
    assert!(spec.permissions.can_read(&wasmctrl::plugin::Gvk::new("v1", "Secret")));
    assert!(spec.permissions.can_write(&wasmctrl::plugin::Gvk::new("apps/v1", "Deployment")));
    assert!(!spec.permissions.can_write(&wasmctrl::plugin::Gvk::new("v1", "Secret")));
    assert_eq!(spec.field_manager, "wasmctrl-configmap-mirror");
}

/// The example TOMLs shipped in examples/ all pass the same checks.
#[test]
fn shipped_examples_parse() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    if let Ok(text) = std::fs::read_to_string(root.join("wasmctrl.toml")) {
        HostConfig::parse(&root.join("wasmctrl.toml"), &text).unwrap_or_else(|e| panic!("{e}"));
    }
    for entry in std::fs::read_dir(root.join("plugins")).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "toml") {
            let p = PluginConfig::load(&path, &PluginDefaults::default()).unwrap_or_else(|e| panic!("{e}"));
            p.check_kinds(&BuiltinKinds).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[test]
fn host_defaults_match_an_empty_file() {
    let base = Path::new("/etc/wasmctrl");
    let parsed = HostConfig::parse(&base.join("wasmctrl.toml"), "").unwrap();
    assert_eq!(HostConfig { path: None, ..parsed }, HostConfig::default_in(base));
}

#[test]
fn idle_instance_timeout_defaults_to_a_minute_and_zero_keeps_instances() {
    let path = Path::new("/etc/wasmctrl/wasmctrl.toml");
    let timeout = |text: &str| HostConfig::parse(path, text).unwrap().idle_instance_timeout;
    assert_eq!(timeout(""), std::time::Duration::from_secs(60));
    assert_eq!(timeout("idle-instance-timeout = \"5m\""), std::time::Duration::from_secs(300));
    assert_eq!(timeout("idle-instance-timeout = \"0s\""), std::time::Duration::ZERO);
    assert!(HostConfig::parse(path, "idle-instance-timeout = \"soon\"").is_err());
}

#[test]
fn idle_code_timeout_defaults_to_ten_minutes_and_zero_keeps_the_code() {
    let path = Path::new("/etc/wasmctrl/wasmctrl.toml");
    let timeout = |text: &str| HostConfig::parse(path, text).unwrap().idle_code_timeout;
    assert_eq!(timeout(""), std::time::Duration::from_secs(600));
    assert_eq!(timeout("idle-code-timeout = \"1h\""), std::time::Duration::from_secs(3600));
    assert_eq!(timeout("idle-code-timeout = \"0s\""), std::time::Duration::ZERO);
    assert!(HostConfig::parse(path, "idle-code-timeout = \"later\"").is_err());
    assert!(HostConfig::parse(path, "idle-code-timeout = 600").is_err(), "a duration is a string");
}

#[test]
fn tier_up_defaults_to_on_and_takes_only_a_bool() {
    let path = Path::new("/etc/wasmctrl/wasmctrl.toml");
    let tier_up = |text: &str| HostConfig::parse(path, text).unwrap().tier_up;
    assert!(tier_up(""));
    assert!(!tier_up("tier-up = false"));
    assert!(tier_up("tier-up = true"));
    assert!(HostConfig::parse(path, "tier-up = \"yes\"").is_err());
}

#[test]
fn compile_cache_budget_defaults_to_a_gibibyte() {
    let path = Path::new("/etc/wasmctrl/wasmctrl.toml");
    let budget = |text: &str| HostConfig::parse(path, text).unwrap().cache_max_bytes;
    assert_eq!(budget(""), 1 << 30);
    assert_eq!(budget("cache-max-size = \"256MiB\""), 256 << 20);
    assert!(HostConfig::parse(path, "cache-max-size = \"lots\"").is_err());
}

#[test]
fn host_paths_resolve_against_the_file() {
    let text = "plugins-dir = \"p\"\n[cluster]\nmode = \"embedded\"\nseed = [\"seed/a.yaml\"]\n[defaults]\nconcurrency = 3\nresync = \"0s\"\n[leader-election]\nenabled = true\n";
    let h = HostConfig::parse(Path::new("/srv/wasmctrl.toml"), text).unwrap();
    assert_eq!(h.plugins_dir, Path::new("/srv/p"));
    assert_eq!(
        h.cluster,
        ClusterConfig::Embedded { seed: vec!["/srv/seed/a.yaml".into()], state_file: None }
    );
    assert_eq!(h.plugin_defaults.concurrency, 3);
    assert_eq!(h.plugin_defaults.resync, None);
    let le = h.leader_election.unwrap();
    assert_eq!((le.namespace.as_str(), le.lease_duration.as_secs()), ("default", 15));
    // Plugin TOMLs fall back to the host's defaults.
    let p = PluginConfig::parse(
        Path::new("/srv/p/x.toml"),
        "[for]\napi-version = \"v1\"\nkind = \"Pod\"\n",
        &h.plugin_defaults,
    )
    .unwrap();
    assert_eq!((p.concurrency, p.name.as_str(), p.field_manager.as_str()), (3, "x", "wasmctrl-x"));
}

mod check {
    use super::*;
    use wasmctrl::reload::{CheckOptions, check_paths};

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn a_valid_directory_reports_what_would_run() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "mirror.toml",
            "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nlabel-selector = \"mirror=true\"\n[permissions]\nwrite = [\"v1/ConfigMap\"]\n",
        );
        write(dir.path(), "mirror.wasm", "not checked without an engine");
        let report = check_paths(&[dir.path().to_path_buf()], &CheckOptions::default());
        assert!(report.ok(), "{}", report.render());
        let text = report.render();
        assert!(text.contains("plugin mirror ("), "{text}");
        assert!(text.contains("for      v1/ConfigMap in all namespaces, labels mirror=true"), "{text}");
        assert!(text.contains("write    v1/ConfigMap"), "{text}");
        assert!(text.ends_with("ok: 1 plugin would run\n"), "{text}");
    }

    #[test]
    fn invalid_plugins_fail_and_name_their_files() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.toml", "name = \"same\"\n[for]\napi-version = \"v1\"\nkind = \"Pod\"\n");
        write(dir.path(), "a.wasm", "x");
        write(dir.path(), "b.toml", "name = \"same\"\n[for]\napi-version = \"v1\"\nkind = \"Pod\"\n");
        write(dir.path(), "b.wasm", "x");
        write(dir.path(), "c.toml", "[for]\napi-version = \"v1\"\nkind = \"Pod\"\n");
        write(dir.path(), "orphan.wasm", "x");
        let report = check_paths(&[dir.path().to_path_buf()], &CheckOptions::default());
        assert!(!report.ok());
        let text = report.render();
        assert!(text.contains("b.toml:1:8: `name`: plugin name `same` is already used by"), "{text}");
        assert!(text.contains("c.toml: `wasm`: cannot read"), "{text}");
        assert!(text.contains("orphan.wasm: no plugin TOML uses this component"), "{text}");
        assert_eq!(report.plugins.len(), 1);
    }

    #[test]
    fn the_report_says_where_a_namespace_limited_plugin_works() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "p.toml",
            "[for]\napi-version = \"v1\"\nkind = \"Pod\"\nnamespace = \"team-a\"\n[permissions]\nnamespaces = [\"team-a\", \"shared\"]\n",
        );
        write(dir.path(), "p.wasm", "x");
        let report = check_paths(&[dir.path().to_path_buf()], &CheckOptions::default());
        let text = report.render();
        assert!(report.ok(), "{text}");
        assert!(text.contains("  only in  shared, team-a\n"), "{text}");
    }

    #[test]
    fn field_managers_overlapping_in_a_directory_fail() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.toml", "[for]\napi-version = \"v1\"\nkind = \"Pod\"\n");
        write(dir.path(), "a.wasm", "x");
        write(
            dir.path(),
            "b.toml",
            "field-manager = \"wasmctrl-a/b\"\n[for]\napi-version = \"v1\"\nkind = \"Pod\"\n",
        );
        write(dir.path(), "b.wasm", "x");
        write(
            dir.path(),
            "c.toml",
            "field-manager = \"wasmctrl-ab\"\n[for]\napi-version = \"v1\"\nkind = \"Pod\"\n",
        );
        write(dir.path(), "c.wasm", "x");
        let report = check_paths(&[dir.path().to_path_buf()], &CheckOptions::default());
        let text = report.render();
        assert!(!report.ok(), "{text}");
        assert!(
            text.contains("b.toml:1:17: `field-manager`: field manager `wasmctrl-a/b` overlaps `wasmctrl-a`, the field manager of"),
            "{text}"
        );
        assert!(!text.contains("c.toml:"), "a manager that only starts the same is its own: {text}");
        assert_eq!(report.plugins.len(), 2);
    }

    #[test]
    fn a_host_toml_checks_its_plugins_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        write(&dir.path().join("plugins"), "p.toml", "[for]\napi-version = \"v1\"\nkind = \"Podd\"\n");
        write(&dir.path().join("plugins"), "p.wasm", "x");
        write(dir.path(), "wasmctrl.toml", "[server]\naddress = \"127.0.0.1:9999\"\n");
        let report = check_paths(&[dir.path().join("wasmctrl.toml")], &CheckOptions::default());
        let text = report.render();
        assert!(!report.ok(), "{text}");
        assert!(text.contains("serving on 127.0.0.1:9999"), "{text}");
        assert!(text.contains("p.toml:3:8: `for.kind`: the cluster serves no kind `Podd` in `v1`"), "{text}");
        assert!(text.contains("did you mean `Pod`?"), "{text}");
    }

    #[test]
    fn a_plugin_named_twice_is_checked_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        write(&dir.path().join("plugins"), "p.toml", "[for]\napi-version = \"v1\"\nkind = \"Pod\"\n");
        write(&dir.path().join("plugins"), "p.wasm", "x");
        write(dir.path(), "wasmctrl.toml", "");
        let paths =
            [dir.path().join("wasmctrl.toml"), dir.path().join("plugins"), dir.path().join("plugins/p.toml")];
        let report = check_paths(&paths, &CheckOptions::default());
        assert!(report.ok(), "{}", report.render());
        assert_eq!(report.plugins.len(), 1);
        assert!(report.render().ends_with("ok: 1 plugin would run\n"), "{}", report.render());
    }

    #[test]
    fn a_single_plugin_toml_or_missing_path() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "p.toml", "[for]\napi-version = \"v1\"\nkind = \"Pod\"\nbogus = 1\n");
        let report =
            check_paths(&[dir.path().join("p.toml"), dir.path().join("nope.toml")], &CheckOptions::default());
        let text = report.render();
        assert!(text.contains("p.toml:4:1: `for.bogus`: unknown key `bogus` in table `for`"), "{text}");
        assert!(text.contains("nope.toml: cannot read"), "{text}");
    }
}

mod rbac {
    use super::*;
    use wasmctrl::reload::{RbacObject, RbacOptions, rbac_for};

    fn plugin(name: &str, text: &str) -> PluginConfig {
        PluginConfig::parse(
            &Path::new("plugins").join(format!("{name}.toml")),
            text,
            &PluginDefaults::default(),
        )
        .unwrap()
    }

    #[test]
    fn cluster_role_is_the_union_of_all_plugins() {
        let mirror = plugin(
            "mirror",
            "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[[owns]]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[[watches]]\napi-version = \"v1\"\nkind = \"Namespace\"\n[permissions]\nwrite = [\"v1/ConfigMap\"]\n",
        );
        let site = plugin(
            "site",
            "[for]\napi-version = \"example.com/v1\"\nkind = \"Website\"\n[[owns]]\napi-version = \"apps/v1\"\nkind = \"Deployment\"\n[permissions]\nread = [\"v1/Secret\"]\nwrite = [\"apps/v1/Deployment\", \"example.com/v1/Website\"]\n",
        );
        let yaml = rbac_for(&[mirror, site], &RbacOptions::default(), &BuiltinKinds).to_yaml().unwrap();
        assert_eq!(
            yaml,
            r#"---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  labels:
    app.kubernetes.io/managed-by: wasmctrl
  name: wasmctrl
rules:
- apiGroups:
  - ''
  resources:
  - configmaps
  verbs:
  - create
  - delete
  - get
  - list
  - patch
  - update
  - watch
- apiGroups:
  - ''
  resources:
  - configmaps/finalizers
  verbs:
  - update
- apiGroups:
  - ''
  resources:
  - configmaps/status
  verbs:
  - patch
  - update
- apiGroups:
  - ''
  resources:
  - events
  verbs:
  - create
  - patch
- apiGroups:
  - ''
  resources:
  - namespaces
  verbs:
  - get
  - list
  - watch
- apiGroups:
  - ''
  resources:
  - secrets
  verbs:
  - get
  - list
  - watch
- apiGroups:
  - apps
  resources:
  - deployments
  verbs:
  - create
  - delete
  - get
  - list
  - patch
  - update
  - watch
- apiGroups:
  - apps
  resources:
  - deployments/status
  verbs:
  - patch
  - update
- apiGroups:
  - events.k8s.io
  resources:
  - events
  verbs:
  - create
  - patch
- apiGroups:
  - example.com
  resources:
  - websites
  verbs:
  - create
  - delete
  - get
  - list
  - patch
  - update
  - watch
- apiGroups:
  - example.com
  resources:
  - websites/finalizers
  verbs:
  - update
- apiGroups:
  - example.com
  resources:
  - websites/status
  verbs:
  - patch
  - update
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  labels:
    app.kubernetes.io/managed-by: wasmctrl
  name: wasmctrl
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: wasmctrl
subjects:
- kind: ServiceAccount
  name: wasmctrl
  namespace: wasmctrl-system
"#
        );
    }

    #[test]
    fn one_namespace_gives_a_role_and_leader_election_a_lease_role() {
        let p = plugin("p", "[for]\napi-version = \"v1\"\nkind = \"Pod\"\nnamespace = \"team-a\"\n");
        let le = HostConfig::parse(
            Path::new("h.toml"),
            "[leader-election]\nenabled = true\nnamespace = \"ops\"\n",
        )
        .unwrap()
        .leader_election;
        let m = rbac_for(&[p], &RbacOptions { leader_election: le, ..RbacOptions::default() }, &BuiltinKinds);
        let yaml = m.to_yaml().unwrap();
        let kinds: Vec<&str> = yaml.lines().filter_map(|l| l.strip_prefix("kind: ")).collect();
        assert_eq!(kinds, ["Role", "RoleBinding", "Role", "RoleBinding"]);
        assert!(yaml.contains("name: wasmctrl\n  namespace: team-a"), "{yaml}");
        assert!(yaml.contains("  - coordination.k8s.io\n  resources:\n  - leases"), "{yaml}");
        assert!(yaml.contains("name: wasmctrl-leader-election\n  namespace: ops"), "{yaml}");
        // A cluster-scoped kind forces a ClusterRole.
        let n = plugin(
            "n",
            "[for]\napi-version = \"v1\"\nkind = \"Pod\"\nnamespace = \"team-a\"\n[permissions]\nread = [\"v1/Node\"]\n",
        );
        let yaml = rbac_for(&[n], &RbacOptions::default(), &BuiltinKinds).to_yaml().unwrap();
        assert!(yaml.contains("kind: ClusterRole\n"), "{yaml}");
    }

    /// Plugins limited to namespaces get a Role in each, granting there only what the
    /// plugins limited to it need; cluster-scoped reads go to a ClusterRole of their own.
    #[test]
    fn namespace_limited_plugins_get_roles_where_they_work() {
        let a = plugin(
            "a",
            "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"team-a\"\n[[watches]]\napi-version = \"v1\"\nkind = \"Namespace\"\n[permissions]\nwrite = [\"v1/ConfigMap\"]\n",
        );
        let b = plugin(
            "b",
            "[for]\napi-version = \"v1\"\nkind = \"Pod\"\nnamespace = \"team-b\"\n[permissions]\nnamespaces = [\"team-b\", \"shared\"]\nread = [\"v1/Secret\"]\n",
        );
        let m = rbac_for(&[a.clone(), b.clone()], &RbacOptions::default(), &BuiltinKinds);
        let roles: Vec<(String, Vec<String>)> = m
            .objects
            .iter()
            .filter_map(|o| match o {
                RbacObject::Role(r) => Some((
                    r.metadata.namespace.clone().unwrap_or_default(),
                    r.rules
                        .iter()
                        .flatten()
                        .map(|p| {
                            format!(
                                "{}:{}",
                                p.resources.clone().unwrap_or_default().join(","),
                                p.verbs.join(",")
                            )
                        })
                        .collect(),
                )),
                _ => None,
            })
            .collect();
        let ns: Vec<&str> = roles.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(ns, ["shared", "team-a", "team-b"]);
        let rules = |n: &str| roles.iter().find(|(x, _)| x == n).map(|(_, r)| r.clone()).unwrap_or_default();
        assert_eq!(
            rules("team-a"),
            [
                "configmaps:create,delete,get,list,patch,update,watch",
                "configmaps/status:patch,update",
                "events:create,patch",
                "events:create,patch"
            ]
        );
        assert_eq!(
            rules("team-b"),
            ["events:create,patch", "pods:get,list,watch", "secrets:get,list,watch", "events:create,patch"]
        );
        assert_eq!(rules("shared"), rules("team-b"));
        let cluster: Vec<String> = m
            .objects
            .iter()
            .filter_map(|o| match o {
                RbacObject::ClusterRole(r) => Some(
                    r.rules
                        .iter()
                        .flatten()
                        .flat_map(|p| p.resources.clone().unwrap_or_default())
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                _ => None,
            })
            .collect();
        assert_eq!(cluster, ["namespaces"], "only the cluster-scoped read");
        let kinds: Vec<&str> = m
            .objects
            .iter()
            .map(|o| match o {
                RbacObject::ClusterRole(_) => "ClusterRole",
                RbacObject::ClusterRoleBinding(_) => "ClusterRoleBinding",
                RbacObject::Role(_) => "Role",
                RbacObject::RoleBinding(_) => "RoleBinding",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "Role",
                "RoleBinding",
                "Role",
                "RoleBinding",
                "Role",
                "RoleBinding",
                "ClusterRole",
                "ClusterRoleBinding"
            ]
        );
        // One plugin in every namespace: the one ClusterRole, as before.
        let wide = plugin("w", "[for]\napi-version = \"v1\"\nkind = \"Pod\"\n");
        let m = rbac_for(&[a.clone(), wide], &RbacOptions::default(), &BuiltinKinds);
        assert!(
            m.objects
                .iter()
                .all(|o| matches!(o, RbacObject::ClusterRole(_) | RbacObject::ClusterRoleBinding(_)))
        );
        // `--cluster-scope` too.
        let m = rbac_for(
            &[a, b],
            &RbacOptions { cluster_scope: Some(true), ..RbacOptions::default() },
            &BuiltinKinds,
        );
        assert_eq!(m.objects.len(), 2);
    }
}

/// `wasmctrl check` with the real plugin engine: the world check, `init`, and the hooks the
/// TOML needs, through compiled test plugins (`cargo xtask build-guests`).
mod check_components {
    use super::*;
    use wasmctrl::plugin::{EngineConfig, PluginEngine};
    use wasmctrl::reload::{CheckOptions, EngineValidator, check_paths};

    fn build(name: &str) -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../guests/target/wasm32-wasip2/release")
            .join(format!("{}.wasm", name.replace('-', "_")));
        std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask build-guests`", path.display()))
    }

    #[test]
    fn a_component_importing_ungranted_wasi_fails_the_check_naming_file_and_interface() {
        use wasm_encoder::{
            Component, ComponentImportSection, ComponentTypeRef, ComponentTypeSection, ComponentValType,
            InstanceType,
        };
        let mut instance = InstanceType::new();
        instance.ty().function().params(std::iter::empty::<(&str, ComponentValType)>()).result(None);
        instance.export("handle", ComponentTypeRef::Func(0));
        let mut types = ComponentTypeSection::new();
        types.instance(&instance);
        let mut imports = ComponentImportSection::new();
        imports.import("wasi:http/outgoing-handler@0.2.0", ComponentTypeRef::Instance(0));
        let mut component = Component::new();
        component.section(&types).section(&imports);

        let engine = PluginEngine::new(EngineConfig::default(), None).unwrap();
        let validator = EngineValidator(engine);
        let options = CheckOptions { components: Some(&validator), ..CheckOptions::default() };
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("fetcher.toml"),
            "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("fetcher.wasm"), component.finish()).unwrap();
        let report = check_paths(&[dir.path().to_path_buf()], &options);
        assert!(!report.ok());
        let text = report.render();
        assert!(text.contains("fetcher.wasm"), "{text}");
        assert!(
            text.contains("imports wasi:http/outgoing-handler@0.2.0, which the host does not grant"),
            "{text}"
        );
    }

    #[test]
    fn a_component_written_for_another_kind_fails_the_check_naming_both() {
        let engine = PluginEngine::new(EngineConfig::default(), None).unwrap();
        let validator = EngineValidator(engine);
        let options = CheckOptions { components: Some(&validator), ..CheckOptions::default() };
        let dir = tempfile::tempdir().unwrap();
        let toml = "[for]\napi-version = \"v1\"\nkind = \"Service\"\n[settings]\nnamespaces = [\"a\"]\n";
        std::fs::write(dir.path().join("mirror.toml"), toml).unwrap();
        std::fs::write(dir.path().join("mirror.wasm"), build("configmap-mirror")).unwrap();
        let report = check_paths(&[dir.path().to_path_buf()], &options);
        assert!(!report.ok());
        let text = report.render();
        assert!(text.contains("written for v1/ConfigMap") && text.contains("[for] is v1/Service"), "{text}");
    }

    #[test]
    fn components_are_compiled_initialised_and_matched_against_the_toml() {
        let engine = PluginEngine::new(EngineConfig::default(), None).unwrap();
        let validator = EngineValidator(engine);
        let options = CheckOptions { components: Some(&validator), ..CheckOptions::default() };
        let dir = tempfile::tempdir().unwrap();
        let toml =
            "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[permissions]\nwrite = [\"v1/ConfigMap\"]\n";
        std::fs::write(dir.path().join("good.toml"), toml).unwrap();
        std::fs::write(dir.path().join("good.wasm"), build("reload-stamp-a")).unwrap();
        let report = check_paths(&[dir.path().to_path_buf()], &options);
        assert!(report.ok(), "{}", report.render());
        assert!(
            report.render().contains("world wasmctrl:controller/plugin@0.2.1, init ok"),
            "{}",
            report.render()
        );

        // `init` fails; `[[watches]]` without a `map` hook; not a component at all.
        std::fs::write(dir.path().join("bad.toml"), toml).unwrap();
        std::fs::write(dir.path().join("bad.wasm"), build("reload-stamp-bad")).unwrap();
        let watches = format!("{toml}[[watches]]\napi-version = \"v1\"\nkind = \"Namespace\"\n");
        std::fs::write(dir.path().join("nomap.toml"), watches).unwrap();
        std::fs::write(dir.path().join("nomap.wasm"), build("reload-stamp-a")).unwrap();
        std::fs::write(dir.path().join("junk.toml"), toml).unwrap();
        std::fs::write(dir.path().join("junk.wasm"), b"\0asm\x01\0\0\0").unwrap();
        let report = check_paths(&[dir.path().to_path_buf()], &options);
        let text = report.render();
        assert!(!report.ok());
        assert!(
            text.contains("bad.wasm: invalid component:") && text.contains("build bad refuses to start"),
            "{text}"
        );
        assert!(
            text.contains("nomap.toml:6:1: `watches[0]`: `[[watches]]` needs the plugin to export `map`"),
            "{text}"
        );
        assert!(text.contains("junk.wasm: invalid component:") && text.contains("not a component"), "{text}");
        assert_eq!(report.plugins.len(), 1, "{text}");
    }
}

/// `[cluster] max-object-size`, `[server] auth` with its TLS files, and the RBAC the
/// endpoint's reviews need.
mod limits_and_endpoint {
    use super::*;
    use wasmctrl::reload::{RbacOptions, rbac_for};

    #[test]
    fn max_object_size_defaults_to_16_mebibytes_and_has_a_floor() {
        let path = Path::new("/etc/wasmctrl/wasmctrl.toml");
        let size = |text: &str| HostConfig::parse(path, text).unwrap().max_object_size;
        assert_eq!(size(""), 16 << 20);
        assert_eq!(size("[cluster]\nmax-object-size = \"64MiB\"\n"), 64 << 20);
        assert_eq!(size("[cluster]\nmode = \"in-cluster\"\nmax-object-size = \"64KiB\"\n"), 64 << 10);
        assert_eq!(
            errors("host", "[cluster]\nmax-object-size = \"1KiB\"\n"),
            r#"error: etc/wasmctrl.toml:2:19: `cluster.max-object-size`: max-object-size `1KiB` is below the minimum, 64KiB
  |
2 | max-object-size = "1KiB"
  |                   ^^^^^^"#
        );
    }

    #[test]
    fn server_auth_defaults_to_none_and_tls_files_come_in_pairs_with_kubernetes() {
        let path = Path::new("/etc/wasmctrl/wasmctrl.toml");
        let auth = |text: &str| HostConfig::parse(path, text).unwrap().server_auth;
        assert_eq!(auth(""), ServerAuth::None);
        assert_eq!(auth("[server]\nauth = \"none\"\n"), ServerAuth::None);
        assert_eq!(auth("[server]\nauth = \"kubernetes\"\n"), ServerAuth::Kubernetes { tls: None });
        assert_eq!(
            auth(
                "[server]\nauth = \"kubernetes\"\ntls-cert-file = \"tls/tls.crt\"\ntls-key-file = \"tls/tls.key\"\n"
            ),
            ServerAuth::Kubernetes {
                tls: Some(TlsFiles {
                    cert: "/etc/wasmctrl/tls/tls.crt".into(),
                    key: "/etc/wasmctrl/tls/tls.key".into()
                })
            }
        );
        assert_eq!(
            errors("host", "[server]\nauth = \"kubernetes\"\ntls-cert-file = \"tls.crt\"\n"),
            r#"error: etc/wasmctrl.toml:3:1: `server.tls-cert-file`: `tls-cert-file` needs `tls-key-file` too
  |
3 | tls-cert-file = "tls.crt"
  | ^^^^^^^^^^^^^
  |
  = hint: give both, or neither for a self-signed certificate"#
        );
        assert_eq!(
            errors("host", "[server]\ntls-key-file = \"tls.key\"\n"),
            r#"error: etc/wasmctrl.toml:2:1: `server.tls-key-file`: `tls-key-file` applies only with auth = "kubernetes"
  |
2 | tls-key-file = "tls.key"
  | ^^^^^^^^^^^^
  |
  = hint: the endpoint serves HTTPS only when it checks who reads it"#
        );
        let unknown = errors("host", "[server]\nauth = \"token\"\n");
        assert!(
            unknown.contains(r#"unknown value "token"; expected one of: "none", "kubernetes""#),
            "{unknown}"
        );
    }

    #[test]
    fn endpoint_auth_adds_a_cluster_role_for_token_and_access_reviews() {
        let p = PluginConfig::parse(
            Path::new("plugins/p.toml"),
            "[for]\napi-version = \"v1\"\nkind = \"Pod\"\n",
            &PluginDefaults::default(),
        )
        .unwrap();
        let plain =
            rbac_for(std::slice::from_ref(&p), &RbacOptions::default(), &BuiltinKinds).to_yaml().unwrap();
        assert!(!plain.contains("tokenreviews"), "{plain}");
        let options = RbacOptions { endpoint_auth: true, ..RbacOptions::default() };
        let yaml = rbac_for(&[p], &options, &BuiltinKinds).to_yaml().unwrap();
        assert!(
            yaml.contains(
                "kind: ClusterRole\nmetadata:\n  labels:\n    app.kubernetes.io/managed-by: wasmctrl\n  name: wasmctrl-endpoint-auth\nrules:\n- apiGroups:\n  - authentication.k8s.io\n  resources:\n  - tokenreviews\n  verbs:\n  - create\n- apiGroups:\n  - authorization.k8s.io\n  resources:\n  - subjectaccessreviews\n  verbs:\n  - create\n"
            ),
            "{yaml}"
        );
        assert!(
            yaml.contains("kind: ClusterRoleBinding\nmetadata:\n  labels:\n    app.kubernetes.io/managed-by: wasmctrl\n  name: wasmctrl-endpoint-auth\n"),
            "{yaml}"
        );
    }
}

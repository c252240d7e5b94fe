//! Turns a [`HostToml`] (as written) into a [`HostConfig`] (checked, defaulted, with
//! paths resolved against the TOML's directory).
//!
//! Invariants: every problem is collected, not only the first, each placed at its field in
//! the file; a value that fails its check is replaced by its default so the rest can still
//! be checked, and the result is then an error; cluster keys that do not apply to the
//! chosen mode are errors, not ignored.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use wasmctrl_selectors::{is_dns_label, is_dns_subdomain};

use super::schema::{ClusterMode, HostToml, ServerAuthMode};
use super::{ClusterConfig, HostConfig, LeaderElectionConfig, OciConfig, ServerAuth, TlsFiles};
use crate::config::error::ConfigErrors;
use crate::config::plugin::PluginDefaults;
use crate::config::source::{PathSeg, SourceMap};
use crate::config::units::{ByteSize, DurationValue};

/// The smallest `[cluster] max-object-size` accepted.
const MIN_MAX_OBJECT_SIZE: u64 = 64 << 10;
/// The most instance slots a host TOML may ask for (each reserves address space for an
/// instance's memories; this many stay well within a 47-bit address space).
const MAX_INSTANCE_SLOTS: u32 = 4096;

fn key(k: &str) -> PathSeg {
    PathSeg::Key(k.to_owned())
}

fn expand_home(p: &str, base: &Path) -> PathBuf {
    if let Some(rest) = p.strip_prefix("~/")
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(rest);
    }
    base.join(p)
}

pub(super) fn resolve(
    map: &SourceMap<'_>,
    file: HostToml,
    base: &Path,
    path: Option<PathBuf>,
) -> Result<HostConfig, ConfigErrors> {
    let mut errors = ConfigErrors::default();
    let mut err = |p: &[PathSeg], at_key: bool, m: String, hint: Option<&str>| {
        let mut e = map.error_for(p, at_key, m);
        e.hint = hint.map(str::to_owned);
        errors.push(e);
    };

    let plugins_dir = base.join(file.plugins_dir.as_deref().unwrap_or("plugins"));
    let cache_dir = base.join(file.cache_dir.as_deref().unwrap_or(".wasmctrl-cache"));
    let cache_max_bytes = file.cache_max_size.map_or(crate::plugin::DEFAULT_CACHE_MAX_BYTES, ByteSize::bytes);
    let idle_instance_timeout =
        file.idle_instance_timeout.map_or(crate::plugin::DEFAULT_IDLE_INSTANCE_TIMEOUT, DurationValue::get);
    let idle_code_timeout =
        file.idle_code_timeout.map_or(crate::plugin::DEFAULT_IDLE_CODE_TIMEOUT, DurationValue::get);
    let tier_up = file.tier_up.unwrap_or(true);
    let rescan_interval = file
        .rescan_interval
        .map_or(Some(crate::reload::DEFAULT_RESCAN_INTERVAL), |d| Some(d.get()).filter(|d| !d.is_zero()));
    let parked_keys_ttl =
        file.parked_keys_ttl.map_or(crate::reload::DEFAULT_PARKED_KEYS_TTL, DurationValue::get);
    if parked_keys_ttl.is_zero() {
        err(
            &[PathSeg::Key("parked-keys-ttl".into())],
            false,
            "parked-keys-ttl must be more than 0".into(),
            None,
        );
    }
    let instance_slots = match file.instance_slots {
        Some(n) if !(1..=MAX_INSTANCE_SLOTS).contains(&n) => {
            err(
                &[key("instance-slots")],
                false,
                format!("instance-slots {n} is outside 1..={MAX_INSTANCE_SLOTS}"),
                Some("each slot reserves address space for an instance's memories"),
            );
            crate::plugin::DEFAULT_INSTANCE_SLOTS
        }
        Some(n) => n,
        None => crate::plugin::DEFAULT_INSTANCE_SLOTS,
    };
    let max_instances_per_plugin = match file.max_instances_per_plugin {
        Some(n) if n < 2 || n > instance_slots => {
            err(
                &[key("max-instances-per-plugin")],
                false,
                format!("max-instances-per-plugin {n} is outside 2..={instance_slots} (instance-slots)"),
                Some("a plugin needs two instances: one for reconciles, one for hook calls"),
            );
            crate::plugin::DEFAULT_INSTANCES_PER_PLUGIN.min(instance_slots)
        }
        Some(n) => n,
        None => crate::plugin::DEFAULT_INSTANCES_PER_PLUGIN.min(instance_slots),
    };
    let compile_timeout = match file.compile_timeout {
        Some(t) if t.0.is_zero() => {
            err(&[key("compile-timeout")], false, "compile-timeout must be more than 0".into(), None);
            crate::plugin::DEFAULT_COMPILE_TIMEOUT
        }
        Some(t) => t.0,
        None => crate::plugin::DEFAULT_COMPILE_TIMEOUT,
    };

    let c = &file.cluster;
    let mode_name = match c.mode {
        ClusterMode::Embedded => "embedded",
        ClusterMode::Kubeconfig => "kubeconfig",
        ClusterMode::InCluster => "in-cluster",
    };
    let mut only = |present: bool, k: &str, modes: &str| {
        if present {
            err(
                &[key("cluster"), key(k)],
                true,
                format!("`{k}` does not apply to mode = \"{mode_name}\""),
                Some(&format!("`{k}` is used with mode = {modes}")),
            );
        }
    };
    let cluster = match c.mode {
        ClusterMode::Embedded => {
            only(c.kubeconfig.is_some(), "kubeconfig", "\"kubeconfig\"");
            only(c.context.is_some(), "context", "\"kubeconfig\"");
            ClusterConfig::Embedded {
                seed: c.seed.iter().map(|s| base.join(s)).collect(),
                state_file: c.state_file.as_ref().map(|s| base.join(s)),
            }
        }
        ClusterMode::Kubeconfig => {
            only(!c.seed.is_empty(), "seed", "\"embedded\"");
            only(c.state_file.is_some(), "state-file", "\"embedded\"");
            ClusterConfig::Kubeconfig {
                path: c.kubeconfig.as_deref().map(|p| expand_home(p, base)),
                context: c.context.clone(),
            }
        }
        ClusterMode::InCluster => {
            only(c.kubeconfig.is_some(), "kubeconfig", "\"kubeconfig\"");
            only(c.context.is_some(), "context", "\"kubeconfig\"");
            only(!c.seed.is_empty(), "seed", "\"embedded\"");
            only(c.state_file.is_some(), "state-file", "\"embedded\"");
            ClusterConfig::InCluster
        }
    };

    let max_object_size = match c.max_object_size {
        Some(m) if m.0 < MIN_MAX_OBJECT_SIZE => {
            err(
                &[key("cluster"), key("max-object-size")],
                false,
                format!("max-object-size `{m}` is below the minimum, 64KiB"),
                None,
            );
            crate::source::DEFAULT_MAX_OBJECT_SIZE as u64
        }
        Some(m) => m.0,
        None => crate::source::DEFAULT_MAX_OBJECT_SIZE as u64,
    };

    let address = file.server.address.as_deref().unwrap_or("127.0.0.1:9090");
    let server_address = match address.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            err(
                &[key("server"), key("address")],
                false,
                format!("`{address}` is not an address"),
                Some("write `host:port` with an IP address, e.g. \"127.0.0.1:9090\" or \"0.0.0.0:9090\""),
            );
            SocketAddr::from(([127, 0, 0, 1], 9090))
        }
    };

    let server = &file.server;
    let server_auth = match server.auth.unwrap_or_default() {
        ServerAuthMode::None => {
            for (present, k) in [
                (server.tls_cert_file.is_some(), "tls-cert-file"),
                (server.tls_key_file.is_some(), "tls-key-file"),
            ] {
                if present {
                    err(
                        &[key("server"), key(k)],
                        true,
                        format!("`{k}` applies only with auth = \"kubernetes\""),
                        Some("the endpoint serves HTTPS only when it checks who reads it"),
                    );
                }
            }
            ServerAuth::None
        }
        ServerAuthMode::Kubernetes => {
            let tls = match (&server.tls_cert_file, &server.tls_key_file) {
                (Some(cert), Some(key)) => Some(TlsFiles { cert: base.join(cert), key: base.join(key) }),
                (None, None) => None,
                (cert, _) => {
                    let (given, missing) = if cert.is_some() {
                        ("tls-cert-file", "tls-key-file")
                    } else {
                        ("tls-key-file", "tls-cert-file")
                    };
                    err(
                        &[key("server"), key(given)],
                        true,
                        format!("`{given}` needs `{missing}` too"),
                        Some("give both, or neither for a self-signed certificate"),
                    );
                    None
                }
            };
            ServerAuth::Kubernetes { tls }
        }
    };

    let le = &file.leader_election;
    let lease_duration = le.lease_duration.map_or(Duration::from_secs(15), |d| d.0);
    let renew_deadline = le.renew_deadline.map_or(Duration::from_secs(10), |d| d.0);
    let retry_period = le.retry_period.map_or(Duration::from_secs(2), |d| d.0);
    let le_path = |k: &str| [key("leader-election"), key(k)];
    if lease_duration <= renew_deadline {
        err(
            &le_path("lease-duration"),
            false,
            "lease-duration must be longer than renew-deadline".into(),
            None,
        );
    }
    if renew_deadline.as_millis() * 10 <= retry_period.as_millis() * 12 {
        err(
            &le_path("renew-deadline"),
            false,
            "renew-deadline must be longer than 1.2 × retry-period".into(),
            None,
        );
    }
    if retry_period.is_zero() {
        err(&le_path("retry-period"), false, "retry-period must be more than 0".into(), None);
    }
    let le_namespace = le.namespace.clone().unwrap_or_else(|| "default".into());
    let le_name = le.name.clone().unwrap_or_else(|| "wasmctrl".into());
    if !is_dns_label(&le_namespace) {
        err(&le_path("namespace"), false, format!("`{le_namespace}` is not a valid namespace name"), None);
    }
    if le_name.is_empty() || !is_dns_subdomain(&le_name) {
        err(&le_path("name"), false, format!("`{le_name}` is not a valid Lease name"), None);
    }
    let leader_election = le.enabled.unwrap_or(false).then_some(LeaderElectionConfig {
        namespace: le_namespace,
        name: le_name,
        lease_duration,
        renew_deadline,
        retry_period,
    });

    let sharding = super::sharding::resolve(&file.sharding, leader_election.is_some(), &mut err);

    let d = &file.defaults;
    let base_defaults = PluginDefaults::default();
    let dp = |k: &str| [key("defaults"), key(k)];
    let concurrency = match d.concurrency {
        Some(0) => {
            err(&dp("concurrency"), false, "concurrency must be at least 1".into(), None);
            1
        }
        Some(n) if n >= max_instances_per_plugin => {
            err(
                &dp("concurrency"),
                false,
                format!(
                    "concurrency {n} needs {} instances, more than max-instances-per-plugin ({max_instances_per_plugin})",
                    u64::from(n) + 1
                ),
                None,
            );
            base_defaults.concurrency
        }
        Some(n) => n as usize,
        None => base_defaults.concurrency,
    };
    let deadline = match d.deadline {
        Some(x) if x.0.is_zero() => {
            err(&dp("deadline"), false, "the deadline must be more than 0".into(), None);
            base_defaults.deadline
        }
        Some(x) => x.0,
        None => base_defaults.deadline,
    };
    let memory = match d.memory {
        Some(m) if m.0 < (1 << 20) => {
            err(&dp("memory"), false, format!("memory `{m}` is below the minimum, 1MiB"), None);
            base_defaults.memory
        }
        Some(m) => m.0,
        None => base_defaults.memory,
    };
    let max_output = match d.max_output {
        Some(m) if m.0 < 1024 => {
            err(&dp("max-output"), false, format!("max-output `{m}` is below the minimum, 1KiB"), None);
            base_defaults.max_output
        }
        Some(m) => m.0,
        None => base_defaults.max_output,
    };
    let log_lines_per_second = match d.log_lines_per_second {
        Some(0) => {
            err(
                &dp("log-lines-per-second"),
                false,
                "log-lines-per-second must be at least 1".to_owned(),
                None,
            );
            base_defaults.log_lines_per_second
        }
        Some(n) => n,
        None => base_defaults.log_lines_per_second,
    };
    let resync = d.resync.map(|r| r.0).filter(|r| !r.is_zero());
    if let Some(r) = resync
        && r < Duration::from_secs(1)
    {
        err(
            &dp("resync"),
            false,
            format!("resync `{}` is below the minimum, 1s", DurationValue(r)),
            Some("use \"0s\" to turn resync off"),
        );
    }
    let cache_sync_timeout = d.cache_sync_timeout.map_or(Duration::from_secs(120), |t| t.0);
    if cache_sync_timeout.is_zero() {
        err(&dp("cache-sync-timeout"), false, "cache-sync-timeout must be more than 0".into(), None);
    }

    let o = &file.oci;
    let op = |k: &str| [key("oci"), key(k)];
    let defaults = OciConfig::default();
    let poll_interval = o.poll_interval.map_or(defaults.poll_interval, |d| d.0);
    if poll_interval < Duration::from_secs(1) {
        err(
            &op("poll-interval"),
            false,
            format!("poll-interval `{}` is below the minimum, 1s", DurationValue(poll_interval)),
            Some("pin a plugin by digest (`oci://...@sha256:...`) to never follow its tag"),
        );
    }
    for (i, registry) in o.insecure_registries.iter().enumerate() {
        if let Err(why) = crate::oci::client::check_insecure_registry(registry) {
            err(&[key("oci"), key("insecure-registries"), PathSeg::Index(i)], false, why, None);
        }
    }
    let oci_cache_max_bytes = o.cache_max_size.map_or(defaults.cache_max_bytes, ByteSize::bytes);
    let max_wasm_bytes = match o.max_wasm_size {
        Some(m) if m.0 < 1024 => {
            err(&op("max-wasm-size"), false, format!("max-wasm-size `{m}` is below the minimum, 1KiB"), None);
            defaults.max_wasm_bytes
        }
        Some(m) => m.0,
        None => defaults.max_wasm_bytes,
    };
    let oci = OciConfig {
        poll_interval,
        credentials: o.credentials.as_deref().map(|p| expand_home(p, base)),
        insecure_registries: o.insecure_registries.clone(),
        ca_certificates: o.ca_certificates.iter().map(|p| expand_home(p, base)).collect(),
        verify_key: o.verify_key.as_deref().map(|p| expand_home(p, base)),
        cache_max_bytes: oci_cache_max_bytes,
        max_wasm_bytes,
    };
    let telemetry = file.telemetry.as_ref().and_then(|t| {
        let tp = |k: &str| [key("telemetry"), key(k)];
        let endpoint = match t.endpoint.as_deref().map(str::trim) {
            Some(e) if e.starts_with("http://") || e.starts_with("https://") => Some(e.to_owned()),
            Some(e) => {
                err(
                    &tp("endpoint"),
                    false,
                    format!("`{e}` is not an http:// or https:// URL"),
                    Some("the collector's OTLP/gRPC endpoint, e.g. \"http://127.0.0.1:4317\""),
                );
                None
            }
            None => {
                err(
                    &[key("telemetry")],
                    false,
                    "[telemetry] needs an endpoint".into(),
                    Some("add endpoint = \"http://127.0.0.1:4317\" (the collector's OTLP/gRPC port), or remove the table"),
                );
                None
            }
        };
        let sampling_ratio = t.sampling_ratio.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&sampling_ratio) {
            err(&tp("sampling-ratio"), false, format!("sampling-ratio {sampling_ratio} is not between 0.0 and 1.0"), None);
        }
        let service_name = t.service_name.clone().unwrap_or_else(|| "wasmctrl".into());
        if service_name.trim().is_empty() {
            err(&tp("service-name"), false, "service-name is empty".into(), None);
        }
        endpoint.map(|endpoint| crate::telemetry::TelemetryConfig { endpoint, sampling_ratio, service_name })
    });
    let admission = file.admission.as_ref().map(|a| super::admission::resolve(map, &mut errors, a, base));

    let config = HostConfig {
        path,
        plugins_dir,
        cache_dir,
        cache_max_bytes,
        idle_instance_timeout,
        idle_code_timeout,
        tier_up,
        rescan_interval,
        parked_keys_ttl,
        instance_slots,
        max_instances_per_plugin,
        compile_timeout,
        cluster,
        max_object_size,
        server_address,
        server_auth,
        leader_election,
        sharding,
        plugin_defaults: PluginDefaults {
            concurrency,
            deadline,
            memory,
            max_output,
            log_lines_per_second,
            resync,
            max_instances: max_instances_per_plugin as usize,
        },
        cache_sync_timeout,
        telemetry,
        admission,
        oci,
        file,
    };
    errors.into_result(config)
}

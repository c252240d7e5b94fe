//! The checks of the `config_host` and `config_plugin` fuzz targets: the TOML decoders and
//! checkers with any text.

use std::path::Path;

use crate::config::{BuiltinKinds, HostConfig, PluginConfig, PluginDefaults};

/// `HostConfig::parse` with any text: an error that renders (file, line, column, snippet) or
/// a configuration whose file form serialises to TOML that checks to the same configuration.
pub fn config_host(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new("/etc/wasmctrl/wasmctrl.toml");
    match HostConfig::parse(path, text) {
        Err(errors) => {
            let _ = errors.to_string();
        }
        Ok(config) => {
            let again = toml::to_string(&config.file)
                .unwrap_or_else(|e| panic!("a checked host TOML does not serialise: {e}"));
            let reparsed = HostConfig::parse(path, &again)
                .unwrap_or_else(|e| panic!("the serialised form is refused:\n{again}\n{e}"));
            assert_eq!(config, reparsed, "the serialised form checks differently:\n{again}");
        }
    }
}

/// `PluginConfig::parse`, the kind and hook checks and the runtime spec with any text: errors
/// that render, or a configuration whose file form serialises to TOML that checks the same.
pub fn config_plugin(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new("/etc/wasmctrl/plugins/fuzzed.toml");
    let defaults = PluginDefaults::default();
    match PluginConfig::parse(path, text, &defaults) {
        Err(errors) => {
            let _ = errors.to_string();
        }
        Ok(config) => {
            if let Err(errors) = config.check_kinds(&BuiltinKinds) {
                let _ = errors.to_string();
            }
            for (map, filter) in [(false, false), (true, true)] {
                if let Err(errors) = config.check_hooks(map, filter) {
                    let _ = errors.to_string();
                }
            }
            let _ = config.kinds();
            let _ = config.to_plugin_spec();
            let again = toml::to_string(&config.file)
                .unwrap_or_else(|e| panic!("a checked plugin TOML does not serialise: {e}"));
            let reparsed = PluginConfig::parse(path, &again, &defaults)
                .unwrap_or_else(|e| panic!("the serialised form is refused:\n{again}\n{e}"));
            assert_eq!(config, reparsed, "the serialised form checks differently:\n{again}");
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzzing::seeds;

    #[test]
    fn the_seeds_pass_the_fuzz_checks() {
        seeds("config_host").iter().for_each(|s| config_host(s));
        seeds("config_plugin").iter().for_each(|s| config_plugin(s));
    }

    /// A seed with one line replaced by generated text, or cut short.
    fn mutated(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
        let seeds = seeds(target);
        let line = proptest::string::string_regex(
            r##"[a-z\-]{1,12} = ("[a-z0-9/.*\-]{0,12}"|[0-9]{1,6}|true|\[\]|\{\}|"[0-9]+(s|ms|Mi|Gi)")|\[\[?[a-z]{1,8}\]\]?|[\[\]{}="#a-z0-9 ]{0,20}"##,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        (0..seeds.len(), any::<prop::sample::Index>(), line, any::<bool>()).prop_map(
            move |(which, at, line, cut)| {
                let text = String::from_utf8_lossy(&seeds[which]).into_owned();
                let mut lines: Vec<&str> = text.lines().collect();
                if lines.is_empty() {
                    return line.into_bytes();
                }
                let at = at.index(lines.len());
                if cut {
                    lines.truncate(at);
                    lines.push(&line);
                } else {
                    lines[at] = &line;
                }
                lines.join("\n").into_bytes()
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn mutated_host_tomls_pass_the_fuzz_check(text in mutated("config_host")) {
            config_host(&text);
        }

        #[test]
        fn mutated_plugin_tomls_pass_the_fuzz_check(text in mutated("config_plugin")) {
            config_plugin(&text);
        }

        #[test]
        fn any_bytes_pass_the_fuzz_checks(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            config_host(&data);
            config_plugin(&data);
        }
    }
}

//! Configuration: the host TOML ([`HostConfig`]) and one TOML per plugin ([`PluginConfig`]).
//!
//! Both are parsed with serde + toml into typed structs that refuse unknown keys, then
//! checked. Every error is a [`ConfigError`] naming the file, line, column and field, with a
//! hint where one helps (a misspelt key, a kind the cluster does not serve):
//!
//! ```text
//! plugins/mirror.toml:9:1: `for.lable-selector`: unknown key `lable-selector` in table `for`
//!   |
//! 9 | lable-selector = "mirror=true"
//!   | ^^^^^^^^^^^^^^
//!   |
//!   = hint: did you mean `label-selector`?
//! ```
//!
//! The stages: `source` holds the text and span-annotated tree and maps field paths to
//! places; `decode` deserializes the tree into the file form with serde's error kinds as
//! data (paths from `serde_path_to_error`); `host` and `plugin` check and default the file
//! forms; `error` renders every problem (with `annotate-snippets`).
//!
//! The file forms ([`HostToml`], [`PluginToml`]) serialize back to TOML, so documented
//! examples round-trip. The reference of every key is `docs/configuration.md`.

mod decode;
mod error;
mod host;
mod kinds;
mod plugin;
mod source;
mod units;

pub use error::{ConfigError, ConfigErrors, Location, did_you_mean};
pub use host::{
    AdmissionServerToml, ClusterConfig, ClusterMode, ClusterToml, DEFAULT_VIRTUAL_NODES, DefaultsToml,
    HostConfig, HostToml, LeaderElectionConfig, LeaderElectionToml, OciConfig, OciToml, ServerAuth,
    ServerAuthMode, ServerToml, ServiceToml, ShardingConfig, ShardingMode, ShardingToml, TelemetryToml,
    TlsFiles,
};
pub use kinds::{BuiltinKinds, KindLookupError, KindResolver, ResolvedKind, guess_plural};
pub use plugin::{
    AdmissionToml, FailurePolicyToml, IndexToml, OperationToml, OwnerIndex, PermissionsToml, PluginConfig,
    PluginDefaults, PluginToml, Predicates, PredicatesToml, RegistryWasm, ReinvocationToml, SideEffectsToml,
    SourceToml, TransformToml, WatchSource,
};
pub use units::{ByteSize, DurationValue, UnitError};

pub(crate) use kinds::resolve_or_guess;

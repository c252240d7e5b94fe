//! The plugin's own configuration, as its TOML gives it.

use serde::de::DeserializeOwned;

use crate::sys::config as wit;
use crate::{Error, Settings};

/// The plugin's name (its TOML's `name`, by default the file stem).
pub fn plugin_name() -> String {
    wit::plugin_name()
}

/// The plugin's `[settings]` table parsed into `T` (the same value [`Plugin::init`]
/// receives).
///
/// [`Plugin::init`]: crate::Plugin::init
pub fn settings<T: DeserializeOwned>() -> Result<T, Error> {
    Settings::from_json(wit::settings()).parse()
}

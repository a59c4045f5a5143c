//! The one error of configuration: a refused setting, named by its flag and its YAML key. Every
//! part of the crate refuses values with it (validation, the `--config` file, the tracing file,
//! leader election), so it sits below all of them.

/// A refused setting: which one, and why. Printed as one line at start (exit code 64):
/// `invalid configuration: --flag (yamlKey): message`.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub flag: String,
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (flag, key, message) = (&self.flag, &self.key, &self.message);
        match flag.as_str() {
            // The file itself has no key, and the static services map has no flag.
            "config" => write!(f, "invalid configuration: --config: {message}"),
            "services" => write!(f, "invalid configuration: {key} (file only): {message}"),
            _ => write!(f, "invalid configuration: --{flag} ({key}): {message}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    pub fn new(flag: &str, message: impl Into<String>) -> Self {
        Self {
            flag: flag.to_owned(),
            key: yaml_key(flag),
            message: message.into(),
        }
    }
}

/// `core-ca-file` → `coreCaFile`: the YAML key serde derives for the same field.
pub(crate) fn yaml_key(flag: &str) -> String {
    let mut out = String::with_capacity(flag.len());
    let mut upper = false;
    for c in flag.chars() {
        if c == '-' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

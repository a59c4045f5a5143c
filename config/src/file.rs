//! The `--config` file: read into [`Options`] and merged under the flags. A mistake in it is
//! refused like a bad flag, naming the setting (flag and YAML key) on the line the YAML parser
//! stopped at, and in one line: the parser's source snippet does not survive being printed as one.

use std::path::Path;

use crate::config::Config;
use crate::error::{yaml_key, ConfigError};
use crate::options::Options;

/// Reads `--config` (if any) and merges the flags over it.
pub fn load(cli: crate::Cli) -> Result<(Options, Config), ConfigError> {
    let file = match &cli.config {
        Some(path) => read_file(path)?,
        None => Options::default(),
    };
    let merged = cli.options.or(file);
    let config = merged.clone().validate()?;
    Ok((merged, config))
}

fn read_file(path: &Path) -> Result<Options, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("config", format!("cannot read {}: {e}", path.display())))?;
    if text.trim().is_empty() {
        return Ok(Options::default());
    }
    serde_saphyr::from_str(&text).map_err(|e| file_error(path, &text, &e.to_string()))
}

/// A setting the file got wrong, named by its flag where the error points at one: the YAML key on
/// the line the parser stopped at (or the top-level key that line belongs to).
fn file_error(path: &Path, text: &str, error: &str) -> ConfigError {
    let line = yaml_error_line(error);
    let located = line.strip_prefix("line ").and_then(|rest| {
        let (number, rest) = rest.split_once(' ')?;
        let rest = rest.strip_prefix("column ")?;
        let (_, what) = rest.split_once(": ")?;
        Some((number.parse::<usize>().ok()?, what))
    });
    let Some((number, what)) = located else {
        return ConfigError::new("config", format!("{}: {line}", path.display()));
    };
    let keys = option_keys();
    if let Some(unknown) = what
        .strip_prefix("unknown field `")
        .and_then(|w| w.split('`').next())
    {
        let hint = keys
            .iter()
            .find(|k| k.eq_ignore_ascii_case(unknown))
            .map(|k| format!("; did you mean {k}?"))
            .unwrap_or_default();
        return ConfigError::new(
            "config",
            format!(
                "{} line {number}: unknown key {unknown}{hint} (keys are the flags in camelCase: \
                 --secure-port is securePort)",
                path.display()
            ),
        );
    }
    let key = text
        .lines()
        .take(number)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find(|l| l.starts_with(|c: char| c.is_ascii_alphabetic()))
        .and_then(|l| l.split_once(':'))
        .map(|(k, _)| k.trim());
    match key.and_then(|k| keys.iter().find(|known| known.as_str() == k)) {
        Some(key) => ConfigError::new(
            &flag_of(key),
            format!("{} line {number}: {what}", path.display()),
        ),
        None => ConfigError::new("config", format!("{}: {line}", path.display())),
    }
}

/// Every YAML key of [`Options`], derived from the flags (plus the file-only `services`).
fn option_keys() -> Vec<String> {
    use clap::Args;
    let mut keys: Vec<String> = Options::augment_args(clap::Command::new("options"))
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(yaml_key)
        .collect();
    keys.push("services".to_owned());
    keys
}

/// `coreCaFile` → `core-ca-file`.
fn flag_of(key: &str) -> String {
    let mut flag = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            flag.push('-');
            flag.push(c.to_ascii_lowercase());
        } else {
            flag.push(c);
        }
    }
    flag
}

/// The first line of a YAML parse error, without its "error: " label; the rest is a source
/// snippet that does not survive being joined into one line.
fn yaml_error_line(text: &str) -> &str {
    let first = text.lines().next().unwrap_or_default().trim();
    first.strip_prefix("error: ").unwrap_or(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row per mistake in the file: the flag the refusal names, the line it points at and,
    /// where the text is ours rather than the YAML parser's, what follows the line number.
    #[test]
    fn file_errors_name_the_setting_they_are_about() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        for (text, flag, line, rest) in [
            (
                "securePort: 8443\nrequestTimeout: soon\n",
                "request-timeout",
                2,
                None,
            ),
            ("securePort: abc\n", "secure-port", 1, None),
            (
                "services:\n- namespace: w\n  name: api\n  port: high\n  urls: []\n",
                "services",
                4,
                None,
            ),
            (
                "securePort: 1\ncoreURL: http://x\n",
                "config",
                2,
                Some(
                    "unknown key coreURL; did you mean coreUrl? (keys are the flags in camelCase: \
                     --secure-port is securePort)",
                ),
            ),
            ("securePort: [1\n", "secure-port", 1, None),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = read_file(&path).unwrap_err();
            assert_eq!(err.flag, flag, "{text:?}: {err}");
            assert!(!err.to_string().contains('\n'), "{text:?}: {err}");
            let at = format!("{} line {line}: ", path.display());
            assert!(err.message.starts_with(&at), "{text:?}: {err}");
            if let Some(rest) = rest {
                assert_eq!(err.message, format!("{at}{rest}"), "{text:?}");
            }
        }
    }

    #[test]
    fn yaml_key_matches_serde() {
        for (flag, key) in [
            ("core-ca-file", "coreCaFile"),
            (
                "http2-max-streams-per-connection",
                "http2MaxStreamsPerConnection",
            ),
        ] {
            assert_eq!(yaml_key(flag), key, "{flag}");
            assert_eq!(flag_of(key), flag, "{key}");
        }
        for key in option_keys() {
            assert_eq!(yaml_key(&flag_of(&key)), key);
        }
    }
}

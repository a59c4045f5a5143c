//! `--authentication-config`: kube-apiserver's structured authentication file (KEP-3331), an
//! `AuthenticationConfiguration` of `apiserver.config.k8s.io` (v1, v1beta1 or v1alpha1). It names
//! the JWT issuers the gateway verifies tokens of itself (no TokenReview on the core), their claim
//! rules and mappings, and the anonymous authenticator (KEP-4633).
//!
//! This module reads and validates the file as kube does (strict decoding: an unknown field is
//! refused, as kube's `EnableStrict` codec refuses it), with kube's field paths and messages
//! (`validate`). CEL expressions are compiled by the caller, through [`ExpressionCompiler`], so
//! that this crate stays free of the evaluator; their errors land in the same list, in kube's
//! order.

mod validate;

use std::path::Path;

use serde::Deserialize;

pub use validate::{
    aggregate, validate, CompiledExpression, ExpressionCompiler, ExpressionKind, FieldError,
};

/// The flag every refusal names.
pub const FLAG: &str = "authentication-config";

/// The API versions of `AuthenticationConfiguration` kube-apiserver reads.
pub const API_VERSIONS: [&str; 3] = [
    "apiserver.config.k8s.io/v1",
    "apiserver.config.k8s.io/v1beta1",
    "apiserver.config.k8s.io/v1alpha1",
];

/// The file as written (the three versions have the same fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthenticationConfiguration {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub jwt: Vec<JwtAuthenticator>,
    #[serde(default)]
    pub anonymous: Option<AnonymousAuthConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnonymousAuthConfig {
    #[serde(default)]
    pub enabled: bool,
    /// When set, anonymous requests are allowed to these paths only (exact match).
    #[serde(default)]
    pub conditions: Vec<AnonymousAuthCondition>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnonymousAuthCondition {
    #[serde(default)]
    pub path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JwtAuthenticator {
    #[serde(default)]
    pub issuer: Issuer,
    #[serde(default)]
    pub claim_validation_rules: Vec<ClaimValidationRule>,
    #[serde(default)]
    pub claim_mappings: ClaimMappings,
    #[serde(default)]
    pub user_validation_rules: Vec<UserValidationRule>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Issuer {
    /// Must equal the token's `iss` claim; `https` only.
    #[serde(default)]
    pub url: String,
    /// Where the discovery document is, when not at `{url}/.well-known/openid-configuration`.
    /// The document's `issuer` must still equal `url`.
    #[serde(default, rename = "discoveryURL")]
    pub discovery_url: Option<String>,
    /// PEM bundle that verifies the issuer's serving certificate (discovery and JWKS); the
    /// system roots when empty.
    #[serde(default)]
    pub certificate_authority: String,
    #[serde(default)]
    pub audiences: Vec<String>,
    /// `MatchAny` (the only policy kube knows), or empty for a single audience.
    #[serde(default)]
    pub audience_match_policy: String,
    /// `controlplane` or `cluster` in kube; the gateway dials the issuer directly either way.
    #[serde(default)]
    pub egress_selector_type: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimValidationRule {
    #[serde(default)]
    pub claim: String,
    #[serde(default)]
    pub required_value: String,
    #[serde(default)]
    pub expression: String,
    #[serde(default)]
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimMappings {
    #[serde(default)]
    pub username: PrefixedClaimOrExpression,
    #[serde(default)]
    pub groups: PrefixedClaimOrExpression,
    #[serde(default)]
    pub uid: ClaimOrExpression,
    #[serde(default)]
    pub extra: Vec<ExtraMapping>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrefixedClaimOrExpression {
    #[serde(default)]
    pub claim: String,
    /// Required with `claim` (it may be empty, which disables prefixing).
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub expression: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimOrExpression {
    #[serde(default)]
    pub claim: String,
    #[serde(default)]
    pub expression: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExtraMapping {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub value_expression: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserValidationRule {
    #[serde(default)]
    pub expression: String,
    #[serde(default)]
    pub message: String,
}

/// Why a file was refused: one line, as kube's start-up error reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LoadError(pub String);

/// Reads the file at `path` and decodes it (no validation: see [`validate`]).
pub fn read(path: &Path) -> Result<(AuthenticationConfiguration, String), LoadError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| LoadError(format!("cannot read {}: {e}", path.display())))?;
    let config = decode(&text)?;
    Ok((config, text))
}

/// Decodes the text of a file, strictly.
pub fn decode(text: &str) -> Result<AuthenticationConfiguration, LoadError> {
    if text.trim().is_empty() {
        return Err(LoadError("empty config data".into()));
    }
    let config: AuthenticationConfiguration = serde_saphyr::from_str(text).map_err(|e| {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default();
        LoadError(format!(
            "strict decoding error: {}",
            first.strip_prefix("error: ").unwrap_or(first)
        ))
    })?;
    if !API_VERSIONS.contains(&config.api_version.as_str()) {
        return Err(LoadError(format!(
            "no kind \"AuthenticationConfiguration\" is registered for version {:?}: apiVersion must be one of {}",
            config.api_version,
            API_VERSIONS.join(", ")
        )));
    }
    if config.kind != "AuthenticationConfiguration" {
        return Err(LoadError(format!(
            "kind {:?}: expected AuthenticationConfiguration",
            config.kind
        )));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str =
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\n";

    #[test]
    fn decodes_every_version_and_json() {
        for version in API_VERSIONS {
            let text = format!("apiVersion: {version}\nkind: AuthenticationConfiguration\njwt:\n- issuer:\n    url: https://a\n    audiences: [x]\n");
            let config = decode(&text).unwrap();
            assert_eq!(config.jwt[0].issuer.url, "https://a", "{version}");
        }
        let json = r#"{"apiVersion":"apiserver.config.k8s.io/v1beta1","kind":"AuthenticationConfiguration","anonymous":{"enabled":true,"conditions":[{"path":"/livez"}]}}"#;
        let anonymous = decode(json).unwrap().anonymous.unwrap();
        assert!(anonymous.enabled);
        assert_eq!(anonymous.conditions[0].path, "/livez");
    }

    #[test]
    fn refuses_unknown_fields() {
        let err = decode(&format!(
            "{HEAD}jwt:\n- issuer:\n    url: https://a\n    audience: x\n"
        ))
        .unwrap_err();
        assert!(err.0.starts_with("strict decoding error: "), "{err}");
        assert!(err.0.contains("audience"), "{err}");
    }

    #[test]
    fn refuses_other_versions_kinds_and_empty_files() {
        let err =
            decode("apiVersion: apiserver.config.k8s.io/v2\nkind: AuthenticationConfiguration\n")
                .unwrap_err();
        assert!(err.0.starts_with(r#"no kind "AuthenticationConfiguration" is registered for version "apiserver.config.k8s.io/v2""#), "{err}");
        let err =
            decode("apiVersion: apiserver.config.k8s.io/v1\nkind: AuthorizationConfiguration\n")
                .unwrap_err();
        assert_eq!(
            err.0,
            r#"kind "AuthorizationConfiguration": expected AuthenticationConfiguration"#
        );
        assert_eq!(decode(" \n").unwrap_err().0, "empty config data");
    }
}

//! kube's `ValidateAuthenticationConfiguration` (k8s.io/apiserver/pkg/apis/apiserver/validation):
//! the same rules, field paths and messages, in the same order.

use std::collections::{BTreeSet, HashSet};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::{
    AuthenticationConfiguration, ClaimMappings, ClaimValidationRule, Issuer, JwtAuthenticator,
    PrefixedClaimOrExpression, UserValidationRule,
};

mod go;
#[cfg(test)]
mod tests;
mod url;

/// Which variable an expression sees, and what it must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpressionKind {
    /// `claimMappings.username.expression`, `uid.expression`: a string, from `claims`.
    ClaimMapping,
    /// `claimMappings.groups.expression`, `extra[*].valueExpression`: a string or a list of
    /// strings, from `claims`.
    ClaimMappingList,
    /// `claimValidationRules[*].expression`: a bool, from `claims`.
    ClaimValidation,
    /// `userValidationRules[*].expression`: a bool, from `user`.
    UserValidation,
}

/// What validation needs to know of a compiled expression.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompiledExpression {
    /// The expression selects `claims.email`.
    pub uses_email: bool,
    /// The expression selects `claims.email_verified`.
    pub uses_email_verified: bool,
}

/// Compiles CEL for validation; the caller keeps the programs.
pub trait ExpressionCompiler {
    /// The compiled expression, or kube's detail for the error (`compilation failed: ...`).
    fn compile(&self, kind: ExpressionKind, expression: &str)
        -> Result<CompiledExpression, String>;
}

/// One refusal, as kube's `field.Error` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError(pub String);

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Every refusal of `config`, in kube's order; `disallowed_issuers` are the issuers of
/// service-account tokens (kube refuses a JWT issuer that overlaps them).
///
/// The feature gates are kube 1.34's defaults (`StructuredAuthenticationConfiguration`,
/// `StructuredAuthenticationConfigurationEgressSelector` and `AnonymousAuthConfigurableEndpoints`
/// all on), so none of kube's "not supported when ... feature gate is disabled" refusals apply.
pub fn validate(
    config: &AuthenticationConfiguration,
    compiler: &dyn ExpressionCompiler,
    disallowed_issuers: &[String],
) -> Vec<FieldError> {
    let root = Path::new("jwt");
    if config.jwt.len() > MAX_AUTHENTICATORS {
        return vec![too_many(&root, config.jwt.len(), MAX_AUTHENTICATORS)];
    }
    let mut checker = Checker {
        compiler,
        disallowed: disallowed_issuers.iter().map(String::as_str).collect(),
        errors: Vec::new(),
    };
    let mut issuers = HashSet::new();
    let mut discovery_urls = HashSet::new();
    for (i, authenticator) in config.jwt.iter().enumerate() {
        let path = root.index(i).child("issuer");
        checker.authenticator(authenticator, &root.index(i));
        let issuer = &authenticator.issuer;
        if !issuers.insert(issuer.url.as_str()) {
            checker.push(duplicate(&path.child("url"), &issuer.url));
        }
        let discovery = issuer.discovery_url.as_deref().unwrap_or_default();
        if !discovery.is_empty() && !discovery_urls.insert(discovery) {
            checker.push(duplicate(&path.child("discoveryURL"), discovery));
        }
    }
    if let Some(anonymous) = &config.anonymous {
        if !anonymous.enabled && !anonymous.conditions.is_empty() {
            // kube prints the conditions as JSON of its internal type, whose field is `Path`.
            let conditions: Vec<String> = (anonymous.conditions.iter())
                .map(|c| format!("{{\"Path\":{}}}", go::json_string(&c.path)))
                .collect();
            checker.push(field_error(
                &Path::new("anonymous").child("conditions"),
                "Invalid value",
                Some(format!("[{}]", conditions.join(","))),
                "enabled should be set to true when conditions are defined",
            ));
        }
    }
    checker.errors
}

/// `field.ErrorList.ToAggregate().Error()`: nothing for no error, one error as itself, several
/// (each once) as `[e1, e2]`.
pub fn aggregate(errors: &[FieldError]) -> String {
    let mut seen = HashSet::new();
    let unique: Vec<&str> = (errors.iter())
        .map(|e| e.0.as_str())
        .filter(|e| seen.insert(*e))
        .collect();
    match unique.as_slice() {
        [] => String::new(),
        [one] => (*one).to_owned(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// kube's cap on `jwt`.
const MAX_AUTHENTICATORS: usize = 64;

const EMAIL_VERIFIED_REQUIRED: &str = "claims.email_verified must be used in \
     claimMappings.username.expression or claimMappings.extra[*].valueExpression or \
     claimValidationRules[*].expression when claims.email is used in \
     claimMappings.username.expression";

const NO_CERTIFICATES: &str = "data does not contain any valid RSA or ECDSA certificates";

const SUBDOMAIN_ERROR: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
     alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character \
     (e.g. 'example.com', regex used for validation is \
     '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

const PATH_ERROR: &str =
    "Invalid path (regex used for validation is '[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')";

/// A field path as kube prints it: `jwt[0].issuer.url`.
#[derive(Debug, Clone)]
struct Path(String);

impl Path {
    fn new(name: &str) -> Path {
        Path(name.to_owned())
    }

    fn child(&self, name: &str) -> Path {
        Path(format!("{}.{name}", self.0))
    }

    fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `path: kind[: value][: detail]`, as `field.Error.Error()` builds it.
fn field_error(path: &Path, kind: &str, value: Option<String>, detail: &str) -> FieldError {
    let mut text = format!("{path}: {kind}");
    for part in value.iter().map(String::as_str).chain(Some(detail)) {
        if !part.is_empty() {
            text.push_str(": ");
            text.push_str(part);
        }
    }
    FieldError(text)
}

fn required(path: &Path, detail: &str) -> FieldError {
    field_error(path, "Required value", None, detail)
}

/// `field.Invalid` with a `string` value (printed `%q`).
fn invalid(path: &Path, value: &str, detail: &str) -> FieldError {
    field_error(path, "Invalid value", Some(go::quote(value)), detail)
}

/// `field.Invalid` with a value of a named string type (printed as JSON).
fn invalid_named(path: &Path, value: &str, detail: &str) -> FieldError {
    field_error(path, "Invalid value", Some(go::json_string(value)), detail)
}

fn duplicate(path: &Path, value: &str) -> FieldError {
    field_error(path, "Duplicate value", Some(go::quote(value)), "")
}

fn too_many(path: &Path, actual: usize, max: usize) -> FieldError {
    let detail = format!(
        "must have at most {max} item{}",
        if max == 1 { "" } else { "s" }
    );
    field_error(path, "Too many", Some(actual.to_string()), &detail)
}

/// What the expressions of one authenticator select, for the `claims.email` rule.
#[derive(Default)]
struct EmailUse {
    email: bool,
    email_verified: bool,
}

struct Checker<'a> {
    compiler: &'a dyn ExpressionCompiler,
    disallowed: BTreeSet<&'a str>,
    errors: Vec<FieldError>,
}

impl Checker<'_> {
    fn push(&mut self, error: FieldError) {
        self.errors.push(error);
    }

    /// Compiles `expression`; a failure is kube's `Invalid` of the expression.
    fn compile(
        &mut self,
        kind: ExpressionKind,
        expression: &str,
        path: &Path,
    ) -> Option<CompiledExpression> {
        match self.compiler.compile(kind, expression) {
            Ok(compiled) => Some(compiled),
            Err(detail) => {
                self.push(invalid(path, expression, &detail));
                None
            }
        }
    }

    fn authenticator(&mut self, authenticator: &JwtAuthenticator, path: &Path) {
        let mut email = EmailUse::default();
        self.issuer(&authenticator.issuer, &path.child("issuer"));
        let rules = &authenticator.claim_validation_rules;
        self.claim_validation_rules(rules, &path.child("claimValidationRules"), &mut email);
        let mappings = &authenticator.claim_mappings;
        self.claim_mappings(mappings, &path.child("claimMappings"), &mut email);
        let rules = &authenticator.user_validation_rules;
        self.user_validation_rules(rules, &path.child("userValidationRules"));
    }

    fn issuer(&mut self, issuer: &Issuer, path: &Path) {
        let url_path = path.child("url");
        if issuer.url.is_empty() {
            self.push(required(&url_path, ""));
        } else {
            self.url(&issuer.url, true, &url_path);
        }
        self.discovery_url(issuer, &path.child("discoveryURL"));
        self.audiences(issuer, path);
        self.certificate_authority(&issuer.certificate_authority, path);
        let egress = issuer.egress_selector_type.as_str();
        if !egress.is_empty() && egress != "controlplane" && egress != "cluster" {
            let detail = "egress selector must be either controlplane or cluster";
            self.push(invalid_named(
                &path.child("egressSelectorType"),
                egress,
                detail,
            ));
        }
    }

    fn discovery_url(&mut self, issuer: &Issuer, path: &Path) {
        let discovery = issuer.discovery_url.as_deref().unwrap_or_default();
        if discovery.is_empty() {
            return;
        }
        if !issuer.url.is_empty()
            && issuer.url.trim_end_matches('/') == discovery.trim_end_matches('/')
        {
            self.push(invalid(
                path,
                discovery,
                "discoveryURL must be different from URL",
            ));
        }
        self.url(discovery, false, path);
    }

    /// kube's `validateURL`; only an issuer URL is held against the disallowed issuers.
    fn url(&mut self, raw: &str, issuer: bool, path: &Path) {
        if issuer && self.disallowed.contains(raw) {
            let list: Vec<&str> = self.disallowed.iter().copied().collect();
            let detail = format!(
                "URL must not overlap with disallowed issuers: [{}]",
                list.join(" ")
            );
            self.push(invalid(path, raw, &detail));
        }
        let parsed = match url::parse(raw) {
            Ok(parsed) => parsed,
            Err(detail) => return self.push(invalid(path, raw, &detail)),
        };
        let refusals = [
            (parsed.scheme != "https", "URL scheme must be https"),
            (
                parsed.has_user,
                "URL must not contain a username or password",
            ),
            (parsed.has_query, "URL must not contain a query"),
            (parsed.has_fragment, "URL must not contain a fragment"),
        ];
        for (_, detail) in refusals.into_iter().filter(|(refused, _)| *refused) {
            self.push(invalid(path, raw, detail));
        }
    }

    fn audiences(&mut self, issuer: &Issuer, issuer_path: &Path) {
        let path = issuer_path.child("audiences");
        let audiences = &issuer.audiences;
        if audiences.is_empty() {
            return self.push(required(&path, &format!("at least one {path} is required")));
        }
        let mut seen = HashSet::new();
        for (i, audience) in audiences.iter().enumerate() {
            if audience.is_empty() {
                self.push(required(&path.index(i), ""));
            }
            if !seen.insert(audience.as_str()) {
                self.push(duplicate(&path.index(i), audience));
            }
        }
        let policy = issuer.audience_match_policy.as_str();
        let policy_path = issuer_path.child("audienceMatchPolicy");
        if audiences.len() > 1 && policy != "MatchAny" {
            let detail = "audienceMatchPolicy must be MatchAny for multiple audiences";
            self.push(invalid_named(&policy_path, policy, detail));
        }
        if audiences.len() == 1 && !policy.is_empty() && policy != "MatchAny" {
            let detail = "audienceMatchPolicy must be empty or MatchAny for single audience";
            self.push(invalid_named(&policy_path, policy, detail));
        }
    }

    fn certificate_authority(&mut self, pem: &str, issuer_path: &Path) {
        if pem.is_empty() {
            return;
        }
        if let Err(detail) = parse_certificates(pem) {
            let path = issuer_path.child("certificateAuthority");
            self.push(invalid(&path, "<omitted>", &detail));
        }
    }

    fn claim_validation_rules(
        &mut self,
        rules: &[ClaimValidationRule],
        path: &Path,
        email: &mut EmailUse,
    ) {
        let mut claims = HashSet::new();
        let mut expressions = HashSet::new();
        for (i, rule) in rules.iter().enumerate() {
            let path = path.index(i);
            match (rule.claim.is_empty(), rule.expression.is_empty()) {
                (false, false) => {
                    let detail = "claim and expression can't both be set";
                    self.push(invalid(&path, &rule.claim, detail));
                }
                (true, true) => self.push(required(&path, "claim or expression is required")),
                (false, true) => {
                    if !rule.message.is_empty() {
                        let detail = "may not be specified when claim is set";
                        self.push(invalid(&path.child("message"), &rule.message, detail));
                    }
                    if !claims.insert(rule.claim.as_str()) {
                        self.push(duplicate(&path.child("claim"), &rule.claim));
                    }
                }
                (true, false) => {
                    if !rule.required_value.is_empty() {
                        let detail = "may not be specified when expression is set";
                        let value_path = path.child("requiredValue");
                        self.push(invalid(&value_path, &rule.required_value, detail));
                    }
                    let expression_path = path.child("expression");
                    if !expressions.insert(rule.expression.as_str()) {
                        self.push(duplicate(&expression_path, &rule.expression));
                        continue;
                    }
                    let kind = ExpressionKind::ClaimValidation;
                    if let Some(compiled) = self.compile(kind, &rule.expression, &expression_path) {
                        email.email_verified |= compiled.uses_email_verified;
                    }
                }
            }
        }
    }

    fn claim_mappings(&mut self, mappings: &ClaimMappings, path: &Path, email: &mut EmailUse) {
        let username = &mappings.username;
        let before = self.errors.len();
        let kind = ExpressionKind::ClaimMapping;
        let compiled = self.prefixed(username, &path.child("username"), true, kind);
        // kube reads the username expression only when the username mapping has no error.
        if let (Some(compiled), true) = (compiled, self.errors.len() == before) {
            email.email |= compiled.uses_email;
            email.email_verified |= compiled.uses_email_verified;
        }
        let kind = ExpressionKind::ClaimMappingList;
        self.prefixed(&mappings.groups, &path.child("groups"), false, kind);
        self.uid(mappings, &path.child("uid"));
        self.extra(mappings, &path.child("extra"), email);
        if email.email && !email.email_verified {
            let path = path.child("username").child("expression");
            self.push(invalid(
                &path,
                &username.expression,
                EMAIL_VERIFIED_REQUIRED,
            ));
        }
    }

    /// A username or groups mapping; the compiled expression, if it has one that compiles.
    fn prefixed(
        &mut self,
        mapping: &PrefixedClaimOrExpression,
        path: &Path,
        required_mapping: bool,
        kind: ExpressionKind,
    ) -> Option<CompiledExpression> {
        match (mapping.claim.is_empty(), mapping.expression.is_empty()) {
            (false, false) => {
                self.push(invalid(path, "", "claim and expression can't both be set"));
            }
            (true, true) if required_mapping => {
                self.push(required(path, "claim or expression is required"));
            }
            (true, false) => {
                if let Some(prefix) = &mapping.prefix {
                    let detail = "may not be specified when expression is set";
                    self.push(invalid(&path.child("prefix"), prefix, detail));
                }
                return self.compile(kind, &mapping.expression, &path.child("expression"));
            }
            (false, true) if mapping.prefix.is_none() => {
                let detail = "prefix is required when claim is set. It can be set to an empty \
                              string to disable prefixing";
                self.push(required(&path.child("prefix"), detail));
            }
            _ => {}
        }
        None
    }

    fn uid(&mut self, mappings: &ClaimMappings, path: &Path) {
        let uid = &mappings.uid;
        if uid.expression.is_empty() {
            return;
        }
        if !uid.claim.is_empty() {
            return self.push(invalid(path, "", "claim and expression can't both be set"));
        }
        self.compile(
            ExpressionKind::ClaimMapping,
            &uid.expression,
            &path.child("expression"),
        );
    }

    fn extra(&mut self, mappings: &ClaimMappings, path: &Path, email: &mut EmailUse) {
        let mut keys = HashSet::new();
        for (i, mapping) in mappings.extra.iter().enumerate() {
            let path = path.index(i);
            let key_path = path.child("key");
            let key = mapping.key.as_str();
            self.errors.extend(domain_prefixed_path(&key_path, key));
            if key.chars().flat_map(char::to_lowercase).ne(key.chars()) {
                self.push(invalid(&key_path, key, "must be lowercase"));
            }
            if reserved_for_kubernetes(key) {
                let detail = "k8s.io, kubernetes.io and their subdomains are reserved for \
                              Kubernetes use";
                self.push(invalid(&key_path, key, detail));
            }
            if !keys.insert(key) {
                self.push(duplicate(&key_path, key));
                continue;
            }
            let value_path = path.child("valueExpression");
            if mapping.value_expression.is_empty() {
                self.push(required(&value_path, ""));
                continue;
            }
            let kind = ExpressionKind::ClaimMappingList;
            if let Some(compiled) = self.compile(kind, &mapping.value_expression, &value_path) {
                email.email_verified |= compiled.uses_email_verified;
            }
        }
    }

    fn user_validation_rules(&mut self, rules: &[UserValidationRule], path: &Path) {
        let mut expressions = HashSet::new();
        for (i, rule) in rules.iter().enumerate() {
            let path = path.index(i).child("expression");
            if rule.expression.is_empty() {
                self.push(required(&path, ""));
            } else if !expressions.insert(rule.expression.as_str()) {
                self.push(duplicate(&path, &rule.expression));
            } else {
                self.compile(ExpressionKind::UserValidation, &rule.expression, &path);
            }
        }
    }
}

/// apimachinery's `IsDomainPrefixedPath`: an RFC 1123 subdomain, `/`, and an HTTP path.
fn domain_prefixed_path(path: &Path, value: &str) -> Vec<FieldError> {
    if value.is_empty() {
        return vec![required(path, "")];
    }
    let (host, rest) = match value.split_once('/') {
        Some((host, rest)) if !host.is_empty() && !rest.is_empty() => (host, rest),
        _ => {
            let detail = "must be a domain-prefixed path (such as \"acme.io/foo\")";
            return vec![invalid(path, value, detail)];
        }
    };
    let mut errors = Vec::new();
    if host.len() > 253 {
        errors.push(invalid(path, host, "must be no more than 253 characters"));
    }
    if !is_subdomain(host) {
        errors.push(invalid(path, host, SUBDOMAIN_ERROR));
    }
    let path_char = |b: u8| b.is_ascii_alphanumeric() || b"/-._~%!$&'()*+,;=:".contains(&b);
    if !rest.bytes().all(path_char) {
        errors.push(invalid(path, rest, PATH_ERROR));
    }
    errors
}

/// Dot-separated labels of lowercase letters, digits and inner `-`.
fn is_subdomain(host: &str) -> bool {
    host.split('.').all(|label| {
        let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let inner = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-';
        edge(label.bytes().next()) && edge(label.bytes().last()) && label.bytes().all(inner)
    })
}

/// A key under `k8s.io`, `kubernetes.io` or their subdomains.
fn reserved_for_kubernetes(key: &str) -> bool {
    let Some((domain, _)) = key.split_once('/') else {
        return false;
    };
    ["k8s.io", "kubernetes.io"]
        .iter()
        .any(|reserved| domain == *reserved || domain.ends_with(&format!(".{reserved}")))
}

/// client-go's `ParseCertsPEM`: at least one `CERTIFICATE` block, each an X.509 certificate.
/// A malformed PEM section ends the scan (Go skips it and reads on), and a certificate that
/// does not parse gets one of Go's two most common messages.
fn parse_certificates(pem: &str) -> Result<(), String> {
    let mut found = false;
    for section in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let Ok(der) = section else {
            break;
        };
        match x509_parser::parse_x509_certificate(&der) {
            Ok(([], _)) => found = true,
            Ok(_) => return Err("x509: trailing data".into()),
            Err(_) => return Err("x509: malformed certificate".into()),
        }
    }
    if found {
        Ok(())
    } else {
        Err(NO_CERTIFICATES.into())
    }
}

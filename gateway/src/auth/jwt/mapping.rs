//! From verified claims to a user, in kube's order (`oidc.go`'s `AuthenticateToken`): username,
//! groups, uid, extra (with the credential ID of a `jti`), then the required claims, the claim
//! validation expressions, and last the user validation rules. Every refusal is worded as kube
//! logs it; the caller sees only kube's 401 `Unauthorized`.

use std::collections::BTreeMap;

use gateway_config::authentication::{JwtAuthenticator, PrefixedClaimOrExpression};
use serde_json::{Map, Value as Json};

use super::cel::{claims_value, user_value, Compiler, Expression};
use crate::identity::UserInfo;

/// kube's extra key for the ID of the credential the user presented.
pub const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

enum Mapping {
    None,
    Claim { claim: String, prefix: String },
    Expression(Expression),
}

/// A rule and the message kube gives when it fails.
struct Rule {
    expression: Expression,
    message: String,
}

/// One issuer's mappings and rules, compiled.
pub struct Mapper {
    compiler: Compiler,
    username: Mapping,
    groups: Mapping,
    uid: Mapping,
    extra: Vec<(String, Expression)>,
    required_claims: Vec<(String, String)>,
    claim_rules: Vec<Rule>,
    user_rules: Vec<Rule>,
    /// Some mapping or claim rule is CEL, so the claims are converted once per token.
    uses_claims_cel: bool,
}

fn mapping(compiler: &Compiler, m: &PrefixedClaimOrExpression) -> Result<Mapping, String> {
    Ok(if !m.expression.is_empty() {
        Mapping::Expression(compiler.compile(&m.expression)?)
    } else if !m.claim.is_empty() {
        Mapping::Claim {
            claim: m.claim.clone(),
            prefix: m.prefix.clone().unwrap_or_default(),
        }
    } else {
        Mapping::None
    })
}

impl Mapper {
    /// Compiles a validated authenticator's expressions.
    pub fn new(compiler: &Compiler, a: &JwtAuthenticator) -> Result<Self, String> {
        let m = &a.claim_mappings;
        let uid = if !m.uid.expression.is_empty() {
            Mapping::Expression(compiler.compile(&m.uid.expression)?)
        } else if !m.uid.claim.is_empty() {
            Mapping::Claim {
                claim: m.uid.claim.clone(),
                prefix: String::new(),
            }
        } else {
            Mapping::None
        };
        let extra = m
            .extra
            .iter()
            .map(|e| Ok((e.key.clone(), compiler.compile(&e.value_expression)?)))
            .collect::<Result<Vec<_>, String>>()?;
        let rules = |pairs: Vec<(&str, &str)>| -> Result<Vec<Rule>, String> {
            pairs
                .into_iter()
                .map(|(e, message)| {
                    Ok(Rule {
                        expression: compiler.compile(e)?,
                        message: message.to_owned(),
                    })
                })
                .collect()
        };
        let claim_rules = rules(
            a.claim_validation_rules
                .iter()
                .filter(|r| !r.expression.is_empty())
                .map(|r| (r.expression.as_str(), r.message.as_str()))
                .collect(),
        )?;
        let user_rules = rules(
            a.user_validation_rules
                .iter()
                .map(|r| (r.expression.as_str(), r.message.as_str()))
                .collect(),
        )?;
        let mut mapper = Self {
            compiler: compiler.clone(),
            username: mapping(compiler, &m.username)?,
            groups: mapping(compiler, &m.groups)?,
            uid,
            extra,
            required_claims: a
                .claim_validation_rules
                .iter()
                .filter(|r| !r.claim.is_empty())
                .map(|r| (r.claim.clone(), r.required_value.clone()))
                .collect(),
            claim_rules,
            user_rules,
            uses_claims_cel: false,
        };
        mapper.uses_claims_cel = [&mapper.username, &mapper.groups, &mapper.uid]
            .iter()
            .any(|m| matches!(m, Mapping::Expression(_)))
            || !mapper.extra.is_empty()
            || !mapper.claim_rules.is_empty();
        Ok(mapper)
    }

    /// The user the verified claims name, or why they name nobody.
    pub fn user(&self, claims: &Map<String, Json>) -> Result<UserInfo, String> {
        let context = if self.uses_claims_cel {
            Some(self.compiler.context("claims", claims_value(claims)?))
        } else {
            None
        };
        let cx = context.as_ref();
        let mut user = UserInfo {
            name: self.username(claims, cx)?,
            ..UserInfo::default()
        };
        user.groups = self.groups(claims, cx)?;
        user.uid = self.uid(claims, cx)?;
        user.extra = self.extra(claims, cx)?;
        for (claim, want) in &self.required_claims {
            if !claims.contains_key(claim) {
                return Err(format!(
                    "oidc: required claim {claim} not present in ID token"
                ));
            }
            let got = string_claim(claims, claim)
                .map_err(|e| format!("oidc: parse claim {claim}: {e}"))?;
            if &got != want {
                return Err(format!(
                    "oidc: required claim {claim} value does not match. Got = {got}, want = {want}"
                ));
            }
        }
        for rule in &self.claim_rules {
            check_rule(rule, needs(cx)?)
                .map_err(|e| format!("oidc: error evaluating claim validation expression: {e}"))?;
        }
        if !self.user_rules.is_empty() {
            let context = self.compiler.context("user", user_value(&user)?);
            for rule in &self.user_rules {
                check_rule(rule, &context).map_err(|e| {
                    format!("oidc: error evaluating user info validation rule: {e}")
                })?;
            }
        }
        Ok(user)
    }

    fn username(&self, claims: &Map<String, Json>, cx: Option<&Context>) -> Result<String, String> {
        match &self.username {
            Mapping::Expression(e) => {
                let name = e.string(needs(cx)?).map_err(|e| {
                    format!("oidc: error evaluating username claim expression: {e}")
                })?;
                if name.is_empty() {
                    return Err("oidc: empty username via CEL expression is not allowed".into());
                }
                Ok(name)
            }
            Mapping::Claim { claim, prefix } => {
                let name = string_claim(claims, claim)
                    .map_err(|e| format!("oidc: parse username claims {claim:?}: {e}"))?;
                if claim == "email" {
                    if let Some(verified) = claims.get("email_verified") {
                        match verified {
                            Json::Bool(true) => {}
                            Json::Bool(false) => return Err("oidc: email not verified".into()),
                            _ => {
                                return Err(
                                    "oidc: parse 'email_verified' claim: not a boolean".into()
                                )
                            }
                        }
                    }
                }
                Ok(format!("{prefix}{name}"))
            }
            Mapping::None => Err("oidc: no username mapping".into()),
        }
    }

    fn groups(
        &self,
        claims: &Map<String, Json>,
        cx: Option<&Context>,
    ) -> Result<Vec<String>, String> {
        match &self.groups {
            // An absent groups claim is no groups, as in kube.
            Mapping::Claim { claim, prefix } => match claims.get(claim) {
                None => Ok(Vec::new()),
                Some(value) => string_or_array(value)
                    .map(|groups| groups.into_iter().map(|g| format!("{prefix}{g}")).collect())
                    .map_err(|e| format!("oidc: parse groups claim {claim:?}: {e}")),
            },
            Mapping::Expression(e) => e
                .strings(needs(cx)?)
                .map_err(|e| format!("oidc: error evaluating group claim expression: {e}")),
            Mapping::None => Ok(Vec::new()),
        }
    }

    fn uid(&self, claims: &Map<String, Json>, cx: Option<&Context>) -> Result<String, String> {
        match &self.uid {
            Mapping::None => Ok(String::new()),
            Mapping::Claim { claim, .. } => string_claim(claims, claim)
                .map_err(|e| format!("oidc: parse uid claim {claim:?}: {e}")),
            Mapping::Expression(e) => e
                .string(needs(cx)?)
                .map_err(|e| format!("oidc: error evaluating uid claim expression: {e}")),
        }
    }

    fn extra(
        &self,
        claims: &Map<String, Json>,
        cx: Option<&Context>,
    ) -> Result<BTreeMap<String, Vec<String>>, String> {
        let mut extra = BTreeMap::new();
        if let Some(Json::String(jti)) = claims.get("jti") {
            extra.insert(CREDENTIAL_ID.to_owned(), vec![format!("JTI={jti}")]);
        }
        for (key, e) in &self.extra {
            let values = e.strings(needs(cx)?).map_err(|err| {
                format!(
                    "oidc: error evaluating extra claim expression: {}: {err}",
                    e.source
                )
            })?;
            if !values.is_empty() {
                extra.insert(key.clone(), values);
            }
        }
        Ok(extra)
    }
}

type Context = cel::Context<'static, 'static>;

fn needs(cx: Option<&Context>) -> Result<&Context, String> {
    cx.ok_or_else(|| "no CEL context for an expression".to_owned())
}

fn check_rule(rule: &Rule, cx: &Context) -> Result<(), String> {
    if rule.expression.boolean(cx)? {
        Ok(())
    } else {
        Err(format!(
            "validation expression '{}' failed: {}",
            rule.expression.source, rule.message
        ))
    }
}

/// A claim that must be a string.
fn string_claim(claims: &Map<String, Json>, name: &str) -> Result<String, String> {
    match claims.get(name) {
        None => Err("claim not present".into()),
        Some(Json::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!(
            "json: cannot unmarshal {} into a string",
            kind(other)
        )),
    }
}

/// A claim that is a string or an array of strings (kube's `stringOrArray`).
fn string_or_array(value: &Json) -> Result<Vec<String>, String> {
    match value {
        Json::String(s) => Ok(vec![s.clone()]),
        Json::Array(items) => items
            .iter()
            .map(|v| match v {
                Json::String(s) => Ok(s.clone()),
                other => Err(format!(
                    "json: cannot unmarshal {} into a string",
                    kind(other)
                )),
            })
            .collect(),
        other => Err(format!(
            "json: cannot unmarshal {} into a string or an array of strings",
            kind(other)
        )),
    }
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "bool",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mapper(yaml: &str) -> Mapper {
        let a: JwtAuthenticator = serde_saphyr::from_str(yaml).unwrap();
        Mapper::new(&Compiler::default(), &a).unwrap()
    }

    fn claims(v: Json) -> Map<String, Json> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn claims_and_prefixes_map_as_kube_maps_them() {
        let m = mapper(
            "issuer: {url: 'https://i', audiences: [a]}\n\
             claimMappings:\n  username: {claim: sub, prefix: 'oidc:'}\n  groups: {claim: roles, prefix: 'r:'}\n  uid: {claim: oid}\n",
        );
        let user = m
            .user(&claims(
                json!({"sub": "alice", "roles": "admin", "oid": "7", "jti": "j1"}),
            ))
            .unwrap();
        assert_eq!(user.name, "oidc:alice");
        assert_eq!(
            user.groups,
            ["r:admin"],
            "a string groups claim is one group"
        );
        assert_eq!(user.uid, "7");
        assert_eq!(user.extra[CREDENTIAL_ID], ["JTI=j1"]);
        let no_groups = m.user(&claims(json!({"sub": "bob", "oid": "8"}))).unwrap();
        assert!(no_groups.groups.is_empty() && no_groups.extra.is_empty());
        let no_uid = m.user(&claims(json!({"sub": "bob"}))).unwrap_err();
        assert!(no_uid.contains("parse uid claim"), "{no_uid}");
        let bad = m.user(&claims(json!({"sub": 5, "oid": "8"}))).unwrap_err();
        assert!(bad.contains("parse username claims"), "{bad}");
    }

    #[test]
    fn email_needs_email_verified_when_present() {
        let m = mapper(
            "issuer: {url: 'https://i', audiences: [a]}\n\
             claimMappings: {username: {claim: email, prefix: ''}}\n",
        );
        let ok = m.user(&claims(json!({"email": "a@x.io"}))).unwrap();
        assert_eq!(ok.name, "a@x.io");
        let verified = json!({"email": "a@x.io", "email_verified": true});
        assert_eq!(m.user(&claims(verified)).unwrap().name, "a@x.io");
        let unverified = json!({"email": "a@x.io", "email_verified": false});
        assert_eq!(
            m.user(&claims(unverified)).unwrap_err(),
            "oidc: email not verified"
        );
    }

    #[test]
    fn expressions_and_rules_run_in_kube_order() {
        let m = mapper(
            "issuer: {url: 'https://i', audiences: [a]}\n\
             claimValidationRules:\n  - {claim: hd, requiredValue: example.com}\n  - {expression: 'claims.level > 1', message: too low}\n\
             claimMappings:\n  username: {expression: \"'u:' + claims.sub\"}\n  groups: {expression: 'claims.teams.map(t, \"t:\" + t)'}\n  uid: {expression: 'claims.sub'}\n  extra:\n    - {key: example.com/tenant, valueExpression: 'claims.tenant'}\n    - {key: example.com/none, valueExpression: '[]'}\n\
             userValidationRules:\n  - {expression: \"!user.username.startsWith('u:root')\", message: no root}\n",
        );
        let base = json!({"sub": "alice", "teams": ["a", "b"], "tenant": "t1", "hd": "example.com", "level": 2});
        let user = m.user(&claims(base.clone())).unwrap();
        assert_eq!(user.name, "u:alice");
        assert_eq!(user.groups, ["t:a", "t:b"]);
        assert_eq!(user.uid, "alice");
        assert_eq!(user.extra["example.com/tenant"], ["t1"]);
        assert!(
            !user.extra.contains_key("example.com/none"),
            "empty extra is left out"
        );
        let with = |k: &str, v: Json| {
            let mut c = claims(base.clone());
            c.insert(k.into(), v);
            m.user(&c).unwrap_err()
        };
        assert!(with("hd", json!("other.com")).contains("required claim hd value does not match"));
        assert!(with("level", json!(1))
            .contains("validation expression 'claims.level > 1' failed: too low"));
        assert!(with("sub", json!("root")).contains("failed: no root"));
        let mut missing = claims(base.clone());
        missing.remove("hd");
        assert!(m
            .user(&missing)
            .unwrap_err()
            .contains("required claim hd not present"));
    }
}

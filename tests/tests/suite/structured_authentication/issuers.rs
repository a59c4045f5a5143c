//! The issuers of the token table and the `AuthenticationConfiguration` naming them, shared by
//! the fixture suite and the kube-apiserver oracle
//! (`real_control_plane::structured_authentication`).
//!
//! | issuer | mappings and rules |
//! |---|---|
//! | `claims` | username `sub` prefix `a:`, groups `groups` prefix `ag:`, uid `uid`, `tenant` must be `acme`; audiences `gateway-e2e`, `gateway-e2e-2` (MatchAny) |
//! | `cel` | username, groups, uid and three extras by CEL; rule `claims.tenant != 'evil'`; user rule: no `cel:system:` names |
//! | `email` | username `email`, prefix `""` (kube's `email_verified` rule) |
//! | `discovery` | discovery only at `issuer.discoveryURL` (the well-known path is a 404); username `sub` prefix `d:` |
//! | `down` | never answers (its discovery hangs); username `sub` prefix `e:` |

use e2e::oidc::{Issuer, IssuerOptions, Misbehaviour};
use serde_json::{json, Value};

/// The audience tokens are minted for, and the second one the `claims` issuer accepts.
pub const AUDIENCE: &str = "gateway-e2e";
pub const SECOND_AUDIENCE: &str = "gateway-e2e-2";
/// An audience the configuration names only after the reload test adds it.
pub const LATER_AUDIENCE: &str = "added-later";

/// The anonymous authenticator's paths: the probes (kube's documented set) and `/version`.
pub const ANONYMOUS_PATHS: [&str; 4] = ["/livez", "/readyz", "/healthz", "/version"];

pub struct Issuers {
    pub claims: Issuer,
    pub cel: Issuer,
    pub email: Issuer,
    pub discovery: Issuer,
    pub down: Issuer,
}

fn tagged(tag: &str) -> IssuerOptions {
    IssuerOptions {
        tag: tag.into(),
        ..IssuerOptions::default()
    }
}

impl Issuers {
    pub async fn start() -> Issuers {
        Issuers {
            claims: Issuer::start_with(tagged("claims")).await,
            cel: Issuer::start_with(tagged("cel")).await,
            email: Issuer::start_with(tagged("email")).await,
            discovery: Issuer::start_with(IssuerOptions {
                well_known: false,
                discovery_path: Some("/tenant-d/openid-configuration".into()),
                ..tagged("discovery")
            })
            .await,
            down: Issuer::start_with(IssuerOptions {
                misbehaviour: Misbehaviour::Hang,
                ..tagged("down")
            })
            .await,
        }
    }

    fn issuer(i: &Issuer, audiences: &[&str]) -> Value {
        let mut issuer = json!({
            "url": i.url(),
            "certificateAuthority": i.ca_pem(),
            "audiences": audiences,
        });
        if audiences.len() > 1 {
            issuer["audienceMatchPolicy"] = json!("MatchAny");
        }
        if let Some(discovery) = i.discovery_url() {
            issuer["discoveryURL"] = json!(discovery);
        }
        issuer
    }

    fn by_sub(i: &Issuer, prefix: &str) -> Value {
        json!({"issuer": Self::issuer(i, &[AUDIENCE]),
               "claimMappings": {"username": {"claim": "sub", "prefix": prefix}}})
    }

    /// The configuration (`apiserver.config.k8s.io/v1`), with `more_audiences` added to the
    /// `claims` issuer's.
    pub fn config(&self, more_audiences: &[&str]) -> Value {
        self.config_with(more_audiences, true)
    }

    /// [`Issuers::config`] without the `down` issuer: a file that can be reloaded (kube, and the
    /// gateway, refuse a new configuration until each of its issuers has served its keys).
    pub fn reloadable(&self, more_audiences: &[&str]) -> Value {
        self.config_with(more_audiences, false)
    }

    fn config_with(&self, more_audiences: &[&str], with_down: bool) -> Value {
        let mut audiences = vec![AUDIENCE, SECOND_AUDIENCE];
        audiences.extend_from_slice(more_audiences);
        let claims = json!({
            "issuer": Self::issuer(&self.claims, &audiences),
            "claimValidationRules": [{"claim": "tenant", "requiredValue": "acme"}],
            "claimMappings": {
                "username": {"claim": "sub", "prefix": "a:"},
                "groups": {"claim": "groups", "prefix": "ag:"},
                "uid": {"claim": "uid"},
            },
        });
        // `dyn(..)`: kube types claims as `any`, which a comprehension cannot range over.
        let cel = json!({
            "issuer": Self::issuer(&self.cel, &[AUDIENCE]),
            "claimValidationRules": [
                {"expression": "claims.tenant != 'evil'", "message": "evil tenants are refused"},
            ],
            "claimMappings": {
                "username": {"expression": "'cel:' + claims.sub"},
                "groups": {"expression": "dyn(claims.roles).map(r, 'role:' + r)"},
                "uid": {"expression": "'uid-' + claims.sub"},
                "extra": [
                    {"key": "example.com/tenant", "valueExpression": "claims.tenant"},
                    {"key": "example.com/levels", "valueExpression": "claims.levels"},
                    {"key": "example.com/empty", "valueExpression": "''"},
                ],
            },
            "userValidationRules": [
                {"expression": "!user.username.startsWith('cel:system:')",
                 "message": "no system users"},
            ],
        });
        let email = json!({
            "issuer": Self::issuer(&self.email, &[AUDIENCE]),
            "claimMappings": {"username": {"claim": "email", "prefix": ""}},
        });
        let conditions: Vec<Value> = ANONYMOUS_PATHS
            .iter()
            .map(|p| json!({ "path": p }))
            .collect();
        let mut jwt = vec![claims, cel, email, Self::by_sub(&self.discovery, "d:")];
        if with_down {
            jwt.push(Self::by_sub(&self.down, "e:"));
        }
        json!({
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AuthenticationConfiguration",
            "jwt": jwt,
            "anonymous": {"enabled": true, "conditions": conditions},
        })
    }
}

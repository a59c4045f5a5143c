//! The token table: one row per token, with the identity kube-apiserver gives it (worked out from
//! kube's `plugin/pkg/authenticator/token/oidc/oidc.go`: mappings, then `requiredValue` claims,
//! then claim rules, then user rules; `system:authenticated` appended by kube's group adder;
//! `JTI=<jti>` as the credential id; an extra whose value is `""` or `[]` left out), or `None`
//! for kube's 401 `Unauthorized`. kube-apiserver 1.36 agrees with every row
//! (`real_control_plane::structured_authentication`).

use e2e::oidc::{now, Issuer};
use serde_json::{json, Value};

use super::issuers::{Issuers, AUDIENCE, SECOND_AUDIENCE};

pub struct Row {
    pub name: String,
    pub token: String,
    /// `status.userInfo` of `kubectl auth whoami -o json`; `None`: 401 Unauthorized.
    pub expect: Option<Value>,
}

fn row(name: &str, token: String, expect: Option<Value>) -> Row {
    Row {
        name: name.to_owned(),
        token,
        expect,
    }
}

/// `claims` with `changes` merged in (a `null` removes the claim).
fn with(mut claims: Value, changes: Value) -> Value {
    for (k, v) in changes.as_object().expect("an object of changes") {
        match v {
            Value::Null => claims.as_object_mut().unwrap().remove(k),
            v => claims.as_object_mut().unwrap().insert(k.clone(), v.clone()),
        };
    }
    claims
}

/// The same header and signature over other claims: a forgery.
fn swap_payload(token: &str, claims: &Value) -> String {
    use base64::Engine as _;
    let parts: Vec<&str> = token.split('.').collect();
    let payload =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims.to_string().as_bytes());
    format!("{}.{payload}.{}", parts[0], parts[2])
}

const AG: [&str; 3] = ["ag:dev", "ag:ops", "system:authenticated"];

fn alice(groups: &[&str]) -> Value {
    json!({"username": "a:alice", "uid": "u-1", "groups": groups})
}

/// Rows of the `claims` issuer: algorithms, time, audience, `requiredValue`, forgeries.
fn claims_rows(i: &Issuer) -> Vec<Row> {
    let base = with(
        i.claims(AUDIENCE, "alice"),
        json!({"uid": "u-1", "tenant": "acme", "groups": ["dev", "ops"]}),
    );
    let ok = |name: &str, changes: Value, expect: Value| {
        row(
            name,
            i.sign("RS256", with(base.clone(), changes)),
            Some(expect),
        )
    };
    let bad =
        |name: &str, changes: Value| row(name, i.sign("RS256", with(base.clone(), changes)), None);
    let t = now();
    let mut rows = vec![ok("RS256, every claim mapped", json!({}), alice(&AG))];
    for alg in [
        "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
    ] {
        rows.push(row(alg, i.sign(alg, base.clone()), Some(alice(&AG))));
    }
    rows.extend([
        ok(
            "groups claim a string",
            json!({"groups": "dev"}),
            alice(&["ag:dev", "system:authenticated"]),
        ),
        ok(
            "no groups claim",
            json!({"groups": null}),
            alice(&["system:authenticated"]),
        ),
        ok(
            "jti becomes the credential id",
            json!({"jti": "tok-1"}),
            json!({
            "username": "a:alice", "uid": "u-1", "groups": AG,
            "extra": {"authentication.kubernetes.io/credential-id": ["JTI=tok-1"]}}),
        ),
        ok(
            "aud an array holding ours",
            json!({"aud": ["someone-else", AUDIENCE]}),
            alice(&AG),
        ),
        ok(
            "the second configured audience",
            json!({"aud": SECOND_AUDIENCE}),
            alice(&AG),
        ),
        ok(
            "nbf 30 s ahead (inside kube's leeway)",
            json!({"nbf": t + 30}),
            alice(&AG),
        ),
        bad("wrong audience", json!({"aud": "someone-else"})),
        bad("expired a minute ago", json!({"exp": t - 60})),
        bad("no exp", json!({"exp": null})),
        // kube's vendored go-oidc allows one minute of leeway on nbf: 2 minutes ahead is
        // refused as 10 are (the real kube-apiserver refuses both).
        bad("nbf 2 minutes ahead", json!({"nbf": t + 120})),
        bad("nbf 10 minutes ahead", json!({"nbf": t + 600})),
        bad("tenant not the required value", json!({"tenant": "other"})),
        bad("required tenant claim missing", json!({"tenant": null})),
        bad("uid claim missing", json!({"uid": null})),
        bad("username claim not a string", json!({"sub": 42})),
        bad(
            "issuer not configured (falls to TokenReview)",
            json!({"iss": "https://127.0.0.1:9/nobody"}),
        ),
    ]);
    let valid = i.sign("RS256", base.clone());
    let forged = with(base.clone(), json!({"sub": "admin"}));
    rows.extend([
        row(
            "bad signature (payload swapped)",
            swap_payload(&valid, &forged),
            None,
        ),
        row("alg none", i.sign("none", base.clone()), None),
        row(
            "HS256 keyed with the public key",
            i.sign("HS256", base.clone()),
            None,
        ),
        row(
            "kid the issuer never published",
            i.sign_with_header(json!({"alg": "RS256", "kid": "nobody"}), base),
            None,
        ),
        row("not a JWT", "not-a-jwt.at.all".into(), None),
    ]);
    rows
}

/// Rows of the `cel` issuer: CEL mappings, extras, claim and user rules.
fn cel_rows(i: &Issuer) -> Vec<Row> {
    let base = with(
        i.claims(AUDIENCE, "bob"),
        json!({"roles": ["admin", "viewer"], "tenant": "acme", "levels": ["l1", "l2"]}),
    );
    let sign = |changes: Value| i.sign("ES256", with(base.clone(), changes));
    vec![
        row(
            "CEL username, groups, uid and extras",
            sign(json!({})),
            Some(json!({
            "username": "cel:bob", "uid": "uid-bob",
            "groups": ["role:admin", "role:viewer", "system:authenticated"],
            "extra": {"example.com/tenant": ["acme"], "example.com/levels": ["l1", "l2"]}})),
        ),
        row(
            "CEL empty lists map to nothing",
            sign(json!({"roles": [], "levels": []})),
            Some(json!({
            "username": "cel:bob", "uid": "uid-bob", "groups": ["system:authenticated"],
            "extra": {"example.com/tenant": ["acme"]}})),
        ),
        row(
            "CEL extras beside the credential id",
            sign(json!({"jti": "j-2"})),
            Some(json!({
            "username": "cel:bob", "uid": "uid-bob",
            "groups": ["role:admin", "role:viewer", "system:authenticated"],
            "extra": {"example.com/tenant": ["acme"], "example.com/levels": ["l1", "l2"],
                      "authentication.kubernetes.io/credential-id": ["JTI=j-2"]}})),
        ),
        row(
            "claim validation expression false",
            sign(json!({"tenant": "evil"})),
            None,
        ),
        row(
            "user validation rule false",
            sign(json!({"sub": "system:admin"})),
            None,
        ),
        row(
            "a mapped claim missing (CEL error)",
            sign(json!({"roles": null})),
            None,
        ),
    ]
}

/// Rows of the `email`, `discovery` and `down` issuers.
fn other_rows(s: &Issuers) -> Vec<Row> {
    let email = |changes: Value| {
        let claims = with(s.email.claims(AUDIENCE, "carol"), changes);
        s.email.sign("RS256", claims)
    };
    let carol = json!({"username": "carol@example.com", "groups": ["system:authenticated"]});
    vec![
        row(
            "email without email_verified",
            email(json!({"email": "carol@example.com"})),
            Some(carol.clone()),
        ),
        row(
            "email_verified true",
            email(json!({"email": "carol@example.com", "email_verified": true})),
            Some(carol),
        ),
        row(
            "email_verified false",
            email(json!({"email": "carol@example.com", "email_verified": false})),
            None,
        ),
        row(
            "email_verified a string",
            email(json!({"email": "carol@example.com", "email_verified": "true"})),
            None,
        ),
        row("email claim missing", email(json!({})), None),
        row(
            "issuer found by discoveryURL",
            s.discovery
                .sign("RS256", s.discovery.claims(AUDIENCE, "dave")),
            Some(json!({"username": "d:dave", "groups": ["system:authenticated"]})),
        ),
        row(
            "issuer that never answers",
            s.down.sign("RS256", s.down.claims(AUDIENCE, "erin")),
            None,
        ),
    ]
}

/// The whole table, minted now (times are relative to now).
pub fn rows(issuers: &Issuers) -> Vec<Row> {
    let mut rows = other_rows(issuers);
    rows.extend(claims_rows(&issuers.claims));
    rows.extend(cel_rows(&issuers.cel));
    rows
}

/// A valid token of each issuer that serves, to wait on until an authenticator has initialized.
pub fn first_tokens(issuers: &Issuers) -> Vec<(&'static str, String)> {
    let claims = with(
        issuers.claims.claims(AUDIENCE, "alice"),
        json!({"uid": "u-1", "tenant": "acme"}),
    );
    let cel = with(
        issuers.cel.claims(AUDIENCE, "bob"),
        json!({"roles": [], "tenant": "acme", "levels": []}),
    );
    let email = with(
        issuers.email.claims(AUDIENCE, "carol"),
        json!({"email": "c@example.com"}),
    );
    vec![
        ("claims", issuers.claims.sign("RS256", claims)),
        ("cel", issuers.cel.sign("RS256", cel)),
        ("email", issuers.email.sign("RS256", email)),
        (
            "discovery",
            issuers
                .discovery
                .sign("RS256", issuers.discovery.claims(AUDIENCE, "d")),
        ),
    ]
}

/// A token of the `claims` issuer for `aud` (valid otherwise), and whom it names.
pub fn claims_token(issuers: &Issuers, alg: &str, aud: &str) -> (String, Value) {
    let i = &issuers.claims;
    let claims = with(
        i.claims(aud, "alice"),
        json!({"uid": "u-1", "tenant": "acme"}),
    );
    (i.sign(alg, claims), alice(&["system:authenticated"]))
}

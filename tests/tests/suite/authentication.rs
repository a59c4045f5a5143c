//! Who the gateway says the caller is: bearer tokens checked by TokenReview (and cached), client
//! certificates from the client CA only, request-header identity only from a trusted front proxy,
//! impersonation only when the core's SubjectAccessReview allows it, and a forged identity never
//! reaching a backend, remote or core.

use std::time::Duration;

use bytes::Bytes;
use e2e::certs::{CertifiedPair, TestCa};
use e2e::harness;
use e2e::scenario::{
    self, json_or_null, path_arg, recorded, recorded_header, recorded_header_names, Scenario,
    WARDLE_GROUP,
};
use http::StatusCode;
use http_body_util::Full;
use serde_json::{json, Value};

const IDENTITY: &str = "/apis/wardle.example.com/v1alpha1/identity";

/// Request headers of one table row.
type Headers = &'static [(&'static str, &'static str)];

/// The core's policy: three token users, ordinary verbs for every authenticated user, reads for
/// anonymous, and alice may impersonate only `carol`, group `qa`, the service accounts of
/// namespace `team` and the plain user `system:serviceaccount:team:Admin` (no service account:
/// its name is not a DNS subdomain).
fn policy() -> Value {
    json!({
        "tokens": {
            "alice-token": {"username": "alice", "uid": "a-1", "groups": ["dev"], "extra": {"scopes": ["read"]}},
            "bob-token": {"username": "bob", "groups": ["ops"]},
            "eve-token": {"username": "eve\nadmin", "groups": ["dev"]}
        },
        "rules": [
            {"group": "system:authenticated", "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
             "apiGroups": ["*"], "resources": ["*"]},
            {"group": "system:unauthenticated", "verbs": ["get"], "apiGroups": ["*"], "resources": ["*"]},
            {"user": "alice", "verbs": ["impersonate"], "apiGroups": [""], "resources": ["users"], "resourceNames": ["carol"]},
            {"user": "alice", "verbs": ["impersonate"], "apiGroups": [""], "resources": ["groups"], "resourceNames": ["qa"]},
            {"user": "alice", "verbs": ["impersonate"], "apiGroups": [""], "resources": ["users"], "resourceNames": ["system:serviceaccount:team:Admin"]},
            {"user": "alice", "verbs": ["impersonate"], "apiGroups": [""], "resources": ["serviceaccounts"], "namespaces": ["team"]}
        ]
    })
}

/// A core with [`policy`], the wardle backend registered from a manifest directory, and a
/// gateway trusting `users-ca` for users and the returned `incoming-proxy-ca` (CN
/// `trusted-proxy`) for front proxies, with `extra` flags. Returns once the remote answers.
async fn start(extra: &[&str]) -> (Scenario, TestCa) {
    let builder =
        Scenario::wardle()
            .core_policy(policy())
            .apiservice(WARDLE_GROUP, "v1alpha1", "wardle");
    let incoming_proxy_ca = TestCa::new("incoming-proxy-ca");
    let incoming_file = incoming_proxy_ca
        .write(builder.pki().dir(), "incoming-proxy-ca")
        .unwrap();
    let incoming_file = path_arg(&incoming_file);
    let s = builder
        .gateway_args(&[
            "--requestheader-client-ca-file",
            &incoming_file,
            "--requestheader-allowed-names",
            "trusted-proxy",
        ])
        .gateway_args(extra)
        .start()
        .await;
    let ready = harness::wait_until(Duration::from_secs(10), || async {
        get(&s, None, IDENTITY, &[("authorization", "Bearer bob-token")])
            .await
            .0
            == StatusCode::OK
    })
    .await;
    assert!(ready, "the remote never became reachable:\n{}", s.logs());
    (s, incoming_proxy_ca)
}

/// GET through the gateway over HTTP/2, optionally with a client certificate.
async fn get(
    s: &Scenario,
    cert: Option<&CertifiedPair>,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    try_get(s, cert, path, headers)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

async fn try_get(
    s: &Scenario,
    cert: Option<&CertifiedPair>,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(StatusCode, Value), harness::HarnessError> {
    let (status, _, body) = scenario::try_get(&s.gateway, cert, path, headers).await?;
    Ok((status, json_or_null(&body)))
}

/// GET through the gateway over HTTP/1.1: the only version whose requests can carry
/// `Connection`, which names headers a proxy must drop.
async fn get_http1(
    s: &Scenario,
    cert: Option<&CertifiedPair>,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let client = s.gateway.http1_client(cert);
    let mut req = http::Request::get(format!("{}{path}", s.gateway.url()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::new())).unwrap();
    let (status, _, body) = harness::send(&client, req)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    (status, json_or_null(&body))
}

async fn token_reviews(s: &Scenario) -> usize {
    scenario::core_posts(&s.core, "/tokenreviews").await.len()
}

/// The request the core recorded for `path` since the last clear.
async fn recorded_by_core(s: &Scenario, path: &str) -> Value {
    let requests = scenario::core_requests(&s.core).await;
    recorded(&requests, path).clone()
}

fn groups(identity: &Value) -> Vec<String> {
    identity["groups"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .filter_map(|g| g.as_str().map(str::to_owned))
        .collect()
}

const FORGED: [(&str, &str); 4] = [
    ("authorization", "Bearer alice-token"),
    ("x-remote-user", "admin"),
    ("x-remote-group", "system:masters"),
    ("x-remote-extra-scopes", "all"),
];

// ---- bearer tokens ------------------------------------------------------------------------------

/// The remote sees alice as the core's TokenReview described her, nothing she claimed.
#[tokio::test]
async fn a_token_user_reaches_backends_as_exactly_themselves() {
    let (s, _) = start(&[]).await;
    let (status, identity) = get(&s, None, IDENTITY, &FORGED).await;
    assert_eq!(status, StatusCode::OK, "{identity}");
    assert_eq!(identity["user"], "alice", "{identity}");
    assert_eq!(identity["uid"], "a-1", "{identity}");
    assert_eq!(groups(&identity), ["dev", "system:authenticated"]);
    assert_eq!(identity["extra"], json!({"scopes": ["read"]}), "{identity}");
    assert_eq!(identity["tlsClientCN"], "aggregator");
    let raw = identity["headers"].to_string().to_ascii_lowercase();
    for leaked in ["system:masters", "admin", "alice-token", "authorization"] {
        assert!(!raw.contains(leaked), "{leaked} reached the backend: {raw}");
    }
}

/// The core gets alice's own token (it authenticates her itself) and none of the forgery.
#[tokio::test]
async fn a_token_user_reaches_the_core_with_their_own_token_and_no_forged_headers() {
    let (s, _) = start(&[]).await;
    scenario::clear_core_requests(&s.core).await;
    let (status, body) = get(&s, None, "/api/v1/namespaces/default/configmaps", &FORGED).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let list = recorded_by_core(&s, "/api/v1/namespaces/default/configmaps").await;
    assert_eq!(
        recorded_header(&list, "authorization"),
        ["Bearer alice-token"]
    );
    for h in ["x-remote-user", "x-remote-group", "x-remote-extra-scopes"] {
        assert!(
            recorded_header(&list, h).is_empty(),
            "{h} reached the core: {list}"
        );
    }
}

/// Forged impersonation is refused with kube's message and reaches nobody: one row per target.
#[tokio::test]
async fn impersonation_the_core_does_not_allow_is_refused_and_reaches_nobody() {
    let (s, _) = start(&[]).await;
    scenario::clear_core_requests(&s.core).await;
    for target in [IDENTITY, "/api/v1/namespaces/default/configmaps"] {
        let (status, body) = get(
            &s,
            None,
            target,
            &[
                ("authorization", "Bearer alice-token"),
                ("impersonate-user", "admin"),
            ],
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{target}: {body}");
        assert_eq!(body["kind"], "Status", "{target}: {body}");
        assert_eq!(body["reason"], "Forbidden", "{target}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.starts_with(
                r#"users "admin" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope"#
            ),
            "{target}: {message}"
        );
        assert_eq!(body["details"]["name"], "admin", "{target}: {body}");
        assert_eq!(body["details"]["kind"], "users", "{target}: {body}");
    }
    let requests = scenario::core_requests(&s.core).await;
    assert!(
        requests
            .iter()
            .all(|r| recorded_header(r, "impersonate-user").is_empty()
                && r["path"] != "/api/v1/namespaces/default/configmaps"),
        "a refused impersonation reached the core: {requests:?}"
    );
}

// ---- impersonation ------------------------------------------------------------------------------

const AS_CAROL: [(&str, &str); 3] = [
    ("authorization", "Bearer alice-token"),
    ("impersonate-user", "carol"),
    ("impersonate-group", "qa"),
];

#[tokio::test]
async fn impersonation_allowed_by_the_core_reaches_backends_as_the_impersonated_user() {
    let (s, _) = start(&[]).await;
    let (status, identity) = get(&s, None, IDENTITY, &AS_CAROL).await;
    assert_eq!(status, StatusCode::OK, "{identity}");
    assert_eq!(identity["user"], "carol", "{identity}");
    assert_eq!(groups(&identity), ["qa", "system:authenticated"]);
    assert!(
        !identity["headers"]
            .to_string()
            .to_ascii_lowercase()
            .contains("impersonate-"),
        "{identity}"
    );
}

/// Passthrough: the core gets alice's token and the impersonation she was allowed, and checks
/// both itself.
#[tokio::test]
async fn impersonation_allowed_by_the_core_passes_through_to_the_core() {
    let (s, _) = start(&[]).await;
    scenario::clear_core_requests(&s.core).await;
    let (status, body) = get(&s, None, "/api/v1/namespaces", &AS_CAROL).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let list = recorded_by_core(&s, "/api/v1/namespaces").await;
    assert_eq!(recorded_header(&list, "impersonate-user"), ["carol"]);
    assert_eq!(recorded_header(&list, "impersonate-group"), ["qa"]);
    assert_eq!(
        recorded_header(&list, "authorization"),
        ["Bearer alice-token"]
    );
}

/// One attribute not allowed refuses the whole request, and groups without a user is
/// malformed: one row per request, with the status and the start of the message it gets.
#[tokio::test]
async fn impersonation_with_an_attribute_not_allowed_or_no_user_is_refused() {
    let (s, _) = start(&[]).await;
    let cases: [(&str, Headers, StatusCode, &str); 2] = [
        (
            "a group not allowed",
            &[
                ("authorization", "Bearer alice-token"),
                ("impersonate-user", "carol"),
                ("impersonate-group", "system:masters"),
            ],
            StatusCode::FORBIDDEN,
            r#"groups "system:masters" is forbidden: User "alice" cannot impersonate resource "groups""#,
        ),
        (
            "groups without a user",
            &[
                ("authorization", "Bearer alice-token"),
                ("impersonate-group", "qa"),
            ],
            StatusCode::BAD_REQUEST,
            "",
        ),
    ];
    for (case, headers, want, message) in cases {
        let (status, body) = get(&s, None, IDENTITY, headers).await;
        assert_eq!(status, want, "{case}: {body}");
        if !message.is_empty() {
            assert!(
                body["message"].as_str().unwrap().starts_with(message),
                "{case}: {body}"
            );
        }
    }
}

/// A name shaped like a service account's whose namespace or name kube would not accept
/// (`serviceaccount.SplitUsername`: a DNS-1123 label and subdomain) is a plain user: the core is
/// asked whether alice may impersonate *users* of that name (not service accounts of namespace
/// `team`, which she may), and the backend gets no service-account groups. One row per name.
#[tokio::test]
async fn a_malformed_service_account_name_is_impersonated_as_a_plain_user() {
    let (s, _) = start(&[]).await;
    let as_user = |user: &'static str| {
        [
            ("authorization", "Bearer alice-token"),
            ("impersonate-user", user),
        ]
    };
    // The well-formed one is a service account, allowed by the serviceaccounts rule.
    let (status, identity) = get(
        &s,
        None,
        IDENTITY,
        &as_user("system:serviceaccount:team:default"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{identity}");
    assert_eq!(
        groups(&identity),
        [
            "system:serviceaccounts",
            "system:serviceaccounts:team",
            "system:authenticated"
        ]
    );
    // Allowed only as a user: a review of `serviceaccounts` would be allowed by the rule for
    // namespace team and add their groups.
    let (status, identity) = get(
        &s,
        None,
        IDENTITY,
        &as_user("system:serviceaccount:team:Admin"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{identity}");
    assert_eq!(identity["user"], "system:serviceaccount:team:Admin");
    assert_eq!(groups(&identity), ["system:authenticated"]);
    for user in [
        "system:serviceaccount:team:cluster admin",
        "system:serviceaccount:team:..",
    ] {
        let (status, body) = get(&s, None, IDENTITY, &as_user(user)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{user}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        let want = format!(
            r#"users "{user}" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope"#
        );
        assert!(message.starts_with(&want), "{user}: {body}");
    }
}

// ---- bearer tokens in a WebSocket subprotocol ---------------------------------------------------

/// `base64url.bearer.authorization.k8s.io.<token>`: how browsers and kubectl's WebSocket
/// transport send a token, which a WebSocket handshake cannot put in `Authorization`.
fn token_protocol(token: &str) -> String {
    use base64::Engine as _;
    format!(
        "base64url.bearer.authorization.k8s.io.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token)
    )
}

/// Opens a WebSocket handshake to `path` over HTTP/1.1 with `protocols` as
/// `Sec-WebSocket-Protocol`, and returns the response head.
async fn websocket_handshake(s: &Scenario, path: &str, protocols: &str) -> String {
    use tokio::io::AsyncWriteExt;
    let gateway = &s.gateway;
    let config =
        harness::tls_client_config(&gateway.ca_pem().unwrap(), None, &[b"http/1.1"]).unwrap();
    let mut tls = harness::tls_connect_with(gateway.addr, config)
        .await
        .unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Protocol: {protocols}\r\n\r\n",
        gateway.addr
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    harness::read_head(&mut tls, Duration::from_secs(5))
        .await
        .unwrap()
}

/// kube's `websocket.ProtocolAuthenticator`: a WebSocket upgrade whose only credential is a
/// token in the subprotocol list is that token's user, and the backend sees neither the token
/// nor its entry, only the other subprotocols (one of which it answers with).
#[tokio::test]
async fn a_token_in_the_websocket_subprotocol_authenticates_and_is_not_forwarded() {
    let (s, _) = start(&[]).await;
    let backend = s.backend("wardle");
    s.pki.clear_backend_requests(backend, "wardle").await;
    let exec = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders/first/exec";
    let protocols = format!("{}, v5.channel.k8s.io", token_protocol("alice-token"));
    let head = websocket_handshake(&s, exec, &protocols).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}\n{}", s.logs());
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-protocol: v5.channel.k8s.io"),
        "{head}"
    );
    let requests = s.pki.backend_requests(backend, "wardle").await;
    let upgrade = recorded(&requests, exec);
    assert_eq!(
        recorded_header(upgrade, "x-remote-user"),
        ["alice"],
        "{upgrade}"
    );
    assert_eq!(
        recorded_header(upgrade, "sec-websocket-protocol"),
        ["v5.channel.k8s.io"],
        "{upgrade}"
    );
    let raw = upgrade["headers"].to_string();
    for leaked in [
        "base64url.bearer",
        &token_protocol("alice-token")["base64url.bearer.authorization.k8s.io.".len()..],
        "alice-token",
    ] {
        assert!(!raw.contains(leaked), "{leaked} reached the backend: {raw}");
    }

    // To the core, the caller goes with the token as its credential, so the core
    // authenticates the same user itself (passthrough), and the subprotocols it negotiates
    // are the caller's others.
    scenario::clear_core_requests(&s.core).await;
    let pod_exec = "/api/v1/namespaces/default/pods/web-0/exec";
    let head = websocket_handshake(&s, pod_exec, &protocols).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let exec = recorded_by_core(&s, pod_exec).await;
    assert_eq!(
        recorded_header(&exec, "authorization"),
        ["Bearer alice-token"]
    );
    assert_eq!(
        recorded_header(&exec, "sec-websocket-protocol"),
        ["v5.channel.k8s.io"]
    );

    // A token the core rejects is kube's 401, whatever the request would have been allowed as
    // anonymously.
    let protocols = format!("{}, v5.channel.k8s.io", token_protocol("not-a-token"));
    let head = websocket_handshake(&s, pod_exec, &protocols).await;
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
}

// ---- client certificates ------------------------------------------------------------------------

/// A user certificate: CN/O is the identity, its X-Remote-* headers are ignored.
#[tokio::test]
async fn a_user_certificate_is_the_identity_at_backends_whatever_its_headers_claim() {
    let (s, _) = start(&[]).await;
    let dave = s.user("dave", &["dev"]);
    let (status, identity) = get(
        &s,
        Some(&dave),
        IDENTITY,
        &[
            ("x-remote-user", "admin"),
            ("x-remote-group", "system:masters"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{identity}");
    assert_eq!(identity["user"], "dave");
    assert_eq!(groups(&identity), ["dev", "system:authenticated"]);
}

/// To the core (passthrough), a certificate user goes as X-Remote-* set by the gateway.
#[tokio::test]
async fn a_user_certificate_reaches_the_core_as_request_headers_set_by_the_gateway() {
    let (s, _) = start(&[]).await;
    let dave = s.user("dave", &["dev"]);
    scenario::clear_core_requests(&s.core).await;
    let (status, _) = get(
        &s,
        Some(&dave),
        "/api/v1/namespaces",
        &[("x-remote-user", "admin")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let list = recorded_by_core(&s, "/api/v1/namespaces").await;
    assert_eq!(recorded_header(&list, "x-remote-user"), ["dave"]);
    assert_eq!(
        recorded_header(&list, "x-remote-group"),
        ["dev", "system:authenticated"]
    );
}

/// The trusted front proxy's X-Remote-* is the identity.
#[tokio::test]
async fn a_trusted_front_proxy_vouches_for_the_identity_in_its_headers() {
    let (s, incoming_proxy_ca) = start(&[]).await;
    let proxy = incoming_proxy_ca.issue_client("trusted-proxy", &[]);
    let (status, identity) = get(
        &s,
        Some(&proxy),
        IDENTITY,
        &[
            ("x-remote-user", "frank"),
            ("x-remote-group", "qa"),
            ("x-remote-extra-acme.com%2fproject", "p1"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{identity}");
    assert_eq!(identity["user"], "frank", "{identity}");
    assert_eq!(groups(&identity), ["qa", "system:authenticated"]);
    assert_eq!(identity["extra"], json!({"acme.com/project": ["p1"]}));
}

/// The UID a trusted front proxy names in `X-Remote-Uid` (kube's `--requestheader-uid-headers`
/// name) is the caller's UID, and goes on in `X-Remote-Uid` as kube-aggregator's proxy sends it:
/// to a remote APIService and to the core (passthrough, over our proxy certificate). A forged
/// second value never comes along.
#[tokio::test]
async fn a_front_proxys_uid_goes_on_in_x_remote_uid_to_backends_and_the_core() {
    let (s, incoming_proxy_ca) = start(&[]).await;
    let proxy = incoming_proxy_ca.issue_client("trusted-proxy", &[]);
    let frank = [
        ("x-remote-user", "frank"),
        ("x-remote-uid", "f-1"),
        ("x-remote-group", "qa"),
    ];
    let (status, identity) = get(&s, Some(&proxy), IDENTITY, &frank).await;
    assert_eq!(status, StatusCode::OK, "{identity}");
    assert_eq!(identity["user"], "frank", "{identity}");
    assert_eq!(identity["uid"], "f-1", "{identity}");
    assert_eq!(
        recorded_header(&identity, "x-remote-uid"),
        ["f-1"],
        "{identity}"
    );

    scenario::clear_core_requests(&s.core).await;
    let (status, body) = get(&s, Some(&proxy), "/api/v1/namespaces", &frank).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let list = recorded_by_core(&s, "/api/v1/namespaces").await;
    assert_eq!(recorded_header(&list, "x-remote-user"), ["frank"], "{list}");
    assert_eq!(recorded_header(&list, "x-remote-uid"), ["f-1"], "{list}");

    // A token user's UID comes from the TokenReview; whatever UID header she adds is dropped.
    let (status, identity) = get(
        &s,
        None,
        IDENTITY,
        &[
            ("authorization", "Bearer alice-token"),
            ("x-remote-uid", "forged"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{identity}");
    assert_eq!(
        recorded_header(&identity, "x-remote-uid"),
        ["a-1"],
        "{identity}"
    );
}

/// Certificates that vouch for nobody: one row each. A request-header CA certificate whose CN
/// is not allowed, the trusted proxy naming nobody, and a request-header certificate named like
/// a user get kube-apiserver's 401; a CA the gateway does not trust fails the handshake.
#[tokio::test]
async fn certificates_count_only_for_the_ca_they_belong_to() {
    let (s, incoming_proxy_ca) = start(&[]).await;
    let cases: [(&str, CertifiedPair, Headers); 3] = [
        (
            "a request-header certificate whose CN is not allowed",
            incoming_proxy_ca.issue_client("someone-else", &[]),
            &[("x-remote-user", "frank")],
        ),
        (
            "the trusted proxy naming nobody",
            incoming_proxy_ca.issue_client("trusted-proxy", &[]),
            &[],
        ),
        (
            "a request-header certificate named like a user",
            incoming_proxy_ca.issue_client("admin", &["system:masters"]),
            &[],
        ),
    ];
    for (case, cert, headers) in &cases {
        let (status, body) = get(&s, Some(cert), IDENTITY, headers).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{case}: {body}");
        assert_eq!(body["reason"], "Unauthorized", "{case}: {body}");
    }

    let mallory = TestCa::new("mallory-ca").issue_client("mallory", &["system:masters"]);
    let refused = try_get(&s, Some(&mallory), IDENTITY, &[]).await;
    assert!(refused.is_err(), "an untrusted CA: {refused:?}");
}

/// A certificate with several CNs names whom Go's `crypto/x509` names: the last CN, both as the
/// user (at the backend and at the core, which must agree on who it is) and for
/// `--requestheader-allowed-names`. One row per certificate.
#[tokio::test]
async fn a_certificate_with_several_common_names_is_named_by_the_last_one() {
    let (s, incoming_proxy_ca) = start(&[]).await;
    let two_names = s
        .pki
        .users_ca
        .issue_client_with_common_names(&["alice", "dave"], &["dev"]);
    let (status, identity) = get(&s, Some(&two_names), IDENTITY, &[]).await;
    assert_eq!(status, StatusCode::OK, "{identity}");
    assert_eq!(identity["user"], "dave", "{identity}");
    scenario::clear_core_requests(&s.core).await;
    let (status, _) = get(&s, Some(&two_names), "/api/v1/namespaces", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let list = recorded_by_core(&s, "/api/v1/namespaces").await;
    assert_eq!(recorded_header(&list, "x-remote-user"), ["dave"]);

    // Front proxies: allowed only when the last CN is an allowed name.
    let rows: [(&str, &[&str], StatusCode); 2] = [
        (
            "an allowed name first, another last",
            &["trusted-proxy", "someone-else"],
            StatusCode::UNAUTHORIZED,
        ),
        (
            "another name first, the allowed one last",
            &["someone-else", "trusted-proxy"],
            StatusCode::OK,
        ),
    ];
    for (case, names, want) in rows {
        let proxy = incoming_proxy_ca.issue_client_with_common_names(names, &[]);
        let (status, body) = get(&s, Some(&proxy), IDENTITY, &[("x-remote-user", "frank")]).await;
        assert_eq!(status, want, "{case}: {body}");
        if want == StatusCode::OK {
            assert_eq!(body["user"], "frank", "{case}: {body}");
        }
    }
}

/// Header names of a recorded request that a non-Go server (WSGI, Rack, nginx) would read as
/// identity headers although they are spelled with `_`.
fn underscore_identity_headers(request: &Value) -> Vec<String> {
    recorded_header_names(request)
        .into_iter()
        .filter(|n| n.contains('_'))
        .filter(|n| {
            let n = n.to_ascii_lowercase().replace('_', "-");
            n.starts_with("x-remote-") || n.starts_with("impersonate-")
        })
        .collect()
}

// ---- headers that must not reach the next hop -------------------------------------------------

/// HTTP/1.1 `Connection` names headers that stop at this hop; the identity the gateway sets for
/// the next hop is not among them. With our proxy certificate and no `X-Remote-User`, the core
/// would fall back to the certificate's own identity. The underscore spellings are identity
/// headers to non-Go servers.
const HOSTILE: [(&str, &str); 5] = [
    (
        "connection",
        "x-remote-user, x-remote-group, X-Remote-Uid, impersonate-user",
    ),
    ("x_remote_user", "admin"),
    ("X_Remote_Group", "system:masters"),
    ("x_remote_extra_scopes", "all"),
    ("impersonate_user", "admin"),
];

#[tokio::test]
async fn identity_headers_named_in_connection_still_reach_the_core() {
    let (s, _) = start(&[]).await;
    let dave = s.user("dave", &["dev"]);
    scenario::clear_core_requests(&s.core).await;
    let (status, body) = get_http1(&s, Some(&dave), "/api/v1/namespaces", &HOSTILE).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let list = recorded_by_core(&s, "/api/v1/namespaces").await;
    assert_eq!(recorded_header(&list, "x-remote-user"), ["dave"], "{list}");
    assert_eq!(
        recorded_header(&list, "x-remote-group"),
        ["dev", "system:authenticated"],
        "{list}"
    );
    assert!(
        underscore_identity_headers(&list).is_empty(),
        "underscore spellings reached the core: {list}"
    );
    let raw = list["headers"].to_string();
    assert!(
        !raw.contains("admin") && !raw.contains("system:masters"),
        "{raw}"
    );
}

/// The remote gets dave exactly, and none of the underscore spellings.
#[tokio::test]
async fn identity_headers_named_in_connection_still_reach_backends() {
    let (s, _) = start(&[]).await;
    let dave = s.user("dave", &["dev"]);
    let (status, identity) = get_http1(&s, Some(&dave), IDENTITY, &HOSTILE).await;
    assert_eq!(status, StatusCode::OK, "{identity}");
    assert_eq!(identity["user"], "dave", "{identity}");
    assert_eq!(groups(&identity), ["dev", "system:authenticated"]);
    let raw = identity["headers"].to_string();
    assert!(
        !raw.contains("admin") && !raw.contains("system:masters"),
        "{raw}"
    );
}

/// The headers kube-apiserver's mixed-version proxy (KEP-4020) reads as "a peer already
/// proxied this, serve it here": the one it sends (`peerproxy_handler.go`) and the one the KEP
/// and its docs name. A client that sends one would skip the core's peer routing.
const PEER_ROUTING: Headers = &[
    ("x-kubernetes-peer-proxied", "true"),
    ("X-Kubernetes-APIServer-Rerouted", "true"),
    ("x_kubernetes_peer_proxied", "true"),
];

/// Names in a recorded request that read (case and `_` aside) as one of [`PEER_ROUTING`].
fn peer_routing_headers(request: &Value) -> Vec<String> {
    recorded_header_names(request)
        .into_iter()
        .filter(|n| {
            let n = n.to_ascii_lowercase().replace('_', "-");
            n == "x-kubernetes-peer-proxied" || n == "x-kubernetes-apiserver-rerouted"
        })
        .collect()
}

/// A client-sent peer-proxy mark reaches neither the core (token caller, certificate caller,
/// impersonate mode) nor a remote APIService: one row per way in.
#[tokio::test]
async fn a_client_sent_peer_proxy_mark_reaches_neither_the_core_nor_a_backend() {
    let (s, _) = start(&[]).await;
    let dave = s.user("dave", &["dev"]);
    let alice: Vec<(&str, &str)> = [("authorization", "Bearer alice-token")]
        .into_iter()
        .chain(PEER_ROUTING.iter().copied())
        .collect();
    /// A way in: its name, the client certificate it presents, the headers it sends.
    type Row<'a> = (&'a str, Option<&'a CertifiedPair>, &'a [(&'a str, &'a str)]);
    let rows: [Row; 2] = [
        ("a token caller", None, &alice),
        ("a certificate caller", Some(&dave), PEER_ROUTING),
    ];
    for (case, cert, headers) in rows {
        scenario::clear_core_requests(&s.core).await;
        let (status, body) = get_http1(&s, cert, "/api/v1/namespaces", headers).await;
        assert_eq!(status, StatusCode::OK, "{case}: {body}");
        let list = recorded_by_core(&s, "/api/v1/namespaces").await;
        assert!(
            peer_routing_headers(&list).is_empty(),
            "{case}: the mark reached the core: {list}"
        );
        let (status, identity) = get_http1(&s, cert, IDENTITY, headers).await;
        assert_eq!(status, StatusCode::OK, "{case}: {identity}");
        let raw = identity["headers"].to_string().to_ascii_lowercase();
        assert!(
            !raw.contains("peer-proxied")
                && !raw.contains("peer_proxied")
                && !raw.contains("rerouted"),
            "{case}: the mark reached the backend: {raw}"
        );
    }

    let s = start_impersonating().await;
    scenario::clear_core_requests(&s.core).await;
    let (status, body) = get_http1(&s, None, "/api/v1/namespaces", &alice).await;
    assert_eq!(status, StatusCode::OK, "impersonate mode: {body}");
    let list = recorded_by_core(&s, "/api/v1/namespaces").await;
    assert!(
        peer_routing_headers(&list).is_empty(),
        "impersonate mode: the mark reached the core: {list}"
    );
}

// ---- the core's identity ------------------------------------------------------------------------

/// [`start`] with `--core-identity impersonate`: the gateway reaches the core with its own token.
async fn start_impersonating() -> Scenario {
    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), "gateway-token\n").unwrap();
    let token_path = scenario::path_arg(token_file.path());
    let (s, _) = start(&[
        "--core-identity",
        "impersonate",
        "--core-token-file",
        &token_path,
    ])
    .await;
    s
}

#[tokio::test]
async fn in_impersonate_mode_the_core_sees_the_caller_not_the_gateway() {
    let s = start_impersonating().await;
    let alice = [
        ("authorization", "Bearer alice-token"),
        (
            "connection",
            "impersonate-user, impersonate-group, impersonate-uid, impersonate-extra-scopes",
        ),
        ("impersonate_user", "admin"),
        ("Impersonate_Group", "system:masters"),
        ("x_remote_user", "admin"),
    ];

    scenario::clear_core_requests(&s.core).await;
    let (status, body) = get_http1(&s, None, "/api/v1/namespaces", &alice).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let list = recorded_by_core(&s, "/api/v1/namespaces").await;
    // The gateway's own token, so the core must be told whom it acts for.
    assert_eq!(
        recorded_header(&list, "authorization"),
        ["Bearer gateway-token"]
    );
    assert_eq!(
        recorded_header(&list, "impersonate-user"),
        ["alice"],
        "{list}"
    );
    assert_eq!(
        recorded_header(&list, "impersonate-group"),
        ["dev"],
        "{list}"
    );
    assert_eq!(recorded_header(&list, "impersonate-uid"), ["a-1"], "{list}");
    assert_eq!(
        recorded_header(&list, "impersonate-extra-scopes"),
        ["read"],
        "{list}"
    );
    assert!(
        underscore_identity_headers(&list).is_empty(),
        "underscore spellings reached the core: {list}"
    );
}

/// A user the gateway cannot name in a header is refused, not sent on with its name left out
/// (which, on our credentials, would be the gateway itself).
#[tokio::test]
async fn in_impersonate_mode_a_user_that_cannot_be_named_in_a_header_is_refused() {
    let s = start_impersonating().await;
    scenario::clear_core_requests(&s.core).await;
    let (status, body) = get_http1(
        &s,
        None,
        "/api/v1/namespaces",
        &[("authorization", "Bearer eve-token")],
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["reason"], "InternalError", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("username"), "{message}");
    let requests = scenario::core_requests(&s.core).await;
    assert!(
        requests.iter().all(|r| r["path"] != "/api/v1/namespaces"),
        "the refused request reached the core: {requests:?}"
    );
}

// ---- anonymous callers and caching --------------------------------------------------------------

#[tokio::test]
async fn without_anonymous_auth_only_health_answers_strangers() {
    let (s, _) = start(&["--anonymous-auth=false"]).await;
    let (status, body) = get(&s, None, "/api/v1/namespaces", &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Unauthorized");
    assert_eq!(body["code"], 401);
    let (status, _) = get(&s, None, IDENTITY, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    for probe in ["/readyz", "/livez", "/healthz", "/readyz/ping"] {
        let (status, _) = get(&s, None, probe, &[]).await;
        assert_eq!(status, StatusCode::OK, "{probe}");
    }
    // Only reading a probe is exempt: anything else there would go on to the core.
    scenario::clear_core_requests(&s.core).await;
    let client = s.gateway.http2_client(None);
    let refused = [
        ("POST", "/healthz"),
        ("DELETE", "/readyz/ping"),
        ("PUT", "/livez/x"),
    ];
    for (method, path) in refused {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", s.gateway.url()))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (status, _, _) = harness::send(&client, req).await.unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}");
    }
    let requests = scenario::core_requests(&s.core).await;
    assert!(
        requests.iter().all(|r| !refused
            .iter()
            .any(|(m, p)| r["method"] == *m && r["path"] == *p)),
        "an unauthenticated request reached the core: {requests:?}"
    );
    // Credentials still work.
    let (status, _) = get(
        &s,
        None,
        "/api/v1/namespaces",
        &[("authorization", "Bearer bob-token")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

/// Accepted and rejected tokens are both reviewed once: one sequence, since the second count
/// includes the first.
#[tokio::test]
async fn token_reviews_are_cached_both_ways() {
    let (s, _) = start(&[]).await;
    scenario::clear_core_requests(&s.core).await;
    for _ in 0..5 {
        let (status, _) = get(
            &s,
            None,
            "/api/v1/namespaces",
            &[("authorization", "Bearer alice-token")],
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = get(
            &s,
            None,
            IDENTITY,
            &[("authorization", "Bearer alice-token")],
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(
        token_reviews(&s).await,
        1,
        "{:?}",
        scenario::core_requests(&s.core).await
    );

    for _ in 0..3 {
        let (status, body) = get(
            &s,
            None,
            "/api/v1/namespaces",
            &[("authorization", "Bearer not-a-token")],
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        assert_eq!(body["message"], "Unauthorized");
    }
    assert_eq!(token_reviews(&s).await, 2, "a rejected token is cached too");
}

/// A burst of requests with one token nobody knows (what a client guessing tokens sends) makes
/// one TokenReview, not one per request: concurrent reviews of a token are shared, and the
/// rejection is then cached for the unauthorized TTL (10s).
#[tokio::test]
async fn a_burst_with_one_unknown_token_is_reviewed_once() {
    let (s, _) = start(&[]).await;
    scenario::clear_core_requests(&s.core).await;
    let client = s.gateway.http2_client(None);
    let url = format!("{}/api/v1/namespaces", s.gateway.url());
    let burst = (0..40).map(|_| {
        let req = http::Request::get(&url)
            .header("authorization", "Bearer random-7f3a9c")
            .body(Full::new(Bytes::new()))
            .unwrap();
        harness::send(&client, req)
    });
    for answer in futures::future::join_all(burst).await {
        let (status, _, _) = answer.unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(token_reviews(&s).await, 1, "one review for the burst");
    let (status, _) = get(
        &s,
        None,
        "/api/v1/namespaces",
        &[("authorization", "Bearer random-7f3a9c")],
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(token_reviews(&s).await, 1, "the rejection is cached");
}

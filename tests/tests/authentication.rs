//! Who the gateway says the caller is: bearer tokens checked by TokenReview (and cached), client
//! certificates from the client CA only, request-header identity only from a trusted front proxy,
//! impersonation only when the core's SubjectAccessReview allows it, and a forged identity never
//! reaching a backend, remote or core.

use std::time::Duration;

use bytes::Bytes;
use e2e::certs::{CertifiedPair, TestCa};
use e2e::harness;
use e2e::scenario::{self, json_or_null, path_arg, Pki, WardleScenario};
use http::StatusCode;
use http_body_util::Full;
use serde_json::{json, Value};

const IDENTITY: &str = "/apis/wardle.example.com/v1alpha1/identity";

/// The core's policy: three token users, ordinary verbs for every authenticated user, reads for
/// anonymous, and alice may impersonate only `carol` and group `qa`.
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
            {"user": "alice", "verbs": ["impersonate"], "apiGroups": [""], "resources": ["groups"], "resourceNames": ["qa"]}
        ]
    })
}

struct Scenario {
    setup: WardleScenario,
    incoming_proxy_ca: TestCa,
}

impl Scenario {
    /// A core with [`policy`], an aggregated backend served through an APIService from a
    /// manifest directory, and a gateway trusting `users-ca` for users and `incoming-proxy-ca`
    /// (CN `trusted-proxy`) for front proxies.
    async fn start(extra: &[&str]) -> Scenario {
        let pki = Pki::new();
        let incoming_proxy_ca = TestCa::new("incoming-proxy-ca");
        let incoming_file = incoming_proxy_ca
            .write(pki.dir(), "incoming-proxy-ca")
            .unwrap();
        let incoming_file = path_arg(&incoming_file);
        let front_proxy = [
            "--requestheader-client-ca-file",
            &incoming_file,
            "--requestheader-allowed-names",
            "trusted-proxy",
        ];
        let gateway_args = [&front_proxy[..], extra].concat();
        let setup = WardleScenario::start(pki, &policy(), &[], &gateway_args).await;
        let s = Scenario {
            setup,
            incoming_proxy_ca,
        };
        s.wait_for_backend().await;
        s
    }

    async fn wait_for_backend(&self) {
        let ready = harness::wait_until(Duration::from_secs(10), || async {
            self.get(None, IDENTITY, &[("authorization", "Bearer bob-token")])
                .await
                .0
                == StatusCode::OK
        })
        .await;
        assert!(
            ready,
            "the remote never became reachable:\n{}",
            self.setup.gateway.process.logs()
        );
    }

    /// GET through the gateway over HTTP/2, optionally with a client certificate.
    async fn get(
        &self,
        cert: Option<&CertifiedPair>,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        self.try_get(cert, path, headers)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// GET through the gateway over HTTP/1.1: the only version whose requests can carry
    /// `Connection`, which names headers a proxy must drop.
    async fn get_http1(
        &self,
        cert: Option<&CertifiedPair>,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let gateway = &self.setup.gateway;
        let client = harness::http1_client(&gateway.ca_pem().unwrap(), cert).unwrap();
        let mut req = http::Request::get(format!("{}{path}", gateway.url()));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::new())).unwrap();
        let (status, _, body) = harness::send(&client, req)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        (status, json_or_null(&body))
    }

    async fn try_get(
        &self,
        cert: Option<&CertifiedPair>,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, Value), harness::HarnessError> {
        let (status, _, body) = scenario::try_get(&self.setup.gateway, cert, path, headers).await?;
        Ok((status, json_or_null(&body)))
    }

    /// The requests the core recorded, oldest first.
    async fn core_requests(&self) -> Vec<Value> {
        scenario::core_requests(&self.setup.core).await
    }

    async fn clear_core_requests(&self) {
        scenario::clear_core_requests(&self.setup.core).await
    }

    async fn token_reviews(&self) -> usize {
        scenario::core_posts(&self.setup.core, "/tokenreviews")
            .await
            .len()
    }
}

fn groups(identity: &Value) -> Vec<String> {
    identity["groups"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .filter_map(|g| g.as_str().map(str::to_owned))
        .collect()
}

/// The value of header `name` in a recorded request (`[[name, value], ...]`), all values joined.
fn header(request: &Value, name: &str) -> Vec<String> {
    request["headers"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .filter(|pair| {
            pair[0]
                .as_str()
                .is_some_and(|n| n.eq_ignore_ascii_case(name))
        })
        .filter_map(|pair| pair[1].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_token_user_reaches_backends_as_exactly_themselves_and_forgeries_never_pass() {
    let s = Scenario::start(&[]).await;
    let forged = [
        ("authorization", "Bearer alice-token"),
        ("x-remote-user", "admin"),
        ("x-remote-group", "system:masters"),
        ("x-remote-extra-scopes", "all"),
    ];

    // The remote sees alice as the core's TokenReview described her, nothing she claimed.
    let (status, identity) = s.get(None, IDENTITY, &forged).await;
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

    // The core gets alice's own token (it authenticates her itself) and none of the forgery.
    s.clear_core_requests().await;
    let (status, body) = s
        .get(None, "/api/v1/namespaces/default/configmaps", &forged)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let requests = s.core_requests().await;
    let list = requests
        .iter()
        .find(|r| r["path"] == "/api/v1/namespaces/default/configmaps")
        .expect("the core saw the list");
    assert_eq!(header(list, "authorization"), ["Bearer alice-token"]);
    for h in ["x-remote-user", "x-remote-group", "x-remote-extra-scopes"] {
        assert!(header(list, h).is_empty(), "{h} reached the core: {list}");
    }

    // Forged impersonation is refused with kube's message and reaches nobody.
    s.clear_core_requests().await;
    for target in [IDENTITY, "/api/v1/namespaces/default/configmaps"] {
        let (status, body) = s
            .get(
                None,
                target,
                &[
                    ("authorization", "Bearer alice-token"),
                    ("impersonate-user", "admin"),
                ],
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["reason"], "Forbidden");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.starts_with(
                r#"users "admin" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope"#
            ),
            "{message}"
        );
        assert_eq!(body["details"]["name"], "admin", "{body}");
        assert_eq!(body["details"]["kind"], "users", "{body}");
    }
    let requests = s.core_requests().await;
    assert!(
        requests
            .iter()
            .all(|r| header(r, "impersonate-user").is_empty()
                && r["path"] != "/api/v1/namespaces/default/configmaps"),
        "a refused impersonation reached the core: {requests:?}"
    );
}

#[tokio::test]
async fn impersonation_allowed_by_the_core_is_honoured_everywhere() {
    let s = Scenario::start(&[]).await;
    let as_carol = [
        ("authorization", "Bearer alice-token"),
        ("impersonate-user", "carol"),
        ("impersonate-group", "qa"),
    ];
    let (status, identity) = s.get(None, IDENTITY, &as_carol).await;
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

    // Passthrough: the core gets alice's token and the impersonation she was allowed, and
    // checks both itself.
    s.clear_core_requests().await;
    let (status, body) = s.get(None, "/api/v1/namespaces", &as_carol).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let requests = s.core_requests().await;
    let list = requests
        .iter()
        .find(|r| r["path"] == "/api/v1/namespaces")
        .expect("the core saw the list");
    assert_eq!(header(list, "impersonate-user"), ["carol"]);
    assert_eq!(header(list, "impersonate-group"), ["qa"]);
    assert_eq!(header(list, "authorization"), ["Bearer alice-token"]);

    // One attribute not allowed refuses the whole request.
    let (status, body) = s
        .get(
            None,
            IDENTITY,
            &[
                ("authorization", "Bearer alice-token"),
                ("impersonate-user", "carol"),
                ("impersonate-group", "system:masters"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with(r#"groups "system:masters" is forbidden: User "alice" cannot impersonate resource "groups""#),
        "{body}"
    );

    // Groups without a user is malformed.
    let (status, _) = s
        .get(
            None,
            IDENTITY,
            &[
                ("authorization", "Bearer alice-token"),
                ("impersonate-group", "qa"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn certificates_count_only_for_the_ca_they_belong_to() {
    let s = Scenario::start(&[]).await;

    // A user certificate: CN/O is the identity, its X-Remote-* headers are ignored.
    let dave = s.setup.pki.user("dave", &["dev"]);
    let (status, identity) = s
        .get(
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

    // To the core (passthrough), a certificate user goes as X-Remote-* set by the gateway.
    s.clear_core_requests().await;
    let (status, _) = s
        .get(
            Some(&dave),
            "/api/v1/namespaces",
            &[("x-remote-user", "admin")],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let requests = s.core_requests().await;
    let list = requests
        .iter()
        .find(|r| r["path"] == "/api/v1/namespaces")
        .expect("the core saw the list");
    assert_eq!(header(list, "x-remote-user"), ["dave"]);
    assert_eq!(
        header(list, "x-remote-group"),
        ["dev", "system:authenticated"]
    );

    // The trusted front proxy's X-Remote-* is the identity.
    let proxy = s.incoming_proxy_ca.issue_client("trusted-proxy", &[]);
    let (status, identity) = s
        .get(
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

    // A certificate from the request-header CA whose CN is not allowed vouches for nothing and
    // is not a user either: 401, as kube-apiserver answers.
    let stranger = s.incoming_proxy_ca.issue_client("someone-else", &[]);
    let (status, body) = s
        .get(Some(&stranger), IDENTITY, &[("x-remote-user", "frank")])
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["reason"], "Unauthorized");
    // ...and neither is the trusted proxy naming nobody.
    let (status, _) = s.get(Some(&proxy), IDENTITY, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A request-header certificate is not a user certificate, whatever its CN says.
    let proxy_named_admin = s
        .incoming_proxy_ca
        .issue_client("admin", &["system:masters"]);
    let (status, _) = s.get(Some(&proxy_named_admin), IDENTITY, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A certificate from a CA the gateway does not trust fails the handshake.
    let mallory = TestCa::new("mallory-ca").issue_client("mallory", &["system:masters"]);
    let refused = s.try_get(Some(&mallory), IDENTITY, &[]).await;
    assert!(refused.is_err(), "{refused:?}");
}

/// Header names of a recorded request that a non-Go server (WSGI, Rack, nginx) would read as
/// identity headers although they are spelled with `_`.
fn underscore_identity_headers(request: &Value) -> Vec<String> {
    request["headers"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .filter_map(|pair| pair[0].as_str())
        .filter(|n| n.contains('_'))
        .filter(|n| {
            let n = n.to_ascii_lowercase().replace('_', "-");
            n.starts_with("x-remote-") || n.starts_with("impersonate-")
        })
        .map(str::to_owned)
        .collect()
}

/// The request the core recorded for `path`.
fn recorded<'a>(requests: &'a [Value], path: &str) -> &'a Value {
    requests
        .iter()
        .find(|r| r["path"] == path)
        .unwrap_or_else(|| panic!("the core never saw {path}: {requests:?}"))
}

#[tokio::test]
async fn identity_headers_named_in_connection_still_reach_backends() {
    let s = Scenario::start(&[]).await;
    let dave = s.setup.pki.user("dave", &["dev"]);
    // HTTP/1.1 `Connection` names headers that stop at this hop; the identity the gateway sets
    // for the next hop is not among them. With our proxy certificate and no `X-Remote-User`, the
    // core would fall back to the certificate's own identity.
    let hostile = [
        (
            "connection",
            "x-remote-user, x-remote-group, X-Remote-Uid, impersonate-user",
        ),
        ("x_remote_user", "admin"),
        ("X_Remote_Group", "system:masters"),
        ("x_remote_extra_scopes", "all"),
        ("impersonate_user", "admin"),
    ];

    s.clear_core_requests().await;
    let (status, body) = s
        .get_http1(Some(&dave), "/api/v1/namespaces", &hostile)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let requests = s.core_requests().await;
    let list = recorded(&requests, "/api/v1/namespaces");
    assert_eq!(header(list, "x-remote-user"), ["dave"], "{list}");
    assert_eq!(
        header(list, "x-remote-group"),
        ["dev", "system:authenticated"],
        "{list}"
    );
    assert!(
        underscore_identity_headers(list).is_empty(),
        "underscore spellings reached the core: {list}"
    );
    let raw = list["headers"].to_string();
    assert!(
        !raw.contains("admin") && !raw.contains("system:masters"),
        "{raw}"
    );

    // The remote gets dave exactly, and none of the underscore spellings.
    let (status, identity) = s.get_http1(Some(&dave), IDENTITY, &hostile).await;
    assert_eq!(status, StatusCode::OK, "{identity}");
    assert_eq!(identity["user"], "dave", "{identity}");
    assert_eq!(groups(&identity), ["dev", "system:authenticated"]);
    let raw = identity["headers"].to_string();
    assert!(
        !raw.contains("admin") && !raw.contains("system:masters"),
        "{raw}"
    );
}

#[tokio::test]
async fn in_impersonate_mode_the_core_sees_the_caller_not_the_gateway() {
    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), "gateway-token\n").unwrap();
    let token_path = scenario::path_arg(token_file.path());
    let s = Scenario::start(&[
        "--core-identity",
        "impersonate",
        "--core-token-file",
        &token_path,
    ])
    .await;
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

    s.clear_core_requests().await;
    let (status, body) = s.get_http1(None, "/api/v1/namespaces", &alice).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let requests = s.core_requests().await;
    let list = recorded(&requests, "/api/v1/namespaces");
    // The gateway's own token, so the core must be told whom it acts for.
    assert_eq!(header(list, "authorization"), ["Bearer gateway-token"]);
    assert_eq!(header(list, "impersonate-user"), ["alice"], "{list}");
    assert_eq!(header(list, "impersonate-group"), ["dev"], "{list}");
    assert_eq!(header(list, "impersonate-uid"), ["a-1"], "{list}");
    assert_eq!(header(list, "impersonate-extra-scopes"), ["read"], "{list}");
    assert!(
        underscore_identity_headers(list).is_empty(),
        "underscore spellings reached the core: {list}"
    );

    // A user the gateway cannot name in a header is refused, not sent on with its name left
    // out (which, on our credentials, would be the gateway itself).
    s.clear_core_requests().await;
    let (status, body) = s
        .get_http1(
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
    let requests = s.core_requests().await;
    assert!(
        requests.iter().all(|r| r["path"] != "/api/v1/namespaces"),
        "the refused request reached the core: {requests:?}"
    );
}

#[tokio::test]
async fn without_anonymous_auth_only_health_answers_strangers() {
    let s = Scenario::start(&["--anonymous-auth=false"]).await;
    let (status, body) = s.get(None, "/api/v1/namespaces", &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Unauthorized");
    assert_eq!(body["code"], 401);
    let (status, _) = s.get(None, IDENTITY, &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    for probe in ["/readyz", "/livez", "/healthz", "/readyz/ping"] {
        let (status, _) = s.get(None, probe, &[]).await;
        assert_eq!(status, StatusCode::OK, "{probe}");
    }
    // Only reading a probe is exempt: anything else there would go on to the core.
    s.clear_core_requests().await;
    let client = harness::http2_client(&s.setup.gateway.ca_pem().unwrap(), None).unwrap();
    let refused = [
        ("POST", "/healthz"),
        ("DELETE", "/readyz/ping"),
        ("PUT", "/livez/x"),
    ];
    for (method, path) in refused {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", s.setup.gateway.url()))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (status, _, _) = harness::send(&client, req).await.unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}");
    }
    let requests = s.core_requests().await;
    assert!(
        requests.iter().all(|r| !refused
            .iter()
            .any(|(m, p)| r["method"] == *m && r["path"] == *p)),
        "an unauthenticated request reached the core: {requests:?}"
    );
    // Credentials still work.
    let (status, _) = s
        .get(
            None,
            "/api/v1/namespaces",
            &[("authorization", "Bearer bob-token")],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn token_reviews_are_cached_both_ways() {
    let s = Scenario::start(&[]).await;
    s.clear_core_requests().await;
    for _ in 0..5 {
        let (status, _) = s
            .get(
                None,
                "/api/v1/namespaces",
                &[("authorization", "Bearer alice-token")],
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = s
            .get(None, IDENTITY, &[("authorization", "Bearer alice-token")])
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(s.token_reviews().await, 1, "{:?}", s.core_requests().await);

    for _ in 0..3 {
        let (status, body) = s
            .get(
                None,
                "/api/v1/namespaces",
                &[("authorization", "Bearer not-a-token")],
            )
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        assert_eq!(body["message"], "Unauthorized");
    }
    assert_eq!(s.token_reviews().await, 2, "a rejected token is cached too");
}

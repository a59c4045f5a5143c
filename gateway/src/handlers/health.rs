//! `/livez`, `/readyz` and `/healthz` for the gateway itself, in kube-apiserver's format: named
//! checks, `?verbose` to list them, `?exclude=<name>`, and `/<endpoint>/<check>` for one.
//! Controllers flip atomics; a probe only reads them.
//!
//! Anyone may read these endpoints (probes carry no credentials), so what they say is public:
//! like kube-apiserver's, the list names failing checks with "reason withheld" (the controller
//! that failed a check logs why), and a single check's answer says why with every address taken
//! out (see [`crate::error::without_addresses`]): a check's reason may name the core's URL.

use std::sync::Arc;

use http::{header, HeaderValue, StatusCode};

use crate::body::{full, Response};
use crate::error::without_addresses;
use crate::health_check::Check;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Endpoint {
    Livez,
    Readyz,
    Healthz,
}

// === impl Endpoint ===

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Self::Livez => "livez",
            Self::Readyz => "readyz",
            Self::Healthz => "healthz",
        }
    }

    /// The endpoint a path belongs to, and the single check it names (if any).
    pub fn from_path(path: &str) -> Option<(Self, Option<&str>)> {
        let (head, check) = match path.trim_start_matches('/').split_once('/') {
            Some((h, c)) => (h, Some(c).filter(|c| !c.is_empty())),
            None => (path.trim_start_matches('/'), None),
        };
        let endpoint = match head {
            "livez" => Self::Livez,
            "readyz" => Self::Readyz,
            "healthz" => Self::Healthz,
            _ => return None,
        };
        Some((endpoint, check))
    }
}

struct Registered {
    name: &'static str,
    endpoints: &'static [Endpoint],
    check: Arc<Check>,
}

/// The gateway's health checks. Built at start; the set is fixed afterwards.
pub struct Health {
    checks: Vec<Registered>,
}

pub const ALL: &[Endpoint] = &[Endpoint::Livez, Endpoint::Readyz, Endpoint::Healthz];
pub const READY: &[Endpoint] = &[Endpoint::Readyz, Endpoint::Healthz];
pub const READY_ONLY: &[Endpoint] = &[Endpoint::Readyz];
/// Checks that neither restart a replica nor take it out of service: what an operator asks
/// `/healthz` about, as of kube-controller-manager's `leaderElection`.
pub const HEALTHZ_ONLY: &[Endpoint] = &[Endpoint::Healthz];

// === impl Health ===

impl Health {
    pub fn new() -> Self {
        let mut h = Self { checks: Vec::new() };
        h.register("ping", ALL, Check::healthy());
        h
    }

    pub fn register(
        &mut self,
        name: &'static str,
        endpoints: &'static [Endpoint],
        check: Arc<Check>,
    ) {
        self.checks.push(Registered {
            name,
            endpoints,
            check,
        });
    }

    pub fn is_ready(&self) -> bool {
        self.checks
            .iter()
            .filter(|c| c.endpoints.contains(&Endpoint::Readyz))
            .all(|c| c.check.is_ok())
    }

    pub fn respond(&self, path: &str, query: &str) -> Option<Response> {
        let (endpoint, single) = Endpoint::from_path(path)?;
        let applies = |c: &&Registered| c.endpoints.contains(&endpoint);
        if let Some(name) = single {
            return Some(
                match self.checks.iter().filter(applies).find(|c| c.name == name) {
                    Some(c) if c.check.is_ok() => text(StatusCode::OK, "ok".into()),
                    Some(c) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!(
                            "internal server error: {}\n",
                            without_addresses(&c.check.reason())
                        ),
                    ),
                    None => text(
                        StatusCode::NOT_FOUND,
                        format!("no {} check named {name:?}\n", endpoint.name()),
                    ),
                },
            );
        }
        let mut verbose = false;
        let mut excluded: Vec<&str> = Vec::new();
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "verbose" => verbose = v != "false",
                "exclude" if !v.trim().is_empty() => excluded.push(v.trim()),
                _ => {}
            }
        }
        excluded.sort_unstable();
        excluded.dedup();
        let mut report = String::new();
        let mut failed = false;
        for c in self.checks.iter().filter(applies) {
            if let Some(at) = excluded.iter().position(|e| *e == c.name) {
                excluded.remove(at);
                report.push_str(&format!("[+]{} excluded: ok\n", c.name));
            } else if c.check.is_ok() {
                report.push_str(&format!("[+]{} ok\n", c.name));
            } else {
                failed = true;
                report.push_str(&format!("[-]{} failed: reason withheld\n", c.name));
            }
        }
        // An exclusion that names no check is likely a typo: say so, as kube-apiserver does.
        if !excluded.is_empty() {
            let names: Vec<String> = excluded.iter().map(|e| format!("{e:?}")).collect();
            report.push_str(&format!(
                "warn: some health checks cannot be excluded: no matches for {}\n",
                names.join(", ")
            ));
        }
        Some(if failed {
            report.push_str(&format!("{} check failed\n", endpoint.name()));
            text(StatusCode::INTERNAL_SERVER_ERROR, report)
        } else if verbose {
            report.push_str(&format!("{} check passed\n", endpoint.name()));
            text(StatusCode::OK, report)
        } else {
            text(StatusCode::OK, "ok".into())
        })
    }
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

fn text(code: StatusCode, body: String) -> Response {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body(resp: Response) -> (u16, String) {
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (code, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readyz_lists_checks_and_fails_with_reason() {
        let mut h = Health::new();
        let core = Check::unhealthy("core server at http://127.0.0.1:1 is unreachable");
        h.register("core-server", READY, core.clone());
        let (code, text) = body(h.respond("/readyz", "").unwrap()).await;
        assert_eq!(code, 500);
        assert!(
            text.contains("[+]ping ok\n[-]core-server failed: reason withheld\n"),
            "{text}"
        );
        let (code, one) = body(h.respond("/readyz/core-server", "").unwrap()).await;
        assert_eq!(code, 500);
        assert_eq!(
            one,
            "internal server error: core server at <address> is unreachable\n"
        );
        assert!(text.ends_with("readyz check failed\n"));
        // Liveness does not depend on the core.
        assert_eq!(
            body(h.respond("/livez", "").unwrap()).await,
            (200, "ok".into())
        );
        core.pass();
        assert_eq!(
            body(h.respond("/readyz", "").unwrap()).await,
            (200, "ok".into())
        );
        let (_, verbose) = body(h.respond("/readyz", "verbose").unwrap()).await;
        assert_eq!(
            verbose,
            "[+]ping ok\n[+]core-server ok\nreadyz check passed\n"
        );
    }

    #[tokio::test]
    async fn single_checks_and_exclusions() {
        let mut h = Health::new();
        h.register(
            "shutdown",
            READY_ONLY,
            Check::unhealthy("the gateway is shutting down"),
        );
        assert_eq!(body(h.respond("/readyz/ping", "").unwrap()).await.0, 200);
        assert_eq!(
            body(h.respond("/readyz/shutdown", "").unwrap()).await.0,
            500
        );
        assert_eq!(body(h.respond("/readyz/nope", "").unwrap()).await.0, 404);
        // A decoded path under an endpoint that names no check (kube's mux: no handler, 404)
        // is answered here, never sent on: the `probes` FlowSchema exempts all of `/healthz/`.
        let (code, text) = body(
            h.respond("/healthz/../api/v1/namespaces/default/configmaps", "")
                .unwrap(),
        )
        .await;
        assert_eq!(code, 404, "{text}");
        assert_eq!(
            body(h.respond("/readyz", "exclude=shutdown").unwrap())
                .await
                .0,
            200
        );
        assert!(h.respond("/version", "").is_none());
    }

    /// kube-apiserver's answer to an exclusion that matches no check: the check list says so,
    /// and the endpoint's result does not change.
    #[tokio::test]
    async fn an_exclusion_that_names_no_check_is_reported() {
        let mut h = Health::new();
        h.register("core-server", READY, Check::unhealthy("down"));
        assert_eq!(
            body(
                h.respond("/readyz", "verbose&exclude=core-server&exclude=core-sever")
                    .unwrap()
            )
            .await,
            (
                200,
                "[+]ping ok\n[+]core-server excluded: ok\nwarn: some health checks cannot be \
                 excluded: no matches for \"core-sever\"\nreadyz check passed\n"
                    .into()
            )
        );
        assert_eq!(
            body(h.respond("/readyz", "exclude=nope").unwrap()).await,
            (
                500,
                "[+]ping ok\n[-]core-server failed: reason withheld\nwarn: some health checks \
                 cannot be excluded: no matches for \"nope\"\nreadyz check failed\n"
                    .into()
            )
        );
        assert_eq!(
            body(h.respond("/readyz", "exclude=core-server").unwrap()).await,
            (200, "ok".into())
        );
    }
}

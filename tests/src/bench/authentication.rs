//! Structured authentication (issue 44): what a bearer token costs the gateway when it is a JWT
//! of an issuer in `--authentication-config` (verified in the gateway: no TokenReview) beside an
//! opaque token the core reviews (a TokenReview, cached by the token's hash for 2 minutes).
//!
//! A gateway of its own (the release binary) in front of the fixture core (`fixture-core`, plain
//! HTTP, as the main table's core), with an authentication config naming the fixture OIDC issuer
//! ([`crate::oidc::Issuer`], in this process; it serves discovery and the JWKS once, then
//! nothing). The same small GET (a ConfigMap the core was seeded with) on 32 HTTP/1.1 keep-alive
//! connections, in these rows:
//! 1. TokenReview path, one token repeated (reviewed once, then from the gateway's cache);
//! 2. TokenReview path, a fresh token per request (every request a review; the core's policy
//!    holds them all);
//! 3. JWT path, one RS256 JWT repeated;
//! 4. JWT path, a fresh RS256 JWT per request (its own `sub` and `jti`);
//! 5. JWT path, a fresh ES256 JWT per request.
//!
//! Rows 1 and 3 run in interleaved rounds (medians reported; noise on a shared machine hits
//! both alike), then each fresh row once. Fresh tokens are made (JWTs signed by the issuer)
//! before anything is timed; a fresh row ends when its tokens run out, if that comes before the
//! measuring window's end, so no token is used twice. Per row: requests/s and latency over the
//! measuring window; the gateway's (and the core's) CPU time (utime + stime from `/proc`) over
//! the whole row divided by its requests; the TokenReviews the core answered (its
//! `GET /fixture/tokenreviews` counter) per request; and for the JWT rows the gateway's own
//! `apiserver_authentication_jwt_authenticator_latency_seconds` (time per verification of a
//! token not in its cache).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{header, HeaderValue};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::load::{client_tls, connect, request, Endpoint, Proto, Sender};
use super::memory::CpuMeter;
use super::report::{Results, Row, Section};
use super::{median, round, BoxError, Settings};
use crate::certs::TestCa;
use crate::harness::{FixtureCore, Gateway, GatewayOptions};
use crate::oidc::Issuer;

pub const NAME: &str = "structured authentication";

const CONNECTIONS: usize = 32;
/// A ConfigMap the core is seeded with: a small 200 the core answers cheaply.
const PATH: &str = "/api/v1/namespaces/default/configmaps/bench";
const AUDIENCE: &str = "bench";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The JWT metric whose sum ÷ count is the gateway's time per verification (cache misses only).
const JWT_LATENCY: &str = "apiserver_authentication_jwt_authenticator_latency_seconds";

/// How many fresh tokens each fresh row gets, and how long a row measures.
struct Sizes {
    reviewed: usize,
    rs256: usize,
    es256: usize,
    warmup: Duration,
    /// The measuring window of a fresh row (it ends sooner when its tokens run out).
    window: Duration,
    /// The measuring window of each round of a repeated-token row.
    round_window: Duration,
    /// Rounds of each repeated-token row, interleaved (TokenReview, JWT, JWT, TokenReview...).
    rounds: usize,
}

impl Sizes {
    fn of(settings: &Settings) -> Sizes {
        if settings.short {
            Sizes {
                reviewed: 4_000,
                rs256: 1_500,
                es256: 3_000,
                warmup: Duration::from_millis(100),
                window: settings.duration.min(Duration::from_secs(1)),
                round_window: settings.duration.min(Duration::from_secs(1)),
                rounds: 1,
            }
        } else {
            // RS256 signing is about 1 ms a token (the issuer signs one at a time): 12 000 take
            // some 12 s before the timing starts, and last about 1.5 s at the JWT path's rate.
            Sizes {
                reviewed: 80_000,
                rs256: 12_000,
                es256: 40_000,
                warmup: Duration::from_millis(250),
                window: settings.duration.min(Duration::from_secs(3)),
                round_window: settings.duration.min(Duration::from_secs(2)),
                rounds: 3,
            }
        }
    }
}

/// The tokens of one row: one repeated, or each once.
struct Tokens {
    values: Arc<Vec<HeaderValue>>,
    repeat: bool,
}

impl Tokens {
    fn repeated(token: &str) -> Result<Tokens, BoxError> {
        Ok(Tokens {
            values: Arc::new(vec![bearer(token)?]),
            repeat: true,
        })
    }
    fn fresh(tokens: &[String]) -> Result<Tokens, BoxError> {
        let values = tokens.iter().map(|t| bearer(t)).collect::<Result<_, _>>()?;
        Ok(Tokens {
            values: Arc::new(values),
            repeat: false,
        })
    }
}

fn bearer(token: &str) -> Result<HeaderValue, BoxError> {
    Ok(HeaderValue::from_str(&format!("Bearer {token}"))?)
}

/// What one row's load measured.
#[derive(Default)]
struct Driven {
    /// Successful requests in the measuring window.
    requests: u64,
    /// Successful requests, warm-up included (CPU and reviews are divided by these).
    all_requests: u64,
    errors: u64,
    error_sample: Option<String>,
    seconds: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// The fresh tokens ran out before the window's end.
    exhausted: bool,
}

impl Driven {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9)
    }
}

#[derive(Default)]
struct WorkerStats {
    requests: u64,
    all_requests: u64,
    errors: u64,
    error_sample: Option<String>,
    latencies_us: Vec<u32>,
    last_measured: Option<Instant>,
    exhausted: bool,
}

async fn worker(
    mut sender: Sender,
    endpoint: Endpoint,
    tokens: Arc<Vec<HeaderValue>>,
    repeat: bool,
    next: Arc<AtomicUsize>,
    measure_from: Instant,
    end: Instant,
) -> WorkerStats {
    let mut stats = WorkerStats {
        latencies_us: Vec::with_capacity(32 * 1024),
        ..WorkerStats::default()
    };
    loop {
        let started = Instant::now();
        if started >= end {
            break;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        let token = if repeat {
            &tokens[i % tokens.len()]
        } else {
            match tokens.get(i) {
                Some(token) => token,
                None => {
                    stats.exhausted = true;
                    break;
                }
            }
        };
        let mut req = request(&endpoint, Proto::H1, PATH, None);
        req.headers_mut()
            .insert(header::AUTHORIZATION, token.clone());
        let exchange = async {
            let resp = sender.send(req).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>((status, body))
        };
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, exchange).await;
        let done = Instant::now();
        match outcome {
            Ok(Ok((status, _))) if status.is_success() => {
                stats.all_requests += 1;
                if started >= measure_from && done <= end {
                    stats.requests += 1;
                    let us = (done - started).as_micros().min(u32::MAX as u128) as u32;
                    stats.latencies_us.push(us);
                    stats.last_measured = Some(done);
                }
            }
            Ok(Ok((status, body))) => {
                stats.errors += 1;
                if stats.error_sample.is_none() {
                    let text = String::from_utf8_lossy(&body[..body.len().min(400)]);
                    stats.error_sample = Some(format!("{status}: {text}"));
                }
            }
            Ok(Err(e)) => {
                stats.errors += 1;
                stats.error_sample.get_or_insert_with(|| e.to_string());
                break;
            }
            Err(_) => {
                stats.errors += 1;
                stats.error_sample.get_or_insert_with(|| "timed out".into());
                break;
            }
        }
    }
    stats
}

/// The load of one row: [`CONNECTIONS`] connections opened first, then `warmup` unmeasured and
/// `window` measured (a fresh row ends sooner when its tokens run out).
async fn drive(
    endpoint: &Endpoint,
    tokens: &Tokens,
    warmup: Duration,
    window: Duration,
) -> Result<Driven, BoxError> {
    let ca = endpoint.ca_pem.as_deref().ok_or("the gateway is TLS")?;
    let tls = client_tls(ca, Proto::H1)?;
    let mut senders = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        senders.push(connect(endpoint, Some(&tls), Proto::H1).await?);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let measure_from = Instant::now() + warmup;
    let end = measure_from + window;
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|sender| {
            tokio::spawn(worker(
                sender,
                endpoint.clone(),
                tokens.values.clone(),
                tokens.repeat,
                next.clone(),
                measure_from,
                end,
            ))
        })
        .collect();
    let mut total = WorkerStats::default();
    for task in tasks {
        let s = task.await?;
        total.requests += s.requests;
        total.all_requests += s.all_requests;
        total.errors += s.errors;
        total.error_sample = total.error_sample.or(s.error_sample);
        total.latencies_us.extend(s.latencies_us);
        total.last_measured = total.last_measured.max(s.last_measured);
        total.exhausted |= s.exhausted;
    }
    total.latencies_us.sort_unstable();
    let seconds = match (total.exhausted, total.last_measured) {
        (true, Some(last)) => (last.min(end) - measure_from).as_secs_f64(),
        _ => window.as_secs_f64(),
    };
    Ok(Driven {
        requests: total.requests,
        all_requests: total.all_requests,
        errors: total.errors,
        error_sample: total.error_sample,
        seconds,
        p50_ms: super::load::percentile(&total.latencies_us, 50.0),
        p99_ms: super::load::percentile(&total.latencies_us, 99.0),
        exhausted: total.exhausted,
    })
}

/// One GET over a fresh connection: status and body.
async fn get(
    endpoint: &Endpoint,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), BoxError> {
    let tls = match endpoint.ca_pem.as_deref() {
        Some(ca) => Some(client_tls(ca, Proto::H1)?),
        None => None,
    };
    let mut sender = connect(endpoint, tls.as_ref(), Proto::H1).await?;
    let mut req = request(endpoint, Proto::H1, path, None);
    if let Some(token) = token {
        req.headers_mut()
            .insert(header::AUTHORIZATION, bearer(token)?);
    }
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, sender.send(req)).await??;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// TokenReviews the core has answered since it started.
async fn reviews(core: &Endpoint) -> Result<u64, BoxError> {
    let (status, body) = get(core, "/fixture/tokenreviews", None).await?;
    if status != 200 {
        return Err(format!("GET /fixture/tokenreviews on the core: {status} {body}").into());
    }
    let v: Value = serde_json::from_str(&body)?;
    v["count"]
        .as_u64()
        .ok_or_else(|| format!("no count in {body}").into())
}

/// TCP connections the core has accepted since it started.
async fn core_connections(core: &Endpoint) -> Result<u64, BoxError> {
    let (_, body) = get(core, "/fixture/connections", None).await?;
    let v: Value = serde_json::from_str(&body)?;
    v["accepted"]
        .as_u64()
        .ok_or_else(|| format!("no accepted count in {body}").into())
}

/// `(count, sum in seconds)` of the gateway's JWT verification histogram, successes only.
async fn jwt_latency(gateway: &Endpoint) -> (f64, f64) {
    let Ok((200, text)) = get(gateway, "/metrics", None).await else {
        return (f64::NAN, f64::NAN);
    };
    let mut count = 0.0;
    let mut sum = 0.0;
    for line in text.lines().filter(|l| l.contains("result=\"success\"")) {
        let value = || line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if line.starts_with(&format!("{JWT_LATENCY}_count")) {
            count += value().unwrap_or(0.0);
        } else if line.starts_with(&format!("{JWT_LATENCY}_sum")) {
            sum += value().unwrap_or(0.0);
        }
    }
    (count, sum)
}

/// One row's figures.
struct Measured {
    label: &'static str,
    path: &'static str,
    driven: Driven,
    gateway_cpu_us: f64,
    core_cpu_us: f64,
    reviews: u64,
    /// Verifications the gateway made (cache misses) and their mean time, from its histogram.
    verifications: Option<(f64, f64)>,
    /// The gateway's CPU µs per request in each round (one for a fresh row).
    cpu_rounds: Vec<f64>,
    /// TCP connections the gateway opened to the core during the row.
    core_connections: u64,
}

impl Measured {
    fn reviews_per_request(&self) -> f64 {
        self.reviews as f64 / self.driven.all_requests.max(1) as f64
    }
    fn to_json(&self) -> Value {
        json!({
            "row": self.label, "path": self.path,
            "requests_measured": self.driven.requests, "requests_all": self.driven.all_requests,
            "seconds": round(self.driven.seconds, 3),
            "requests_per_second": round(self.driven.rps(), 1),
            "p50_ms": round(self.driven.p50_ms, 3), "p99_ms": round(self.driven.p99_ms, 3),
            "gateway_cpu_us_per_request": round(self.gateway_cpu_us, 2),
            "core_cpu_us_per_request": round(self.core_cpu_us, 2),
            "token_reviews": self.reviews,
            "core_connections_opened": self.core_connections,
            "token_reviews_per_request": round(self.reviews_per_request(), 5),
            "tokens_ran_out": self.driven.exhausted,
            "jwt_verifications": self.verifications.map(|(n, _)| n),
            "jwt_verification_mean_us": self.verifications.map(|(_, us)| round(us, 2)),
            "gateway_cpu_us_per_request_rounds": self.cpu_rounds.iter().map(|v| round(*v, 2)).collect::<Vec<_>>(),
        })
    }

    /// Rounds of one row as one: medians of the rates, latencies and CPU; counts summed.
    fn combine(mut rounds: Vec<Measured>) -> Measured {
        if rounds.len() == 1 {
            return rounds.remove(0);
        }
        let med =
            |f: &dyn Fn(&Measured) -> f64| median(&mut rounds.iter().map(f).collect::<Vec<_>>());
        let rps = med(&|m| m.driven.rps());
        let p50_ms = med(&|m| m.driven.p50_ms);
        let p99_ms = med(&|m| m.driven.p99_ms);
        let gateway_cpu_us = med(&|m| m.gateway_cpu_us);
        let core_cpu_us = med(&|m| m.core_cpu_us);
        let requests: u64 = rounds.iter().map(|m| m.driven.requests).sum();
        let all_requests: u64 = rounds.iter().map(|m| m.driven.all_requests).sum();
        let verifications = rounds
            .iter()
            .filter_map(|m| m.verifications)
            .reduce(|(n, a), (k, b)| (n + k, (n * a + k * b) / (n + k).max(1.0)));
        Measured {
            label: rounds[0].label,
            path: rounds[0].path,
            driven: Driven {
                requests,
                all_requests,
                // So that rps() is the median rate.
                seconds: requests as f64 / rps.max(1e-9),
                p50_ms,
                p99_ms,
                ..Driven::default()
            },
            gateway_cpu_us,
            core_cpu_us,
            reviews: rounds.iter().map(|m| m.reviews).sum(),
            verifications,
            cpu_rounds: rounds.iter().map(|m| m.gateway_cpu_us).collect(),
            core_connections: rounds.iter().map(|m| m.core_connections).sum(),
        }
    }
}

/// The running issuer, core and gateway, and where the load goes.
struct Rig {
    gateway: Gateway,
    core: FixtureCore,
    via: Endpoint,
    core_endpoint: Endpoint,
    _issuer: Issuer,
    _dir: tempfile::TempDir,
}

impl Rig {
    async fn measure(
        &self,
        label: &'static str,
        path: &'static str,
        tokens: &Tokens,
        warmup: Duration,
        window: Duration,
    ) -> Result<Measured, BoxError> {
        eprintln!("bench:   {label}");
        let before = reviews(&self.core_endpoint).await?;
        let connections_before = core_connections(&self.core_endpoint).await?;
        let jwt_before = jwt_latency(&self.via).await;
        let meter = CpuMeter::start(&[self.gateway.process.id(), self.core.process.id()]);
        let driven = drive(&self.via, tokens, warmup, window).await?;
        let cpu = meter.per_request_us(driven.all_requests);
        let jwt_after = jwt_latency(&self.via).await;
        let after = reviews(&self.core_endpoint).await?;
        // Less the two look-ups' own connections.
        let connections = core_connections(&self.core_endpoint)
            .await?
            .saturating_sub(connections_before + 2);
        if driven.errors > 0 {
            return Err(format!(
                "{label}: {} of {} requests failed; first: {}",
                driven.errors,
                driven.errors + driven.all_requests,
                driven.error_sample.as_deref().unwrap_or("?")
            )
            .into());
        }
        if driven.requests == 0 {
            return Err(format!("{label}: nothing measured (too few tokens?)").into());
        }
        let verified = jwt_after.0 - jwt_before.0;
        let verifications = (path == "JWT" && verified.is_finite()).then(|| {
            (
                verified,
                (jwt_after.1 - jwt_before.1) * 1e6 / verified.max(1.0),
            )
        });
        let m = Measured {
            label,
            path,
            driven,
            gateway_cpu_us: cpu[0],
            core_cpu_us: cpu[1],
            reviews: after - before,
            verifications,
            cpu_rounds: vec![cpu[0]],
            core_connections: connections,
        };
        eprintln!(
            "bench:     {:.0} req/s, p99 {:.2} ms, gateway {:.1} µs/request, core {:.1} µs/request, {:.4} TokenReviews/request, {} new connections to the core",
            m.driven.rps(),
            m.driven.p99_ms,
            m.gateway_cpu_us,
            m.core_cpu_us,
            m.reviews_per_request(),
            m.core_connections
        );
        Ok(m)
    }
}

/// The authentication config: the issuer, its CA, a CEL username mapping and a claim for groups
/// (kube's usual OIDC shape, with an expression so the CEL path is measured).
fn authentication_config(issuer: &Issuer) -> String {
    let ca: String = issuer
        .ca_pem()
        .lines()
        .map(|l| format!("      {l}\n"))
        .collect();
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\njwt:\n\
         - issuer:\n    url: {url}\n    audiences: [{AUDIENCE}]\n    certificateAuthority: |\n{ca}\
         \x20 claimMappings:\n    username:\n      expression: '\"oidc:\" + claims.sub'\n    \
         groups:\n      claim: groups\n      prefix: \"oidc:\"\n",
        url = issuer.url()
    )
}

/// JWTs of `alg` for users `jwt-<alg>-<i>`, each with its own `jti`.
fn sign_many(issuer: &Issuer, alg: &str, n: usize) -> Vec<String> {
    let tag = alg.to_ascii_lowercase();
    (0..n)
        .map(|i| {
            let mut claims = issuer.claims(AUDIENCE, &format!("jwt-{tag}-{i}"));
            claims["jti"] = json!(format!("{tag}-{i}"));
            claims["groups"] = json!(["bench"]);
            issuer.sign(alg, claims)
        })
        .collect()
}

pub async fn run(
    settings: &Settings,
    gateway_binary: &std::path::Path,
    results: &mut Results,
) -> Result<(), BoxError> {
    eprintln!("bench: {NAME}: TokenReview path vs JWT path");
    let sizes = Sizes::of(settings);
    let dir = tempfile::Builder::new().prefix("bench-authn-").tempdir()?;
    let issuer = Issuer::start().await;

    // Every token before anything is timed (RS256 signing is the slow part).
    let signing = Instant::now();
    let (jwt_repeated, rs256, es256) = tokio::task::block_in_place(|| {
        (
            sign_many(&issuer, "RS256", 1).remove(0),
            sign_many(&issuer, "RS256", sizes.rs256),
            sign_many(&issuer, "ES256", sizes.es256),
        )
    });
    let signing = signing.elapsed();
    eprintln!(
        "bench:   signed {} RS256 and {} ES256 JWTs in {:.1} s",
        sizes.rs256 + 1,
        sizes.es256,
        signing.as_secs_f64()
    );
    let review_repeated = "bench-review-repeated".to_owned();
    let reviewed: Vec<String> = (0..sizes.reviewed)
        .map(|i| format!("bench-review-{i:06}"))
        .collect();
    let mut tokens = serde_json::Map::new();
    for t in std::iter::once(&review_repeated).chain(&reviewed) {
        tokens.insert(
            t.clone(),
            json!({"username": format!("user-{t}"), "groups": ["bench"]}),
        );
    }
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        serde_json::to_vec(&json!({"tokens": tokens, "rules": []}))?,
    )?;
    let seed = dir.path().join("seed.json");
    std::fs::write(
        &seed,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "bench", "namespace": "default"}, "data": {"k": "v"}})
        .to_string(),
    )?;
    let authn = dir.path().join("authentication.yaml");
    std::fs::write(&authn, authentication_config(&issuer))?;
    let proxy_ca = TestCa::try_new("bench-front-proxy-ca")?;
    let (proxy_cert, proxy_key) = proxy_ca
        .issue_client("aggregator", &[])
        .write(dir.path(), "proxy-client")?;

    let path_arg = |p: &std::path::Path| p.display().to_string();
    let core =
        FixtureCore::start(&["--policy", &path_arg(&policy), "--seed", &path_arg(&seed)]).await?;
    let options = GatewayOptions::new(core.url())
        .binary(gateway_binary)
        .args([
            "--apiservice-source".to_owned(),
            "none".to_owned(),
            "--authentication-config".to_owned(),
            path_arg(&authn),
            "--authorization-webhook=false".to_owned(),
            "--authorize-metrics=false".to_owned(),
            "--proxy-client-cert-file".to_owned(),
            path_arg(&proxy_cert),
            "--proxy-client-key-file".to_owned(),
            path_arg(&proxy_key),
        ])
        // As the setup's gateway: the access log would measure the log pipeline.
        .log_level("info,access=warn");
    let gateway = Gateway::start(options).await?;
    let via = Endpoint {
        addr: gateway.addr,
        ca_pem: Some(Arc::from(gateway.ca_pem()?)),
        client_cert: None,
    };
    let core_endpoint = Endpoint {
        addr: core.addr,
        ca_pem: None,
        client_cert: None,
    };
    let rig = Rig {
        gateway,
        core,
        via,
        core_endpoint,
        _issuer: issuer,
        _dir: dir,
    };

    // Ready: both paths answer 200 (the issuer's keys fetched, the repeated token reviewed).
    let deadline = Instant::now() + Duration::from_secs(30);
    for token in [&review_repeated, &jwt_repeated] {
        loop {
            match get(&rig.via, PATH, Some(token)).await {
                Ok((200, _)) => break,
                outcome if Instant::now() > deadline => {
                    return Err(format!(
                    "{NAME}: GET {PATH} through the gateway never answered 200: {outcome:?}\n{}",
                    rig.gateway.process.logs()
                )
                    .into())
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    // The gateway warmed up on the cheapest path before the first row.
    let review_once = Tokens::repeated(&review_repeated)?;
    drive(&rig.via, &review_once, settings.warmup, Duration::ZERO).await?;

    // The repeated-token rows in interleaved rounds (noise on a shared machine hits both
    // alike), then each fresh row once (its tokens are used once).
    let jwt_once = Tokens::repeated(&jwt_repeated)?;
    let (mut review_rounds, mut jwt_rounds) = (Vec::new(), Vec::new());
    let (w, rw) = (sizes.warmup, sizes.round_window);
    for i in 0..sizes.rounds {
        let review = ("1. TokenReview path, one token repeated", "TokenReview");
        let jwt = ("3. JWT path (RS256), one JWT repeated", "JWT");
        if i % 2 == 0 {
            review_rounds.push(rig.measure(review.0, review.1, &review_once, w, rw).await?);
            jwt_rounds.push(rig.measure(jwt.0, jwt.1, &jwt_once, w, rw).await?);
        } else {
            jwt_rounds.push(rig.measure(jwt.0, jwt.1, &jwt_once, w, rw).await?);
            review_rounds.push(rig.measure(review.0, review.1, &review_once, w, rw).await?);
        }
    }
    let mut fresh_rows = Vec::new();
    for (label, path, tokens) in [
        (
            "2. TokenReview path, a fresh token per request",
            "TokenReview",
            &reviewed,
        ),
        (
            "4. JWT path (RS256), a fresh JWT per request",
            "JWT",
            &rs256,
        ),
        (
            "5. JWT path (ES256), a fresh JWT per request",
            "JWT",
            &es256,
        ),
    ] {
        let tokens = Tokens::fresh(tokens)?;
        fresh_rows.push(rig.measure(label, path, &tokens, w, sizes.window).await?);
    }
    let mut fresh_rows = fresh_rows.into_iter();
    let (Some(two), Some(four), Some(five)) =
        (fresh_rows.next(), fresh_rows.next(), fresh_rows.next())
    else {
        unreachable!("three fresh rows");
    };
    let rows = vec![
        Measured::combine(review_rounds),
        two,
        Measured::combine(jwt_rounds),
        four,
        five,
    ];
    report(&rows, signing, results);
    Ok(())
}

fn report(rows: &[Measured], signing: Duration, results: &mut Results) {
    let mut table = String::from(
        "| row | req/s | p50 | p99 | gateway CPU per request | core CPU per request | TokenReviews per request | JWT verifications: mean time (count) | requests measured |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for m in rows {
        let verification = match m.verifications {
            Some((n, us)) if n > 0.0 => format!("{us:.1} µs ({n:.0})"),
            Some(_) => "— (0: cached)".to_owned(),
            None => "—".to_owned(),
        };
        let ran_out = if m.driven.exhausted {
            format!(" in {:.2} s (tokens ran out)", m.driven.seconds)
        } else if m.cpu_rounds.len() > 1 {
            let cpu: Vec<String> = m.cpu_rounds.iter().map(|v| format!("{v:.1}")).collect();
            format!(
                " in {} rounds (gateway CPU {} µs)",
                m.cpu_rounds.len(),
                cpu.join(", ")
            )
        } else {
            String::new()
        };
        table.push_str(&format!(
            "| {} | {:.0} | {:.3} ms | {:.3} ms | {:.1} µs | {:.1} µs | {:.4} | {} | {}{} |\n",
            m.label,
            m.driven.rps(),
            m.driven.p50_ms,
            m.driven.p99_ms,
            m.gateway_cpu_us,
            m.core_cpu_us,
            m.reviews_per_request(),
            verification,
            m.driven.requests,
            ran_out,
        ));
    }
    let intro = format!(
        "A gateway of its own in front of the fixture core (plain HTTP), with \
         `--authentication-config` naming the fixture OIDC issuer (username from a CEL expression, \
         groups from a claim); the same small GET (`{PATH}`) on {CONNECTIONS} HTTP/1.1 keep-alive \
         connections over TLS; the repeated-token rows (1 and 3) in interleaved rounds, medians shown, \
         then each fresh row once. CPU per request: the process's utime + \
         stime (`/proc`) over the row, warm-up included, divided by its requests. TokenReviews: \
         the core's own count (`GET /fixture/tokenreviews`) over the row, per request. JWT \
         verifications: the gateway's `{JWT_LATENCY}` (sum ÷ count, cache misses only). The \
         fresh JWTs were signed before the timing ({:.1} s); a fresh row ends when its tokens run \
         out.\n\n",
        signing.as_secs_f64()
    );
    results.sections.push(Section::new(
        "structured authentication: a JWT costs no TokenReview (issue 44)",
        format!("{intro}{table}"),
    ));
    results.raw.insert(
        NAME.to_owned(),
        json!({"rows": rows.iter().map(Measured::to_json).collect::<Vec<_>>(),
               "signing_seconds": round(signing.as_secs_f64(), 2)}),
    );
    // In the main table: the TokenReview path in the direct column, the JWT path in the via one.
    let pairs = [
        ("one bearer token repeated", &rows[0], &rows[2]),
        (
            "a fresh bearer token per request (RS256)",
            &rows[1],
            &rows[3],
        ),
    ];
    for (shape, review, jwt) in pairs {
        let scenario = format!(
            "{NAME}: small GET, HTTP/1.1, {CONNECTIONS} connections, {shape}: TokenReview path \
             (direct column) vs JWT path (via column)"
        );
        results.rows.push(
            Row::new(&scenario, "throughput", "req/s")
                .values(Some(review.driven.rps()), Some(jwt.driven.rps())),
        );
        results.rows.push(
            Row::new(&scenario, "CPU per request: gateway", "µs")
                .values(Some(review.gateway_cpu_us), Some(jwt.gateway_cpu_us))
                .note(format!(
                    "core: {:.1} µs vs {:.1} µs",
                    review.core_cpu_us, jwt.core_cpu_us
                )),
        );
        results.rows.push(
            Row::new(&scenario, "TokenReviews on the core per request", "")
                .values(
                    Some(review.reviews_per_request()),
                    Some(jwt.reviews_per_request()),
                )
                .target("0 on the JWT path", Some(jwt.reviews == 0)),
        );
    }
}

//! How fast what changes around the gateway reaches the route table, availability and discovery,
//! as a user sees it: a new APIService is served and discovered, an endpoint appearing on the core
//! makes its APIService Available, a killed backend gets a 503, goes `Stale` in discovery and
//! `Available=False`, and is routed again as soon as it is back, a flaky backend is not punished,
//! and a hung backend holds back no other APIService.
//!
//! Each test times one reaction with [`Instant`] from the change to the first observation (polled
//! every [`POLL`]), prints it as `reaction: <what> <ms> ms` (`cargo test -- --nocapture` shows the
//! lines; they are the before/after figures of the control-loop redesign), and asserts a bound
//! generous enough for a loaded machine but well below any fixed interval that could explain it.

use std::future::Future;
use std::time::{Duration, Instant};

use e2e::certs::CertifiedPair;
use e2e::harness::{self, assert_within, FixtureCore, Gateway, HttpClient, Stopped};
use e2e::scenario::{self, available_condition, create_on_core, ApiService, Pki, Scenario};
use http::StatusCode;
use serde_json::Value;

const GROUP: &str = "wardle.example.com";
const NAME: &str = "v1alpha1.wardle.example.com";
const FLUNDERS: &str = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// How often an observation is repeated while waiting for a reaction.
const POLL: Duration = Duration::from_millis(25);

/// Repeats `observed` every [`POLL`] until it holds, prints the time from `since` to that first
/// observation as `reaction: <what> <ms> ms` and returns it; `None` if it did not hold by `limit`
/// after `since`.
async fn reaction<F, Fut>(
    what: &str,
    since: Instant,
    limit: Duration,
    mut observed: F,
) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    loop {
        if observed().await {
            let took = since.elapsed();
            eprintln!("reaction: {what} {} ms", took.as_millis());
            return Some(took);
        }
        if since.elapsed() >= limit {
            eprintln!("reaction: {what} none within {} ms", limit.as_millis());
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A user's own HTTP/2 connection to the gateway, reused across polls so that a poll measures
/// the gateway and not a TLS handshake.
struct User {
    client: HttpClient,
    base: String,
}

impl User {
    fn new(gateway: &Gateway, user: &CertifiedPair) -> User {
        User {
            client: gateway.http2_client(Some(user)),
            base: gateway.url(),
        }
    }

    /// GET `path` with `accept`: the status and the body as JSON (`null` if it is not); `None`
    /// without an answer.
    async fn get(&self, path: &str, accept: &str) -> Option<(StatusCode, Value)> {
        let req = http::Request::get(format!("{}{path}", self.base))
            .header("accept", accept)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let (status, _, body) = harness::send(&self.client, req).await.ok()?;
        Some((status, scenario::json_or_null(&body)))
    }

    /// Whether `path` is served by the backend: a 200 `FlunderList`.
    async fn reaches_backend(&self, path: &str) -> bool {
        self.get(path, "application/json")
            .await
            .is_some_and(|(status, body)| status == StatusCode::OK && body["kind"] == "FlunderList")
    }

    /// The 503 `Status` message for `path`, if that is the answer.
    async fn unavailable_message(&self, path: &str) -> Option<String> {
        let (status, body) = self.get(path, "application/json").await?;
        (status == StatusCode::SERVICE_UNAVAILABLE && body["kind"] == "Status")
            .then(|| body["message"].as_str().unwrap_or_default().to_owned())
    }

    /// Whether aggregated `/apis` lists flunders in exactly `v1alpha1`, with `freshness`.
    async fn flunders_discovered_as(&self, freshness: &str) -> bool {
        self.discovered(GROUP, "flunders").await == [("v1alpha1".to_owned(), freshness.to_owned())]
    }

    /// The versions of `group` in the merged aggregated `/apis` that list `resource`, each with
    /// its `freshness`.
    async fn discovered(&self, group: &str, resource: &str) -> Vec<(String, String)> {
        let Some((StatusCode::OK, doc)) = self.get("/apis", AGGREGATED).await else {
            return Vec::new();
        };
        doc["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| g["metadata"]["name"] == group)
            .flat_map(|g| g["versions"].as_array().cloned().unwrap_or_default())
            .filter(|v| {
                v["resources"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r["resource"] == resource)
            })
            .map(|v| {
                let field = |name: &str| v[name].as_str().unwrap_or_default().to_owned();
                (field("version"), field("freshness"))
            })
            .collect()
    }
}

/// `apiservice` stored straight on the core, as `kubectl apply` would (without kubectl's own
/// start-up time in a measurement).
async fn create_apiservice_on_core(core: &FixtureCore, apiservice: &ApiService) {
    let object: Value = serde_saphyr::from_str(&apiservice.yaml()).unwrap();
    assert_eq!(
        create_on_core(core, "/apis/apiregistration.k8s.io/v1/apiservices", object).await,
        StatusCode::CREATED
    );
}

/// Waits up to `timeout` for APIService `name`'s `Available` condition on the core to be
/// `(status, reason)`.
async fn wait_for_condition(core: &FixtureCore, name: &str, want: (&str, &str), timeout: Duration) {
    let seen = harness::wait_until(timeout, || async {
        available_condition(core, name)
            .await
            .is_some_and(|(status, reason)| (status.as_str(), reason.as_str()) == want)
    })
    .await;
    assert!(
        seen,
        "{name}: Available is {:?}, not {want:?}",
        available_condition(core, name).await
    );
}

/// With the file source, a manifest for a new APIService is routed and discovered as soon as it
/// is written: no availability round (60 s here) and no discovery refresh (60 s) is waited for.
#[tokio::test]
async fn a_new_apiservice_manifest_is_served_and_discovered_at_once() {
    let s = Scenario::wardle()
        .file_source()
        .availability_interval("60s")
        .start()
        .await;
    let alice = User::new(&s.gateway, &s.user("alice", &[]));
    // Not registered yet: the core has no such group.
    assert_eq!(
        alice
            .get(FLUNDERS, "application/json")
            .await
            .map(|(status, _)| status),
        Some(StatusCode::NOT_FOUND)
    );

    let since = Instant::now();
    s.register(&s.pki.apiservice(GROUP, "v1alpha1", "wardle"));
    let limit = Duration::from_secs(10);
    let (routed, discovered) = tokio::join!(
        reaction(
            "new APIService manifest -> request reaches the backend",
            since,
            limit,
            || alice.reaches_backend(FLUNDERS)
        ),
        reaction(
            "new APIService manifest -> listed in aggregated /apis",
            since,
            limit,
            || async { alice.flunders_discovered_as("Current").await }
        ),
    );
    // The file watch's 200 ms burst window, one probe, one discovery fetch.
    assert_within("routed", routed, Duration::from_secs(3));
    assert_within("discovered", discovered, Duration::from_secs(3));
}

/// With the kube source, an APIService whose Service has no endpoints becomes Available as soon
/// as an EndpointSlice with a ready endpoint appears on the core, and serves requests: the next
/// availability check (60 s here) is not waited for.
#[tokio::test]
async fn a_new_endpointslice_makes_its_apiservice_available_at_once() {
    // No static services map: the backend is found through the core's Service and endpoints.
    let s = Scenario::wardle()
        .without_static_services()
        .availability_interval("60s")
        .start()
        .await;
    let port = s.backend("wardle").addr.port();
    let alice_pair = s.user("alice", &[]);
    let kubectl = s.kubectl(&alice_pair);
    let alice = User::new(&s.gateway, &alice_pair);

    scenario::create_wardle_service(&s.core, port).await;
    kubectl
        .apply_yaml(
            &s.pki
                .apiservice(GROUP, "v1alpha1", "wardle")
                .port(port)
                .yaml(),
        )
        .await;
    wait_for_condition(
        &s.core,
        NAME,
        ("False", "EndpointsNotFound"),
        Duration::from_secs(10),
    )
    .await;

    let since = Instant::now();
    assert_eq!(
        scenario::create_endpoint_slice(&s.core, "api-abcde", port, true).await,
        StatusCode::CREATED
    );
    let limit = Duration::from_secs(10);
    let (available, routed) = tokio::join!(
        reaction(
            "new EndpointSlice -> Available True on the core",
            since,
            limit,
            || async {
                available_condition(&s.core, NAME)
                    .await
                    .is_some_and(|(status, _)| status == "True")
            }
        ),
        reaction(
            "new EndpointSlice -> request reaches the backend",
            since,
            limit,
            || alice.reaches_backend(FLUNDERS)
        ),
    );
    // The resolver's watch, one probe and one status write.
    assert_within("Available", available, Duration::from_secs(3));
    assert_within("routed", routed, Duration::from_secs(3));
    scenario::wait_for_apiservice_row(&kubectl, NAME, "True", Duration::from_secs(5)).await;
}

/// Where the APIService of a kill-and-restart session comes from.
#[derive(Clone, Copy, PartialEq)]
enum Registered {
    /// On the core (the kube source): the `Available` condition is written back and timed too.
    OnCore,
    /// A manifest in the gateway's directory (the file source).
    InFile,
}

/// A backend killed, then started again on the same port, at the gateway's default availability
/// interval (30 s, as most users run it), so nothing here can be a periodic check:
/// * killed → aggregated `/apis` shows its versions `Stale` (3 s) and, on the core,
///   `Available=False` (5 s), with no request sent to it; requests then get the 503 Status
///   naming the APIService (3 s from the kill);
/// * down for 6 s, then back → requests reach it, `/apis` shows it `Current` and
///   `Available=True` (3 s each), without any traffic asking for it.
///
/// Before: the kill was noticed only through a refused connection on a request (or the next
/// check, 30 s), and the return only at the next retry of the failed check, whose backoff had
/// grown to seconds by then (up to kube-aggregator's cap of 30 s).
async fn a_killed_backend_is_noticed_and_its_return_too(registered: Registered) {
    let builder = Scenario::wardle().availability_interval("30s");
    let mut s = match registered {
        Registered::OnCore => builder.start().await,
        Registered::InFile => {
            builder
                .apiservice(GROUP, "v1alpha1", "wardle")
                .start()
                .await
        }
    };
    if registered == Registered::OnCore {
        create_apiservice_on_core(&s.core, &s.pki.apiservice(GROUP, "v1alpha1", "wardle")).await;
    }
    let alice = User::new(&s.gateway, &s.user("alice", &[]));
    let ready = harness::wait_until(Duration::from_secs(10), || async {
        alice.reaches_backend(FLUNDERS).await
            && alice.flunders_discovered_as("Current").await
            && (registered == Registered::InFile || condition_is(&s.core, "True").await)
    })
    .await;
    assert!(
        ready,
        "{NAME} was never served and discovered\n{}",
        s.logs()
    );

    let port = s.backend("wardle").addr.port();
    let since = Instant::now();
    s.backend_mut("wardle").process.kill();
    let limit = Duration::from_secs(10);
    // First without a single request to the backend: the gateway notices on its own.
    let (stale, unavailable) = tokio::join!(
        reaction(
            "killed backend -> Stale in aggregated /apis",
            since,
            limit,
            || alice.flunders_discovered_as("Stale")
        ),
        condition_reaction(
            registered,
            "killed backend -> Available=False on the core",
            since,
            || condition_is(&s.core, "False")
        ),
    );
    let refused = reaction(
        "killed backend -> 503 naming the APIService",
        since,
        limit,
        || async {
            alice
                .unavailable_message(FLUNDERS)
                .await
                .is_some_and(|m| m.contains(NAME))
        },
    )
    .await;
    assert_within("Stale", stale, Duration::from_secs(3));
    assert_within("Available=False", unavailable, Duration::from_secs(5));
    assert_within("503", refused, Duration::from_secs(3));

    // Down long enough for a backoff from 5 ms to have grown to seconds: kube-aggregator's
    // retries at about 2.6 s and 5.1 s, then 10.2 s (its cap is 30 s).
    tokio::time::sleep(Duration::from_secs(6)).await;
    // The same port, as a restarted Pod behind the same Service would be.
    let listen = format!("127.0.0.1:{port}");
    let backend = s
        .pki
        .start_backend(GROUP, "v1alpha1", &["--listen", &listen])
        .await;
    let since = Instant::now();
    *s.backend_mut("wardle") = backend;
    let (routed, current, available) = tokio::join!(
        reaction("backend back -> request reaches it", since, limit, || alice
            .reaches_backend(FLUNDERS)),
        reaction(
            "backend back -> Current in aggregated /apis",
            since,
            limit,
            || alice.flunders_discovered_as("Current")
        ),
        condition_reaction(
            registered,
            "backend back -> Available=True on the core",
            since,
            || condition_is(&s.core, "True")
        ),
    );
    assert_within("routed again", routed, Duration::from_secs(3));
    assert_within("Current", current, Duration::from_secs(3));
    assert_within("Available=True", available, Duration::from_secs(3));
}

/// Whether the `Available` condition on the core has status `want`.
async fn condition_is(core: &FixtureCore, want: &str) -> bool {
    available_condition(core, NAME)
        .await
        .is_some_and(|(status, _)| status == want)
}

/// [`reaction`] of the `Available` condition within 10 s; with the file source there is none
/// (`Some(0)`, nothing printed).
async fn condition_reaction<F, Fut>(
    registered: Registered,
    what: &str,
    since: Instant,
    observed: F,
) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    match registered {
        Registered::OnCore => reaction(what, since, Duration::from_secs(10), observed).await,
        Registered::InFile => Some(Duration::ZERO),
    }
}

#[tokio::test]
async fn a_killed_backend_is_noticed_and_its_return_too_with_the_kube_source() {
    a_killed_backend_is_noticed_and_its_return_too(Registered::OnCore).await;
}

#[tokio::test]
async fn a_killed_backend_is_noticed_and_its_return_too_with_the_file_source() {
    a_killed_backend_is_noticed_and_its_return_too(Registered::InFile).await;
}

/// A flaky backend (every second `GET /apis/<group>/<version>`, the availability probe, fails)
/// is not punished: a client sending requests back to back for several availability intervals
/// never gets a 503. Before, a check was one probe, so every other check failed and the route
/// went unavailable until its retry a few milliseconds later.
#[tokio::test]
async fn one_failed_probe_among_successes_never_fails_a_request() {
    let s = Scenario::builder()
        .backend(
            "wardle",
            GROUP,
            "v1alpha1",
            &["--fail-every-nth-group-version", "2"],
        )
        .apiservice(GROUP, "v1alpha1", "wardle")
        .availability_interval("200ms")
        .start()
        .await;
    let alice = User::new(&s.gateway, &s.user("alice", &[]));
    let ready =
        harness::wait_until(Duration::from_secs(10), || alice.reaches_backend(FLUNDERS)).await;
    assert!(ready, "{NAME} was never served\n{}", s.logs());

    // Several clients back to back, so that even a few milliseconds of 503 are seen.
    let until = Instant::now() + Duration::from_secs(4);
    let client = || async {
        let (mut served, mut failed) = (0u32, Vec::new());
        while Instant::now() < until {
            match alice.get(FLUNDERS, "application/json").await {
                Some((StatusCode::OK, _)) => served += 1,
                other => failed.push(format!("{other:?}")),
            }
        }
        (served, failed)
    };
    let results = futures::future::join_all((0..4).map(|_| client())).await;
    let served: u32 = results.iter().map(|(n, _)| n).sum();
    let failed: Vec<&String> = results.iter().flat_map(|(_, f)| f).collect();
    eprintln!(
        "flaky backend: {served} requests served, {} failed",
        failed.len()
    );
    assert!(served > 50, "only {served} requests were served");
    assert!(
        failed.is_empty(),
        "{} requests failed, e.g. {:?}\n{}",
        failed.len(),
        failed.first(),
        s.logs()
    );
}

/// One backend hanging (stopped with SIGSTOP: connections are accepted, nothing is answered) does
/// not hold back another APIService: a new one on a healthy backend is Available within 2 s,
/// though the hung backend's probe only gives up after its 5 s timeout.
#[tokio::test]
async fn a_hung_backend_does_not_delay_another_apiservices_availability() {
    const FLOWERS: &str = "flowers.example.com";
    // Availability probed every second: the hung backend's probe is in flight when B arrives.
    let s = Scenario::with_pki(Pki::for_services(&["wardle", "flowers"]))
        .backend("wardle", GROUP, "v1alpha1", &[])
        .backend("flowers", FLOWERS, "v1", &[])
        .start()
        .await;
    let kubectl = s.kubectl(&s.user("alice", &[]));
    kubectl
        .apply_yaml(&s.pki.apiservice(GROUP, "v1alpha1", "wardle").yaml())
        .await;
    wait_for_condition(&s.core, NAME, ("True", "Passed"), Duration::from_secs(10)).await;

    let stopped = Stopped::stop(s.backend("wardle").process.id());
    // More than one interval: a probe of the hung backend has started and is waiting.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let flowers = s.pki.apiservice(FLOWERS, "v1", "flowers");
    let since = Instant::now();
    create_apiservice_on_core(&s.core, &flowers).await;
    let available = reaction(
        "new APIService beside a hung backend -> Available True on the core",
        since,
        Duration::from_secs(15),
        || async {
            available_condition(&s.core, &flowers.name())
                .await
                .is_some_and(|(status, _)| status == "True")
        },
    )
    .await;
    assert_within(
        "Available beside a hung backend (one hung probe must not hold back other APIServices)",
        available,
        Duration::from_secs(2),
    );
    scenario::wait_for_apiservice_row(&kubectl, &flowers.name(), "True", Duration::from_secs(5))
        .await;
    drop(stopped);
}

/// The wardle APIService on the core, Available and discovered `Current`, with not one request
/// sent to its backend through the gateway: what the gateway then knows of the backend, it
/// learnt on its own (its probes, its discovery fetches, the connections it keeps).
async fn quiet_wardle(backend_args: &[&str]) -> (Scenario, User) {
    let s = Scenario::builder()
        .backend("wardle", GROUP, "v1alpha1", backend_args)
        .availability_interval("30s")
        .start()
        .await;
    create_apiservice_on_core(&s.core, &s.pki.apiservice(GROUP, "v1alpha1", "wardle")).await;
    let alice = User::new(&s.gateway, &s.user("alice", &[]));
    let ready = harness::wait_until(Duration::from_secs(10), || async {
        alice.flunders_discovered_as("Current").await && condition_is(&s.core, "True").await
    })
    .await;
    assert!(
        ready,
        "{NAME} was never Available and discovered\n{}",
        s.logs()
    );
    // Past the first round of fetches and checks, so none of them is what notices the change.
    tokio::time::sleep(Duration::from_secs(1)).await;
    (s, alice)
}

/// Issue 27, a backend killed with no request to it: aggregated `/apis` lists it `Stale` within
/// 2 s and the core shows `Available=False` within 3 s, from the connection the gateway keeps to
/// it closing, not from a request or the 30 s resync. The backend closes each connection after
/// one request (kube-apiserver's `--goaway-chance` at its extreme), so no connection is left
/// from the gateway's own probes and fetches, as none is after 90 s without traffic. Before:
/// the resync (up to 30 s).
#[tokio::test]
async fn a_killed_backend_nobody_calls_is_stale_and_unavailable_within_seconds() {
    let (mut s, alice) = quiet_wardle(&["--goaway-after-requests", "1"]).await;
    let since = Instant::now();
    s.backend_mut("wardle").process.kill();
    let limit = Duration::from_secs(10);
    let (stale, unavailable) = tokio::join!(
        reaction(
            "killed backend, no requests -> Stale in aggregated /apis",
            since,
            limit,
            || alice.flunders_discovered_as("Stale")
        ),
        reaction(
            "killed backend, no requests -> Available=False on the core",
            since,
            limit,
            || condition_is(&s.core, "False")
        ),
    );
    assert_within("Stale", stale, Duration::from_secs(2));
    assert_within("Available=False", unavailable, Duration::from_secs(3));
}

/// Issue 27, a backend frozen (SIGSTOP: the kernel still accepts connections, nothing answers)
/// with no request to it: the HTTP/2 PINGs on the connection the gateway keeps go unanswered,
/// and within 8 s aggregated `/apis` lists it `Stale` and the core shows `Available=False`; a
/// request sent 0.3 s after the freeze gets the 503 naming the APIService within 12 s. Before:
/// Stale and unavailable only after the next resync and probe timeout, the request hung for
/// most of a minute (a fresh 10 s dial per retry).
#[tokio::test]
async fn a_frozen_backend_nobody_calls_is_stale_and_unavailable_within_seconds() {
    let (s, alice) = quiet_wardle(&[]).await;
    let since = Instant::now();
    let stopped = Stopped::stop(s.backend("wardle").process.id());
    let limit = Duration::from_secs(20);
    let request = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sent = Instant::now();
        let answer = tokio::time::timeout(limit, alice.get(FLUNDERS, "application/json")).await;
        let took = sent.elapsed();
        eprintln!(
            "reaction: frozen backend -> request sent 0.3 s after answered {:?} in {} ms",
            answer
                .as_ref()
                .ok()
                .and_then(Option::as_ref)
                .map(|(status, _)| *status),
            took.as_millis()
        );
        match answer {
            Ok(Some((StatusCode::SERVICE_UNAVAILABLE, body)))
                if body["message"].as_str().is_some_and(|m| m.contains(NAME)) =>
            {
                Some(took)
            }
            _ => None,
        }
    };
    let (stale, unavailable, refused) = tokio::join!(
        reaction(
            "frozen backend, no requests -> Stale in aggregated /apis",
            since,
            limit,
            || alice.flunders_discovered_as("Stale")
        ),
        reaction(
            "frozen backend, no requests -> Available=False on the core",
            since,
            limit,
            || condition_is(&s.core, "False")
        ),
        request,
    );
    drop(stopped);
    assert_within("Stale", stale, Duration::from_secs(8));
    assert_within("Available=False", unavailable, Duration::from_secs(8));
    assert_within(
        "503 to a request sent 0.3 s after",
        refused,
        Duration::from_secs(12),
    );
}

/// Issue 41, a backend that speaks HTTP/1.1 only (no `h2` in ALPN: a Python or Java aggregated
/// server, one behind an HTTP/1.1 proxy), with no request to it: killed, aggregated `/apis`
/// lists it `Stale` and the core shows `Available=False` within 2 s; started again on its port,
/// `Current` and `Available=True` within 2 s; frozen, both within 8 s. The gateway keeps an idle
/// HTTP/1.1 connection to it (its close is the kill's signal) and probes on it once a second (a
/// frozen backend leaves the probe unanswered). Before: nothing watched it between the 30 s
/// availability rounds.
#[tokio::test]
async fn an_http1_backend_nobody_calls_is_watched_killed_restarted_and_frozen() {
    let http1 = ["--http1-only"];
    let (mut s, alice) = quiet_wardle(&http1).await;
    let port = s.backend("wardle").addr.port();
    let since = Instant::now();
    s.backend_mut("wardle").process.kill();
    let limit = Duration::from_secs(10);
    let stale = ("Stale", "False");
    let (listed, condition) = discovery_and_condition(
        "killed HTTP/1.1 backend",
        since,
        limit,
        &alice,
        &s.core,
        stale,
    )
    .await;
    assert_within("killed: Stale", listed, Duration::from_secs(2));
    assert_within("killed: Available=False", condition, Duration::from_secs(2));

    let listen = format!("127.0.0.1:{port}");
    let backend = s
        .pki
        .start_backend(
            GROUP,
            "v1alpha1",
            &[&["--listen", &listen][..], &http1[..]].concat(),
        )
        .await;
    let since = Instant::now();
    *s.backend_mut("wardle") = backend;
    let current = ("Current", "True");
    let (listed, condition) = discovery_and_condition(
        "restarted HTTP/1.1 backend",
        since,
        limit,
        &alice,
        &s.core,
        current,
    )
    .await;
    assert_within("back: Current", listed, Duration::from_secs(2));
    assert_within("back: Available=True", condition, Duration::from_secs(2));

    tokio::time::sleep(Duration::from_secs(1)).await;
    let since = Instant::now();
    let stopped = Stopped::stop(s.backend("wardle").process.id());
    let limit = Duration::from_secs(20);
    let (listed, condition) = discovery_and_condition(
        "frozen HTTP/1.1 backend",
        since,
        limit,
        &alice,
        &s.core,
        stale,
    )
    .await;
    drop(stopped);
    assert_within("frozen: Stale", listed, Duration::from_secs(8));
    assert_within("frozen: Available=False", condition, Duration::from_secs(8));
}

/// The reactions to one change of aggregated `/apis` (flunders listed with `freshness`) and of
/// the core's `Available` condition (`status`), timed together from `since`.
async fn discovery_and_condition(
    what: &str,
    since: Instant,
    limit: Duration,
    alice: &User,
    core: &FixtureCore,
    (freshness, status): (&str, &str),
) -> (Option<Duration>, Option<Duration>) {
    let (listed, available) = (
        format!("{what} -> {freshness}"),
        format!("{what} -> Available={status}"),
    );
    tokio::join!(
        reaction(&listed, since, limit, || alice
            .flunders_discovered_as(freshness)),
        reaction(&available, since, limit, || condition_is(core, status)),
    )
}

/// Issue 41, one view of a backend: one whose availability check fails (every `GET
/// /apis/<group>/<version>` answers 500) while its `/apis` answers is `Stale` in aggregated
/// discovery within a second of `Available=False`, as kube-aggregator has it (its discovery goes
/// through the proxy, which refuses an unavailable APIService). Before: `Current` for good.
#[tokio::test]
async fn an_unavailable_apiservice_is_stale_in_discovery_within_a_second() {
    let s = Scenario::builder()
        .backend(
            "wardle",
            GROUP,
            "v1alpha1",
            &["--fail-every-nth-group-version", "1"],
        )
        .start()
        .await;
    create_apiservice_on_core(&s.core, &s.pki.apiservice(GROUP, "v1alpha1", "wardle")).await;
    let alice = User::new(&s.gateway, &s.user("alice", &[]));
    let since = Instant::now();
    let unavailable = reaction(
        "failing availability check -> Available=False",
        since,
        Duration::from_secs(10),
        || condition_is(&s.core, "False"),
    )
    .await;
    assert!(unavailable.is_some(), "never Available=False\n{}", s.logs());
    let since = Instant::now();
    let stale = reaction(
        "Available=False -> Stale in aggregated /apis",
        since,
        Duration::from_secs(5),
        || alice.flunders_discovered_as("Stale"),
    )
    .await;
    assert_within("Stale after Available=False", stale, Duration::from_secs(1));
}

/// Issue 27, a backend restarted (same port, as a Pod behind a ClusterIP) whose discovery then
/// takes longer than 5 s, with no request to it: aggregated `/apis` lists it `Stale` within 7 s
/// of the restart and keeps it so, as kube-aggregator's 5 s discovery deadline makes it; it
/// never goes back to `Current` on the old document. The backend closes each connection after
/// one request, so no connection is left from the gateway's own probes and fetches. Before:
/// nothing noticed the restart and the old document stayed `Current`.
#[tokio::test]
async fn a_backend_restarted_with_slow_discovery_is_stale_within_seconds() {
    restarted_with_slow_discovery(&["--goaway-after-requests", "1"]).await;
}

/// Issue 41, the same with a backend that speaks HTTP/1.1 only: its kept HTTP/1.1 connection
/// closing is what notices the restart. Before: `Current` on the old document until the 30 s
/// availability round.
#[tokio::test]
async fn an_http1_backend_restarted_with_slow_discovery_is_stale_within_seconds() {
    restarted_with_slow_discovery(&["--http1-only"]).await;
}

/// The backend (started with `args`) restarted on its port with a 6 s discovery.
async fn restarted_with_slow_discovery(args: &[&str]) {
    let (mut s, alice) = quiet_wardle(args).await;
    let port = s.backend("wardle").addr.port();
    s.backend_mut("wardle").process.kill();
    let listen = format!("127.0.0.1:{port}");
    let backend = s
        .pki
        .start_backend(
            GROUP,
            "v1alpha1",
            &[&["--listen", &listen, "--discovery-delay-ms", "6000"], args].concat(),
        )
        .await;
    let since = Instant::now();
    *s.backend_mut("wardle") = backend;
    let stale = reaction(
        "backend restarted with 6 s discovery -> Stale in aggregated /apis",
        since,
        Duration::from_secs(12),
        || alice.flunders_discovered_as("Stale"),
    )
    .await;
    assert_within("Stale", stale, Duration::from_secs(7));
    tokio::time::sleep_until((since + Duration::from_secs(7)).into()).await;
    assert!(
        alice.flunders_discovered_as("Stale").await,
        "7 s after the restart, aggregated /apis lists {:?}",
        alice.discovered(GROUP, "flunders").await
    );
}

/// The PINGs the wardle backend counted on each HTTP/2 connection, in the order it accepted
/// them (the fixture follows the frames it reads; see `e2e::fixture::pings`).
async fn pings_received(s: &Scenario) -> Vec<u64> {
    let url = format!("{}/fixture/connections", s.backend("wardle").url());
    let (status, _, body) = harness::get(&s.pki.backend_client("wardle"), &url)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    scenario::json_or_null(&body)["pings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect()
}

/// PINGs per connection between two counts.
fn pings_between(before: &[u64], after: &[u64]) -> Vec<u64> {
    after
        .iter()
        .enumerate()
        .map(|(i, n)| n - before.get(i).copied().unwrap_or(0))
        .collect()
}

/// Issue 27: an idle backend gets at most one PING per `http2-ping-interval` (1 s) on each
/// connection, and one connection to it stays up and pinged even while requests flow and the
/// backend closes every connection after one request (GOAWAY): the gateway's kept connection
/// carries no requests. Before: the kept connection was one of the pool's, so each request's
/// GOAWAY closed it and no connection was pinged across the requests.
#[tokio::test]
async fn an_idle_backend_gets_one_ping_per_interval_on_a_connection_requests_never_close() {
    const WINDOW: Duration = Duration::from_secs(5);
    let (s, alice) = quiet_wardle(&["--goaway-after-requests", "1"]).await;
    let start = pings_received(&s).await;
    tokio::time::sleep(WINDOW).await;
    let idle_end = pings_received(&s).await;
    let busy_since = Instant::now();
    let mut served = 0;
    while busy_since.elapsed() < WINDOW {
        served += u32::from(alice.reaches_backend(FLUNDERS).await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let busy_end = pings_received(&s).await;
    let idle = pings_between(&start, &idle_end);
    let busy = pings_between(&idle_end, &busy_end);
    eprintln!("pings per connection: idle 5 s {idle:?}; 5 s with {served} requests {busy:?}");
    assert!(served >= 10, "only {served} requests were served");
    // One per second over 5 s, and one more for where the window falls.
    let most = WINDOW.as_secs() + 1;
    assert!(
        idle.iter().all(|&n| n <= most),
        "a connection of an idle backend got more than {most} PINGs in 5 s: {idle:?}"
    );
    let kept = idle
        .iter()
        .zip(&busy)
        .any(|(&idle, &busy)| idle >= 3 && busy >= 3);
    assert!(
        kept,
        "no connection was pinged both while the backend was idle and while requests flowed \
         (idle {idle:?}, busy {busy:?})\n{}",
        s.logs()
    );
}

//! Where routes come from, seen by a user: a manifest directory with one bad APIService (or one
//! unreadable file) still serves everything else and says what is wrong, and a Service or
//! EndpointSlice appearing on the core makes its APIService available at once rather than at the
//! next availability interval. With the `kube` source, routes stay up while the APIService watch
//! expires (410) and relists, and while the core restarts, and later changes still arrive.

use std::time::Duration;

use e2e::certs::CertifiedPair;
use e2e::harness::{self, FixtureCore, Gateway, Kubectl};
use e2e::scenario::{self, ApiService, Pki, Scenario};
use http::StatusCode;

const GROUP: &str = "wardle.example.com";
const NAME: &str = "v1alpha1.wardle.example.com";
const BETA: &str = "v1beta1.wardle.example.com";

const ALPHA_FLUNDERS: &str = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
const BETA_FLUNDERS: &str = "/apis/wardle.example.com/v1beta1/namespaces/default/flunders";

/// Whether GET `path` answers 200 with a list of `kind` within `timeout`.
async fn serves(s: &Scenario, user: &CertifiedPair, path: &str, timeout: Duration) -> bool {
    scenario::serves(&s.gateway, user, path, "FlunderList", timeout).await
}

// ---- the file source ----------------------------------------------------------------------------

/// A manifest directory with a good APIService (`alpha.yaml`), one kube-apiserver would refuse
/// on `kubectl apply` (`beta.yaml`: groupPriorityMinimum must be positive) and one file that is
/// not YAML at all (`junk.yaml`), for a backend serving both versions.
async fn manifests_with_mistakes() -> (Scenario, CertifiedPair) {
    let pki = Pki::new();
    let alpha = pki.apiservice(GROUP, "v1alpha1", "wardle");
    let beta = pki
        .apiservice(GROUP, "v1beta1", "wardle")
        .group_priority_minimum(0);
    // Becoming ready at all is the first assertion: start waits for /readyz.
    let s = Scenario::with_pki(pki)
        .backend("wardle", GROUP, "v1alpha1,v1beta1", &[])
        .manifest("alpha.yaml", &alpha.yaml())
        .manifest("beta.yaml", &beta.yaml())
        .manifest("junk.yaml", "kind: APIService\nspec: [oops\n")
        .start()
        .await;
    let alice = s.user("alice", &[]);
    assert!(
        serves(&s, &alice, ALPHA_FLUNDERS, Duration::from_secs(5)).await,
        "{}",
        s.logs()
    );
    (s, alice)
}

#[tokio::test]
async fn an_invalid_apiservice_in_the_manifest_directory_does_not_block_the_others() {
    let (s, alice) = manifests_with_mistakes().await;
    let dir = s.manifests();
    // The refused version is not routed: the group's other version is, so the path is unclaimed
    // and the core answers (it has no such group).
    assert_eq!(
        s.get(&alice, BETA_FLUNDERS, &[]).await.0,
        StatusCode::NOT_FOUND
    );

    let text = scenario::metrics(&s.gateway).await;
    assert!(
        text.contains(&format!(
            "aggregation_gateway_invalid_apiservice{{name=\"{BETA}\"}} 1"
        )),
        "{text}"
    );
    assert!(
        !text.contains(&format!(
            "aggregation_gateway_invalid_apiservice{{name=\"{NAME}\"}}"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "aggregation_gateway_invalid_apiservice_manifest{{file=\"{}\"}} 1",
            dir.join("junk.yaml").display()
        )),
        "{text}"
    );

    // The log says which file, which line, and what to fix.
    let logs = s.logs();
    assert!(
        logs.lines().any(|l| l.contains(&format!(
            "beta.yaml:1: APIService \\\"{BETA}\\\" is invalid"
        )) && l.contains("spec.groupPriorityMinimum: Invalid value: 0")),
        "{logs}"
    );
    assert!(
        logs.lines()
            .any(|l| l.contains("junk.yaml:") && l.contains("ERROR")),
        "{logs}"
    );
}

/// An APIService that would send `apiregistration.k8s.io` to a backend is refused with a
/// message saying why, and the APIService API stays the core's.
#[tokio::test]
async fn no_apiservice_takes_apiregistration_away_from_the_core() {
    let pki = Pki::new();
    let alpha = pki.apiservice(GROUP, "v1alpha1", "wardle");
    let hijack = pki.apiservice("apiregistration.k8s.io", "v1", "wardle");
    let s = Scenario::with_pki(pki)
        .backend("wardle", GROUP, "v1alpha1", &[])
        .manifest("alpha.yaml", &alpha.yaml())
        .manifest("hijack.yaml", &hijack.yaml())
        .start()
        .await;
    let alice = s.user("alice", &[]);
    assert!(serves(&s, &alice, ALPHA_FLUNDERS, Duration::from_secs(5)).await);
    let (status, body) = s
        .get(&alice, "/apis/apiregistration.k8s.io/v1/apiservices", &[])
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["kind"], "APIServiceList", "{body}");
    let text = scenario::metrics(&s.gateway).await;
    assert!(
        text.contains(
            "aggregation_gateway_invalid_apiservice{name=\"v1.apiregistration.k8s.io\"} 1"
        ),
        "{text}"
    );
    let logs = s.logs();
    assert!(
        logs.lines().any(|l| l.contains("hijack.yaml")
            && l.contains(
                "spec.service: Forbidden: apiregistration.k8s.io is served by the core server"
            )),
        "{logs}"
    );
}

/// An invalid edit of a working APIService leaves it working and is reported; fixing it clears
/// the report.
#[tokio::test]
async fn an_invalid_edit_of_a_working_apiservice_keeps_it_working_until_fixed() {
    let (s, alice) = manifests_with_mistakes().await;
    let alpha = s.pki.apiservice(GROUP, "v1alpha1", "wardle");
    alpha
        .clone()
        .group_priority_minimum(0)
        .write_to(s.manifests(), "alpha.yaml");
    let reported = harness::wait_until(Duration::from_secs(5), || async {
        scenario::metrics(&s.gateway).await.contains(&format!(
            "aggregation_gateway_invalid_apiservice{{name=\"{NAME}\"}} 1"
        ))
    })
    .await;
    assert!(reported, "{}", s.logs());
    assert!(
        serves(&s, &alice, ALPHA_FLUNDERS, Duration::from_secs(1)).await,
        "{}",
        s.logs()
    );

    alpha.write_to(s.manifests(), "alpha.yaml");
    let cleared = harness::wait_until(Duration::from_secs(5), || async {
        !scenario::metrics(&s.gateway).await.contains(&format!(
            "aggregation_gateway_invalid_apiservice{{name=\"{NAME}\"}}"
        ))
    })
    .await;
    assert!(cleared, "{}", scenario::metrics(&s.gateway).await);
}

/// Fixing the manifests clears the reports and routes the fixed version.
#[tokio::test]
async fn fixing_the_manifests_clears_the_reports_and_routes_the_fixed_version() {
    let (s, alice) = manifests_with_mistakes().await;
    let dir = s.manifests();
    s.pki
        .apiservice(GROUP, "v1beta1", "wardle")
        .write_to(dir, "beta.yaml");
    std::fs::remove_file(dir.join("junk.yaml")).unwrap();
    assert!(
        serves(&s, &alice, BETA_FLUNDERS, Duration::from_secs(5)).await,
        "{}",
        s.logs()
    );
    let cleared = harness::wait_until(Duration::from_secs(5), || async {
        let text = scenario::metrics(&s.gateway).await;
        !text.contains("aggregation_gateway_invalid_apiservice{")
            && !text.contains("aggregation_gateway_invalid_apiservice_manifest{")
    })
    .await;
    assert!(cleared, "{}", scenario::metrics(&s.gateway).await);
}

// ---- the kube source ----------------------------------------------------------------------------

/// With a long availability interval only a reaction to the core's Services and EndpointSlices
/// can change an APIService's availability within a test.
#[tokio::test]
async fn a_new_service_and_endpointslice_make_the_apiservice_available_without_waiting() {
    // No static services map: the backend is found through the core's Service.
    let s = Scenario::wardle()
        .without_static_services()
        .availability_interval("60s")
        .start()
        .await;
    let core = &s.core;
    let port = s.backend("wardle").addr.port();
    let alice = s.user("alice", &[]);
    let kubectl = s.kubectl(&alice);

    kubectl
        .apply_yaml(
            &s.pki
                .apiservice(GROUP, "v1alpha1", "wardle")
                .port(port)
                .yaml(),
        )
        .await;
    // A new APIService is checked at once; its Service does not exist yet.
    scenario::wait_for_apiservice_row(
        &kubectl,
        NAME,
        "False (ServiceNotFound)",
        Duration::from_secs(10),
    )
    .await;

    // Each step below would otherwise wait for the 60 s interval.
    scenario::create_wardle_service(core, port).await;
    scenario::wait_for_apiservice_row(
        &kubectl,
        NAME,
        "False (EndpointsNotFound)",
        Duration::from_secs(5),
    )
    .await;

    assert_eq!(
        scenario::create_endpoint_slice(core, "api-abcde", port, true).await,
        StatusCode::CREATED
    );
    scenario::wait_for_apiservice_row(&kubectl, NAME, "True", Duration::from_secs(5)).await;
    let (status, body) = s.get(&alice, ALPHA_FLUNDERS, &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// What a client polling one path saw: how many answers, and every one that was not the
/// backend's list (time since start, status, and the body's `kind` or message).
#[derive(Debug, Default)]
struct PollReport {
    answers: usize,
    failures: Vec<(Duration, StatusCode, String)>,
}

/// A user who GETs `path` every 50 ms until stopped, as a controller would during an outage of
/// the core: any answer that is not the backend's `FlunderList` is a dropped route.
struct Poller {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<PollReport>,
}

impl Poller {
    fn start(gateway: &Gateway, user: &CertifiedPair, path: &str) -> Poller {
        let client = gateway.http2_client(Some(user));
        let url = format!("{}{path}", gateway.url());
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let mut report = PollReport::default();
            while !*stopped.borrow() {
                let answer =
                    tokio::time::timeout(Duration::from_secs(5), harness::get(&client, &url)).await;
                report.answers += 1;
                match answer {
                    Ok(Ok((status, _, body))) => {
                        let body = scenario::json_or_null(&body);
                        if status != StatusCode::OK || body["kind"] != "FlunderList" {
                            let what = body["message"]
                                .as_str()
                                .unwrap_or(body["kind"].as_str().unwrap_or(""));
                            report
                                .failures
                                .push((started.elapsed(), status, what.to_owned()));
                        }
                    }
                    Ok(Err(e)) => report.failures.push((
                        started.elapsed(),
                        StatusCode::BAD_GATEWAY,
                        format!("no answer: {e}"),
                    )),
                    Err(_) => report.failures.push((
                        started.elapsed(),
                        StatusCode::GATEWAY_TIMEOUT,
                        "no answer within 5s".into(),
                    )),
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    _ = stopped.changed() => {}
                }
            }
            report
        });
        Poller { stop, task }
    }

    async fn stop(self) -> PollReport {
        let _ = self.stop.send(true);
        self.task.await.unwrap()
    }
}

/// The core's recorded GETs of the APIService collection: `(path, is_watch)`.
async fn apiservice_reads(core: &FixtureCore) -> Vec<(String, bool)> {
    scenario::core_requests(core)
        .await
        .into_iter()
        .filter(|r| r["method"] == "GET")
        .filter_map(|r| r["path"].as_str().map(str::to_owned))
        .filter(|p| p.split('?').next() == Some("/apis/apiregistration.k8s.io/v1/apiservices"))
        .map(|p| {
            let watch = p.contains("watch=true") || p.contains("watch=1");
            (p, watch)
        })
        .collect()
}

async fn post_to_core(core: &FixtureCore, path: &str) -> StatusCode {
    let req = http::Request::post(format!("{}{path}", core.url()))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    harness::send(&scenario::core_client(), req)
        .await
        .unwrap()
        .0
}

/// The backend (serving `backend_versions`) behind a gateway watching the core's APIServices,
/// and alice applying v1alpha1 with kubectl: served through the gateway within 2 s.
async fn wardle_applied_with_kubectl(
    backend_versions: &str,
) -> (Scenario, CertifiedPair, Kubectl, ApiService) {
    let s = Scenario::builder()
        .backend("wardle", GROUP, backend_versions, &[])
        .start()
        .await;
    let alice = s.user("alice", &[]);
    let kubectl = s.kubectl(&alice);
    let alpha = s.pki.apiservice(GROUP, "v1alpha1", "wardle");
    kubectl.apply_yaml(&alpha.yaml()).await;
    assert!(
        serves(&s, &alice, ALPHA_FLUNDERS, Duration::from_secs(2)).await,
        "{}",
        s.logs()
    );
    (s, alice, kubectl, alpha)
}

/// The core forgets its watch history and closes the gateway's watch, like an etcd compaction:
/// resuming answers 410 Expired, and only a fresh list gets the gateway going. Waits for that
/// list and the new watch after it.
async fn compact_and_wait_for_relist(s: &Scenario) {
    scenario::clear_core_requests(&s.core).await;
    assert_eq!(
        post_to_core(&s.core, "/fixture/compact").await,
        StatusCode::OK
    );
    let relisted = harness::wait_until(Duration::from_secs(10), || async {
        let reads = apiservice_reads(&s.core).await;
        // A re-watch, then a list after its 410, then a new watch.
        reads.iter().any(|(_, watch)| !watch) && reads.last().is_some_and(|(_, watch)| *watch)
    })
    .await;
    assert!(
        relisted,
        "the gateway never relisted APIServices after the compaction: {:?}\n{}",
        apiservice_reads(&s.core).await,
        s.logs()
    );
}

#[tokio::test]
async fn routes_stay_up_while_an_expired_watch_relists() {
    let (s, alice, _, _) = wardle_applied_with_kubectl("v1alpha1,v1beta1").await;
    let poller = Poller::start(&s.gateway, &alice, ALPHA_FLUNDERS);
    tokio::time::sleep(Duration::from_millis(300)).await;
    compact_and_wait_for_relist(&s).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = poller.stop().await;
    assert!(
        report.failures.is_empty() && report.answers >= 10,
        "requests to {NAME} failed during the relist ({} answers): {:?}\n{}",
        report.answers,
        report.failures,
        s.logs()
    );
}

/// The new watch after a relist is live: changes made after the compaction reach the route
/// table, an added APIService and a deleted one.
#[tokio::test]
async fn changes_after_a_relist_still_reach_the_routes() {
    let (s, alice, kubectl, _) = wardle_applied_with_kubectl("v1alpha1,v1beta1").await;
    compact_and_wait_for_relist(&s).await;
    kubectl
        .apply_yaml(&s.pki.apiservice(GROUP, "v1beta1", "wardle").yaml())
        .await;
    assert!(
        serves(&s, &alice, BETA_FLUNDERS, Duration::from_secs(5)).await,
        "{BETA} was not routed after the relist:\n{}",
        s.logs()
    );
    kubectl.run_ok(&["delete", "apiservice", NAME]).await;
    let back_to_core = harness::wait_until(Duration::from_secs(5), || async {
        s.get(&alice, ALPHA_FLUNDERS, &[]).await.0 == StatusCode::NOT_FOUND
    })
    .await;
    assert!(
        back_to_core,
        "deleting {NAME} after the relist did not send it back to the core:\n{}",
        s.logs()
    );
}

/// Down, back, and followed: one sequence, since following the restarted core is only
/// meaningful after routes survived it going away.
#[tokio::test]
async fn routes_stay_up_while_the_core_restarts_and_follow_the_restarted_core() {
    let (mut s, alice, kubectl, alpha) = wardle_applied_with_kubectl("v1alpha1").await;
    // What the restarted core finds in its (here: seeded) storage.
    let stored: serde_json::Value = serde_saphyr::from_str(&alpha.yaml()).unwrap();
    let seed = s.pki.write("core-seed.json", &stored.to_string());

    let poller = Poller::start(&s.gateway, &alice, ALPHA_FLUNDERS);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let addr = s.core.addr.to_string();
    s.core.process.kill();
    // Long enough for the watch to fail and be retried a few times against a closed port.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let down = poller.stop().await;
    assert!(
        down.failures.is_empty() && down.answers >= 10,
        "requests to {NAME} failed while the core was down ({} answers): {:?}\n{}",
        down.answers,
        down.failures,
        s.logs()
    );
    let logs = s.logs();
    assert!(
        logs.contains("cannot use the core server") && logs.contains("\"APIService watch\""),
        "{logs}"
    );

    let poller = Poller::start(&s.gateway, &alice, ALPHA_FLUNDERS);
    let seed = scenario::path_arg(&seed);
    s.core = FixtureCore::start(&["--listen", &addr, "--seed", &seed])
        .await
        .unwrap();
    // Two watches of APIServices come back: the APIService source's (the routes) and
    // discovery's (the core's own groups). Either alone is not enough for the delete below.
    let resynced = harness::wait_until(Duration::from_secs(20), || async {
        apiservice_reads(&s.core)
            .await
            .iter()
            .filter(|(_, watch)| *watch)
            .count()
            >= 2
    })
    .await;
    assert!(
        resynced,
        "the gateway never watched the restarted core:\n{}",
        s.logs()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let up = poller.stop().await;
    assert!(
        up.failures.is_empty(),
        "requests to {NAME} failed while the gateway reconnected ({} answers): {:?}\n{}",
        up.answers,
        up.failures,
        s.logs()
    );

    // The restarted core is the source of truth again: deleting there sends the group back.
    kubectl.run_ok(&["delete", "apiservice", NAME]).await;
    let back_to_core = harness::wait_until(Duration::from_secs(5), || async {
        s.get(&alice, ALPHA_FLUNDERS, &[]).await.0 == StatusCode::NOT_FOUND
    })
    .await;
    assert!(
        back_to_core,
        "deleting {NAME} on the restarted core did not send it back to the core:\n{}",
        s.logs()
    );
}

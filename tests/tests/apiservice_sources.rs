//! Where routes come from, seen by a user: a manifest directory with one bad APIService (or one
//! unreadable file) still serves everything else and says what is wrong, and a Service or
//! EndpointSlice appearing on the core makes its APIService available at once rather than at the
//! next availability interval. With the `kube` source, routes stay up while the APIService watch
//! expires (410) and relists, and while the core restarts, and later changes still arrive.

use std::path::Path;
use std::time::Duration;

use e2e::certs::CertifiedPair;
use e2e::harness::{
    self, FixtureAggregated, FixtureCore, Gateway, GatewayOptions, Kubectl, KubectlVersion,
};
use e2e::scenario::{self, create_on_core, get_as, path_arg, ApiService, Pki};
use http::StatusCode;

const GROUP: &str = "wardle.example.com";
const NAME: &str = "v1alpha1.wardle.example.com";
const BETA: &str = "v1beta1.wardle.example.com";

/// `/metrics`, fetched anonymously.
async fn metrics(gateway: &Gateway) -> String {
    let client = harness::http1_client(&gateway.ca_pem().unwrap(), None).unwrap();
    let (status, _, body) = harness::get(&client, &format!("{}/metrics", gateway.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    String::from_utf8_lossy(&body).into_owned()
}

/// Whether GET `path` answers 200 with a list of `kind` within `timeout`.
async fn serves(
    gateway: &Gateway,
    user: &e2e::certs::CertifiedPair,
    path: &str,
    kind: &str,
    timeout: Duration,
) -> bool {
    harness::wait_until(timeout, || async {
        let (status, body) = get_as(gateway, user, path, &[]).await;
        status == StatusCode::OK && body["kind"] == kind
    })
    .await
}

#[tokio::test]
async fn an_invalid_apiservice_in_the_manifest_directory_does_not_block_the_others() {
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let backend = pki.start_backend(GROUP, "v1alpha1,v1beta1", &[]).await;
    let manifests = tempfile::tempdir().unwrap();
    let dir = manifests.path();
    let alpha = pki.apiservice(GROUP, "v1alpha1", "wardle");
    let beta = pki.apiservice(GROUP, "v1beta1", "wardle");
    alpha.write_to(dir, "alpha.yaml");
    // kube-apiserver would refuse this on `kubectl apply`: groupPriorityMinimum must be positive.
    beta.clone()
        .group_priority_minimum(0)
        .write_to(dir, "beta.yaml");
    std::fs::write(dir.join("junk.yaml"), "kind: APIService\nspec: [oops\n").unwrap();
    let config = pki.gateway_config(&[("wardle", &backend)], "");

    // Becoming ready at all is the first assertion: start_gateway waits for /readyz.
    let gateway = pki
        .start_gateway_with_file_source(&core, &config, dir, &[])
        .await;
    let alice = pki.user("alice", &[]);
    let alpha_flunders = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
    let beta_flunders = "/apis/wardle.example.com/v1beta1/namespaces/default/flunders";
    assert!(
        serves(
            &gateway,
            &alice,
            alpha_flunders,
            "FlunderList",
            Duration::from_secs(5)
        )
        .await,
        "{}",
        gateway.process.logs()
    );
    // The refused version is not routed: the group's other version is, so the path is unclaimed
    // and the core answers (it has no such group).
    assert_eq!(
        get_as(&gateway, &alice, beta_flunders, &[]).await.0,
        StatusCode::NOT_FOUND
    );

    let text = metrics(&gateway).await;
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
    let logs = gateway.process.logs();
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

    // An invalid edit of a working APIService leaves it working, and is reported.
    alpha
        .clone()
        .group_priority_minimum(0)
        .write_to(dir, "alpha.yaml");
    let reported = harness::wait_until(Duration::from_secs(5), || async {
        metrics(&gateway).await.contains(&format!(
            "aggregation_gateway_invalid_apiservice{{name=\"{NAME}\"}} 1"
        ))
    })
    .await;
    assert!(reported, "{}", gateway.process.logs());
    assert!(
        serves(
            &gateway,
            &alice,
            alpha_flunders,
            "FlunderList",
            Duration::from_secs(1)
        )
        .await,
        "{}",
        gateway.process.logs()
    );

    // Fixing the manifests clears the reports and routes the fixed version.
    alpha.write_to(dir, "alpha.yaml");
    beta.write_to(dir, "beta.yaml");
    std::fs::remove_file(dir.join("junk.yaml")).unwrap();
    assert!(
        serves(
            &gateway,
            &alice,
            beta_flunders,
            "FlunderList",
            Duration::from_secs(5)
        )
        .await,
        "{}",
        gateway.process.logs()
    );
    let cleared = harness::wait_until(Duration::from_secs(5), || async {
        let text = metrics(&gateway).await;
        !text.contains("aggregation_gateway_invalid_apiservice{")
            && !text.contains("aggregation_gateway_invalid_apiservice_manifest{")
    })
    .await;
    assert!(cleared, "{}", metrics(&gateway).await);
}

/// [`Pki::start_gateway`] with the kube source and a long availability interval, so that only a
/// reaction to the core's Services and EndpointSlices can change an APIService's availability
/// within a test.
async fn start_gateway_with_slow_interval(pki: &Pki, core: &FixtureCore, config: &Path) -> Gateway {
    let (cert, key) = &pki.proxy_client;
    let args = [
        "--config".to_owned(),
        path_arg(config),
        "--proxy-client-cert-file".to_owned(),
        path_arg(cert),
        "--proxy-client-key-file".to_owned(),
        path_arg(key),
        "--client-ca-file".to_owned(),
        path_arg(&pki.users_ca_file),
        "--apiservice-availability-interval".to_owned(),
        "60s".to_owned(),
    ];
    let gateway = Gateway::start(GatewayOptions::new(core.url()).args(args))
        .await
        .expect("gateway starts");
    let client = harness::http1_client(&gateway.ca_pem().unwrap(), None).unwrap();
    let readyz = format!("{}/readyz", gateway.url());
    let ready = harness::wait_until(Duration::from_secs(10), || async {
        harness::get(&client, &readyz)
            .await
            .is_ok_and(|(status, _, _)| status == StatusCode::OK)
    })
    .await;
    assert!(
        ready,
        "gateway never became ready:\n{}",
        gateway.process.logs()
    );
    gateway
}

#[tokio::test]
async fn a_new_service_and_endpointslice_make_the_apiservice_available_without_waiting() {
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let backend = pki.start_backend(GROUP, "v1alpha1", &[]).await;
    let port = backend.addr.port();
    // No static services map: the backend is found through the core's Service.
    let config = pki.gateway_config(&[], "");
    let gateway = start_gateway_with_slow_interval(&pki, &core, &config).await;
    let alice = pki.user("alice", &[]);
    let kubectl = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);

    kubectl
        .apply_yaml(
            &pki.apiservice(GROUP, "v1alpha1", "wardle")
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
    let service = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "api", "namespace": "wardle"},
        "spec": {"type": "ClusterIP", "clusterIP": "127.0.0.1",
                 "ports": [{"name": "https", "port": port, "targetPort": port, "protocol": "TCP"}]}
    });
    assert_eq!(
        create_on_core(&core, "/api/v1/namespaces/wardle/services", service).await,
        StatusCode::CREATED
    );
    scenario::wait_for_apiservice_row(
        &kubectl,
        NAME,
        "False (EndpointsNotFound)",
        Duration::from_secs(5),
    )
    .await;

    let slice = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "api-abcde", "namespace": "wardle",
                     "labels": {"kubernetes.io/service-name": "api"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}]
    });
    assert_eq!(
        create_on_core(
            &core,
            "/apis/discovery.k8s.io/v1/namespaces/wardle/endpointslices",
            slice,
        )
        .await,
        StatusCode::CREATED
    );
    scenario::wait_for_apiservice_row(&kubectl, NAME, "True", Duration::from_secs(5)).await;
    let (status, body) = get_as(
        &gateway,
        &alice,
        "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
        &[],
    )
    .await;
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
    fn start(gateway: &Gateway, user: &e2e::certs::CertifiedPair, path: &str) -> Poller {
        let client = harness::http2_client(&gateway.ca_pem().unwrap(), Some(user)).unwrap();
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

const ALPHA_FLUNDERS: &str = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";
const BETA_FLUNDERS: &str = "/apis/wardle.example.com/v1beta1/namespaces/default/flunders";

/// A gateway watching `core`'s APIServices, and alice applying v1alpha1 (backed by `backend`)
/// with kubectl: served through the gateway within 2 s.
async fn wardle_applied_with_kubectl(
    pki: &Pki,
    core: &FixtureCore,
    backend: &FixtureAggregated,
) -> (Gateway, CertifiedPair, Kubectl, ApiService) {
    let config = pki.gateway_config(&[("wardle", backend)], "");
    let gateway = pki.start_gateway(core, &config, &[]).await;
    let alice = pki.user("alice", &[]);
    let kubectl = scenario::kubectl_as(&gateway, KubectlVersion::V1_32, &alice);
    let alpha = pki.apiservice(GROUP, "v1alpha1", "wardle");
    kubectl.apply_yaml(&alpha.yaml()).await;
    assert!(
        serves(
            &gateway,
            &alice,
            ALPHA_FLUNDERS,
            "FlunderList",
            Duration::from_secs(2)
        )
        .await,
        "{}",
        gateway.process.logs()
    );
    (gateway, alice, kubectl, alpha)
}

#[tokio::test]
async fn routes_stay_up_while_an_expired_watch_relists_and_later_changes_still_arrive() {
    let pki = Pki::new();
    let core = FixtureCore::start(&[]).await.unwrap();
    let backend = pki.start_backend(GROUP, "v1alpha1,v1beta1", &[]).await;
    let (gateway, alice, kubectl, _) = wardle_applied_with_kubectl(&pki, &core, &backend).await;

    scenario::clear_core_requests(&core).await;
    let poller = Poller::start(&gateway, &alice, ALPHA_FLUNDERS);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The core forgets its watch history and closes the gateway's watch, like an etcd
    // compaction: resuming answers 410 Expired, and only a fresh list gets the gateway going.
    assert_eq!(
        post_to_core(&core, "/fixture/compact").await,
        StatusCode::OK
    );
    let relisted = harness::wait_until(Duration::from_secs(10), || async {
        let reads = apiservice_reads(&core).await;
        // A re-watch, then a list after its 410, then a new watch.
        reads.iter().any(|(_, watch)| !watch) && reads.last().is_some_and(|(_, watch)| *watch)
    })
    .await;
    assert!(
        relisted,
        "the gateway never relisted APIServices after the compaction: {:?}\n{}",
        apiservice_reads(&core).await,
        gateway.process.logs()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = poller.stop().await;
    assert!(
        report.failures.is_empty() && report.answers >= 10,
        "requests to {NAME} failed during the relist ({} answers): {:?}\n{}",
        report.answers,
        report.failures,
        gateway.process.logs()
    );

    // The new watch is live: changes made after the compaction reach the route table.
    kubectl
        .apply_yaml(&pki.apiservice(GROUP, "v1beta1", "wardle").yaml())
        .await;
    assert!(
        serves(
            &gateway,
            &alice,
            BETA_FLUNDERS,
            "FlunderList",
            Duration::from_secs(5)
        )
        .await,
        "{BETA} was not routed after the relist:\n{}",
        gateway.process.logs()
    );
    kubectl.run_ok(&["delete", "apiservice", NAME]).await;
    let back_to_core = harness::wait_until(Duration::from_secs(5), || async {
        get_as(&gateway, &alice, ALPHA_FLUNDERS, &[]).await.0 == StatusCode::NOT_FOUND
    })
    .await;
    assert!(
        back_to_core,
        "deleting {NAME} after the relist did not send it back to the core:\n{}",
        gateway.process.logs()
    );
}

#[tokio::test]
async fn routes_stay_up_while_the_core_restarts_and_follow_the_restarted_core() {
    let pki = Pki::new();
    let mut core = FixtureCore::start(&[]).await.unwrap();
    let backend = pki.start_backend(GROUP, "v1alpha1", &[]).await;
    let (gateway, alice, kubectl, alpha) = wardle_applied_with_kubectl(&pki, &core, &backend).await;
    // What the restarted core finds in its (here: seeded) storage.
    let stored: serde_json::Value = serde_saphyr::from_str(&alpha.yaml()).unwrap();
    let seed = pki.write("core-seed.json", &stored.to_string());

    let poller = Poller::start(&gateway, &alice, ALPHA_FLUNDERS);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let addr = core.addr.to_string();
    core.process.kill();
    // Long enough for the watch to fail and be retried a few times against a closed port.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let down = poller.stop().await;
    assert!(
        down.failures.is_empty() && down.answers >= 10,
        "requests to {NAME} failed while the core was down ({} answers): {:?}\n{}",
        down.answers,
        down.failures,
        gateway.process.logs()
    );
    let logs = gateway.process.logs();
    assert!(logs.contains("APIService watch failed"), "{logs}");

    let poller = Poller::start(&gateway, &alice, ALPHA_FLUNDERS);
    let seed = scenario::path_arg(&seed);
    let core = FixtureCore::start(&["--listen", &addr, "--seed", &seed])
        .await
        .unwrap();
    let resynced = harness::wait_until(Duration::from_secs(20), || async {
        apiservice_reads(&core)
            .await
            .iter()
            .any(|(_, watch)| *watch)
    })
    .await;
    assert!(
        resynced,
        "the gateway never watched the restarted core:\n{}",
        gateway.process.logs()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let up = poller.stop().await;
    assert!(
        up.failures.is_empty(),
        "requests to {NAME} failed while the gateway reconnected ({} answers): {:?}\n{}",
        up.answers,
        up.failures,
        gateway.process.logs()
    );

    // The restarted core is the source of truth again: deleting there sends the group back.
    kubectl.run_ok(&["delete", "apiservice", NAME]).await;
    let back_to_core = harness::wait_until(Duration::from_secs(5), || async {
        get_as(&gateway, &alice, ALPHA_FLUNDERS, &[]).await.0 == StatusCode::NOT_FOUND
    })
    .await;
    assert!(
        back_to_core,
        "deleting {NAME} on the restarted core did not send it back to the core:\n{}",
        gateway.process.logs()
    );
}

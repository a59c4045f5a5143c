//! What an operator reads in the gateway's log: one warning per change of an APIService's state,
//! not one per probe or request; one warning and one line back per client of the core when the
//! core goes away for a while; no colour codes when the log goes to a pipe; a clear error, not a
//! silent takeover, when two manifest files define the same APIService; no Forbidden from a
//! core that is still starting, and one warning, 30 s in, from one that refuses `/readyz` for good.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::harness::{self, FixtureCore, Gateway, GatewayOptions, Process, DEFAULT_TOKEN};
use e2e::scenario::{self, Scenario, WARDLE_GROUP};
use http::StatusCode;
use serde_json::Value;

const NAME: &str = "v1alpha1.wardle.example.com";
const FLUNDERS: &str = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";

/// The gateway's JSON log lines so far (the harness starts it with `--logging-format json`).
fn json_lines(s: &Scenario) -> Vec<Value> {
    s.gateway
        .process
        .lines()
        .iter()
        .filter_map(|l| serde_json::from_str(&l.text).ok())
        .collect()
}

/// Lines at `level` whose fields mention `needle` (message, APIService, error...).
fn lines_at<'a>(lines: &'a [Value], level: &str, needle: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["level"] == level && l.to_string().contains(needle))
        .collect()
}

/// A backend that goes down twice while a client keeps asking for it: the log says so once per
/// change of state (unavailable, available again), though every request in between failed and
/// the backend was probed about once a second. Before, every failed request was a warning.
#[tokio::test]
async fn a_flapping_backend_is_one_warning_per_state_change() {
    let mut s = Scenario::wardle()
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .start()
        .await;
    let alice = s.user("alice", &[]);
    let served = || async { s.get(&alice, FLUNDERS, &[]).await.0 == StatusCode::OK };
    assert!(
        harness::wait_until(Duration::from_secs(10), served).await,
        "{}",
        s.logs()
    );
    let port = s.backend("wardle").addr.port();
    let mut refused = 0;
    for _ in 0..2 {
        s.backend_mut("wardle").process.kill();
        // Three seconds of requests: three probes or more, dozens of 503s.
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < until {
            if s.get(&alice, FLUNDERS, &[]).await.0 == StatusCode::SERVICE_UNAVAILABLE {
                refused += 1;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let listen = format!("127.0.0.1:{port}");
        let backend = s
            .pki
            .start_backend(WARDLE_GROUP, "v1alpha1", &["--listen", &listen])
            .await;
        *s.backend_mut("wardle") = backend;
        let served = || async { s.get(&alice, FLUNDERS, &[]).await.0 == StatusCode::OK };
        assert!(
            harness::wait_until(Duration::from_secs(10), served).await,
            "{}",
            s.logs()
        );
    }
    assert!(refused >= 20, "only {refused} requests were refused");

    let lines = json_lines(&s);
    let unavailable: Vec<_> = lines_at(&lines, "WARN", "APIService unavailable");
    let available: Vec<_> = lines_at(&lines, "INFO", "APIService available");
    let warnings: Vec<_> = lines_at(&lines, "WARN", NAME);
    // The discovery controller logs its own fetch failures (once per distinct error text); it
    // is not what routes requests and is left out of the count here.
    let routing_warnings: Vec<_> = warnings
        .iter()
        .filter(|l| {
            !l["target"]
                .as_str()
                .is_some_and(|t| t.starts_with("aggregation_gateway::control::discovery"))
        })
        .collect();
    eprintln!(
        "log: {refused} refused requests, {} warnings naming {NAME} ({} from routing/availability)",
        warnings.len(),
        routing_warnings.len()
    );
    assert_eq!(unavailable.len(), 2, "{warnings:#?}");
    // At start, and after each return.
    assert_eq!(available.len(), 3, "{available:#?}");
    // Per outage: the availability controller's line and nothing else, however many requests
    // failed or probes ran.
    assert_eq!(routing_warnings.len(), 2, "{routing_warnings:#?}");
}

/// How long the core stays away in [`a_core_down_for_half_a_minute_is_one_warning_and_one_line_back_per_client`].
// Half a minute: every loop has retried many times by then (leader election every 500 ms here);
// the before/after figures for a minute are in issue 28's note.
const CORE_DOWN: Duration = Duration::from_secs(30);

/// What `apiservice::outage` logs when a client of the core loses it and when it is back.
const LOST: &str = "cannot use the core server";
const BACK: &str = "the core server answers again";

/// The client that asks the core once a minute: its return may come after the test's wait.
const EVERY_MINUTE: &str = "OpenAPI v2 fetch of the core";

/// The core goes away for half a minute while every loop that uses it keeps trying (their retry
/// periods shortened where flags allow, so that each retries many times) and users keep sending
/// requests that need it (a bearer token to review, a request to authorize). Each client of the
/// core logs one warning with the error's root cause and one line when the core answers again,
/// with its retries and time down; the full error chains are debug lines. Before, every retry
/// of every watcher was a warning with the whole chain, and no watcher said when the core was
/// back.
#[tokio::test]
async fn a_core_down_for_half_a_minute_is_one_warning_and_one_line_back_per_client() {
    let mut s = Scenario::wardle()
        .gateway_args(&[
            "--leader-elect-retry-period",
            "500ms",
            "--leader-elect-renew-deadline",
            "2s",
            "--leader-elect-lease-duration",
            "3s",
            "--discovery-refresh-interval",
            "1s",
        ])
        .start()
        .await;
    s.register_wardle_until_available().await;
    let alice = s.user("alice", &[]);
    // What the restarted core finds in its storage.
    let api = s.pki.apiservice(WARDLE_GROUP, "v1alpha1", "wardle");
    let stored: Value = serde_saphyr::from_str(&api.yaml()).unwrap();
    let seed = scenario::path_arg(&s.pki.write("core-seed.json", &stored.to_string()));
    let addr = s.core.addr.to_string();

    let from = s.gateway.process.line_count();
    s.core.process.kill();
    // Users keep asking: with a client certificate (authorized by a SubjectAccessReview) and
    // with a bearer token (a TokenReview), every half second.
    let asking = AtomicBool::new(true);
    let ask = async {
        let bearer = format!("Bearer {DEFAULT_TOKEN}");
        while asking.load(Ordering::Relaxed) {
            let _ = scenario::try_get(&s.gateway, Some(&alice), FLUNDERS, &[]).await;
            let _ =
                scenario::try_get(&s.gateway, None, FLUNDERS, &[("authorization", &bearer)]).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let outage = async {
        tokio::time::sleep(CORE_DOWN).await;
        let during = outage_lines(&s.gateway.process.lines()[from..]).len();
        let core = FixtureCore::start(&["--listen", &addr, "--seed", &seed])
            .await
            .unwrap();
        let restarted = std::time::Instant::now();
        // Every client that lost the core says it is back: the watchers within their backoff
        // (at most a minute), all but the OpenAPI v2 loop, which asks once a minute.
        let back = harness::wait_until(Duration::from_secs(90), || async {
            let lines = outage_lines(&s.gateway.process.lines()[from..]);
            let lost = clients(&lines, "WARN", LOST);
            let back = clients(&lines, "INFO", BACK);
            !lost.is_empty() && lost.iter().all(|c| c == EVERY_MINUTE || back.contains(c))
        })
        .await;
        asking.store(false, Ordering::Relaxed);
        (core, during, back, restarted.elapsed())
    };
    let ((core, during, back, waited), ()) = tokio::join!(outage, ask);
    s.core = core;

    let all = outage_lines(&s.gateway.process.lines()[from..]);
    let lost = clients(&all, "WARN", LOST);
    let returned = clients(&all, "INFO", BACK);
    let text: String = all.iter().map(|l| format!("{l}\n")).collect();
    let count = |level: &str| all.iter().filter(|l| l["level"] == level).count();
    eprintln!(
        "core down {CORE_DOWN:?}: {during} log lines while it was down (access log aside), {} \
         until the clients were back {waited:.1?} after the core ({} WARN, {} INFO); {} clients \
         of the core: {lost:?}",
        all.len(),
        count("WARN"),
        count("INFO"),
        lost.len()
    );
    assert!(back, "not every client said the core was back:\n{text}");
    // The loops that use the core, and the review clients of the users' requests.
    for client in [
        "APIService watch",
        "Service watch",
        "core readiness probe",
        "leader election",
        "core discovery fetch",
        "TokenReview",
        "SubjectAccessReview",
    ] {
        assert!(
            lost.iter().any(|c| c == client),
            "{client} did not report the outage:\n{text}"
        );
    }
    // One warning and one line back per client (the OpenAPI v2 loop's may be yet to come).
    let mut unique = lost.clone();
    unique.dedup();
    assert_eq!(unique, lost, "one warning per client:\n{text}");
    let mut missing = lost.clone();
    missing.retain(|c| !returned.contains(c));
    assert!(
        missing.iter().all(|c| c == EVERY_MINUTE) && returned.iter().all(|c| lost.contains(c)),
        "one line back per client that warned:\n{text}"
    );
    let mut unique = returned.clone();
    unique.dedup();
    assert_eq!(unique, returned, "one line back per client:\n{text}");
    let leader = all
        .iter()
        .find(|l| l["client"] == "leader election" && is(l, "INFO", BACK))
        .unwrap();
    assert!(leader["retries"].as_u64().unwrap() > 10, "{leader}");
    assert!(
        leader["down_for"].as_str().unwrap().ends_with('s'),
        "{leader}"
    );
    // The root cause at warn; the chain around it (the core's URL, hyper's layers) at debug.
    assert!(!text.contains("tcp connect error"), "{text}");
    // Beside them, only what changed: leadership lost and taken again, the trust ConfigMap
    // written to the restarted core.
    let others = all.len() - lost.len() - returned.len();
    assert!(others <= 4, "{others} more lines:\n{text}");
}

fn is(line: &Value, level: &str, message: &str) -> bool {
    line["level"] == level && line["message"].as_str().unwrap_or("").contains(message)
}

/// The gateway's JSON log lines at error, warn and info in `lines`, without the access log
/// (one line per request by design).
fn outage_lines(lines: &[harness::LogLine]) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(&l.text).ok())
        .filter(|l| {
            ["ERROR", "WARN", "INFO"]
                .iter()
                .any(|level| l["level"] == *level)
        })
        .filter(|l| l["target"] != "access")
        .collect()
}

/// The `client` fields of the lines at `level` whose message contains `message`, sorted.
fn clients(lines: &[Value], level: &str, message: &str) -> Vec<String> {
    let mut out: Vec<String> = lines
        .iter()
        .filter(|l| is(l, level, message))
        .filter_map(|l| l["client"].as_str().map(str::to_owned))
        .collect();
    out.sort();
    out
}

/// With stderr a pipe (a container runtime, a file, `kubectl logs`), the text log has no ANSI
/// colour codes; before, every level and field name was wrapped in them.
#[tokio::test]
async fn the_text_log_has_no_colour_codes_when_stderr_is_not_a_terminal() {
    let core = FixtureCore::start(&[]).await.unwrap();
    let binary = tokio::task::spawn_blocking(harness::ensure_gateway_built)
        .await
        .unwrap()
        .unwrap();
    let certs = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(binary);
    cmd.args(["--bind-address", "127.0.0.1", "--secure-port", "0"])
        .arg("--cert-dir")
        .arg(certs.path())
        .args(["--core-url", &core.url(), "--apiservice-source", "none"])
        .args(["--logging-format", "text"])
        .env_remove("NO_COLOR");
    let gateway = Process::spawn("aggregation-gateway", cmd).unwrap();
    let serving = gateway
        .wait_for_line(|l| l.contains("serving"), Duration::from_secs(20))
        .await;
    let logs = gateway.logs();
    assert!(serving.is_some(), "no serving line\n{logs}");
    assert!(logs.contains("INFO"), "{logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "colour codes in the log:\n{logs:?}"
    );
}

/// A second manifest file that defines an APIService already routed from another file (sorting
/// earlier, so that it used to win) does not take it over: requests still reach the backend the
/// working definition names, and the error names both files.
#[tokio::test]
async fn a_duplicate_apiservice_name_across_files_keeps_the_working_route() {
    let s = Scenario::wardle()
        .apiservice(WARDLE_GROUP, "v1alpha1", "wardle")
        .start()
        .await;
    let alice = s.user("alice", &[]);
    let served = || async { s.get(&alice, FLUNDERS, &[]).await.0 == StatusCode::OK };
    assert!(
        harness::wait_until(Duration::from_secs(10), served).await,
        "{}",
        s.logs()
    );
    let working = format!("{NAME}.yaml");
    // The same name, pointing at a Service nothing serves.
    let copy = s.pki.apiservice(WARDLE_GROUP, "v1alpha1", "nowhere").yaml();
    std::fs::write(s.manifests().join("00-copy.yaml"), copy).unwrap();

    let reported = s
        .gateway
        .process
        .wait_for_line(
            |l| l.contains("00-copy.yaml") && l.contains(&working) && l.contains("ERROR"),
            Duration::from_secs(10),
        )
        .await;
    assert!(
        reported.is_some(),
        "no error naming both files\n{}",
        s.logs()
    );
    // Past the file watch's debounce and the route table rebuild.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..5 {
        let (status, body) = s.get(&alice, FLUNDERS, &[]).await;
        assert_eq!(status, StatusCode::OK, "{body}\n{}", s.logs());
    }
    let metrics = scenario::metrics(&s.gateway).await;
    assert!(
        metrics.contains(&format!(
            "aggregation_gateway_invalid_apiservice{{name=\"{NAME}\"}} 1"
        )),
        "{metrics}"
    );
}

/// Whether the gateway's `/readyz` answers 200 now.
async fn is_ready(client: &harness::HttpClient, gateway: &Gateway) -> bool {
    harness::get(client, &format!("{}/readyz", gateway.url()))
        .await
        .is_ok_and(|(status, _, _)| status == StatusCode::OK)
}

/// A core that is still starting, as kube-apiserver is for a few seconds beside a sidecar gateway:
/// every request, `/readyz` included, gets 403 until its RBAC authorizer has synced. The gateway
/// waits for it: unready meanwhile, Ready soon after the core is, and no Forbidden in its log.
/// Before, the APIService, Service and EndpointSlice watches and the discovery refresh each
/// logged a 403 warning at once and backed off (the real node's native-sidecar shape saw seven).
#[tokio::test]
async fn a_core_still_starting_is_waited_for_not_logged_as_forbidden() {
    let core = FixtureCore::start(&["--starting"])
        .await
        .expect("fixture core starts");
    // The default APIService source: the core's APIServices, and its Services to resolve them.
    let gateway = Gateway::start(GatewayOptions::new(core.url()))
        .await
        .expect("gateway starts");
    let client = gateway.http1_client(None);
    let ready = || is_ready(&client, &gateway);
    // Several of the gateway's readiness probes and every controller's first try fall in here.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !ready().await,
        "Ready before its core:\n{}",
        gateway.process.logs()
    );

    let req = http::Request::post(format!("{}/fixture/ready", core.url()))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (status, _, _) = harness::send(&scenario::core_client(), req).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    // Ready means the APIServices were listed and discovery fetched from the core.
    assert!(
        harness::wait_until(Duration::from_secs(5), ready).await,
        "not Ready 5 s after the core:\n{}",
        gateway.process.logs()
    );

    let lines: Vec<Value> = gateway
        .process
        .lines()
        .iter()
        .filter_map(|l| serde_json::from_str(&l.text).ok())
        .collect();
    let refused: Vec<String> = lines
        .iter()
        .filter(|l| l["level"] == "WARN" || l["level"] == "ERROR")
        .map(Value::to_string)
        .filter(|l| l.contains("403") || l.to_lowercase().contains("forbidden"))
        .collect();
    assert!(
        refused.is_empty(),
        "the starting core's refusals were logged:\n{}",
        refused.join("\n")
    );
}

/// A core that refuses `/readyz` to the gateway's identity for good (its RBAC binds no
/// `system:public-info-viewer`) but serves everything else: the gateway cannot tell a starting
/// core from it, so it holds its watches back for at most 30 s (`REFUSED_READYZ_WAIT`), then
/// starts them anyway, says so in one warning, and becomes Ready. Without that bound it would
/// wait for a 2xx forever and never be Ready.
#[tokio::test]
async fn a_core_that_refuses_readyz_for_good_is_watched_after_thirty_seconds() {
    let core = FixtureCore::start(&["--forbid-readyz"])
        .await
        .expect("fixture core starts");
    let gateway = Gateway::start(GatewayOptions::new(core.url()))
        .await
        .expect("gateway starts");
    let started = Instant::now();
    let client = gateway.http1_client(None);
    let ready = || is_ready(&client, &gateway);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !ready().await,
        "Ready before its watches could start:\n{}",
        gateway.process.logs()
    );
    assert!(
        harness::wait_until(Duration::from_secs(45), ready).await,
        "not Ready {:?} after start against a core that refuses /readyz:\n{}",
        started.elapsed(),
        gateway.process.logs()
    );
    let waited = started.elapsed();
    // The bound starts at the first refused probe, a moment after the gateway listens.
    assert!(
        waited >= Duration::from_secs(25),
        "Ready after {waited:?}: the watches did not wait for the core"
    );
    eprintln!("Ready {waited:?} after start against a core that refuses /readyz");

    let lines: Vec<Value> = gateway
        .process
        .lines()
        .iter()
        .filter_map(|l| serde_json::from_str(&l.text).ok())
        .collect();
    let said = lines_at(&lines, "WARN", "refused /readyz");
    assert_eq!(
        said.len(),
        1,
        "one warning that the watches start without /readyz, got {said:#?}"
    );
}

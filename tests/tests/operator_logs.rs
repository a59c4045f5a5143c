//! What an operator reads in the gateway's log: one warning per change of an APIService's state,
//! not one per probe or request; no colour codes when the log goes to a pipe; and a clear error,
//! not a silent takeover, when two manifest files define the same APIService; and no Forbidden
//! from a core that is still starting.

use std::process::Command;
use std::time::Duration;

use e2e::harness::{self, FixtureCore, Gateway, GatewayOptions, Process};
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
    let client = harness::http1_client(&gateway.ca_pem().unwrap(), None).unwrap();
    let readyz = format!("{}/readyz", gateway.url());
    let ready = || async {
        harness::get(&client, &readyz)
            .await
            .is_ok_and(|(status, _, _)| status == StatusCode::OK)
    };
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

//! Issue 27 beside kube-aggregator: sample-apiserver frozen (SIGSTOP), then killed, with no
//! request to it before, timed on both sides in the same run. The gateway (kube source, availability
//! checked every 5 s) and kube-apiserver's aggregator (resync every 30 s) watch the same process:
//!
//! * `Stale`: aggregated `/apis` (v2) lists `wardle.example.com/v1alpha1` as `Stale`;
//! * unavailable: each side's `/metrics` has `aggregator_unavailable_apiservice` at 1 for the
//!   APIService (both sides write the one `Available` condition, so it cannot tell them apart);
//! * a request sent 0.3 s after the freeze: the time to its answer;
//! * probes: a GET of flunders every 250 ms with a 1 s timeout, until one is answered 503.
//!
//! The gateway's figures are asserted against the goals; kube-aggregator's are printed.
//! The check kills sample-apiserver at its end, so it runs last. sample-apiserver has no way to
//! make its discovery slow, so the "restarted with slow discovery" row is fixture-only
//! (tests/control_loops.rs).

use std::future::Future;
use std::time::{Duration, Instant};

use e2e::harness::{self, assert_within, HttpClient, Stopped};
use e2e::real::sample_apiserver::{WARDLE_APISERVICE, WARDLE_GROUP, WARDLE_VERSION};
use http::StatusCode;

use super::session::{Real, AGGREGATED_V2};

const FLUNDERS: &str = "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders";

/// One side: the gateway or kube-apiserver.
struct Side<'a> {
    name: &'static str,
    real: &'a Real,
    client: HttpClient,
    base: String,
}

impl Side<'_> {
    async fn get(
        &self,
        path: &str,
        accept: &str,
        timeout: Duration,
    ) -> Option<(StatusCode, String)> {
        let request = self
            .real
            .admin_request(&format!("{}{path}", self.base), accept);
        let sent = tokio::time::timeout(timeout, harness::send(&self.client, request)).await;
        let (status, _, body) = sent.ok()?.ok()?;
        Some((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// The freshness aggregated `/apis` gives wardle's version, if listed.
    async fn freshness(&self) -> Option<String> {
        let (status, body) = self
            .get("/apis", AGGREGATED_V2, Duration::from_secs(5))
            .await?;
        if status != StatusCode::OK {
            return None;
        }
        let doc: serde_json::Value = serde_json::from_str(&body).ok()?;
        doc["items"]
            .as_array()?
            .iter()
            .filter(|g| g["metadata"]["name"] == WARDLE_GROUP)
            .flat_map(|g| g["versions"].as_array().cloned().unwrap_or_default())
            .find(|v| v["version"] == WARDLE_VERSION)
            .map(|v| v["freshness"].as_str().unwrap_or("Current").to_owned())
    }

    async fn stale(&self) -> bool {
        self.freshness().await.as_deref() == Some("Stale")
    }

    /// `aggregator_unavailable_apiservice` for wardle's APIService on this side's `/metrics`.
    async fn unavailable_gauge(&self) -> Option<bool> {
        let (status, body) = self
            .get("/metrics", "text/plain", Duration::from_secs(5))
            .await?;
        if status != StatusCode::OK {
            return None;
        }
        let series = format!("aggregator_unavailable_apiservice{{name=\"{WARDLE_APISERVICE}\"}}");
        body.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map(|value| value.trim() == "1")
    }

    async fn unavailable(&self) -> bool {
        self.unavailable_gauge().await == Some(true)
    }

    async fn serves_flunders(&self) -> bool {
        self.get(FLUNDERS, "application/json", Duration::from_secs(5))
            .await
            .is_some_and(|(status, _)| status == StatusCode::OK)
    }

    /// Back to normal: flunders served, `Current`, available.
    async fn healthy(&self) -> bool {
        self.serves_flunders().await
            && self.freshness().await.as_deref() == Some("Current")
            && self.unavailable_gauge().await == Some(false)
    }

    /// A request sent 0.3 s after `since`: the time to its answer, and its status.
    async fn request_after_freeze(
        &self,
        since: Instant,
        limit: Duration,
    ) -> Option<(Duration, StatusCode)> {
        tokio::time::sleep_until((since + Duration::from_millis(300)).into()).await;
        let sent = Instant::now();
        let answer = self.get(FLUNDERS, "application/json", limit).await;
        answer.map(|(status, _)| (sent.elapsed(), status))
    }

    /// The time from `since` to the first probe answered 503.
    async fn probes_answered_503(&self, since: Instant, limit: Duration) -> Option<Duration> {
        while since.elapsed() < limit {
            let probe = self
                .get(FLUNDERS, "application/json", Duration::from_secs(1))
                .await;
            if probe.is_some_and(|(status, _)| status == StatusCode::SERVICE_UNAVAILABLE) {
                return Some(since.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        None
    }
}

/// Polls `observed` every 100 ms until it holds: the time from `since`, `None` past `limit`.
async fn reaction<F, Fut>(since: Instant, limit: Duration, mut observed: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    while since.elapsed() < limit {
        if observed().await {
            return Some(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

fn ms(took: Option<Duration>) -> String {
    took.map_or_else(
        || "none".to_owned(),
        |d| format!("{:.1} s", d.as_secs_f64()),
    )
}

/// What one side showed after the freeze.
struct Frozen {
    request: Option<(Duration, StatusCode)>,
    stale: Option<Duration>,
    unavailable: Option<Duration>,
    probes_503: Option<Duration>,
}

async fn frozen(side: &Side<'_>, since: Instant) -> Frozen {
    let limit = Duration::from_secs(60);
    let (request, stale, unavailable, probes_503) = tokio::join!(
        side.request_after_freeze(since, limit),
        reaction(since, limit, || side.stale()),
        reaction(since, limit, || side.unavailable()),
        side.probes_answered_503(since, limit),
    );
    let answer = request.map_or_else(
        || "none".to_owned(),
        |(took, status)| format!("{} after {:.1} s", status.as_u16(), took.as_secs_f64()),
    );
    eprintln!(
        "real control plane: issue 27, sample-apiserver frozen, {}: request sent 0.3 s after \
         answered {answer} (from sending); Stale {}; unavailable {}; probes answered 503 {}",
        side.name,
        ms(stale),
        ms(unavailable),
        ms(probes_503)
    );
    Frozen {
        request,
        stale,
        unavailable,
        probes_503,
    }
}

pub async fn frozen_then_killed(real: &Real) {
    let gateway = Side {
        name: "gateway",
        real,
        client: real.gateway_client(),
        base: real.gateway.url(),
    };
    let kube = Side {
        name: "kube-aggregator",
        real,
        client: real.direct_client(),
        base: real.plane.url.clone(),
    };
    let pid = real.sample.process.id();
    let healthy = harness::wait_until(Duration::from_secs(60), || async {
        gateway.healthy().await && kube.healthy().await
    })
    .await;
    assert!(
        healthy,
        "sample-apiserver was not available on both sides to start with"
    );
    // No request to sample-apiserver for a while: what either side notices next it notices on
    // its own.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let since = Instant::now();
    let stopped = Stopped::stop(pid);
    let (on_gateway, _) = tokio::join!(frozen(&gateway, since), frozen(&kube, since));
    drop(stopped);

    // Both sides see it back before the kill.
    let back = Instant::now();
    let healthy = harness::wait_until(Duration::from_secs(90), || async {
        gateway.healthy().await && kube.healthy().await
    })
    .await;
    eprintln!(
        "real control plane: issue 27, sample-apiserver resumed: both sides healthy again \
         after {:.1} s",
        back.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    let since = Instant::now();
    harness::signal_pid("KILL", pid).unwrap();
    let limit = Duration::from_secs(40);
    let (g_stale, g_unavailable, k_stale, k_unavailable) = tokio::join!(
        reaction(since, limit, || gateway.stale()),
        reaction(since, limit, || gateway.unavailable()),
        reaction(since, limit, || kube.stale()),
        reaction(since, limit, || kube.unavailable()),
    );
    eprintln!(
        "real control plane: issue 27, sample-apiserver killed, no requests: Stale gateway {}, \
         kube-aggregator {}; unavailable gateway {}, kube-aggregator {}",
        ms(g_stale),
        ms(k_stale),
        ms(g_unavailable),
        ms(k_unavailable)
    );

    assert!(
        healthy,
        "sample-apiserver was not healthy on both sides 90 s after SIGCONT"
    );
    let request = on_gateway
        .request
        .filter(|(_, status)| *status == StatusCode::SERVICE_UNAVAILABLE)
        .map(|(took, _)| took);
    assert_within(
        "frozen: 503 to a request sent 0.3 s after",
        request,
        Duration::from_secs(12),
    );
    assert_within("frozen: Stale", on_gateway.stale, Duration::from_secs(8));
    assert_within(
        "frozen: unavailable",
        on_gateway.unavailable,
        Duration::from_secs(8),
    );
    assert_within(
        "frozen: probes answered 503",
        on_gateway.probes_503,
        Duration::from_secs(8),
    );
    assert_within("killed: Stale", g_stale, Duration::from_secs(2));
    assert_within("killed: unavailable", g_unavailable, Duration::from_secs(3));
}

//! What API Priority and Fairness costs per request: the setup's gateway (flow control on, the
//! default) beside a second gateway on the same backend with `--enable-priority-and-fairness=false`
//! (kube's older in-flight limits), the same small GET load against each in interleaved rounds,
//! each gateway's CPU time per request from `/proc`. Classification and dispatch must not show
//! beyond the noise between rounds of the same gateway. (What flow control is for, a quiet
//! caller served beside a flood, is an e2e test's: `tests/tests/suite/priority_and_fairness.rs`.)

use serde_json::json;

use super::load::{load, Endpoint, LoadSpec, Proto};
use super::memory::CpuMeter;
use super::report::{Results, Row};
use super::setup::Setup;
use super::{median, BoxError, Settings};
use crate::harness::Gateway;

pub const NAME: &str = "priority and fairness";

/// Rounds per gateway; the order alternates so drift on a shared machine hits both alike.
const ROUNDS: usize = 3;

/// One gateway's rounds: CPU µs per request and requests/s.
#[derive(Default)]
struct Rounds {
    cpu_us: Vec<f64>,
    rps: Vec<f64>,
}

impl Rounds {
    fn spread(&self) -> String {
        let parts: Vec<String> = self.cpu_us.iter().map(|v| format!("{v:.1}")).collect();
        parts.join(", ")
    }
}

async fn round(
    gateway: &Gateway,
    endpoint: &Endpoint,
    spec: &LoadSpec,
    into: &mut Rounds,
) -> Result<(), BoxError> {
    let meter = CpuMeter::start(&[gateway.process.id()]);
    let result = load(endpoint, spec).await?;
    if result.errors > 0 {
        return Err(format!("{} errors in a round of {}", result.errors, result.requests).into());
    }
    into.cpu_us
        .push(meter.per_request_us(result.all_requests)[0]);
    into.rps.push(result.rps());
    Ok(())
}

pub async fn run(
    settings: &Settings,
    setup: &Setup,
    results: &mut Results,
) -> Result<(), BoxError> {
    let scenario = "small GET, HTTP/1.1 keep-alive, 32 connections: priority and fairness off \
                    (direct column) vs on (via column)";
    eprintln!("bench: {scenario}");
    let off = Gateway::start(
        setup
            .gateway_options
            .clone()
            .args(["--enable-priority-and-fairness=false"]),
    )
    .await?;
    let endpoint = |gateway: &Gateway| Endpoint {
        addr: gateway.addr,
        ca_pem: Some(setup.ca_pem.clone()),
        client_cert: None,
    };
    let spec = LoadSpec {
        proto: Proto::H1,
        connections: 32,
        streams_per_connection: 1,
        path: "/api/v1/namespaces/default/configmaps/bench".to_owned(),
        accept: None,
        warmup: settings.warmup,
        duration: settings.duration,
    };
    let (mut with_apf, mut without) = (Rounds::default(), Rounds::default());
    for i in 0..ROUNDS {
        if i % 2 == 0 {
            round(&off, &endpoint(&off), &spec, &mut without).await?;
            round(&setup.gateway, &setup.via(), &spec, &mut with_apf).await?;
        } else {
            round(&setup.gateway, &setup.via(), &spec, &mut with_apf).await?;
            round(&off, &endpoint(&off), &spec, &mut without).await?;
        }
    }
    let spread = format!(
        "{ROUNDS} interleaved rounds each, median; off: {} µs, on: {} µs",
        without.spread(),
        with_apf.spread()
    );
    results.raw.insert(
        NAME.to_owned(),
        json!({
            "rounds": ROUNDS,
            "cpu_us_per_request_off": without.cpu_us,
            "cpu_us_per_request_on": with_apf.cpu_us,
            "rps_off": without.rps,
            "rps_on": with_apf.rps,
        }),
    );
    // "Beyond noise": above the largest figure of the gateway without flow control.
    let noisiest_off = without.cpu_us.iter().copied().fold(f64::NAN, f64::max);
    let (cpu_off, cpu_on) = (median(&mut without.cpu_us), median(&mut with_apf.cpu_us));
    eprintln!("bench:   gateway CPU per request off {cpu_off:.1} µs, on {cpu_on:.1} µs");
    results.rows.push(
        Row::new(scenario, "CPU per request: gateway", "µs")
            .values(Some(cpu_off), Some(cpu_on))
            .target("on ≤ the largest round off", Some(cpu_on <= noisiest_off))
            .note(spread),
    );
    results
        .rows
        .push(Row::new(scenario, "throughput", "req/s").values(
            Some(median(&mut without.rps)),
            Some(median(&mut with_apf.rps)),
        ));
    Ok(())
}

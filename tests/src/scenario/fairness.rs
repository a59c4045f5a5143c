//! The fairness experiment of issue 25 (API Priority and Fairness): one user floods a server
//! with LISTs on many connections while a ServiceAccount makes small GETs one after the other.
//! The fixture suite, the real-control-plane suite and the bench run it against the core
//! directly and through the gateway, and compare what the quiet caller got.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;

use crate::harness::{self, HttpClient};

/// The ServiceAccount's certificate subject as kube's x509 authenticator reads it: kube puts
/// ServiceAccounts in `system:serviceaccounts`, which the built-in `service-accounts` FlowSchema
/// sends to the `workload-low` priority level.
pub const QUIET_SERVICE_ACCOUNT: &str = "system:serviceaccount:default:quiet";
pub const QUIET_GROUPS: [&str; 2] = ["system:serviceaccounts", "system:serviceaccounts:default"];

/// A flood in progress: `connections` tasks each sending `GET url` as fast as answers come.
pub struct Flood {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<FloodTally>>,
    started: Instant,
}

/// What the flood got.
#[derive(Debug, Default)]
pub struct FloodTally {
    /// Answers by status code; 0 counts requests that got none (a transport error).
    pub answers: BTreeMap<u16, usize>,
    /// The headers of one refusal (429), and of one answer served (200).
    pub refusal: Option<HeaderMap>,
    pub served: Option<HeaderMap>,
    pub elapsed: Duration,
}

impl FloodTally {
    pub fn count(&self, status: u16) -> usize {
        self.answers.get(&status).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.answers.values().sum()
    }

    fn merge(&mut self, other: FloodTally) {
        for (status, n) in other.answers {
            *self.answers.entry(status).or_default() += n;
        }
        self.refusal = self.refusal.take().or(other.refusal);
        self.served = self.served.take().or(other.served);
    }
}

impl Flood {
    /// Starts `connections` flooding tasks on `client` (which opens a connection per task).
    /// They ignore `Retry-After`, as the wrk did.
    pub fn start(client: &HttpClient, url: &str, connections: usize) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..connections)
            .map(|_| {
                let (client, url, stop) = (client.clone(), url.to_owned(), stop.clone());
                tokio::spawn(async move {
                    let mut tally = FloodTally::default();
                    while !stop.load(Ordering::Relaxed) {
                        let status = match harness::get(&client, &url).await {
                            Ok((status, headers, _)) => {
                                let slot = match status.as_u16() {
                                    429 => &mut tally.refusal,
                                    200 => &mut tally.served,
                                    _ => &mut None,
                                };
                                if slot.is_none() {
                                    *slot = Some(headers);
                                }
                                status.as_u16()
                            }
                            Err(_) => 0,
                        };
                        *tally.answers.entry(status).or_default() += 1;
                    }
                    tally
                })
            })
            .collect();
        Flood {
            stop,
            tasks,
            started: Instant::now(),
        }
    }

    /// Stops the flood once every task's request in progress is answered.
    pub async fn stop(self) -> FloodTally {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = FloodTally::default();
        for task in self.tasks {
            if let Ok(tally) = task.await {
                total.merge(tally);
            }
        }
        total.elapsed = self.started.elapsed();
        total
    }
}

/// What the quiet caller got.
#[derive(Debug)]
pub struct Quiet {
    /// Status and latency of each request, in order (status 0: no answer).
    pub requests: Vec<(u16, Duration)>,
}

impl Quiet {
    /// `n` GETs of `url`, one after the other.
    pub async fn run(client: &HttpClient, url: &str, n: usize) -> Quiet {
        Self::run_within(client, url, n, Duration::MAX).await
    }

    /// Up to `n` GETs of `url`, one after the other, none started after `budget`: for a server
    /// so slow under the flood that `n` would take minutes.
    pub async fn run_within(client: &HttpClient, url: &str, n: usize, budget: Duration) -> Quiet {
        let deadline = Instant::now().checked_add(budget);
        let mut requests = Vec::with_capacity(n);
        for _ in 0..n {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            let started = Instant::now();
            let status = harness::get(client, url)
                .await
                .map_or(0, |(status, _, _)| status.as_u16());
            requests.push((status, started.elapsed()));
        }
        Quiet { requests }
    }

    /// The share of requests answered 200.
    pub fn ok_share(&self) -> f64 {
        let ok = self.requests.iter().filter(|(s, _)| *s == 200).count();
        ok as f64 / self.requests.len().max(1) as f64
    }

    /// The 90th percentile of the latencies (nearest rank).
    pub fn p90(&self) -> Duration {
        self.percentile(0.9)
    }

    pub fn p50(&self) -> Duration {
        self.percentile(0.5)
    }

    fn percentile(&self, q: f64) -> Duration {
        let mut latencies: Vec<Duration> = self.requests.iter().map(|(_, d)| *d).collect();
        latencies.sort();
        let rank = ((q * latencies.len() as f64).ceil() as usize).max(1);
        latencies.get(rank - 1).copied().unwrap_or_default()
    }

    /// `40 × 200, p50 3 ms, p90 5 ms` (other codes listed).
    pub fn summary(&self) -> String {
        let mut codes: BTreeMap<u16, usize> = BTreeMap::new();
        for (status, _) in &self.requests {
            *codes.entry(*status).or_default() += 1;
        }
        let codes: Vec<String> = codes.iter().map(|(s, n)| format!("{n} × {s}")).collect();
        format!(
            "{}, p50 {:.1} ms, p90 {:.1} ms",
            codes.join(", "),
            self.p50().as_secs_f64() * 1000.0,
            self.p90().as_secs_f64() * 1000.0
        )
    }
}

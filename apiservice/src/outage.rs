//! What every client of the core server logs when the core stops answering: one warning when a
//! loop loses it (with the error's root cause), one line when it answers again (with how many
//! retries it took and how long it was down), and each retry in between at debug only, with the
//! full error chain. A core down for ten minutes costs each loop two lines, whatever its retry
//! period, instead of one line per retry.
//!
//! It lives here, in the lowest crate with clients of the core (the APIService source and the
//! Service/EndpointSlice caches), so that every loop of the gateway uses this one piece: the
//! discovery watches and fetches, the OpenAPI loop, the trust ConfigMap, leader election, core
//! readiness, status writes and the review clients of the request path.
//!
//! How a loop uses it: one [`Outage`] per loop (or per shared client), named for what it does
//! ("APIService watch") and for what holds while the core is away ("the last known APIServices
//! stay in force"); then [`Outage::failed`] on every failed call and [`Outage::answered`] on every
//! successful one. A kube-rs watcher's events go to [`Outage::watch_event`] as they come, and its
//! client is [`Outage::client`], so that a watch resumed after an outage reports the return
//! although no event comes with it. Calls take `&self` and are cheap while the core answers (one
//! atomic load), so a client shared by concurrent requests can hold one in an `Arc` or a field.
//!
//! ```
//! # use apiservice::outage::Outage;
//! let outage = Outage::new("Lease renewal", "this replica stops writing status after the renew deadline");
//! let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
//! outage.failed(&refused); // WARN, once
//! outage.failed(&refused); // debug
//! outage.answered(); // INFO: retries=2, down_for
//! ```

use std::error::Error;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use kube::runtime::watcher;
use kube::Client;
use tokio::time::Instant;

/// One client's view of the core server: answering, or down since when and after how many
/// retries. Logs on the transitions only.
#[derive(Debug)]
pub struct Outage {
    /// What the client does, as the log names it: `APIService watch`, `TokenReview`.
    client: &'static str,
    /// What holds while the core is away, for the warning.
    meanwhile: &'static str,
    /// Set while down; read first so that a success costs one load.
    down: AtomicBool,
    state: Mutex<Option<Down>>,
}

#[derive(Debug)]
struct Down {
    since: Instant,
    /// Attempts after the first failure.
    retries: u64,
}

impl Outage {
    pub const fn new(client: &'static str, meanwhile: &'static str) -> Self {
        Self {
            client,
            meanwhile,
            down: AtomicBool::new(false),
            state: Mutex::new(None),
        }
    }

    /// A call to the core failed: a warning the first time, with the error's root cause (the
    /// rest of the chain usually repeats the core's URL and the layers it went through); after
    /// that, debug lines with the whole chain.
    pub fn failed(&self, error: &(dyn Error + 'static)) {
        self.fail(&root_cause(error), &chain(error));
    }

    /// [`Outage::failed`] for an error known only as text (an unexpected answer, say).
    pub fn failed_with(&self, message: &str) {
        self.fail(message, message);
    }

    fn fail(&self, cause: &str, chain: &str) {
        let mut state = lock(&self.state);
        match state.as_mut() {
            Some(down) => {
                down.retries += 1;
                tracing::debug!(client = self.client, retry = down.retries, error = %chain,
                    "the core server still does not answer");
            }
            None => {
                *state = Some(Down {
                    since: Instant::now(),
                    retries: 0,
                });
                self.down.store(true, Ordering::Release);
                tracing::warn!(client = self.client, error = %cause,
                    "cannot use the core server (--core-url), retrying with backoff: {}", self.meanwhile);
                tracing::debug!(client = self.client, error = %chain, "the full error");
            }
        }
    }

    /// A call to the core succeeded: one line if it was down, nothing otherwise.
    pub fn answered(&self) {
        if !self.down.load(Ordering::Acquire) {
            return;
        }
        // The flag is cleared under the lock: a failure racing in between would otherwise set
        // the state again and then see the flag cleared, and the outage would never be said.
        let mut state = lock(&self.state);
        let Some(down) = state.take() else {
            return;
        };
        self.down.store(false, Ordering::Release);
        drop(state);
        tracing::info!(
            client = self.client,
            retries = down.retries + 1,
            down_for = %seconds(down.since.elapsed()),
            "the core server answers again"
        );
    }

    /// Records what a call returned.
    pub fn outcome<T, E: Error + 'static>(&self, result: &Result<T, E>) {
        match result {
            Ok(_) => self.answered(),
            Err(e) => self.failed(e),
        }
    }

    /// Records a kube-rs watcher's event: an error is a failure; a listed or watched object, or
    /// the end of a list, an answer. `Init` says nothing (the watcher emits it before it asks).
    /// A watch that resumes where it left off after an outage (kube-apiserver kept the
    /// resourceVersion) has no event to report it with: such a watch counts as back at its next
    /// event or relist. A `410 Gone` (the resourceVersion is too old; the watcher lists again) is how a watch
    /// normally restarts, not a failure.
    pub fn watch_event<K>(&self, event: &Result<watcher::Event<K>, watcher::Error>) {
        match event {
            Ok(watcher::Event::Init) => {}
            Ok(_) => self.answered(),
            Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                tracing::debug!(client = self.client, error = %status, "the watch expired; listing again")
            }
            Err(e) => self.failed(e),
        }
    }

    /// Whether the last call failed.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// `client`, with every watch the core accepts (a `2xx` answer to a `watch` request) counted
    /// as an answer. A kube-rs watcher that resumes from its last resourceVersion after an
    /// outage has no event to say so; its client does.
    pub fn client(self: &Arc<Self>, client: Client) -> Client {
        let namespace = client.default_namespace().to_owned();
        Client::new(
            AnsweredWatches {
                client,
                outage: Arc::clone(self),
            },
            namespace,
        )
    }
}

/// The transport of [`Outage::client`].
struct AnsweredWatches {
    client: Client,
    outage: Arc<Outage>,
}

impl tower::Service<Request<Body>> for AnsweredWatches {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let client = self.client.clone();
        let outage = Arc::clone(&self.outage);
        let watch = req.uri().query().is_some_and(is_watch);
        Box::pin(async move {
            let resp = client.send(req).await?;
            if watch && resp.status().is_success() {
                outage.answered();
            }
            Ok(resp)
        })
    }
}

/// Whether a query asks for a watch (`watch=true` or `watch=1`, as kube-rs writes it).
fn is_watch(query: &str) -> bool {
    query
        .split('&')
        .any(|kv| matches!(kv, "watch=true" | "watch=1"))
}

/// `a: b: c` from an error and its sources, the way Go errors read in kube's messages; a
/// source whose text the outer message already carries is not repeated.
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}

/// The innermost error of the chain: what actually went wrong (`Connection refused`, a
/// Status's message), without the layers around it.
pub fn root_cause(err: &(dyn Error + 'static)) -> String {
    let mut cur = err;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// `61.2s`: a time down as an operator reads it.
fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex as StdMutex};
    use tracing::Level;

    /// The lines a closure logs, as `LEVEL message field=value...`.
    fn logged(f: impl FnOnce()) -> Vec<String> {
        #[derive(Clone, Default)]
        struct Lines(Arc<StdMutex<Vec<String>>>);
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0.insert_str(0, &format!("{value:?}"));
                } else {
                    self.0.push_str(&format!(" {}={value:?}", field.name()));
                }
            }
        }
        impl tracing::Subscriber for Lines {
            fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
                tracing::span::Id::from_u64(1)
            }
            fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
            fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
            fn event(&self, event: &tracing::Event<'_>) {
                let mut fields = Fields(String::new());
                event.record(&mut fields);
                let level = *event.metadata().level();
                self.0.lock().unwrap().push(format!("{level} {}", fields.0));
            }
            fn enter(&self, _: &tracing::span::Id) {}
            fn exit(&self, _: &tracing::span::Id) {}
        }
        let lines = Lines::default();
        tracing::subscriber::with_default(lines.clone(), f);
        let out = lines.0.lock().unwrap().clone();
        out
    }

    fn at(lines: &[String], level: Level) -> Vec<&String> {
        lines
            .iter()
            .filter(|l| l.starts_with(level.as_str()))
            .collect()
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the core server at http://10.0.0.1:8080 is unreachable")]
    struct Unreachable(#[source] std::io::Error);

    fn refused() -> Unreachable {
        Unreachable(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (os error 111)",
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_is_one_warning_and_one_line_when_it_ends() {
        let outage = Outage::new(
            "APIService watch",
            "the last known APIServices stay in force",
        );
        let lines = logged(|| {
            outage.answered();
            for _ in 0..600 {
                outage.failed(&refused());
            }
        });
        tokio::time::advance(Duration::from_secs(60)).await;
        let back = logged(|| {
            outage.answered();
            outage.answered();
        });
        let warnings = at(&lines, Level::WARN);
        assert_eq!(warnings.len(), 1, "{lines:#?}");
        assert!(
            warnings[0].contains("error=Connection refused (os error 111)")
                && warnings[0].contains("client=\"APIService watch\"")
                && warnings[0].contains("the last known APIServices stay in force")
                && !warnings[0].contains("10.0.0.1"),
            "the root cause only: {}",
            warnings[0]
        );
        assert!(at(&lines, Level::INFO).is_empty(), "{lines:#?}");
        // Every retry is there for whoever turns on debug, with the whole chain.
        let debug = at(&lines, Level::DEBUG);
        assert_eq!(debug.len(), 600, "{}", debug.len());
        assert!(debug
            .iter()
            .all(|l| l.contains("is unreachable: Connection refused")));
        assert_eq!(
            back,
            ["INFO the core server answers again client=\"APIService watch\" retries=600 down_for=60.0s"]
        );
        assert!(!outage.is_down());
    }

    #[tokio::test]
    async fn a_second_outage_is_reported_again() {
        let outage = Outage::new("TokenReview", "requests with bearer tokens answer 503");
        let lines = logged(|| {
            for _ in 0..2 {
                outage.failed_with("no answer within 10s");
                outage.failed_with("no answer within 10s");
                outage.answered();
            }
        });
        let summary: Vec<&str> = lines
            .iter()
            .filter(|l| !l.starts_with("DEBUG"))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        assert_eq!(summary, ["WARN", "INFO", "WARN", "INFO"], "{lines:#?}");
    }

    #[test]
    fn watch_events_count_as_answers_except_init() {
        let outage = Outage::new("Service watch", "routes use the last known Services");
        let failed: Result<watcher::Event<()>, watcher::Error> =
            Err(watcher::Error::NoResourceVersion);
        outage.watch_event(&failed);
        assert!(outage.is_down());
        outage.watch_event::<()>(&Ok(watcher::Event::Init));
        assert!(outage.is_down(), "Init comes before the list is asked for");
        outage.watch_event::<()>(&Ok(watcher::Event::InitDone));
        assert!(!outage.is_down());
    }

    #[test]
    fn chain_and_root_cause() {
        let e = refused();
        assert_eq!(
            chain(&e),
            "the core server at http://10.0.0.1:8080 is unreachable: Connection refused (os error 111)"
        );
        assert_eq!(root_cause(&e), "Connection refused (os error 111)");
    }
}

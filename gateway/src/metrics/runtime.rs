//! What kube-apiserver's Go runtime metrics tell an operator about leaks, for the gateway's
//! runtime: `go_goroutines` has its counterpart in the tokio runtime's live tasks, read at each
//! scrape (a task that outlives its request or its loop shows as a count that keeps growing).

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGauge, Opts};

/// `aggregation_gateway_runtime_tasks`: tasks alive in the runtime that serves the scrape.
pub struct RuntimeCollector {
    tasks: IntGauge,
}

impl RuntimeCollector {
    pub fn new() -> Self {
        let opts = Opts::new(
            "aggregation_gateway_runtime_tasks",
            "Tasks alive in the gateway's tokio runtime (the counterpart of go_goroutines)",
        );
        Self {
            tasks: IntGauge::with_opts(opts).expect("valid metric definition"),
        }
    }
}

impl Collector for RuntimeCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.tasks.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        // Scrapes run on the runtime; outside one (a unit test's registry dump) nothing is known.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Vec::new();
        };
        let alive = runtime.metrics().num_alive_tasks();
        self.tasks.set(i64::try_from(alive).unwrap_or(i64::MAX));
        self.tasks.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_the_tasks_alive_at_the_scrape() {
        let collector = RuntimeCollector::new();
        let count = |c: &RuntimeCollector| c.collect()[0].get_metric()[0].get_gauge().get_value();
        let before = count(&collector);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = rx.await;
        });
        assert_eq!(count(&collector), before + 1.0);
        drop(tx);
        task.await.unwrap();
        assert_eq!(count(&collector), before);
    }
}

//! Tables of cases, each case checked on its own, as kube-aggregator's `handler_proxy_test.go`
//! runs its table: one failing row does not hide the rows after it, and the failure names every
//! row that failed. [`check_each`] runs rows that assert (panic); [`assert_rows_passed`] reports
//! rows an async check already judged.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `check` on every case, each isolated from the others' panics, then fails listing each case
/// that failed (named by `name`) with its message.
#[track_caller]
pub fn check_each<C>(
    cases: impl IntoIterator<Item = C>,
    name: impl Fn(&C) -> String,
    check: impl Fn(C),
) {
    let mut failed = Vec::new();
    for case in cases {
        let row = name(&case);
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| check(case))) {
            failed.push(format!("{row}: {}", panic_message(panic.as_ref())));
        }
    }
    assert!(
        failed.is_empty(),
        "{} case(s) failed:\n- {}",
        failed.len(),
        failed.join("\n- ")
    );
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(a panic without a message)")
}

/// Fails listing `failures` (each already naming its row) unless there are none; `context` says
/// which table, `rows` how many rows it had.
#[track_caller]
pub fn assert_rows_passed(context: &str, rows: usize, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{context}: {} of {rows} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// One named check of a long session (a real control plane, a real node): an async function of
/// the session's state.
pub type Check<S> =
    for<'a> fn(&'a S) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;

/// Runs `checks` in order on `session`, each isolated from the others' panics, printing
/// `<label>: <name> ...`, `passed` or `FAILED` with the time each took, and returns one line per
/// failure naming the check. `<ONLY_ENV>=<text>` (e.g. `REAL_CHECKS`) runs only the checks whose
/// name contains the text.
pub async fn run_checks<S>(
    label: &str,
    only_env: &str,
    session: &S,
    checks: &[(&str, Check<S>)],
) -> Vec<String> {
    use futures::FutureExt;
    let mut failures = Vec::new();
    let only = std::env::var(only_env).ok().filter(|s| !s.is_empty());
    for (name, check) in checks {
        if only.as_deref().is_some_and(|only| !name.contains(only)) {
            eprintln!("{label}: {name} not selected by {only_env}");
            continue;
        }
        let started = std::time::Instant::now();
        eprintln!("{label}: {name} ...");
        let outcome = AssertUnwindSafe(check(session)).catch_unwind().await;
        let took = started.elapsed();
        match outcome {
            Ok(()) => eprintln!("{label}: {name} passed ({took:.1?})"),
            Err(panic) => {
                eprintln!("{label}: {name} FAILED ({took:.1?})");
                failures.push(format!("- {name}: {}", panic_message(panic.as_ref())));
            }
        }
    }
    failures
}

/// `&[(name, Check)]` from `"name" => async_fn` pairs, for [`run_checks`].
#[macro_export]
macro_rules! checks {
    ($($name:literal => $f:path),* $(,)?) => {
        &[$(($name, (|session| Box::pin($f(session))) as $crate::table::Check<_>)),*]
    };
}

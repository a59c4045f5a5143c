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

//! Flunders through the gateway (kube source) as a user works with them: kubectl create, get,
//! watch, patch, delete and explain, and a refused user.

use std::time::Duration;

use e2e::real::pki::ALICE_TOKEN;

use super::file_source::{flunder, last_line};
use super::session::Real;

pub async fn explain(real: &Real) {
    let (direct, through) = real.admins();
    let want = direct.run_ok(&["explain", "flunders.spec"]).await.stdout;
    let got = through.run_ok(&["explain", "flunders.spec"]).await.stdout;
    assert!(want.contains("FIELDS"), "{want}");
    assert_eq!(
        got, want,
        "kubectl explain flunders.spec through the gateway"
    );
}

pub async fn crud_and_watch(real: &Real) {
    let (_, admin) = real.admins();
    let watch = admin
        .spawn(&[
            "get",
            "flunders",
            "-n",
            "default",
            "--watch",
            "--output-watch-events",
        ])
        .unwrap();
    // The watch is established once kubectl printed the (empty) list's header or waited a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;

    admin.apply_yaml(&flunder("default", "crud-1")).await;
    let listed = admin.run_ok(&["get", "flunders", "-n", "default"]).await;
    assert!(listed.stdout.contains("crud-1"), "{listed}");

    admin
        .run_ok(&[
            "patch",
            "flunder",
            "crud-1",
            "-n",
            "default",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"labels":{"patched":"yes"}},"spec":{"reference":"crud-0"}}"#,
        ])
        .await;
    let patched = admin
        .run_ok(&[
            "get",
            "flunder",
            "crud-1",
            "-n",
            "default",
            "-o",
            "jsonpath={.metadata.labels.patched} {.spec.reference} {.spec.referenceType}",
        ])
        .await;
    assert_eq!(patched.stdout, "yes crud-0 Flunder", "{patched}");

    admin
        .run_ok(&["delete", "flunder", "crud-1", "-n", "default"])
        .await;
    let gone = admin
        .run(&["get", "flunder", "crud-1", "-n", "default"])
        .await;
    assert!(gone.stderr.contains("NotFound"), "{gone}");

    for event in ["ADDED", "MODIFIED", "DELETED"] {
        let seen = watch
            .wait_for_line(
                |l| l.starts_with(event) && l.contains("crud-1"),
                Duration::from_secs(15),
            )
            .await;
        assert!(
            seen.is_some(),
            "kubectl get flunders --watch through the gateway did not show {event} crud-1:\n{}",
            watch.logs()
        );
    }
}

pub async fn forbidden_like_kube(real: &Real) {
    let args = ["get", "flunders", "-n", "default"];
    let through = real.through_gateway(ALICE_TOKEN).run(&args).await;
    let direct = real.alice_direct().run(&args).await;
    assert!(
        !direct.success() && direct.stderr.contains("Forbidden"),
        "{direct}"
    );
    assert_eq!(
        last_line(&through.stderr),
        last_line(&direct.stderr),
        "alice's 403 through the gateway"
    );
}

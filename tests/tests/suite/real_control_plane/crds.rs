//! A CRD and a resource of it in one file, applied with `kubectl apply -f` the way install scripts
//! and charts with `crds/` do: kubectl maps every object before applying, so the first run can
//! refuse the resource ("ensure CRDs are installed first") and a user runs it again. Against
//! kube-apiserver the second run works; through the gateway it must take no more runs than that.
//!
//! Expected to fail until the gateway follows the core's discovery without its 5 s poll
//! (issue 12, item 1): the gateway still serves the old `/apis` for up to 5 s.

use std::time::Duration;

use e2e::harness::Kubectl;

use super::session::Real;

const ROUNDS: usize = 3;
const MAX_RUNS: usize = 10;

fn bundle(group: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  \
         name: widgets.{group}\nspec:\n  group: {group}\n  scope: Namespaced\n  names:\n    \
         kind: Widget\n    plural: widgets\n    singular: widget\n    listKind: WidgetList\n  \
         versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      \
         openAPIV3Schema:\n        type: object\n        x-kubernetes-preserve-unknown-fields: \
         true\n---\napiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: first\n  \
         namespace: default\nspec:\n  size: 1\n"
    )
}

/// Runs `kubectl apply -f` of the bundle until it succeeds; the number of runs it took.
async fn runs_until_applied(kubectl: &Kubectl, group: &str) -> Result<usize, String> {
    let file = kubectl.home().join(format!("{group}.yaml"));
    std::fs::write(&file, bundle(group)).unwrap();
    let path = file.display().to_string();
    let mut last = String::new();
    for run in 1..=MAX_RUNS {
        let out = kubectl.run(&["apply", "-f", &path]).await;
        if out.success() {
            return Ok(run);
        }
        last = out.to_string();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("not applied in {MAX_RUNS} runs; last:\n{last}"))
}

pub async fn crd_and_resource_in_one_apply(real: &Real) {
    let (direct, through) = real.admins();
    let mut rows = Vec::new();
    for round in 0..ROUNDS {
        let want = runs_until_applied(&direct, &format!("direct{round}.crds.e2e.example.com"))
            .await
            .unwrap_or_else(|e| panic!("against kube-apiserver directly: {e}"));
        let got = runs_until_applied(&through, &format!("gateway{round}.crds.e2e.example.com"))
            .await
            .unwrap_or_else(|e| panic!("through the gateway: {e}"));
        rows.push((want, got));
    }
    eprintln!("real control plane: kubectl apply runs per CRD bundle (direct, gateway): {rows:?}");
    assert!(
        rows.iter().all(|(want, got)| got <= want),
        "kubectl apply of a CRD and its resource took more runs through the gateway than \
         against kube-apiserver (direct, gateway) per round: {rows:?}"
    );
}

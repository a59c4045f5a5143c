//! The `file` source: sample-apiserver routed from a manifest directory and a static `services:`
//! entry while kube-apiserver has no APIService for it. The gateway's own authorization is off
//! here, so every decision on flunders is sample-apiserver's own SubjectAccessReview, made for
//! the identity the gateway forwarded.

use e2e::real::pki::{ADMIN_TOKEN, ALICE_TOKEN};

use super::session::{kubectl_for, Real};

/// A Flunder manifest.
pub fn flunder(namespace: &str, name: &str) -> String {
    format!(
        "apiVersion: wardle.example.com/v1alpha1\nkind: Flunder\nmetadata:\n  name: {name}\n  \
         namespace: {namespace}\nspec: {{}}\n"
    )
}

pub async fn routes_what_kube_apiserver_does_not_know(real: &Real) {
    let direct = real.plane.admin();
    let gone = direct
        .run(&["get", "--raw", "/apis/wardle.example.com/v1alpha1"])
        .await;
    assert!(
        !gone.success() && gone.stderr.contains("NotFound"),
        "kube-apiserver must not know wardle.example.com yet:\n{gone}"
    );

    let admin = kubectl_for(&real.file_gateway, ADMIN_TOKEN);
    admin
        .apply_yaml(&flunder("default", "from-file-source"))
        .await;
    let got = admin
        .run_ok(&["get", "flunders", "-n", "default", "-o", "name"])
        .await;
    assert!(
        got.stdout
            .contains("flunder.wardle.example.com/from-file-source"),
        "{got}"
    );
    let resources = admin
        .run_ok(&[
            "api-resources",
            "--api-group",
            "wardle.example.com",
            "-o",
            "name",
        ])
        .await;
    assert!(
        resources
            .stdout
            .lines()
            .any(|l| l == "flunders.wardle.example.com"),
        "kubectl api-resources through the gateway must list flunders:\n{resources}"
    );
    admin
        .run_ok(&["delete", "flunder", "from-file-source", "-n", "default"])
        .await;
}

pub async fn sample_apiserver_authorizes_the_caller(real: &Real) {
    // alice may work with flunders in wardle-alice only, by RBAC on kube-apiserver, which
    // sample-apiserver asks with a SubjectAccessReview for whoever the gateway says is calling.
    real.plane
        .admin()
        .apply_yaml(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: wardle-alice\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: flunders\n  \
             namespace: wardle-alice\nrules:\n- apiGroups: [wardle.example.com]\n  resources: \
             [flunders]\n  verbs: [get, list, create, delete]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: \
             alice-flunders\n  namespace: wardle-alice\nroleRef:\n  apiGroup: \
             rbac.authorization.k8s.io\n  kind: Role\n  name: flunders\nsubjects:\n- kind: User\n  \
             name: alice\n",
        )
        .await;
    let alice = kubectl_for(&real.file_gateway, ALICE_TOKEN);
    alice.apply_yaml(&flunder("wardle-alice", "alices")).await;
    let mine = alice
        .run_ok(&["get", "flunders", "-n", "wardle-alice", "-o", "name"])
        .await;
    assert!(
        mine.stdout.contains("flunder.wardle.example.com/alices"),
        "{mine}"
    );

    let denied = alice.run(&["get", "flunders", "-n", "default"]).await;
    let want = "User \"alice\" cannot list resource \"flunders\" in API group \
                \"wardle.example.com\" in the namespace \"default\"";
    assert!(
        !denied.success() && denied.stderr.contains(want),
        "sample-apiserver must refuse alice by name (not the gateway's identity, not \
         system:anonymous):\n{denied}"
    );
    // kube-apiserver's own words for the same request (it authorizes before routing, so the
    // group need not be served there).
    let raw = [
        "get",
        "--raw",
        "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
    ];
    let kube = real.alice_direct().run(&raw).await;
    let denied = alice.run(&raw).await;
    assert_eq!(
        last_line(&denied.stderr),
        last_line(&kube.stderr),
        "the 403 through the gateway must read as kube-apiserver's"
    );
    alice
        .run_ok(&["delete", "flunder", "alices", "-n", "wardle-alice"])
        .await;
}

/// The last non-empty line of kubectl's stderr (the error; earlier lines are discovery noise).
pub fn last_line(stderr: &str) -> &str {
    stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

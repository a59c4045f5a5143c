//! The install notes (`NOTES.txt`), read as a user reads them after `helm install`: the steps
//! come in the order that works on a fresh core, and what the values leave surprising is said.

use e2e::helm::{render_notes, Rendered};

/// Issue 24, finding 5: with no client CA the gateway verifies no client certificate, so a
/// client-certificate kubeconfig is silently `system:anonymous`. The notes say so, and what to do.
#[test]
fn notes_say_when_client_certificates_are_not_verified() {
    let notes = render_notes(None, &[]);
    assert!(
        notes.contains("authentication.clientCASecret is empty")
            && notes.contains("is system:anonymous through the gateway")
            && notes.contains("<your user, with a bearer token>"),
        "default values:\n{notes}"
    );
    let notes = render_notes(None, &["authentication.anonymous=false"]);
    assert!(
        notes.contains("is refused (401) through the gateway"),
        "anonymous off:\n{notes}"
    );
    let notes = render_notes(None, &["authentication.clientCASecret=users-ca"]);
    assert!(
        !notes.contains("clientCASecret is empty") && !notes.contains("with a bearer token"),
        "with a client CA:\n{notes}"
    );
}

/// Issue 24, finding 3: a fresh sidecar core cannot be bootstrapped through the gateway (every
/// request needs a TokenReview the gateway may not make yet, and the Service has no Ready
/// endpoint). The notes apply the core's manifests first, straight to the core over
/// port-forward, and only then wait for the rollout.
#[test]
fn notes_bootstrap_a_sidecar_core_directly_before_the_rollout() {
    let notes = render_notes(Some("sidecar-core"), &[]);
    let step = |text: &str| {
        notes
            .find(text)
            .unwrap_or_else(|| panic!("the notes have no {text:?}:\n{notes}"))
    };
    let port_forward = step("port-forward deployment/edge-aggregation-gateway 18443:8080");
    let rbac = step("{.data.rbac\\.yaml}' | kubectl --context core apply -f -");
    let rollout = step("rollout status deployment/edge-aggregation-gateway");
    assert!(
        port_forward < rbac && rbac < rollout,
        "the core's manifests go to the core first, then the rollout:\n{notes}"
    );
    let before_rollout = &notes[..rollout];
    assert!(
        !before_rollout.contains("--context gateway"),
        "nothing before the rollout may go through the gateway:\n{notes}"
    );
}

/// Issue 24, finding 3: the leader-election Role was rendered into the release namespace, which
/// a fresh core does not have, and the authentication ConfigMap's Role was not rendered for the
/// core at all. `rbac.yaml` now creates the Lease's namespace before its Role, and grants the
/// ConfigMap as it is granted in this cluster.
#[test]
fn core_rbac_creates_the_lease_namespace_and_grants_the_authentication_configmap() {
    let r = Rendered::of(Some("sidecar-core"));
    let rbac = &r.core_manifests()["rbac.yaml"];
    let position = |kind: &str, name: &str| {
        rbac.iter()
            .position(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("rbac.yaml has no {kind} {name}: {rbac:#?}"))
    };
    let namespace = position("Namespace", "gateway-system");
    let role = position("Role", "edge-aggregation-gateway-leader-election");
    assert!(namespace < role, "the namespace before the Role in it");
    assert_eq!(rbac[role]["metadata"]["namespace"], "gateway-system");
    let authentication = position("Role", "edge-aggregation-gateway-authentication");
    assert_eq!(rbac[authentication]["metadata"]["namespace"], "kube-system");
    let binding = position("RoleBinding", "edge-aggregation-gateway-authentication");
    assert_eq!(
        rbac[binding]["subjects"][0]["name"], "edge-gateway",
        "bound to rbac.coreSubjects"
    );

    // A Lease in a namespace every core has needs no Namespace object.
    let r = Rendered::with(
        Some("sidecar-core"),
        &["leaderElection.namespace=kube-system"],
    );
    assert!(
        !r.core_manifests()["rbac.yaml"]
            .iter()
            .any(|o| o["kind"] == "Namespace"),
        "kube-system exists on every core"
    );
}

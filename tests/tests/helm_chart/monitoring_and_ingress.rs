//! The optional ServiceMonitor and Ingress follow their switches and point at the gateway's
//! `https` port.

use k8s_openapi::api::networking::v1::Ingress;

use e2e::helm::{label, Rendered, EXAMPLES, FULLNAME};

use crate::typed::ServiceMonitor;
use e2e::table::check_each;

#[test]
fn service_monitor_and_ingress_follow_their_switches() {
    check_each(
        EXAMPLES,
        |e| label(*e).to_owned(),
        |example| {
            let r = Rendered::of(example);
            assert_eq!(
                r.has("ServiceMonitor"),
                example == Some("external-core"),
                "{}",
                label(example)
            );
            assert_eq!(
                r.has("Ingress"),
                example == Some("external-core"),
                "{}",
                label(example)
            );
        },
    );
    let r = Rendered::of(Some("external-core"));
    let sm: ServiceMonitor = r.get("ServiceMonitor", FULLNAME);
    let ep = &sm.spec.endpoints[0];
    assert_eq!(
        (ep.port.as_str(), ep.path.as_str(), ep.scheme.as_str()),
        ("https", "/metrics", "https")
    );
    assert_eq!(sm.metadata.labels.unwrap()["release"], "prometheus");
    let ing: Ingress = r.get("Ingress", FULLNAME);
    let spec = ing.spec.unwrap();
    assert_eq!(spec.ingress_class_name.as_deref(), Some("nginx"));
    let backend = spec.rules.unwrap()[0].http.as_ref().unwrap().paths[0]
        .backend
        .service
        .clone()
        .unwrap();
    assert_eq!(
        (backend.name.as_str(), backend.port.unwrap().name.as_deref()),
        (FULLNAME, Some("https"))
    );
}

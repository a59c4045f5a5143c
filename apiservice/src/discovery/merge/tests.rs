use super::*;
use crate::model::{Backend, RemoteBackendSpec, ServiceRef};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_core::discovery::v2::{APIGroupDiscovery, APIVersionDiscovery, GroupVersionKind};
use serde_json::Value;

fn resource(plural: &str, kind: &str) -> APIResourceDiscovery {
    APIResourceDiscovery {
        resource: Some(plural.into()),
        response_kind: Some(GroupVersionKind {
            group: Some(String::new()),
            version: Some(String::new()),
            kind: Some(kind.into()),
        }),
        scope: Some("Namespaced".into()),
        singular_resource: Some(plural.trim_end_matches('s').into()),
        verbs: vec!["get".into(), "list".into()],
        ..APIResourceDiscovery::default()
    }
}

/// A core group: `(name, [(version, [plural])])`, every resource kind `K<plural>`.
fn group(name: &str, versions: &[(&str, &[&str])]) -> APIGroupDiscovery {
    APIGroupDiscovery {
        metadata: Some(ObjectMeta {
            name: (!name.is_empty()).then(|| name.to_owned()),
            ..ObjectMeta::default()
        }),
        versions: versions
            .iter()
            .map(|(v, plurals)| APIVersionDiscovery {
                version: Some((*v).into()),
                resources: plurals
                    .iter()
                    .map(|p| resource(p, &format!("K{p}")))
                    .collect(),
                freshness: Some("Current".into()),
            })
            .collect(),
    }
}

fn core(api: Vec<APIGroupDiscovery>, apis: Vec<APIGroupDiscovery>) -> CoreDiscovery {
    CoreDiscovery {
        api: APIGroupDiscoveryList {
            metadata: None,
            items: api,
        },
        apis: APIGroupDiscoveryList {
            metadata: None,
            items: apis,
        },
    }
}

fn svc(group: &str, version: &str, gp: i32, vp: i32, remote: bool) -> RegisteredAPIService {
    RegisteredAPIService {
        traffic: Default::default(),
        name: format!("{version}.{group}"),
        group: group.into(),
        version: version.into(),
        group_priority_minimum: gp,
        version_priority: vp,
        backend: if remote {
            Backend::Remote(RemoteBackendSpec {
                service: ServiceRef {
                    namespace: "ns".into(),
                    name: group.replace('.', "-"),
                    port: 443,
                },
                ca_bundle: None,
                insecure_skip_tls_verify: true,
            })
        } else {
            Backend::Local
        },
    }
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

/// `[(group, [version])]` of an aggregated body.
fn layout(bytes: &[u8]) -> Vec<(String, Vec<String>)> {
    json(bytes)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                g["versions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v["version"].as_str().unwrap().to_owned())
                    .collect(),
            )
        })
        .collect()
}

fn version_entry(bytes: &[u8], group: &str, version: &str) -> Value {
    json(bytes)["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["metadata"]["name"].as_str().unwrap_or("") == group)
        .flat_map(|g| g["versions"].as_array().unwrap().clone())
        .find(|v| v["version"] == version)
        .unwrap_or_else(|| panic!("{group}/{version} missing"))
}

fn names(l: &[(String, Vec<String>)]) -> Vec<&str> {
    l.iter().map(|(g, _)| g.as_str()).collect()
}

fn kube_like_core() -> CoreDiscovery {
    core(
        vec![group("", &[("v1", &["pods", "configmaps"])])],
        vec![
            group("batch", &[("v1", &["jobs"])]),
            group("apps", &[("v1", &["deployments"])]),
            group("stable.example.com", &[("v1", &["crontabs"])]),
            group("apiregistration.k8s.io", &[("v1", &["apiservices"])]),
            group(
                "autoscaling",
                &[
                    ("v1", &["horizontalpodautoscalers"]),
                    ("v2", &["horizontalpodautoscalers"]),
                ],
            ),
        ],
    )
}

#[test]
fn core_only_keeps_the_cores_order() {
    let merged = merge(&kube_like_core(), &[]).unwrap();
    let l = layout(&merged.apis.v2);
    // As the core lists them, but apiregistration.k8s.io first.
    assert_eq!(
        names(&l),
        [
            "apiregistration.k8s.io",
            "batch",
            "apps",
            "stable.example.com",
            "autoscaling"
        ]
    );
    // autoscaling: the core's version order (v1 first here), not a table's.
    assert_eq!(l[4].1, ["v1", "v2"]);
    // The core group is only in /api, without a name.
    assert_eq!(
        layout(&merged.api.v2),
        [(String::new(), vec!["v1".to_owned()])]
    );
    let api = json(&merged.api.v2);
    assert_eq!(api["items"][0]["metadata"], serde_json::json!({}));
    // No APIService → no /apis/<group> bodies of ours.
    assert!(merged.groups_legacy.is_empty());
}

#[test]
fn another_releases_order_is_kept_and_apiservice_groups_go_around_it() {
    // resource.k8s.io before flowcontrol, as kube-apiserver 1.33's table has it, and the
    // other way round: the gateway follows whichever the core publishes.
    for core_order in [
        ["resource.k8s.io", "flowcontrol.apiserver.k8s.io"],
        ["flowcontrol.apiserver.k8s.io", "resource.k8s.io"],
    ] {
        let c = core(
            vec![],
            core_order
                .iter()
                .map(|g| group(g, &[("v1beta1", &["things"]), ("v1", &["things"])]))
                .collect(),
        );
        let high = svc("high.example.com", "v1", 1001, 10, true);
        let tie = svc("tie.example.com", "v1", 1000, 10, true);
        let merged = merge(
            &c,
            &[
                APIServiceDiscovery::new(&tie, None),
                APIServiceDiscovery::new(&high, None),
            ],
        )
        .unwrap();
        let l = layout(&merged.apis.v2);
        let expected = [
            "high.example.com",
            core_order[0],
            core_order[1],
            "tie.example.com",
        ];
        assert_eq!(names(&l), expected);
        // Preferred versions stay the core's (v1beta1 first here).
        assert_eq!(l[1].1, ["v1beta1", "v1"]);
        let legacy = json(&merged.apis_legacy);
        assert_eq!(
            legacy["groups"][1]["preferredVersion"]["version"],
            "v1beta1"
        );
        let legacy_names: Vec<_> = legacy["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert_eq!(legacy_names, expected);
    }
}

#[test]
fn ordering_and_tie_cases() {
    // The core serves apiregistration.k8s.io, which a local APIService below names.
    let c = core(
        vec![],
        vec![group("apiregistration.k8s.io", &[("v1", &["apiservices"])])],
    );
    let services = [
        // Same group priority: ties broken by group name.
        svc("zeta.example.com", "v1", 500, 10, true),
        svc("alpha.example.com", "v1", 500, 10, true),
        // Highest groupPriorityMinimum among its versions counts for the group.
        svc("multi.example.com", "v1", 100, 10, true),
        svc("multi.example.com", "v2", 900, 10, true),
        // Same versionPriority: kube-aware version order.
        svc("versions.example.com", "v1beta1", 200, 15, true),
        svc("versions.example.com", "v1", 200, 15, true),
        svc("versions.example.com", "v10", 200, 15, true),
        svc("versions.example.com", "v2alpha1", 200, 15, true),
        svc("versions.example.com", "foo1", 200, 15, true),
        svc("versions.example.com", "v2", 200, 15, true),
        // Higher versionPriority beats the version order.
        svc("versions.example.com", "v1alpha1", 200, 20, true),
        // apiregistration is first regardless of its priority.
        svc("apiregistration.k8s.io", "v1", 1, 1, false),
    ];
    let inputs: Vec<_> = services
        .iter()
        .map(|s| APIServiceDiscovery::new(s, None))
        .collect();
    let merged = merge(&c, &inputs).unwrap();
    let l = layout(&merged.apis.v2);
    assert_eq!(
        names(&l),
        [
            "apiregistration.k8s.io",
            "multi.example.com",
            "alpha.example.com",
            "zeta.example.com",
            "versions.example.com"
        ]
    );
    assert_eq!(l[1].1, ["v2", "v1"]);
    assert_eq!(
        l[4].1,
        ["v1alpha1", "v10", "v2", "v1", "v1beta1", "v2alpha1", "foo1"]
    );
    // Legacy /apis has the same order and preferredVersion = first version.
    let legacy = json(&merged.apis_legacy);
    assert_eq!(legacy["kind"], "APIGroupList");
    assert_eq!(legacy["apiVersion"], "v1");
    let legacy_names: Vec<_> = legacy["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert_eq!(legacy_names, names(&l));
    // Like real servers: the groups inside the list carry no kind/apiVersion.
    assert_eq!(
        legacy["groups"][0],
        serde_json::json!({
            "name": "apiregistration.k8s.io",
            "versions": [{"groupVersion": "apiregistration.k8s.io/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "apiregistration.k8s.io/v1", "version": "v1"}
        })
    );
    let versions = json(&merged.groups_legacy["versions.example.com"]);
    assert_eq!(versions["kind"], "APIGroup");
    assert_eq!(versions["apiVersion"], "v1");
    assert_eq!(
        versions["preferredVersion"],
        serde_json::json!({"groupVersion": "versions.example.com/v1alpha1", "version": "v1alpha1"})
    );
    assert_eq!(versions["versions"].as_array().unwrap().len(), 7);
    assert_eq!(
        versions["versions"][1],
        serde_json::json!({"groupVersion": "versions.example.com/v10", "version": "v10"})
    );
}

#[test]
fn remote_apiservice_overrides_core() {
    let c = core(
        vec![],
        vec![
            group("apps", &[("v1", &["deployments"])]),
            group("metrics.k8s.io", &[("v1beta1", &["stale-from-core"])]),
        ],
    );
    let metrics = svc("metrics.k8s.io", "v1beta1", 100, 100, true);
    let remote = RemoteDiscovery::current(vec![resource("pods", "PodMetrics")]);
    let merged = merge(&c, &[APIServiceDiscovery::new(&metrics, Some(&remote))]).unwrap();
    let entry = version_entry(&merged.apis.v2, "metrics.k8s.io", "v1beta1");
    assert_eq!(entry["freshness"], "Current");
    assert_eq!(entry["resources"].as_array().unwrap().len(), 1);
    assert_eq!(entry["resources"][0]["resource"], "pods");
    assert_eq!(entry["resources"][0]["responseKind"]["kind"], "PodMetrics");
    assert_eq!(names(&layout(&merged.apis.v2)), ["apps", "metrics.k8s.io"]);
    assert!(merged.group_legacy("metrics.k8s.io").is_some());
    assert!(merged.group_legacy("apps").is_none());
}

#[test]
fn local_apiservice_takes_core_resources_and_its_own_priorities() {
    let c = core(
        vec![],
        vec![
            group("apps", &[("v1", &["deployments"])]),
            group(
                "stable.example.com",
                &[("v1", &["crontabs"]), ("v2", &["crontabs"])],
            ),
        ],
    );
    // Without APIServices: the core's order, groups and versions.
    let l = layout(&merge(&c, &[]).unwrap().apis.v2);
    assert_eq!(names(&l), ["apps", "stable.example.com"]);
    assert_eq!(l[1].1, ["v1", "v2"]);

    let v1 = svc("stable.example.com", "v1", 19000, 200, false);
    let missing = svc("stable.example.com", "v3", 19000, 1, false);
    let merged = merge(
        &c,
        &[
            APIServiceDiscovery::new(&v1, None),
            APIServiceDiscovery::new(&missing, None),
        ],
    )
    .unwrap();
    let l = layout(&merged.apis.v2);
    assert_eq!(names(&l), ["stable.example.com", "apps"]);
    // v3 is not listed by the core (yet): left out, rather than an entry without resources
    // that kubectl would believe (issue 31).
    assert_eq!(l[0].1, ["v1", "v2"]);
    let v1 = version_entry(&merged.apis.v2, "stable.example.com", "v1");
    assert_eq!(v1["resources"][0]["resource"], "crontabs");
    assert_eq!(v1["freshness"], "Current");
    let legacy = json(merged.group_legacy("stable.example.com").unwrap());
    assert!(!legacy["versions"].to_string().contains("v3"), "{legacy}");
    // A group the core does not list at all is not listed either.
    let absent = svc("later.example.com", "v1", 19000, 1, false);
    let merged_absent = merge(&c, &[APIServiceDiscovery::new(&absent, None)]).unwrap();
    assert!(merged_absent.group_legacy("later.example.com").is_none());
    assert_eq!(
        names(&layout(&merged_absent.apis.v2)),
        ["apps", "stable.example.com"]
    );
    let group = json(merged.group_legacy("stable.example.com").unwrap());
    assert_eq!(group["preferredVersion"]["version"], "v1");
}

#[test]
fn stale_and_empty_entries() {
    let c = core(vec![], vec![]);
    let never = svc("never.example.com", "v1", 100, 100, true);
    let failed = svc("failed.example.com", "v1", 100, 100, true);
    let failed_empty = svc("failedempty.example.com", "v1", 100, 100, true);
    let unlisted = svc("unlisted.example.com", "v1", 100, 100, true);
    let ok = svc("ok.example.com", "v1", 100, 100, true);
    let failed_r = RemoteDiscovery::failed(Some(vec![resource("widgets", "Widget")]));
    let failed_empty_r = RemoteDiscovery::failed(None);
    let unlisted_r = RemoteDiscovery::not_listed();
    let ok_r = RemoteDiscovery::current(vec![resource("gadgets", "Gadget")]);
    let never_r = RemoteDiscovery::never_fetched();
    let merged = merge(
        &c,
        &[
            APIServiceDiscovery::new(&never, None),
            APIServiceDiscovery::new(&failed, Some(&failed_r)),
            APIServiceDiscovery::new(&failed_empty, Some(&failed_empty_r)),
            APIServiceDiscovery::new(&unlisted, Some(&unlisted_r)),
            APIServiceDiscovery::new(&ok, Some(&ok_r)),
        ],
    )
    .unwrap();
    let body = &merged.apis.v2;
    assert_eq!(
        version_entry(body, "never.example.com", "v1"),
        serde_json::json!({"version": "v1", "freshness": "Stale"})
    );
    let f = version_entry(body, "failed.example.com", "v1");
    assert_eq!(f["freshness"], "Stale");
    assert_eq!(f["resources"][0]["resource"], "widgets");
    assert_eq!(
        version_entry(body, "failedempty.example.com", "v1"),
        serde_json::json!({"version": "v1", "freshness": "Stale"})
    );
    assert_eq!(
        version_entry(body, "unlisted.example.com", "v1"),
        serde_json::json!({"version": "v1", "freshness": "Current"})
    );
    assert_eq!(
        version_entry(body, "ok.example.com", "v1")["freshness"],
        "Current"
    );
    // never_fetched() behaves like passing nothing.
    let merged2 = merge(&c, &[APIServiceDiscovery::new(&never, Some(&never_r))]).unwrap();
    assert_eq!(
        version_entry(&merged2.apis.v2, "never.example.com", "v1"),
        serde_json::json!({"version": "v1", "freshness": "Stale"})
    );
}

#[test]
fn remote_discovery_from_backend_document() {
    let doc = APIGroupDiscoveryList {
        metadata: None,
        items: vec![group("metrics.k8s.io", &[("v1beta1", &["pods", "nodes"])])],
    };
    let found = RemoteDiscovery::from_backend_document(&doc, "metrics.k8s.io", "v1beta1");
    assert!(found.fresh);
    assert_eq!(found.resources.as_ref().unwrap().len(), 2);
    let missing = RemoteDiscovery::from_backend_document(&doc, "metrics.k8s.io", "v1");
    assert_eq!(missing, RemoteDiscovery::not_listed());
}

#[test]
fn v2_and_v2beta1_differ_only_in_api_version() {
    let s = svc("metrics.k8s.io", "v1beta1", 100, 100, true);
    let r = RemoteDiscovery::current(vec![resource("pods", "PodMetrics")]);
    let merged = merge(&kube_like_core(), &[APIServiceDiscovery::new(&s, Some(&r))]).unwrap();
    for doc in [&merged.apis, &merged.api] {
        let v2 = std::str::from_utf8(&doc.v2).unwrap();
        let v2beta1 = std::str::from_utf8(&doc.v2beta1).unwrap();
        assert_ne!(v2, v2beta1);
        assert_eq!(
            v2.replacen(
                "apidiscovery.k8s.io/v2\"",
                "apidiscovery.k8s.io/v2beta1\"",
                1
            ),
            v2beta1
        );
        let (a, b) = (json(&doc.v2), json(&doc.v2beta1));
        assert_eq!(a["kind"], "APIGroupDiscoveryList");
        assert_eq!(a["apiVersion"], "apidiscovery.k8s.io/v2");
        assert_eq!(b["apiVersion"], "apidiscovery.k8s.io/v2beta1");
        assert_eq!(a["metadata"], serde_json::json!({}));
        assert_eq!(a["items"], b["items"]);
        assert_eq!(doc.body(Negotiated::AggregatedV2), Some(&doc.v2));
        assert_eq!(doc.body(Negotiated::AggregatedV2Beta1), Some(&doc.v2beta1));
        assert_eq!(doc.body(Negotiated::Legacy), None);
    }
}

#[test]
fn etag_is_sha512_of_the_v2_body() {
    let merged = merge(&kube_like_core(), &[]).unwrap();
    for doc in [&merged.apis, &merged.api] {
        let etag = &doc.etag;
        assert_eq!(etag.len(), 130);
        assert!(etag.starts_with('"') && etag.ends_with('"'));
        assert!(etag[1..129]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)));
        assert_eq!(*etag, etag_for(&doc.v2));
    }
    assert_ne!(merged.apis.etag, merged.api.etag);
    // A change in content changes the ETag.
    let s = svc("x.example.com", "v1", 1, 1, true);
    let other = merge(&kube_like_core(), &[APIServiceDiscovery::new(&s, None)]).unwrap();
    assert_ne!(other.apis.etag, merged.apis.etag);
    assert_eq!(other.api.etag, merged.api.etag);
}

#[test]
fn every_resource_keeps_a_response_kind() {
    let mut bare = resource("things", "Thing");
    bare.response_kind = None;
    let s = svc("x.example.com", "v1", 1, 1, true);
    let r = RemoteDiscovery::current(vec![bare]);
    let merged = merge(&kube_like_core(), &[APIServiceDiscovery::new(&s, Some(&r))]).unwrap();
    for body in [&merged.apis.v2, &merged.api.v2] {
        for g in json(body)["items"].as_array().unwrap() {
            for v in g["versions"].as_array().unwrap() {
                for r in v["resources"].as_array().into_iter().flatten() {
                    assert!(r["responseKind"].is_object(), "{r}");
                }
            }
        }
    }
    let e = version_entry(&merged.apis.v2, "x.example.com", "v1");
    assert_eq!(
        e["resources"][0]["responseKind"],
        serde_json::json!({"group": "", "version": "", "kind": ""})
    );
}

#[test]
fn core_group_apiservice() {
    // A remote `v1.` APIService takes over the core group in /api, and stays out of /apis.
    let s = svc("", "v1", 18000, 1, true);
    let r = RemoteDiscovery::current(vec![resource("widgets", "Widget")]);
    let merged = merge(&kube_like_core(), &[APIServiceDiscovery::new(&s, Some(&r))]).unwrap();
    let e = version_entry(&merged.api.v2, "", "v1");
    assert_eq!(e["resources"].as_array().unwrap().len(), 1);
    assert!(!names(&layout(&merged.apis.v2)).contains(&""));
    assert!(merged.groups_legacy.is_empty());
    let legacy = json(&merged.apis_legacy);
    assert!(legacy["groups"]
        .as_array()
        .unwrap()
        .iter()
        .all(|g| g["name"] != ""));
}

#[test]
fn empty_inputs() {
    let merged = merge(&CoreDiscovery::default(), &[]).unwrap();
    assert_eq!(
        &merged.apis.v2[..],
        br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[]}"#
    );
    assert_eq!(
        json(&merged.apis_legacy),
        serde_json::json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
    );
}

/// A small deterministic shuffle (xorshift + Fisher–Yates), so the test needs no extra crate.
fn shuffle<T>(items: &mut [T], seed: &mut u64) {
    for i in (1..items.len()).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let j = (*seed % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

#[test]
fn merge_is_order_independent() {
    let mut services = vec![
        svc("apiregistration.k8s.io", "v1", 18000, 15, false),
        svc("apps", "v1", 17800, 15, false),
        svc("metrics.k8s.io", "v1beta1", 100, 100, true),
        svc("metrics.k8s.io", "v1", 100, 100, true),
        svc("a.example.com", "v1", 100, 100, true),
        svc("b.example.com", "v1", 100, 100, true),
        svc("b.example.com", "v2", 100, 100, true),
        svc("c.example.com", "v1alpha1", 500, 5, true),
        svc("stable.example.com", "v1", 1000, 100, false),
        svc("stable.example.com", "v9", 1000, 100, false),
    ];
    // Duplicates of one group-version: the winner must not depend on input order.
    let mut dup_local = svc("a.example.com", "v1", 9000, 9000, false);
    dup_local.name = "v1.a.example.com".into();
    services.push(dup_local);
    let mut dup_other_name = svc("a.example.com", "v1", 1, 1, true);
    dup_other_name.name = "zzz".into();
    services.push(dup_other_name);

    let remotes: Vec<RemoteDiscovery> = services
        .iter()
        .enumerate()
        .map(|(i, s)| match i % 3 {
            0 => RemoteDiscovery::current(vec![resource(&format!("r{i}s"), &s.version)]),
            1 => RemoteDiscovery::failed(Some(vec![resource("olds", "Old")])),
            _ => RemoteDiscovery::not_listed(),
        })
        .collect();
    let mut inputs: Vec<APIServiceDiscovery<'_>> = services
        .iter()
        .zip(&remotes)
        .map(|(s, r)| APIServiceDiscovery::new(s, Some(r)))
        .collect();
    // The core's order is an input that counts; only the APIServices' order must not.
    let c = kube_like_core();
    let reference = merge(&c, &inputs).unwrap();

    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..50 {
        shuffle(&mut inputs, &mut seed);
        let merged = merge(&c, &inputs).unwrap();
        assert_eq!(merged, reference);
    }
    // Sanity: the remote duplicate with the lower name (input 4, a failed fetch) won.
    let e = version_entry(&reference.apis.v2, "a.example.com", "v1");
    assert_eq!(e["freshness"], "Stale");
    assert_eq!(e["resources"][0]["resource"], "olds");
}

#[test]
fn real_server_document_round_trips_through_the_merge() {
    // Shaped like a real kube-apiserver's aggregated /apis (keys sorted, creationTimestamp
    // null, empty group/version in responseKind, a cross-group subresource).
    let real = r#"{
      "apiVersion": "apidiscovery.k8s.io/v2",
      "items": [
        {"metadata": {"creationTimestamp": null, "name": "apiregistration.k8s.io"},
         "versions": [{"freshness": "Current", "resources": [
           {"categories": ["api-extensions"], "resource": "apiservices",
            "responseKind": {"group": "", "kind": "APIService", "version": ""},
            "scope": "Cluster", "singularResource": "apiservice",
            "subresources": [{"responseKind": {"group": "", "kind": "APIService", "version": ""},
                              "subresource": "status", "verbs": ["get", "patch", "update"]}],
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}],
           "version": "v1"}]},
        {"metadata": {"creationTimestamp": null, "name": "apps"},
         "versions": [{"freshness": "Current", "resources": [
           {"categories": ["all"], "resource": "deployments",
            "responseKind": {"group": "", "kind": "Deployment", "version": ""},
            "scope": "Namespaced", "shortNames": ["deploy"], "singularResource": "deployment",
            "subresources": [
              {"responseKind": {"group": "autoscaling", "kind": "Scale", "version": "v1"},
               "subresource": "scale", "verbs": ["get", "patch", "update"]},
              {"responseKind": {"group": "", "kind": "Deployment", "version": ""},
               "subresource": "status", "verbs": ["get", "patch", "update"]}],
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}],
           "version": "v1"}]},
        {"metadata": {"creationTimestamp": null, "name": "autoscaling"},
         "versions": [
           {"freshness": "Current", "resources": [
             {"categories": ["all"], "resource": "horizontalpodautoscalers",
              "responseKind": {"group": "", "kind": "HorizontalPodAutoscaler", "version": ""},
              "scope": "Namespaced", "shortNames": ["hpa"], "singularResource": "horizontalpodautoscaler",
              "verbs": ["get", "list"]}], "version": "v2"},
           {"freshness": "Current", "resources": [
             {"resource": "horizontalpodautoscalers",
              "responseKind": {"group": "", "kind": "HorizontalPodAutoscaler", "version": ""},
              "scope": "Namespaced", "singularResource": "horizontalpodautoscaler",
              "verbs": ["get", "list"]}], "version": "v1"}]}
      ],
      "kind": "APIGroupDiscoveryList",
      "metadata": {}
    }"#;
    let apis: APIGroupDiscoveryList = serde_json::from_str(real).unwrap();
    let c = CoreDiscovery {
        api: APIGroupDiscoveryList::default(),
        apis,
    };
    let merged = merge(&c, &[]).unwrap();
    let out = json(&merged.apis.v2);
    let input: Value = serde_json::from_str(real).unwrap();
    // Same groups, versions and resources (metadata differs only by the null timestamp).
    assert_eq!(
        layout(&merged.apis.v2),
        [
            ("apiregistration.k8s.io".to_owned(), vec!["v1".to_owned()]),
            ("apps".to_owned(), vec!["v1".to_owned()]),
            (
                "autoscaling".to_owned(),
                vec!["v2".to_owned(), "v1".to_owned()]
            ),
        ]
    );
    for i in 0..3 {
        assert_eq!(out["items"][i]["versions"], input["items"][i]["versions"]);
    }
    assert_eq!(
        out["items"][1]["metadata"],
        serde_json::json!({"name": "apps"})
    );
    // And what we serve parses back into the client types.
    let back: APIGroupDiscoveryList = serde_json::from_slice(&merged.apis.v2beta1).unwrap();
    assert_eq!(
        back.items,
        c.apis
            .items
            .iter()
            .cloned()
            .map(|mut g| {
                g.metadata = Some(ObjectMeta {
                    name: g.metadata.unwrap().name,
                    ..ObjectMeta::default()
                });
                g
            })
            .collect::<Vec<_>>()
    );
}

//! Route-table and discovery rebuilds, timed in process with the gateway's own `apiservice` types
//! (no sockets): what the controllers pay on every APIService change, and what a route lookup
//! costs on the request path, as the number of APIServices grows.

use std::sync::Arc;
use std::time::Instant;

use apiservice::discovery::merge::{merge, APIServiceDiscovery, CoreDiscovery, RemoteDiscovery};
use apiservice::model::{Backend, RegisteredAPIService, RemoteBackendSpec, ServiceRef};
use apiservice::route_table::{Availability, Lookup, RouteTable};
use kube_core::discovery::v2::APIGroupDiscoveryList;
use serde_json::{json, Value};

use super::documents::{core_api_doc, core_apis_doc, discovery_list, group_entry, resource};
use super::report::{Results, Row};
use super::{median, Settings};

/// The `i`th of many APIServices, spread over `backends` Services.
fn registered(i: usize, backends: usize) -> RegisteredAPIService {
    let group = format!("g{i}.bench.example.com");
    RegisteredAPIService {
        traffic: Default::default(),
        name: format!("v1.{group}"),
        group,
        version: "v1".into(),
        group_priority_minimum: 1000,
        version_priority: 15,
        backend: Backend::Remote(RemoteBackendSpec {
            service: ServiceRef {
                namespace: "bench".into(),
                name: format!("backend{}", i % backends),
                port: 443,
            },
            ca_bundle: None,
            insecure_skip_tls_verify: true,
        }),
    }
}

/// The median wall time of `repeats` calls of `f`, in milliseconds.
fn time_median(repeats: usize, mut f: impl FnMut()) -> f64 {
    let mut samples: Vec<f64> = (0..repeats)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    median(&mut samples)
}

/// Route-table builds, lookups and discovery merges for 10, 500 and 10 000 APIServices.
pub fn run(settings: &Settings, results: &mut Results) {
    let Results { rows, raw, .. } = results;
    let backends = 50;
    let sizes = [10usize, 500, 10_000];
    let core: CoreDiscovery = CoreDiscovery {
        api: serde_json::from_value(core_api_doc()).expect("valid discovery document"),
        apis: serde_json::from_value(core_apis_doc()).expect("valid discovery document"),
    };
    let mut out = serde_json::Map::new();
    for &n in &sizes {
        let services: Vec<Arc<RegisteredAPIService>> =
            (0..n).map(|i| Arc::new(registered(i, backends))).collect();

        // Route table: what the routing controller does on every APIService change.
        let build = || {
            let mut builder = RouteTable::<usize>::builder();
            for (i, s) in services.iter().enumerate() {
                builder.insert(s.clone(), i, Availability::Available);
            }
            builder.build().0
        };
        let route_ms = time_median(settings.repeats, || {
            std::hint::black_box(build());
        });
        let table = build();
        let paths: Vec<String> = (0..1024)
            .map(|i| {
                format!(
                    "/apis/g{}.bench.example.com/v1/namespaces/default/things/x",
                    (i * 7919) % n
                )
            })
            .collect();
        let lookups = if settings.short { 200_000 } else { 5_000_000 };
        let lookup_ns = {
            let mut samples: Vec<f64> = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    let mut hits = 0usize;
                    for i in 0..lookups {
                        if let Lookup::GroupVersion(_) =
                            table.lookup(std::hint::black_box(&paths[i & 1023]))
                        {
                            hits += 1;
                        }
                    }
                    assert_eq!(hits, lookups, "every lookup hits");
                    t.elapsed().as_nanos() as f64 / lookups as f64
                })
                .collect();
            median(&mut samples)
        };

        // Discovery: each backend's document lists its APIServices' group-versions; the rebuild
        // reads every APIService's entry from its backend's document and merges.
        let mut backend_docs: Vec<Vec<Value>> = vec![Vec::new(); backends];
        for (i, s) in services.iter().enumerate() {
            let resources = (0..5)
                .map(|r| {
                    resource(
                        &s.group,
                        "v1",
                        &format!("things{r}"),
                        &format!("Thing{r}"),
                        true,
                    )
                })
                .collect();
            backend_docs[i % backends].push(group_entry(&s.group, "v1", resources));
        }
        let backend_docs: Vec<APIGroupDiscoveryList> = backend_docs
            .into_iter()
            .map(|items| serde_json::from_value(discovery_list(items)).expect("valid document"))
            .collect();
        let rebuild = || {
            let remotes: Vec<RemoteDiscovery> = services
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    RemoteDiscovery::from_backend_document(
                        &backend_docs[i % backends],
                        &s.group,
                        &s.version,
                    )
                })
                .collect();
            let inputs: Vec<APIServiceDiscovery<'_>> = services
                .iter()
                .zip(&remotes)
                .map(|(s, r)| APIServiceDiscovery::new(s, Some(r)))
                .collect();
            merge(&core, &inputs).expect("merge")
        };
        let merged = rebuild();
        let discovery_ms = time_median(
            settings.repeats.min(if n >= 10_000 { 5 } else { 15 }),
            || {
                std::hint::black_box(rebuild());
            },
        );
        out.insert(
            n.to_string(),
            json!({
                "route_table_build_ms": route_ms, "lookup_ns": lookup_ns,
                "discovery_rebuild_ms": discovery_ms, "apis_v2_bytes": merged.apis.v2.len(),
            }),
        );
    }
    let get = |n: usize, key: &str| out[&n.to_string()][key].as_f64().unwrap_or(f64::NAN);
    for &n in &sizes {
        let ms = get(n, "route_table_build_ms");
        let mut row = Row::new(
            "route-table rebuild (in process)",
            &format!("{n} APIServices"),
            "ms",
        )
        .values(None, Some(ms))
        .note(format!("median of {}", settings.repeats));
        if n == 10_000 {
            row = row.target("< 20 ms", Some(ms < 20.0));
        }
        rows.push(row);
    }
    let small = get(10, "lookup_ns");
    let large = get(10_000, "lookup_ns");
    rows.push(
        Row::new(
            "route lookup (in process)",
            "ns per lookup, 10 vs 10 000 APIServices",
            "ns",
        )
        .values(Some(small), Some(large))
        .target(
            "independent of size (ratio < 2×)",
            Some(large / small < 2.0),
        )
        .note("direct column = 10-entry table, via column = 10 000-entry table"),
    );
    for &n in &sizes {
        let ms = get(n, "discovery_rebuild_ms");
        let bytes = out[&n.to_string()]["apis_v2_bytes"].as_u64().unwrap_or(0);
        let mut row = Row::new(
            "discovery rebuild (in process, 50 backends)",
            &format!("{n} APIServices"),
            "ms",
        )
        .values(None, Some(ms))
        .note(format!("merged /apis {:.0} KB", bytes as f64 / 1e3));
        if n == 500 {
            row = row.target("< 50 ms", Some(ms < 50.0));
        }
        rows.push(row);
    }
    raw.insert("rebuilds".into(), Value::Object(out));
}

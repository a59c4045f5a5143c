//! Discovery and OpenAPI through the gateway against kube-apiserver's own answers for the same
//! APIServices: kube-apiserver aggregates `v1alpha1.wardle.example.com` itself, and the gateway
//! routes the same APIService to the same sample-apiserver, so every document must be equal.
//!
//! Deliberate differences, checked as such:
//! - `null` members (`metadata.creationTimestamp: null` in aggregated discovery): kube-apiserver
//!   writes them, the gateway leaves them out; compared as absent;
//! - the `/openapi/v3` root: the same paths; the `?hash=` of each `serverRelativeURL` is each
//!   server's own digest of the document, so only the paths are compared, and each document
//!   itself is compared where both serve it.

use http::StatusCode;
use serde_json::Value;

use super::session::{Real, AGGREGATED_V2, AGGREGATED_V2BETA1};

/// Panics naming every JSON path where the documents differ (the first 20) and showing both.
#[track_caller]
pub fn assert_same(what: &str, direct: &Value, through: &Value) {
    let mut differences = Vec::new();
    diff(
        &without_nulls(direct),
        &without_nulls(through),
        String::new(),
        &mut differences,
    );
    if differences.is_empty() {
        return;
    }
    let shown: Vec<&String> = differences.iter().take(20).collect();
    panic!(
        "{what} differs from kube-apiserver's at {} place(s):\n{}\n--- kube-apiserver ---\n{}\n--- gateway ---\n{}",
        differences.len(),
        shown.iter().map(|d| format!("  {d}")).collect::<Vec<_>>().join("\n"),
        truncate(&serde_json::to_string_pretty(direct).unwrap()),
        truncate(&serde_json::to_string_pretty(through).unwrap())
    );
}

/// `v` without object members whose value is `null`: kube-apiserver writes the empty
/// `metadata.creationTimestamp` of discovery documents as `null` (Go's `metav1.Time` has no
/// `omitempty`), the gateway leaves it out; both decode to the same object in every client.
fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// Collects `path: kube-apiserver <a>, gateway <b>` for each place `a` and `b` differ.
fn diff(a: &Value, b: &Value, path: String, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    Some(w) => diff(v, w, format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}: kube-apiserver {v}, gateway (absent)")),
                }
            }
            for (k, w) in y {
                if !x.contains_key(k) {
                    out.push(format!("{path}.{k}: kube-apiserver (absent), gateway {w}"));
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                diff(v, w, format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => {
            let short = |v: &Value| {
                let text = v.to_string();
                if text.len() > 300 {
                    format!("{}...", &text[..300])
                } else {
                    text
                }
            };
            out.push(format!(
                "{path}: kube-apiserver {}, gateway {}",
                short(a),
                short(b)
            ));
        }
        _ => {}
    }
}

fn truncate(text: &str) -> String {
    const MAX: usize = 6000;
    if text.len() <= MAX {
        text.to_owned()
    } else {
        format!("{}\n... ({} bytes more)", &text[..MAX], text.len() - MAX)
    }
}

async fn compare(real: &Real, path: &str, accept: &str) {
    let ((ds, direct), (gs, through)) = real.both(path, accept).await;
    assert_eq!(
        (ds, gs),
        (StatusCode::OK, StatusCode::OK),
        "GET {path} ({accept}): kube-apiserver {ds}, gateway {gs}"
    );
    assert_same(&format!("GET {path} ({accept})"), &direct, &through);
}

pub async fn legacy_apis(real: &Real) {
    compare(real, "/apis", "application/json").await;
}

pub async fn aggregated_apis(real: &Real) {
    compare(real, "/apis", AGGREGATED_V2).await;
}

/// kube-apiserver 1.33 on serves no v2beta1 (`AggregatedDiscoveryRemoveBetaType`); the gateway
/// follows the core: a v2beta1-only Accept is refused alike, and kubectl 1.29's Accept (v2beta1,
/// then plain JSON) gets the same legacy `APIGroupList`.
pub async fn aggregated_v2beta1(real: &Real) {
    let ((ds, _), (gs, beta)) = real.both("/apis", AGGREGATED_V2BETA1).await;
    assert_eq!(
        ds,
        StatusCode::NOT_ACCEPTABLE,
        "kube-apiserver 1.33 on answers 406 to v2beta1 only"
    );
    assert_eq!(gs, ds, "the gateway answers v2beta1 as the core: {beta}");
    compare(
        real,
        "/apis",
        &format!("{AGGREGATED_V2BETA1},application/json"),
    )
    .await;
}

pub async fn core_api(real: &Real) {
    compare(real, "/api", "application/json").await;
    compare(real, "/api", AGGREGATED_V2).await;
}

pub async fn group_documents(real: &Real) {
    for path in [
        "/apis/wardle.example.com",
        "/apis/wardle.example.com/v1alpha1",
        "/apis/apps",
        "/apis/apps/v1",
        "/api/v1",
    ] {
        compare(real, path, "application/json").await;
    }
}

pub async fn openapi_root(real: &Real) {
    let paths = |v: &Value| -> Vec<String> {
        v["paths"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    // kube-apiserver adds an aggregated server's paths to its root asynchronously, seconds after
    // the APIService is Available (the gateway is quicker); the oracle is its settled answer.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (missing, extra, listed) = loop {
        let ((ds, direct), (gs, through)) = real.both("/openapi/v3", "application/json").await;
        assert_eq!((ds, gs), (StatusCode::OK, StatusCode::OK));
        let (want, got) = (paths(&direct), paths(&through));
        let missing: Vec<String> = want.iter().filter(|p| !got.contains(p)).cloned().collect();
        let extra: Vec<String> = got.iter().filter(|p| !want.contains(p)).cloned().collect();
        if (missing.is_empty() && extra.is_empty()) || std::time::Instant::now() >= deadline {
            break (missing, extra, want.len());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert!(
        missing.is_empty() && extra.is_empty(),
        "/openapi/v3 through the gateway: missing {missing:?}, extra {extra:?} (kube-apiserver \
         lists {listed} paths)"
    );
    for path in [
        "apis/wardle.example.com/v1alpha1",
        "apis/wardle.example.com",
    ] {
        let ((ds, direct), (gs, through)) = real
            .both(&format!("/openapi/v3/{path}"), "application/json")
            .await;
        assert_eq!(
            (ds, gs),
            (StatusCode::OK, StatusCode::OK),
            "/openapi/v3/{path}: kube-apiserver {ds}, gateway {gs}"
        );
        assert_same(&format!("/openapi/v3/{path}"), &direct, &through);
    }
}

pub async fn api_versions(real: &Real) {
    let (direct, through) = real.admins();
    let want = direct.run_ok(&["api-versions"]).await.stdout;
    let got = through.run_ok(&["api-versions"]).await.stdout;
    assert!(want.contains("wardle.example.com/v1alpha1"), "{want}");
    assert_eq!(got, want, "kubectl api-versions through the gateway");
}

pub async fn api_resources(real: &Real) {
    let (direct, through) = real.admins();
    let want = direct.run_ok(&["api-resources"]).await.stdout;
    let got = through.run_ok(&["api-resources"]).await.stdout;
    assert!(want.contains("flunders"), "{want}");
    assert_eq!(got, want, "kubectl api-resources through the gateway");
}

/// The merged `/openapi/v2` lists the paths and definitions kube-apiserver's lists. Here the core
/// is kube-apiserver, whose own spec already holds sample-apiserver's (it aggregates the same
/// APIService), so the gateway's merge must add nothing and lose nothing; both are compared once
/// kube-apiserver's aggregator has settled (it adds a spec asynchronously).
pub async fn openapi_v2(real: &Real) {
    let keys = |v: &Value, field: &str| -> Vec<String> {
        v[field]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    let flunder = |v: &Value| {
        keys(v, "definitions")
            .into_iter()
            .find(|k| k.ends_with(".Flunder"))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let (direct, through) = loop {
        let ((ds, direct), (gs, through)) = real.both("/openapi/v2", "application/json").await;
        assert_eq!((ds, gs), (StatusCode::OK, StatusCode::OK));
        let both_list = flunder(&direct).is_some() && flunder(&through).is_some();
        let same = keys(&direct, "paths") == keys(&through, "paths")
            && keys(&direct, "definitions") == keys(&through, "definitions");
        if (both_list && same) || std::time::Instant::now() >= deadline {
            break (direct, through);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    for field in ["paths", "definitions"] {
        let (want, got) = (keys(&direct, field), keys(&through, field));
        let missing: Vec<&String> = want.iter().filter(|k| !got.contains(k)).collect();
        let extra: Vec<&String> = got.iter().filter(|k| !want.contains(k)).collect();
        eprintln!(
            "/openapi/v2 {field}: kube-apiserver {}, gateway {}, missing {}, extra {}",
            want.len(),
            got.len(),
            missing.len(),
            extra.len()
        );
        assert!(
            missing.is_empty() && extra.is_empty(),
            "/openapi/v2 {field} through the gateway: missing {missing:?}, extra {extra:?}"
        );
    }
    assert!(
        flunder(&through).is_some(),
        "no Flunder definition in the merged /openapi/v2"
    );
}

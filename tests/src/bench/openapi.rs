//! OpenAPI v2 aggregation at scale (issue 16, "Speed and memory"): a gateway of its own in front
//! of many remote APIServices, each on its own Service with a large v2 spec ([`specs`], served by
//! [`servers`] in this process), and a core with a spec of its own. It measures:
//!
//! - **the first merge**: from the gateway's start until `/openapi/v2` has every APIService;
//! - **regeneration after one backend changes its spec**: the backend starts serving a new spec
//!   (new ETag), then that APIService's manifest gets a label edit in the gateway's APIService
//!   directory (`--apiservice-source=file`), the way a user's change reaches the gateway. The
//!   gateway revalidates every spec when its routes change (or every 60 s); the time is from the
//!   edit until `/openapi/v2` answers a new ETag, polled with `If-None-Match`. Beside it, the
//!   gateway's own `aggregator_openapi_v2_regeneration_duration` (merge and encoding only);
//! - **serving the cached merge**: requests/s, p50/p99 and CPU per request for `/openapi/v2`
//!   (JSON, and the protobuf `kubectl explain` reads) through the gateway, against the very same
//!   bytes served as a static file by the bench's static TLS backend (`serve-backend
//!   --static-file`), same generator, TLS and concurrency, in interleaved rounds so that the
//!   other work on a shared machine falls on both sides alike;
//! - **memory**: the gateway's RSS after the merge (and its peak during the regenerations) beside
//!   the merged JSON document's size.

mod servers;
mod serving;
pub mod specs;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::load::{client_tls, connect, load, request, Endpoint, LoadSpec, Proto};
use super::memory::{mb, rss_bytes, CpuMeter, RssSampler};
use super::report::{Results, Row};
use super::setup::webhooks_off;
use super::{median, BoxError, Settings};
use crate::certs::TestCa;
use crate::harness::{FixtureServer, Gateway, GatewayOptions};
use servers::SpecServer;
use serving::{serving_rows, Serving, Side};

/// Every row of this scenario names it, so `--only "openapi v2"` runs just this.
pub const NAME: &str = "openapi v2";
/// What client-go's `OpenAPISchema()` (and so `kubectl explain`) asks for.
const PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
const JSON: &str = "application/json";
const VERSION: &str = "v1";
const NAMESPACE: &str = "openapi";
/// The core's group (its spec is not filtered, so any paths would do).
const CORE_GROUP: &str = "apps.core.example.com";

/// How big one run is.
struct Shape {
    apiservices: usize,
    spec_bytes: usize,
    core_bytes: usize,
    /// Spec changes timed, each on a different backend.
    regenerations: usize,
    /// Interleaved static/gateway rounds per representation.
    rounds: usize,
    connections: usize,
}

impl Shape {
    fn of(settings: &Settings) -> Shape {
        if settings.short {
            Shape {
                apiservices: 10,
                spec_bytes: 256 << 10,
                core_bytes: 64 << 10,
                regenerations: 1,
                rounds: 1,
                connections: 2,
            }
        } else {
            Shape {
                apiservices: 100,
                spec_bytes: 1 << 20,
                core_bytes: 256 << 10,
                regenerations: 5,
                rounds: 3,
                connections: 4,
            }
        }
    }
}

fn group(i: usize) -> String {
    format!("g{i:03}.openapi.example.com")
}

fn service(i: usize) -> String {
    format!("api-{i:03}")
}

/// The scenario; see the module docs.
///
/// `idle_gateway` is the RSS of the bench's other gateway, idle (0 if unknown): what a gateway
/// uses without any spec, to show what the merge itself costs.
pub async fn run(
    settings: &Settings,
    gateway_binary: &Path,
    idle_gateway: u64,
    results: &mut Results,
) -> Result<(), BoxError> {
    let shape = Shape::of(settings);
    let n = shape.apiservices;
    eprintln!(
        "bench: {NAME}: generating {n} specs of {} KiB",
        shape.spec_bytes >> 10
    );
    let bench = Bench::start(&shape, gateway_binary).await?;
    let merge = bench.wait_for_first_merge(&shape).await?;
    eprintln!(
        "bench: {NAME}: first merge served after {:.2} s: {:.1} MB JSON, {:.1} MB protobuf",
        merge.seconds,
        mb(merge.json.len() as u64),
        mb(merge.protobuf.len() as u64)
    );
    // RSS once the merge is published and the request path has served it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = bench.gateway.process.id();
    let rss_merged = rss_bytes(pid).unwrap_or(0);

    let sampler = RssSampler::start(vec![pid]);
    let regen = bench.regenerations(&shape, &merge.json_etag).await?;
    let peak = sampler
        .finish()
        .await
        .get(&pid)
        .copied()
        .unwrap_or(0)
        .max(rss_merged);
    let rss_after = rss_bytes(pid).unwrap_or(0);

    let serving = bench.serving(settings, &shape, &merge).await?;
    let rss_serving = rss_bytes(pid).unwrap_or(0);

    let doc = merge.json.len() as u64;
    let scenario = format!(
        "{NAME}: merged spec of the core + {n} remote APIServices × {} KiB specs",
        shape.spec_bytes >> 10
    );
    let rows = &mut results.rows;
    rows.push(
        Row::new(
            &scenario,
            "first merge served (gateway start → /openapi/v2 with every APIService)",
            "s",
        )
        .values(None, Some(merge.seconds))
        .note(format!(
            "merged JSON {:.1} MB, protobuf {:.1} MB; {} paths, {} definitions",
            mb(doc),
            mb(merge.protobuf.len() as u64),
            merge.paths,
            merge.definitions
        )),
    );
    let mut latencies = regen.iter().map(|r| r.seconds * 1e3).collect::<Vec<_>>();
    let (lo, hi) = min_max(&latencies);
    rows.push(
        Row::new(&scenario, "regeneration after one backend's spec changes: label edit → new ETag served", "ms")
            .values(None, Some(median(&mut latencies)))
            .note(format!(
                "median of {}, {lo:.0}–{hi:.0} ms; trigger: a label edit of that APIService's manifest \
                 (file source, whose 200 ms debounce is included); the gateway then revalidates every \
                 spec with its ETag",
                regen.len()
            )),
    );
    let mut durations = regen
        .iter()
        .filter_map(|r| r.metric_seconds)
        .map(|s| s * 1e3)
        .collect::<Vec<_>>();
    let (lo, hi) = min_max(&durations);
    rows.push(
        Row::new(&scenario, "aggregator_openapi_v2_regeneration_duration (merge + encodings)", "ms")
            .values(None, (!durations.is_empty()).then(|| median(&mut durations)))
            .note(format!(
                "the gateway's gauge after each change (reason=\"update\"), median of {}, {lo:.0}–{hi:.0} ms",
                durations.len()
            )),
    );
    for s in &serving {
        serving_rows(rows, s, shape.connections);
    }
    let ratio = rss_merged as f64 / doc.max(1) as f64;
    let mem = format!(
        "{NAME}: gateway memory beside the merged JSON document ({n} × {} KiB specs)",
        shape.spec_bytes >> 10
    );
    rows.push(
        Row::new(
            &mem,
            "RSS after the merge (direct = merged JSON size; ratio = RSS ÷ document)",
            "MB",
        )
        .values(Some(mb(doc)), Some(mb(rss_merged)))
        .target("≤ 3× the document", Some(ratio <= 3.0))
        .note(format!(
            "{}RSS {:.0} MB after the regenerations, {:.0} MB after the serving rounds",
            if idle_gateway > 0 {
                format!(
                    "above an idle gateway ({:.0} MB): {:.0} MB, {:.1}× the document; ",
                    mb(idle_gateway),
                    mb(rss_merged.saturating_sub(idle_gateway)),
                    rss_merged.saturating_sub(idle_gateway) as f64 / doc.max(1) as f64
                )
            } else {
                String::new()
            },
            mb(rss_after),
            mb(rss_serving)
        )),
    );
    rows.push(
        Row::new(
            &mem,
            "peak RSS during the regenerations (sampled every 50 ms)",
            "MB",
        )
        .values(Some(mb(doc)), Some(mb(peak))),
    );
    results.raw.insert(
        NAME.to_owned(),
        json!({
            "apiservices": n, "spec_bytes": shape.spec_bytes, "core_spec_bytes": shape.core_bytes,
            "remote_spec_bytes_mean": bench.mean_spec_bytes,
            "merged_json_bytes": doc, "merged_protobuf_bytes": merge.protobuf.len(),
            "merged_paths": merge.paths, "merged_definitions": merge.definitions,
            "first_merge_seconds": merge.seconds,
            "regenerations": regen.iter().map(|r| json!({
                "apiservice": r.apiservice, "change_to_new_etag_seconds": r.seconds,
                "regeneration_duration_metric_seconds": r.metric_seconds,
            })).collect::<Vec<_>>(),
            "rss_bytes": {"after_merge": rss_merged, "peak_during_regenerations": peak,
                          "after_regenerations": rss_after, "after_serving": rss_serving},
            "serving": serving.iter().map(Serving::to_json).collect::<Vec<_>>(),
            "trigger": "label edit of the changed backend's APIService manifest (--apiservice-source=file)",
        }),
    );
    Ok(())
}

/// Those of `flags` (`--name=value`) that `gateway_binary --help` lists (`--gateway` may name an
/// older build).
fn optional_flags(gateway_binary: &Path, flags: &[&str]) -> Result<Vec<String>, BoxError> {
    let help = std::process::Command::new(gateway_binary)
        .arg("--help")
        .output()?;
    let help = String::from_utf8_lossy(&help.stdout);
    Ok(flags
        .iter()
        .filter(|f| {
            let name = f.split('=').next().unwrap_or(f);
            help.contains(&format!("{name}[=")) || help.contains(&format!("{name} "))
        })
        .map(|f| (*f).to_owned())
        .collect())
}

/// The end of the gateway's log, for errors: enough to see why, not megabytes.
fn log_tail(gateway: &Gateway) -> String {
    let logs = gateway.process.logs();
    let mut start = logs.len().saturating_sub(8 << 10);
    while !logs.is_char_boundary(start) {
        start += 1;
    }
    logs[start..].to_owned()
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::NAN, f64::NAN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

/// The servers, the gateway in front of them, and their files.
struct Bench {
    gateway: Gateway,
    /// When the gateway was started.
    started: Instant,
    remotes: Vec<SpecServer>,
    _core: SpecServer,
    ca_pem: Arc<str>,
    ca_b64: String,
    backend_cert: PathBuf,
    backend_key: PathBuf,
    apiservices: PathBuf,
    mean_spec_bytes: usize,
    dir: tempfile::TempDir,
}

/// The first merge as served.
struct Merge {
    seconds: f64,
    json: Bytes,
    json_etag: String,
    protobuf: Bytes,
    paths: usize,
    definitions: usize,
}

/// One timed spec change.
struct Regeneration {
    apiservice: String,
    seconds: f64,
    metric_seconds: Option<f64>,
}

fn apiservice_manifest(i: usize, ca_b64: &str, revision: u32) -> String {
    let g = group(i);
    let labels = if revision > 0 {
        format!("  labels:\n    bench.example.com/revision: \"{revision}\"\n")
    } else {
        String::new()
    };
    format!(
        "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: {VERSION}.{g}\n{labels}\
         spec:\n  group: {g}\n  version: {VERSION}\n  groupPriorityMinimum: 1000\n  versionPriority: 15\n  \
         caBundle: {ca_b64}\n  service:\n    namespace: {NAMESPACE}\n    name: {}\n    port: 443\n",
        service(i)
    )
}

impl Bench {
    async fn start(shape: &Shape, gateway_binary: &Path) -> Result<Bench, BoxError> {
        let dir = tempfile::Builder::new()
            .prefix("bench-openapi-")
            .tempdir()?;
        let ca = TestCa::try_new("bench-openapi-ca")?;
        let ca_file = ca.write(dir.path(), "ca.crt")?;
        let ca_pem: Arc<str> = Arc::from(ca.cert_pem());
        let mut sans: Vec<String> = vec!["localhost".into(), "127.0.0.1".into()];
        sans.extend((0..shape.apiservices).map(|i| format!("{}.{NAMESPACE}.svc", service(i))));
        let sans: Vec<&str> = sans.iter().map(String::as_str).collect();
        let backend_pair = ca.issue_server(&sans);
        let (backend_cert, backend_key) = backend_pair.write(dir.path(), "backend")?;
        let (gateway_cert, gateway_key) = ca
            .issue_server(&["localhost", "127.0.0.1"])
            .write(dir.path(), "gateway")?;
        let (proxy_cert, proxy_key) = ca
            .issue_client("aggregator", &[])
            .write(dir.path(), "proxy-client")?;
        let acceptor =
            tokio_rustls::TlsAcceptor::from(Arc::new(super::backend::server_tls(&backend_pair)?));

        let (n, bytes) = (shape.apiservices, shape.spec_bytes);
        let specs = tokio::task::spawn_blocking(move || {
            (0..n)
                .map(|i| specs::generate(&group(i), VERSION, bytes, 0))
                .collect::<Vec<_>>()
        })
        .await?;
        let mean_spec_bytes = specs.iter().map(|s| s.json.len()).sum::<usize>() / n.max(1);
        let mut remotes = Vec::with_capacity(n);
        for (i, spec) in specs.into_iter().enumerate() {
            remotes.push(
                SpecServer::start(
                    &group(i),
                    VERSION,
                    spec.kinds,
                    spec.json,
                    Some(acceptor.clone()),
                    false,
                )
                .await?,
            );
        }
        let core_spec = specs::generate(CORE_GROUP, VERSION, shape.core_bytes, 0);
        let core = SpecServer::start(
            CORE_GROUP,
            VERSION,
            core_spec.kinds,
            core_spec.json,
            None,
            true,
        )
        .await?;

        let ca_b64 = {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(ca.cert_pem())
        };
        let apiservices = dir.path().join("apiservices");
        std::fs::create_dir_all(&apiservices)?;
        let mut config = String::from("services:\n");
        for (i, server) in remotes.iter().enumerate() {
            std::fs::write(
                apiservices.join(format!("{}.yaml", service(i))),
                apiservice_manifest(i, &ca_b64, 0),
            )?;
            config.push_str(&format!(
                "- namespace: {NAMESPACE}\n  name: {}\n  port: 443\n  urls: [\"https://{}\"]\n",
                service(i),
                server.addr
            ));
        }
        let config_file = dir.path().join("gateway.yaml");
        std::fs::write(&config_file, config)?;
        let mut args = super::setup::gateway_args(
            [&gateway_cert, &gateway_key, &proxy_cert, &proxy_key],
            &apiservices,
            &ca_file,
        );
        args.extend(webhooks_off(gateway_binary)?);
        args.extend(optional_flags(
            gateway_binary,
            &[
                // The bench reads /metrics anonymously; no SubjectAccessReview to ask the core.
                "--authorize-metrics=false",
                // This core has no ConfigMaps to publish the gateway's CAs in.
                "--manage-extension-apiserver-authentication=false",
            ],
        )?);
        let options = GatewayOptions::new(format!("http://{}", core.addr))
            .binary(gateway_binary)
            .config(config_file)
            .args(args)
            .log_level("info,access=warn");
        let started = Instant::now();
        let gateway = Gateway::start(options).await?;
        Ok(Bench {
            gateway,
            started,
            remotes,
            _core: core,
            ca_pem,
            ca_b64,
            backend_cert,
            backend_key,
            apiservices,
            mean_spec_bytes,
            dir,
        })
    }

    fn via(&self) -> Endpoint {
        Endpoint {
            addr: self.gateway.addr,
            ca_pem: Some(self.ca_pem.clone()),
            client_cert: None,
        }
    }

    /// One GET through the gateway on a new connection: status, ETag and body.
    async fn get(
        &self,
        path: &str,
        accept: &str,
        if_none_match: Option<&str>,
    ) -> Result<(StatusCode, Option<String>, Bytes), BoxError> {
        let via = self.via();
        let tls = client_tls(&self.ca_pem, Proto::H1)?;
        let mut sender = connect(&via, Some(&tls), Proto::H1).await?;
        let mut req = request(&via, Proto::H1, path, Some(accept));
        if let Some(tag) = if_none_match {
            req.headers_mut()
                .insert(header::IF_NONE_MATCH, HeaderValue::from_str(tag)?);
        }
        let resp = sender.send(req).await?;
        let status = resp.status();
        let etag = resp
            .headers()
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, etag, body))
    }

    async fn metrics(&self) -> Result<String, BoxError> {
        let (status, _, body) = self.get("/metrics", "text/plain", None).await?;
        if status != StatusCode::OK {
            return Err(format!("GET /metrics: {status}").into());
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// Waits until every APIService has been merged (the regeneration counter has an `add` for
    /// each) and `/openapi/v2` serves their paths.
    async fn wait_for_first_merge(&self, shape: &Shape) -> Result<Merge, BoxError> {
        let started = self.started;
        let deadline = Instant::now() + Duration::from_secs(300);
        let added = |metrics: &str| {
            metrics
                .lines()
                .filter(|l| {
                    l.starts_with("aggregator_openapi_v2_regeneration_count{")
                        && l.contains("openapi.example.com\"")
                        && l.contains("reason=\"add\"")
                })
                .count()
        };
        loop {
            if let Ok(metrics) = self.metrics().await {
                if added(&metrics) >= shape.apiservices {
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{NAME}: the gateway did not merge {} APIServices' specs within 300 s\n{}",
                    shape.apiservices,
                    log_tail(&self.gateway)
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let seconds = started.elapsed().as_secs_f64();
        let (status, json_etag, json) = self.get("/openapi/v2", JSON, None).await?;
        let (pb_status, _, protobuf) = self.get("/openapi/v2", PROTOBUF, None).await?;
        let (Some(json_etag), StatusCode::OK, StatusCode::OK) = (json_etag, status, pb_status)
        else {
            return Err(format!(
                "{NAME}: GET /openapi/v2 answered {status} / {pb_status} (protobuf), or no ETag"
            )
            .into());
        };
        let body = json.clone();
        let n = shape.apiservices;
        let (paths, definitions) = tokio::task::spawn_blocking(move || {
            let spec: Value = serde_json::from_slice(&body)?;
            let paths = spec["paths"].as_object().ok_or("no paths")?;
            if let Some(missing) = (0..n)
                .find(|&i| !paths.contains_key(&format!("/apis/{}/{VERSION}/widget000s", group(i))))
            {
                return Err(format!("the merged spec has no paths of {}", group(missing)).into());
            }
            let definitions = spec["definitions"].as_object().map_or(0, |d| d.len());
            Ok::<_, BoxError>((paths.len(), definitions))
        })
        .await??;
        Ok(Merge {
            seconds,
            json,
            json_etag,
            protobuf,
            paths,
            definitions,
        })
    }

    /// Changes one backend's spec at a time and times the gateway's new ETag.
    async fn regenerations(
        &self,
        shape: &Shape,
        first_etag: &str,
    ) -> Result<Vec<Regeneration>, BoxError> {
        let mut etag = first_etag.to_owned();
        let mut out = Vec::new();
        for revision in 1..=shape.regenerations as u32 {
            let i = (revision as usize * 37) % shape.apiservices;
            let bytes = shape.spec_bytes;
            let spec = tokio::task::spawn_blocking(move || {
                specs::generate(&group(i), VERSION, bytes, revision)
            })
            .await?;
            self.remotes[i].replace_spec(spec.json);
            // Written aside and renamed, as an editor or the kubelet would, so the gateway never
            // reads half a file. Dot-files are skipped by the source.
            let tmp = self.apiservices.join(format!(".{}.tmp", service(i)));
            std::fs::write(&tmp, apiservice_manifest(i, &self.ca_b64, revision))?;
            let changed = Instant::now();
            std::fs::rename(&tmp, self.apiservices.join(format!("{}.yaml", service(i))))?;
            let deadline = changed + Duration::from_secs(180);
            let body = loop {
                match self.get("/openapi/v2", JSON, Some(&etag)).await {
                    Ok((StatusCode::OK, Some(tag), body)) if tag != etag => {
                        etag = tag;
                        break body;
                    }
                    Ok((StatusCode::NOT_MODIFIED | StatusCode::OK, _, _)) => {}
                    Ok((status, _, _)) => {
                        return Err(format!("{NAME}: GET /openapi/v2 answered {status}").into())
                    }
                    Err(e) => return Err(format!("{NAME}: GET /openapi/v2: {e}").into()),
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "{NAME}: no new /openapi/v2 within 180 s of {}'s change\n{}",
                        group(i),
                        log_tail(&self.gateway)
                    )
                    .into());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            let seconds = changed.elapsed().as_secs_f64();
            let wanted = format!("(revision {revision})");
            let has_change =
                tokio::task::spawn_blocking(move || memchr_find(&body, wanted.as_bytes())).await?;
            if !has_change {
                return Err(format!(
                    "{NAME}: the new /openapi/v2 does not carry {}'s changed spec",
                    group(i)
                )
                .into());
            }
            let metric_seconds = self.metrics().await.ok().and_then(|m| {
                m.lines()
                    .find(|l| {
                        l.starts_with(
                            "aggregator_openapi_v2_regeneration_duration{reason=\"update\"}",
                        )
                    })
                    .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            });
            eprintln!(
                "bench: {NAME}: {} changed: new ETag after {:.0} ms (regeneration_duration {:?} s)",
                group(i),
                seconds * 1e3,
                metric_seconds
            );
            out.push(Regeneration {
                apiservice: format!("{VERSION}.{}", group(i)),
                seconds,
                metric_seconds,
            });
        }
        Ok(out)
    }

    /// The cached merge through the gateway against the same bytes from the static backend, in
    /// interleaved rounds, for JSON and protobuf.
    async fn serving(
        &self,
        settings: &Settings,
        shape: &Shape,
        merge: &Merge,
    ) -> Result<Vec<Serving>, BoxError> {
        let json_file = self.dir.path().join("merged.json");
        let pb_file = self.dir.path().join("merged.pb");
        std::fs::write(&json_file, &merge.json)?;
        std::fs::write(&pb_file, &merge.protobuf)?;
        let me = std::env::current_exe()?;
        let s = |p: &Path| p.display().to_string();
        let (cert, key, jf, pf) = (
            s(&self.backend_cert),
            s(&self.backend_key),
            s(&json_file),
            s(&pb_file),
        );
        let static_backend = FixtureServer::start_binary(
            "backend-static-openapi",
            &me,
            &[
                "serve-backend",
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--static-file",
                &jf,
                "--static-file",
                &pf,
            ],
        )
        .await?;
        let direct = Endpoint {
            addr: static_backend.addr,
            ca_pem: Some(self.ca_pem.clone()),
            client_cert: None,
        };
        let round = if settings.short {
            settings.duration
        } else {
            settings.duration.max(Duration::from_secs(4))
        };
        let mut out = Vec::new();
        for (form, accept, file) in [
            ("JSON", JSON, "/bench/static/merged.json"),
            ("protobuf", PROTOBUF, "/bench/static/merged.pb"),
        ] {
            let spec = LoadSpec {
                proto: Proto::H1,
                connections: shape.connections,
                streams_per_connection: 1,
                path: String::new(),
                accept: None,
                warmup: settings.warmup,
                duration: round,
            };
            let mut s = Serving {
                form,
                bytes: if form == "JSON" {
                    merge.json.len()
                } else {
                    merge.protobuf.len()
                },
                direct: Side::default(),
                via: Side::default(),
            };
            eprintln!(
                "bench: {NAME}: serving the cached {form} merge, {} rounds",
                shape.rounds
            );
            for _ in 0..shape.rounds {
                let meter = CpuMeter::start(&[static_backend.process.id()]);
                let d = load(
                    &direct,
                    &LoadSpec {
                        path: file.to_owned(),
                        ..spec.clone()
                    },
                )
                .await?;
                s.direct.add(&d, meter.per_request_us(d.all_requests)[0]);
                let meter = CpuMeter::start(&[self.gateway.process.id()]);
                let v = load(
                    &self.via(),
                    &LoadSpec {
                        path: "/openapi/v2".to_owned(),
                        accept: Some(accept),
                        ..spec.clone()
                    },
                )
                .await?;
                s.via.add(&v, meter.per_request_us(v.all_requests)[0]);
                eprintln!(
                    "bench:   static {:.1} req/s p99 {:.0} ms; gateway {:.1} req/s p99 {:.0} ms",
                    d.rps(),
                    d.p99_ms,
                    v.rps(),
                    v.p99_ms
                );
            }
            out.push(s);
        }
        Ok(out)
    }
}

/// Whether `needle` occurs in `haystack`.
fn memchr_find(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

//! `kubectl get apiservices` on a core that stores APIServices as the chart's CRD.
//!
//! kube-aggregator prints SERVICE as `namespace/name` (or `Local`) and AVAILABLE as `True` or
//! `False (Reason)` (`kube-aggregator/pkg/registry/apiservice/etcd`, `ConvertToTable`). A CRD's
//! printer columns are one JSON path each, so the chart's CRD prints the parts instead: `Service`
//! (the name), `Available` (the status), and, at priority 1, `Service Namespace` and `Reason`.
//! When the core answers a Table with those parts, the gateway joins them into kube's cells and
//! drops the helper columns, so through the gateway the table reads as the built-in API's. Any
//! other Table (kube-apiserver's own, a core that prints its own way) passes untouched.
//!
//! A list or get is buffered whole (bounded; a larger answer streams on unchanged). A watch is
//! rewritten event by event: kube sends the column definitions with the first event only, so the
//! columns found there are kept for the rest of the stream.
//!
//! What is buffered is bounded per answer and in total: every list being buffered and every
//! watch's partial event draw on one budget ([`MAX_BUFFERED_TOTAL`]), however many such
//! requests arrive at once. An answer the budget cannot take passes as the core wrote it (the
//! CRD's own columns), as an answer over the per-answer bound does; nothing waits for budget.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::body::{self, Body, BoxError, Response};
use crate::request_info::RequestInfo;

/// The largest list answer buffered for rewriting; a larger one streams on as the core sent it.
const MAX_TABLE_BYTES: usize = 4 << 20;
/// The largest watch event rewritten; past it the rest of the stream passes unchanged.
const MAX_EVENT_BYTES: usize = 1 << 20;
/// What all answers being rewritten may buffer at once (their parsed trees, held briefly while
/// rewriting, take a few times as much). Fifty parallel 3 MiB lists once took the gateway from
/// 37 to 133 MB; now they take at most this.
pub const MAX_BUFFERED_TOTAL: usize = 16 << 20;

/// The budget every rewrite draws on, one permit per byte buffered.
static BUFFERED: Semaphore = Semaphore::const_new(MAX_BUFFERED_TOTAL);

/// Bytes of the budget one answer holds.
struct Held {
    budget: &'static Semaphore,
    permits: Option<SemaphorePermit<'static>>,
}

impl Held {
    fn new(budget: &'static Semaphore) -> Self {
        Self {
            budget,
            permits: None,
        }
    }

    /// Holds `n` more bytes, or `false` when the budget has not that much left.
    fn grow(&mut self, n: usize) -> bool {
        let Ok(n) = u32::try_from(n) else {
            return false;
        };
        if n == 0 {
            return true;
        }
        match self.budget.try_acquire_many(n) {
            Ok(more) => {
                match &mut self.permits {
                    Some(held) => held.merge(more),
                    None => self.permits = Some(more),
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Gives back all but `keep` bytes.
    fn shrink_to(&mut self, keep: usize) {
        if let Some(held) = &mut self.permits {
            let extra = held.num_permits().saturating_sub(keep);
            drop(held.split(extra));
        }
    }
}

/// Whether the answer to this request may be a CRD's APIService Table worth rewriting: a get,
/// list or watch of `apiservices` (in any group, so a renamed test copy of the CRD behaves the
/// same) whose client asked for a Table.
pub fn applies(info: &RequestInfo, request_headers: &HeaderMap) -> bool {
    info.is_resource_request
        && info.resource() == "apiservices"
        && info.subresource().is_empty()
        && matches!(info.verb(), "get" | "list" | "watch")
        && request_headers
            .get_all(header::ACCEPT)
            .iter()
            .any(|v| v.to_str().is_ok_and(|v| v.contains("as=Table")))
}

/// The core's answer, with a CRD's APIService Table presented as kube-aggregator's.
pub async fn present(resp: Response, watch: bool) -> Response {
    present_within(resp, watch, &BUFFERED).await
}

/// [`present`], drawing on `budget` (tests use budgets of their own).
async fn present_within(resp: Response, watch: bool, budget: &'static Semaphore) -> Response {
    let plain_json = resp.status() == StatusCode::OK
        && !resp.headers().contains_key(header::CONTENT_ENCODING)
        && resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
    if !plain_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    if watch {
        parts.headers.remove(header::CONTENT_LENGTH);
        let tables = WatchTables::new(body, Held::new(budget));
        return Response::from_parts(parts, body::boxed(tables));
    }
    let mut held = Held::new(budget);
    match collect_bounded(body, MAX_TABLE_BYTES, &mut held).await {
        Ok(bytes) => {
            let mut columns = None;
            match rewrite_document(&bytes, &mut columns) {
                Some(rewritten) => {
                    parts.headers.remove(header::CONTENT_LENGTH);
                    Response::from_parts(parts, body::full(rewritten))
                }
                None => Response::from_parts(parts, body::full(bytes)),
            }
        }
        Err(replay) => Response::from_parts(parts, replay),
    }
}

/// Where kube's cells come from in the CRD's row.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Columns {
    name: usize,
    service_name: usize,
    service_namespace: usize,
    available: usize,
    reason: usize,
    age: usize,
}

// === impl Columns ===

impl Columns {
    /// The chart CRD's columns, by name; `None` for any other Table.
    fn find(definitions: &[Value]) -> Option<Columns> {
        let at = |name: &str| {
            definitions
                .iter()
                .position(|d| d.get("name").and_then(Value::as_str) == Some(name))
        };
        Some(Columns {
            name: at("Name")?,
            service_name: at("Service")?,
            service_namespace: at("Service Namespace")?,
            available: at("Available")?,
            reason: at("Reason")?,
            age: at("Age")?,
        })
    }
}

/// kube-aggregator's column definitions, keeping the core's Name and Age (their descriptions
/// come from the object metadata's, as upstream's do).
fn definitions(core: &[Value], columns: Columns) -> Value {
    json!([
        core[columns.name],
        {"name": "Service", "type": "string", "format": "", "priority": 0,
         "description": "The reference to the service that hosts this API endpoint."},
        {"name": "Available", "type": "string", "format": "", "priority": 0,
         "description": "Whether this service is available."},
        core[columns.age],
    ])
}

fn text(cell: Option<&Value>) -> &str {
    cell.and_then(Value::as_str).unwrap_or("")
}

/// One row's cells as kube-aggregator prints them: name, service, availability, age.
fn cells(row: &[Value], columns: Columns) -> Value {
    let name = text(row.get(columns.service_name));
    let service = if name.is_empty() {
        "Local".to_owned()
    } else {
        format!("{}/{name}", text(row.get(columns.service_namespace)))
    };
    let status = text(row.get(columns.available));
    let reason = text(row.get(columns.reason));
    let available = match status {
        "" => "Unknown".to_owned(),
        "True" => status.to_owned(),
        _ if !reason.is_empty() => format!("{status} ({reason})"),
        _ => status.to_owned(),
    };
    json!([
        row.get(columns.name).cloned().unwrap_or(Value::Null),
        service,
        available,
        row.get(columns.age).cloned().unwrap_or(Value::Null),
    ])
}

/// Rewrites `table` in place when it is the CRD's; `columns` carries what the first Table of a
/// watch said to the header-less ones after it. Whether anything changed.
fn rewrite_table(table: &mut Value, columns: &mut Option<Columns>) -> bool {
    if table.get("kind").and_then(Value::as_str) != Some("Table") {
        return false;
    }
    match table.get_mut("columnDefinitions") {
        Some(Value::Array(defs)) if !defs.is_empty() => {
            *columns = Columns::find(defs);
            if let Some(found) = *columns {
                *defs = match definitions(defs, found) {
                    Value::Array(kube) => kube,
                    _ => unreachable!("definitions builds an array"),
                };
            }
        }
        _ => {}
    }
    let Some(found) = *columns else {
        return false;
    };
    if let Some(Value::Array(rows)) = table.get_mut("rows") {
        for row in rows {
            if let Some(Value::Array(cells_in)) = row.get("cells") {
                row["cells"] = cells(cells_in, found);
            }
        }
    }
    true
}

/// A list answer as [`present`] rewrites it (`None`: passed on as it is), and a watch's event
/// lines as it rewrites them, one after the other: the fuzz target's view.
pub(crate) fn rewritten(
    list: &[u8],
    events: impl IntoIterator<Item = Bytes>,
) -> (Option<Bytes>, Vec<Bytes>) {
    let list = rewrite_document(list, &mut None);
    let mut columns = None;
    let events = events
        .into_iter()
        .map(|line| rewrite_event(line, &mut columns))
        .collect();
    (list, events)
}

/// A list or get answer, rewritten; `None` when it is not the CRD's Table.
fn rewrite_document(bytes: &[u8], columns: &mut Option<Columns>) -> Option<Bytes> {
    let mut doc: Value = serde_json::from_slice(bytes).ok()?;
    if !rewrite_table(&mut doc, columns) {
        return None;
    }
    serde_json::to_vec(&doc).ok().map(Bytes::from)
}

/// A watch event line (`{"type":…,"object":{Table}}`), rewritten, or as it came.
fn rewrite_event(line: Bytes, columns: &mut Option<Columns>) -> Bytes {
    let Ok(mut event) = serde_json::from_slice::<Value>(&line) else {
        return line;
    };
    let Some(object) = event.get_mut("object") else {
        return line;
    };
    if !rewrite_table(object, columns) {
        return line;
    }
    match serde_json::to_vec(&event) {
        Ok(mut out) => {
            out.push(b'\n');
            Bytes::from(out)
        }
        Err(_) => line,
    }
}

/// The body whole, if it ends within `limit` bytes and `held` can hold them; otherwise (or on a
/// read error) a body that replays what was read and goes on with the rest, so nothing is lost.
async fn collect_bounded(mut body: Body, limit: usize, held: &mut Held) -> Result<Bytes, Body> {
    let mut read: Vec<Frame<Bytes>> = Vec::new();
    let mut len = 0;
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                let size = frame.data_ref().map_or(0, Bytes::len);
                len += size;
                let trailers = frame.is_trailers();
                read.push(frame);
                if len > limit || trailers || !held.grow(size) {
                    return Err(replay(read, Ok(body)));
                }
            }
            Some(Err(e)) => return Err(replay(read, Err(e))),
        }
    }
    let mut whole = BytesMut::with_capacity(len);
    for frame in read {
        if let Ok(data) = frame.into_data() {
            whole.extend_from_slice(&data);
        }
    }
    Ok(whole.freeze())
}

fn replay(read: Vec<Frame<Bytes>>, rest: Result<Body, BoxError>) -> Body {
    use futures::StreamExt;
    let head = futures::stream::iter(read.into_iter().map(Ok::<_, BoxError>));
    match rest {
        Ok(rest) => body::boxed(http_body_util::StreamBody::new(
            head.chain(http_body_util::BodyStream::new(rest)),
        )),
        Err(e) => body::boxed(http_body_util::StreamBody::new(
            head.chain(futures::stream::once(async { Err(e) })),
        )),
    }
}

/// A watch body, its newline-delimited events rewritten one at a time.
struct WatchTables {
    inner: Body,
    /// Bytes of the event being received.
    partial: BytesMut,
    /// Events ready to send.
    ready: VecDeque<Bytes>,
    columns: Option<Columns>,
    /// Set after an oversized event, or one the budget could not hold: the rest streams as it
    /// comes.
    passthrough: bool,
    done: bool,
    /// The budget held for `partial`.
    held: Held,
}

// === impl WatchTables ===

impl WatchTables {
    fn new(inner: Body, held: Held) -> Self {
        WatchTables {
            inner,
            partial: BytesMut::new(),
            ready: VecDeque::new(),
            columns: None,
            passthrough: false,
            done: false,
            held,
        }
    }

    /// Takes in `data`: complete events are rewritten; an event too large, or that the budget
    /// cannot hold, goes out as it is and so does the rest of the stream.
    fn take(&mut self, data: &[u8]) {
        if !self.held.grow(data.len()) {
            self.partial.extend_from_slice(data);
            self.pass_the_rest();
            return;
        }
        self.partial.extend_from_slice(data);
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line = self.partial.split_to(end + 1).freeze();
            let event = rewrite_event(line, &mut self.columns);
            self.ready.push_back(event);
        }
        if self.partial.len() > MAX_EVENT_BYTES {
            self.pass_the_rest();
        }
        self.held.shrink_to(self.partial.len());
    }

    fn pass_the_rest(&mut self) {
        self.ready.push_back(self.partial.split().freeze());
        self.passthrough = true;
        self.held.shrink_to(0);
    }
}

impl http_body::Body for WatchTables {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(event))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) if this.passthrough => return Poll::Ready(Some(Ok(frame))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.take(&data),
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.done = true;
                    if !this.partial.is_empty() {
                        let rest = this.partial.split().freeze();
                        let event = rewrite_event(rest, &mut this.columns);
                        this.ready.push_back(event);
                    }
                    this.held.shrink_to(0);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A Table as kube-apiserver's CRD table convertor writes it for the chart's CRD.
    fn crd_table(with_headers: bool) -> Value {
        let mut t = json!({
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "42"},
            "rows": [
                {"cells": ["v1alpha1.wardle.example.com", "api", "False", "5m", "wardle", "FailedDiscoveryCheck"],
                 "object": {"kind": "PartialObjectMetadata", "metadata": {"name": "v1alpha1.wardle.example.com"}}},
                {"cells": ["v1.apps", null, "True", "9d", null, "Local"]},
                {"cells": ["v1beta1.metrics.k8s.io", "metrics-server", null, "1s", "kube-system", null]},
                {"cells": ["v2.example.com", "svc", "False", "2h", "ns", null]},
            ]
        });
        if with_headers {
            t["columnDefinitions"] = json!([
                {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique", "priority": 0},
                {"name": "Service", "type": "string", "format": "", "description": "", "priority": 0},
                {"name": "Available", "type": "string", "format": "", "description": "", "priority": 0},
                {"name": "Age", "type": "date", "format": "", "description": "CreationTimestamp", "priority": 0},
                {"name": "Service Namespace", "type": "string", "format": "", "description": "", "priority": 1},
                {"name": "Reason", "type": "string", "format": "", "description": "", "priority": 1},
            ]);
        }
        t
    }

    fn cells_of(t: &Value) -> Vec<Value> {
        t["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["cells"].clone())
            .collect()
    }

    fn kube_cells() -> Vec<Value> {
        vec![
            json!([
                "v1alpha1.wardle.example.com",
                "wardle/api",
                "False (FailedDiscoveryCheck)",
                "5m"
            ]),
            json!(["v1.apps", "Local", "True", "9d"]),
            json!([
                "v1beta1.metrics.k8s.io",
                "kube-system/metrics-server",
                "Unknown",
                "1s"
            ]),
            json!(["v2.example.com", "ns/svc", "False", "2h"]),
        ]
    }

    #[test]
    fn the_crd_table_reads_as_kube_aggregators() {
        let bytes = serde_json::to_vec(&crd_table(true)).unwrap();
        let out = rewrite_document(&bytes, &mut None).expect("the CRD's table is rewritten");
        let t: Value = serde_json::from_slice(&out).unwrap();
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["Name", "Service", "Available", "Age"]);
        assert_eq!(cells_of(&t), kube_cells());
        // What is not a cell is kept: the list's resourceVersion and each row's object.
        assert_eq!(t["metadata"]["resourceVersion"], "42");
        assert_eq!(
            t["rows"][0]["object"]["metadata"]["name"],
            "v1alpha1.wardle.example.com"
        );
    }

    #[test]
    fn other_tables_and_documents_pass_untouched() {
        // kube-apiserver's built-in table already has kube's columns.
        let builtin = json!({"kind": "Table", "columnDefinitions": [
            {"name": "Name"}, {"name": "Service"}, {"name": "Available"}, {"name": "Age"}],
            "rows": [{"cells": ["v1.apps", "Local", "True", "9d"]}]});
        let bytes = serde_json::to_vec(&builtin).unwrap();
        assert!(rewrite_document(&bytes, &mut None).is_none());
        assert!(rewrite_document(br#"{"kind":"APIServiceList","items":[]}"#, &mut None).is_none());
        assert!(rewrite_document(b"not json", &mut None).is_none());
        // A header-less table with nothing learned before it cannot be placed.
        let bytes = serde_json::to_vec(&crd_table(false)).unwrap();
        assert!(rewrite_document(&bytes, &mut None).is_none());
    }

    fn line(v: Value) -> Bytes {
        let mut b = serde_json::to_vec(&v).unwrap();
        b.push(b'\n');
        Bytes::from(b)
    }

    #[tokio::test]
    async fn a_watch_keeps_the_first_events_columns_for_the_rest() {
        let first = line(json!({"type": "ADDED", "object": crd_table(true)}));
        let later = line(json!({"type": "MODIFIED", "object": crd_table(false)}));
        // Split mid-event, as a stream may be.
        let mut all = BytesMut::new();
        all.extend_from_slice(&first);
        all.extend_from_slice(&later);
        let all = all.freeze();
        let (a, b) = all.split_at(first.len() + 10);
        let frames = vec![
            Ok::<_, BoxError>(Frame::data(Bytes::copy_from_slice(a))),
            Ok(Frame::data(Bytes::copy_from_slice(b))),
        ];
        let inner = body::boxed(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )));
        let out = WatchTables::new(inner, Held::new(&BUFFERED))
            .collect()
            .await
            .unwrap()
            .to_bytes();
        let events: Vec<Value> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["type"], "ADDED");
        assert_eq!(cells_of(&events[0]["object"]), kube_cells());
        assert_eq!(events[1]["type"], "MODIFIED");
        assert_eq!(cells_of(&events[1]["object"]), kube_cells());
        assert!(events[1]["object"].get("columnDefinitions").is_none());
    }

    #[tokio::test]
    async fn a_list_larger_than_the_bound_streams_on_unchanged() {
        let big = Bytes::from(vec![b'x'; 64]);
        let frames = vec![
            Ok::<_, BoxError>(Frame::data(big.slice(..40))),
            Ok(Frame::data(big.slice(40..))),
        ];
        let inner = body::boxed(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )));
        let Err(replayed) = collect_bounded(inner, 32, &mut Held::new(&BUFFERED)).await else {
            panic!("64 bytes are over a 32-byte bound");
        };
        assert_eq!(replayed.collect().await.unwrap().to_bytes(), big);
    }

    /// A `len`-byte Table answer that never ends: its first `len` bytes arrive, then nothing.
    fn stalled_table(len: usize) -> Response {
        let chunk = Bytes::from(vec![b' '; 1 << 20]);
        let frames = (0..len >> 20).map(move |_| Ok::<_, BoxError>(Frame::data(chunk.clone())));
        let stream = futures::stream::iter(frames).chain(futures::stream::pending());
        let mut resp = Response::new(body::boxed(http_body_util::StreamBody::new(stream)));
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        resp
    }

    use futures::StreamExt;

    /// Issue 26, finding 7: fifty parallel lists each buffered up to 4 MiB, whatever their
    /// number. Now they share one budget: fifty 3 MiB answers under an 8 MiB budget leave at
    /// most two buffering, and the others pass on as the core wrote them, at once.
    #[tokio::test]
    async fn parallel_lists_share_one_buffer_budget() {
        const BUDGET: usize = 8 << 20;
        let budget: &'static Semaphore = Box::leak(Box::new(Semaphore::new(BUDGET)));
        let presented = futures::stream::iter(0..50)
            .map(|_| async move {
                tokio::time::timeout(
                    Duration::from_secs(2),
                    present_within(stalled_table(3 << 20), false, budget),
                )
                .await
                .is_ok()
            })
            .buffer_unordered(50)
            .collect::<Vec<bool>>()
            .await;
        let passed_on = presented.iter().filter(|done| **done).count();
        assert!(
            passed_on >= 48,
            "only {passed_on} of 50 passed on; the rest buffer"
        );
        // Every byte comes back, with the answers passed on and those dropped by the timeout.
        assert_eq!(budget.available_permits(), BUDGET);
    }

    #[tokio::test]
    async fn a_watch_the_budget_cannot_hold_passes_on_unchanged() {
        let budget: &'static Semaphore = Box::leak(Box::new(Semaphore::new(64)));
        let event = line(json!({"type": "ADDED", "object": crd_table(true)}));
        assert!(event.len() > 64);
        let inner = body::boxed(http_body_util::Full::new(event.clone()));
        let out = WatchTables::new(inner, Held::new(budget))
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(out, event, "as the core wrote it");
        assert_eq!(budget.available_permits(), 64);
    }
}

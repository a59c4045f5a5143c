//! A small OTLP trace receiver: what an OpenTelemetry collector's `otlp` receiver does for
//! traces over gRPC, and no more. It serves `TraceService/Export` on plain HTTP/2 (the gateway,
//! like kube-apiserver, dials its collector without TLS), decodes each `ExportTraceServiceRequest`
//! with the protocol's own protobuf definitions (`opentelemetry-proto`), keeps the spans, and
//! answers with an empty `ExportTraceServiceResponse` and `grpc-status: 0`.
//!
//! A gRPC message on the wire is a 5-byte prefix (compressed flag, big-endian length) and the
//! protobuf bytes; the status travels in the HTTP/2 trailers.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// The path of OTLP/gRPC's trace export.
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The largest export accepted (the collector's default gRPC limit is 4 MiB).
const MAX_MESSAGE: usize = 4 << 20;

/// One received span, flattened for assertions: ids in lowercase hex as in `traceparent`.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service_name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP's `SpanKind` number: 2 is `SPAN_KIND_SERVER`.
    pub kind: i32,
    /// Attribute values rendered as text (`503`, `GET`, `12.5`).
    pub attributes: BTreeMap<String, String>,
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// A running receiver; stops when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    arrived: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OtlpReceiver {
    /// Listens on 127.0.0.1, port 0.
    pub async fn start() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let arrived = Arc::new(Notify::new());
        let (kept, notify) = (spans.clone(), arrived.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (kept, notify) = (kept.clone(), notify.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let (kept, notify) = (kept.clone(), notify.clone());
                        async move { Ok::<_, Infallible>(export(req, &kept, &notify).await) }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        OtlpReceiver {
            addr,
            spans,
            arrived,
            task,
        }
    }

    /// The `endpoint` of a TracingConfiguration pointing here.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until the spans received satisfy `done` (checked at each arrival) and returns them,
    /// or returns what arrived when `timeout` passes.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let arrival = self.arrived.notified();
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            if tokio::time::timeout_at(deadline, arrival).await.is_err() {
                return self.spans();
            }
        }
    }
}

/// Answers one gRPC call: an export is decoded and kept; anything else is UNIMPLEMENTED (12).
async fn export(
    req: Request<Incoming>,
    kept: &Mutex<Vec<ReceivedSpan>>,
    arrived: &Notify,
) -> Response<Body> {
    if req.uri().path() != EXPORT_PATH {
        return grpc_answer(None, 12, "only trace export is served here");
    }
    let body = match http_body_util::Limited::new(req.into_body(), MAX_MESSAGE + 5)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => return grpc_answer(None, 8, &format!("request too large or broken: {e}")),
    };
    let message = match unframe(&body) {
        Ok(m) => m,
        Err(e) => return grpc_answer(None, 3, e),
    };
    let request = match ExportTraceServiceRequest::decode(message) {
        Ok(r) => r,
        Err(e) => return grpc_answer(None, 3, &format!("not an ExportTraceServiceRequest: {e}")),
    };
    kept.lock().unwrap().extend(flatten(request));
    arrived.notify_waiters();
    grpc_answer(Some(ExportTraceServiceResponse::default()), 0, "")
}

/// The one message of a unary gRPC request body.
fn unframe(body: &[u8]) -> Result<&[u8], &'static str> {
    if body.len() < 5 {
        return Err("short gRPC frame");
    }
    if body[0] != 0 {
        return Err("compressed messages are not accepted");
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    body.get(5..5 + len)
        .ok_or("gRPC frame longer than the body")
}

/// A gRPC answer: the message (if any) framed, then `grpc-status` (and `grpc-message`) as
/// trailers.
fn grpc_answer(
    message: Option<ExportTraceServiceResponse>,
    code: u8,
    text: &str,
) -> Response<Body> {
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = Vec::new();
    if let Some(m) = message {
        let encoded = m.encode_to_vec();
        let mut buf = BytesMut::with_capacity(5 + encoded.len());
        buf.put_u8(0);
        buf.put_u32(encoded.len() as u32);
        buf.put_slice(&encoded);
        frames.push(Ok(Frame::data(buf.freeze())));
    }
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if let Ok(v) = HeaderValue::from_str(text) {
        if !text.is_empty() {
            trailers.insert("grpc-message", v);
        }
    }
    frames.push(Ok(Frame::trailers(trailers)));
    let mut resp = Response::new(StreamBody::new(futures::stream::iter(frames)).boxed());
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    resp
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let service_name = resource_spans
            .resource
            .map(|r| attributes(&r.attributes))
            .and_then(|mut a| a.remove("service.name"))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                out.push(ReceivedSpan {
                    service_name: service_name.clone(),
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    attributes: attributes(&span.attributes),
                });
            }
        }
    }
    out
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map(text).unwrap_or_default(),
            )
        })
        .collect()
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(f)) => f.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

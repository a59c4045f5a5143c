//! `/openapi/v2` in gnostic's protobuf form, as client-go's `OpenAPISchema()` and `kubectl
//! explain` ask for it: the gateway's encoder, given kube-apiserver's JSON spec, must write what
//! kube-apiserver itself serves for the same spec.
//!
//! Compared field by field (a schema-less decode of both messages); `Any.yaml` texts are compared
//! as the values their YAML parses to, since kubectl parses them back. Byte equality is reported.

use std::time::Instant;

use apiservice::discovery::openapi_v2_proto::{encode, size_limit};
use bytes::Bytes;
use e2e::harness::send;
use http::StatusCode;

use super::session::Real;

const PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

async fn get(real: &Real, accept: &str) -> Bytes {
    let url = format!("{}/openapi/v2", real.plane.url);
    let (status, _, body) = send(&real.direct_client(), real.admin_request(&url, accept))
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(status, StatusCode::OK, "GET {url} ({accept})");
    body
}

pub async fn encode_equals_kube_apiserver(real: &Real) {
    // kube-apiserver regenerates its spec as aggregated servers come and go: take a protobuf
    // bracketed by two equal JSON documents.
    let (json, kube_pb) = {
        let mut attempt = 0;
        loop {
            let before = get(real, "application/json").await;
            let pb = get(real, PROTOBUF).await;
            let after = get(real, "application/json").await;
            if before == after {
                break (before, pb);
            }
            attempt += 1;
            assert!(attempt < 10, "kube-apiserver's /openapi/v2 kept changing");
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    };
    // For timing the encoder outside this (debug) build: `OPENAPI_V2_JSON_OUT=<file>`.
    if let Ok(out) = std::env::var("OPENAPI_V2_JSON_OUT") {
        std::fs::write(&out, &json).unwrap_or_else(|e| panic!("writing {out}: {e}"));
    }
    let spec: serde_json::Value = serde_json::from_slice(&json).expect("/openapi/v2 is JSON");
    let started = Instant::now();
    let ours = encode(&spec, size_limit(json.len()))
        .expect("encode kube-apiserver's spec within its size limit");
    let took = started.elapsed();
    eprintln!(
        "openapi v2 protobuf: JSON {} bytes, kube-apiserver's protobuf {} bytes, ours {} bytes \
         (encoded in {took:.1?}, this build's profile); byte-equal: {}",
        json.len(),
        kube_pb.len(),
        ours.len(),
        ours == kube_pb
    );
    if ours == kube_pb {
        return;
    }
    let mut cmp = Comparison::default();
    cmp.bytes(&kube_pb, &ours, "");
    eprintln!(
        "openapi v2 protobuf: {} Any.yaml text(s) differ in text but parse to the same value{}",
        cmp.yaml_text_only,
        cmp.yaml_examples
            .iter()
            .map(|(a, b)| format!("\n  kube {a:?} / ours {b:?}"))
            .collect::<String>()
    );
    assert!(
        cmp.differences.is_empty(),
        "our protobuf differs from kube-apiserver's at {} place(s) (first 20):\n{}",
        cmp.differences.len(),
        cmp.differences
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// One decoded field: number and value.
#[derive(Debug)]
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Len(&'a [u8]),
}

fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// `b` as a protobuf message (field number, value), or `None` when it is not one.
fn decode(mut b: &[u8]) -> Option<Vec<(u64, Wire<'_>)>> {
    let mut fields = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let (number, wire) = (key >> 3, key & 7);
        if number == 0 {
            return None;
        }
        let value = match wire {
            0 => Wire::Varint(varint(&mut b)?),
            1 => {
                let (v, rest) = b.split_first_chunk::<8>()?;
                b = rest;
                Wire::Fixed64(u64::from_le_bytes(*v))
            }
            5 => {
                let (v, rest) = b.split_first_chunk::<4>()?;
                b = rest;
                Wire::Fixed32(u32::from_le_bytes(*v))
            }
            2 => {
                let len = usize::try_from(varint(&mut b)?).ok()?;
                if len > b.len() {
                    return None;
                }
                let (v, rest) = b.split_at(len);
                b = rest;
                Wire::Len(v)
            }
            _ => return None,
        };
        fields.push((number, value));
    }
    Some(fields)
}

/// A readable label for a message: its field 1 when that is a short name (`Named*` pairs).
fn label(fields: &[(u64, Wire<'_>)]) -> String {
    match fields.first() {
        Some((1, Wire::Len(b))) if b.len() < 120 => match std::str::from_utf8(b) {
            Ok(s) if s.chars().all(|c| !c.is_control()) => format!("({s})"),
            _ => String::new(),
        },
        _ => String::new(),
    }
}

#[derive(Default)]
struct Comparison {
    differences: Vec<String>,
    yaml_text_only: usize,
    yaml_examples: Vec<(String, String)>,
}

impl Comparison {
    /// Compares two length-delimited values: as messages where both decode as one, else as
    /// text, where YAML texts that parse to the same value count as equal.
    fn bytes(&mut self, kube: &[u8], ours: &[u8], path: &str) {
        if kube == ours {
            return;
        }
        if let (Some(k), Some(o)) = (decode(kube), decode(ours)) {
            return self.message(&k, &o, path);
        }
        let (Ok(k), Ok(o)) = (std::str::from_utf8(kube), std::str::from_utf8(ours)) else {
            self.differences.push(format!("{path}: bytes differ"));
            return;
        };
        let parse = |s: &str| serde_saphyr::from_str::<serde_json::Value>(s).ok();
        match (parse(k), parse(o)) {
            (Some(a), Some(b)) if a == b => {
                self.yaml_text_only += 1;
                if self.yaml_examples.len() < 5 {
                    self.yaml_examples.push((k.to_owned(), o.to_owned()));
                }
            }
            _ => self
                .differences
                .push(format!("{path}: kube {k:?}, ours {o:?}")),
        }
    }

    fn message(&mut self, kube: &[(u64, Wire<'_>)], ours: &[(u64, Wire<'_>)], path: &str) {
        let path = format!("{path}{}", label(kube));
        let numbers = |f: &[(u64, Wire<'_>)]| f.iter().map(|(n, _)| *n).collect::<Vec<_>>();
        if numbers(kube) != numbers(ours) {
            self.differences.push(format!(
                "{path}: fields kube {:?}, ours {:?}",
                numbers(kube),
                numbers(ours)
            ));
            return;
        }
        let mut index = std::collections::HashMap::<u64, usize>::new();
        for ((number, k), (_, o)) in kube.iter().zip(ours) {
            let i = index.entry(*number).or_default();
            let here = format!("{path}.{number}[{i}]");
            *i += 1;
            match (k, o) {
                (Wire::Len(a), Wire::Len(b)) => self.bytes(a, b, &here),
                (Wire::Varint(a), Wire::Varint(b)) if a == b => {}
                (Wire::Fixed64(a), Wire::Fixed64(b)) if a == b => {}
                (Wire::Fixed32(a), Wire::Fixed32(b)) if a == b => {}
                _ => self
                    .differences
                    .push(format!("{here}: kube {k:?}, ours {o:?}")),
            }
        }
    }
}

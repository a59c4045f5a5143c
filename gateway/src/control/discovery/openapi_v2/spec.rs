//! One server's `/openapi/v2` spec: its revalidation with the ETag it came with, and the check a
//! new spec passes before it may take part in the merge.

use apiservice::discovery::{etag_for, openapi_v2_proto};
use bytes::Bytes;
use http::StatusCode;
use serde_json::Value;

use super::PATH;
use crate::body::BoxError;
use crate::control::discovery::fetch::{FetchError, Source, OPENAPI_TIMEOUT};

/// What one server last said at `/openapi/v2`. Cheap to clone (the spec is shared bytes): a
/// fetch works on a copy while the loop keeps merging the last one.
#[derive(Clone, Default)]
pub struct SpecState {
    /// The last good body as received (see [`check_spec`]).
    pub spec: Option<Bytes>,
    etag: Option<String>,
    /// A remote's last failure, to log changes only (the core's are its `Outage`'s).
    error: Option<String>,
    /// The digest of the last body refused by [`check_spec`], and why: sent again, it is
    /// refused again without parsing it again.
    refused: Option<(String, String)>,
}

impl SpecState {
    /// Whether the last fetch failed (the key is then on its backoff).
    pub fn is_failing(&self) -> bool {
        self.error.is_some()
    }
}

/// What [`refresh`] found: the reason of a change (`add`, `update`, `delete`) or `None`.
pub type Refreshed = Result<Option<&'static str>, BoxError>;

/// Revalidates one server's spec; on failure the last spec stays.
pub async fn refresh(source: &Source, state: &mut SpecState) -> Refreshed {
    let fetched = source
        .get(
            PATH,
            "application/json",
            state.etag.as_deref(),
            OPENAPI_TIMEOUT,
        )
        .await;
    match fetched {
        Ok(answer) if answer.status == StatusCode::NOT_MODIFIED && state.spec.is_some() => Ok(None),
        Ok(answer) if answer.status == StatusCode::OK => {
            if state.spec.as_ref() == Some(&answer.body) {
                state.etag = answer.etag();
                Ok(None)
            } else {
                let digest = etag_for(&answer.body);
                let checked = match &state.refused {
                    Some((refused, why)) if *refused == digest => Err(why.clone()),
                    _ => checked(answer.body.clone()).await,
                };
                match checked {
                    Ok(()) => {
                        let reason = if state.spec.is_none() {
                            "add"
                        } else {
                            "update"
                        };
                        state.etag = answer.etag();
                        state.spec = Some(answer.body);
                        state.refused = None;
                        Ok(Some(reason))
                    }
                    Err(e) => {
                        state.refused = Some((digest, e.clone()));
                        Err(e.into())
                    }
                }
            }
        }
        Ok(answer) if answer.status == StatusCode::NOT_FOUND => {
            state.etag = None;
            Ok(state.spec.take().map(|_| "delete"))
        }
        Ok(answer) => Err(format!("GET {PATH}: {}", answer.status).into()),
        Err(e) => Err(e.into()),
    }
}

/// A remote APIService's fetch, logged once per change of its error.
pub fn log_remote(state: &mut SpecState, name: &str, outcome: &Refreshed) {
    match outcome {
        Ok(_) => {
            if state.error.take().is_some() {
                tracing::info!(apiservice = name, "OpenAPI v2 spec fetched again");
            }
        }
        Err(e) => {
            let e = e.to_string();
            if state.error.as_ref() != Some(&e) {
                tracing::warn!(apiservice = name, error = %e,
                    "cannot fetch the OpenAPI v2 spec; keeping the last one");
                state.error = Some(e);
            }
        }
    }
}

/// [`check_spec`] on a blocking thread, one spec at a time (each is parsed whole).
async fn checked(body: Bytes) -> Result<(), String> {
    static ONE_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
    let _turn = ONE_AT_A_TIME.acquire().await;
    tokio::task::spawn_blocking(move || check_spec(&body))
        .await
        .unwrap_or_else(|e| Err(format!("checking the spec: {e}")))
}

/// Whether a spec can take part in the merge: a JSON object the parser takes (nested at most
/// `MAX_JSON_DEPTH` deep) whose protobuf form is within its size limit. Checked when a new
/// spec arrives, so that a bad one is refused once, with the server's last good spec kept,
/// instead of being left out of (or failing) every merge after it.
fn check_spec(body: &[u8]) -> Result<(), String> {
    let spec: Value = serde_json::from_slice(body)
        .map_err(|e| FetchError::decode(PATH, "OpenAPI v2 spec", e).to_string())?;
    if !spec.is_object() {
        return Err(format!("GET {PATH}: the body is not a JSON object"));
    }
    openapi_v2_proto::encode(&spec, openapi_v2_proto::size_limit(body.len()))
        .map_err(|e| format!("GET {PATH}: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_objects_count_as_specs() {
        assert_eq!(check_spec(b" {\"swagger\": \"2.0\"}"), Ok(()));
        for bad in [&b"[]"[..], b"{\"swagger\": ", b"<html>"] {
            assert!(check_spec(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_spec_nested_too_deep_or_encoding_too_large_is_refused_with_a_reason() {
        let depth = apiservice::discovery::MAX_JSON_DEPTH;
        let deep = format!(r#"{{"x-a":{}{}}}"#, "[".repeat(depth), "]".repeat(depth));
        assert_eq!(
            check_spec(deep.as_bytes()),
            Err(
                "GET /openapi/v2: the OpenAPI v2 spec nests deeper than 128 levels, which the \
                 gateway does not parse; the server must publish a flatter document"
                    .to_owned()
            )
        );
        // 120 levels parse, but as YAML each of the 200 000 leaves sits behind 240 spaces.
        let mut wide = String::from(r#"{"x-a":"#);
        wide.push_str(&"[".repeat(120));
        wide.push_str(&vec!["0"; 200_000].join(","));
        wide.push_str(&"]".repeat(120));
        wide.push('}');
        let refused = check_spec(wide.as_bytes()).unwrap_err();
        assert!(refused.contains("protobuf form would pass"), "{refused}");
        assert_eq!(
            check_spec(br#"{"paths": []}"#).unwrap_err(),
            "GET /openapi/v2: openapi v2 spec: /paths must be an object"
        );
    }
}

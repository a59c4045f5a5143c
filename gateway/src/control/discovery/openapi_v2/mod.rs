//! `/openapi/v2`: the core's Swagger spec merged with every remote APIService's, as
//! kube-aggregator serves it, in JSON and in the protobuf form `kubectl explain` asks for.
//!
//! kube-aggregator's users pay for this in CPU and memory (kubernetes#105932, #101755): it
//! re-merges large specs often. Here one loop owns it ([`OpenApiV2Controller`]):
//! * [`controller`]: a work queue with one key per backing Service's spec and one for the core's,
//!   at kube-aggregator's rates: each spec is revalidated with its ETag a minute after a success
//!   (a 304 costs nothing), retried from a minute up to an hour while it fails, and fetched at
//!   once when its APIServices change, when one of them turns available or unavailable, or when
//!   one of the Service's connections fails. Fetches run concurrently, so a backend that hangs
//!   until its timeout delays no other backend's spec. The core's spec is revalidated as well
//!   after every change of its CRDs or APIServices, a few times over two seconds.
//! * [`spec`]: one server's spec, kept as the bytes the backend sent, not as a parsed tree (which
//!   takes several times the memory). A new spec is checked once, when it arrives: it parses,
//!   and its protobuf form stays within its size limit; so one backend's bad spec costs neither
//!   the merge nor anybody else's updates: it is logged once and the last good spec kept.
//! * [`merge`]: the merge (`apiservice::discovery::openapi_v2`) parses one remote spec at a time
//!   and drops it once merged. It runs only when a contributing spec or the APIService set
//!   changed, on a blocking thread, off the request path, one at a time: changes arriving during
//!   a merge are taken in by one more merge after it.
//! * here: requests read prepared bytes ([`OpenApiV2`]) and answer `If-None-Match` with 304. The
//!   gzip form is made on the first request that accepts it (client-go's transport always does),
//!   once per merged document, so a merge nobody downloads compressed costs no compression.
//!
//! A backend that fails keeps its last spec; one that never answered is left out. Until the
//! core's spec has been fetched once nothing is published, and `/openapi/v2` goes to the core as
//! before.

use std::io::Write;

use apiservice::discovery::etag_for;
use bytes::Bytes;
use tokio::sync::OnceCell;

pub mod controller;
pub mod merge;
pub mod spec;

pub use controller::OpenApiV2Controller;

/// The Content-Type of the protobuf form, as kube-openapi answers it. Clients ask for it as
/// `application/com.github.proto-openapi.spec.v2@v1.0+protobuf` (client-go's `OpenAPISchema()`)
/// or with this name; Go's MIME parser refuses the `@` form in a Content-Type.
pub const CONTENT_TYPE_PROTOBUF: &str =
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
/// Where every server serves its spec.
const PATH: &str = "/openapi/v2";

/// The merged spec as served.
pub struct OpenApiV2 {
    pub json: Encoded,
    pub protobuf: Encoded,
}

// === impl OpenApiV2 ===

impl OpenApiV2 {
    /// The protobuf or the JSON form, with its Content-Type.
    pub fn representation(&self, protobuf: bool) -> (&'static str, &Encoded) {
        if protobuf {
            (CONTENT_TYPE_PROTOBUF, &self.protobuf)
        } else {
            ("application/json", &self.json)
        }
    }
}

/// One representation of the merged spec: its bytes, ETag, and gzip form once asked for.
pub struct Encoded {
    pub bytes: Bytes,
    pub etag: String,
    gzip: OnceCell<Bytes>,
}

// === impl Encoded ===

impl Encoded {
    pub(super) fn new(bytes: Bytes) -> Self {
        Self {
            etag: etag_for(&bytes),
            bytes,
            gzip: OnceCell::new(),
        }
    }

    /// The gzip form, compressed on a blocking thread by the first caller; callers arriving
    /// meanwhile wait for that one compression instead of starting their own.
    pub async fn gzip(&self) -> Bytes {
        self.gzip
            .get_or_init(|| {
                let bytes = self.bytes.clone();
                async move {
                    tokio::task::spawn_blocking(move || gzip(&bytes))
                        .await
                        .unwrap_or_default()
                }
            })
            .await
            .clone()
    }
}

/// The fastest gzip level: the documents are large and JSON compresses well at any level;
/// a request should not wait seconds for the last few percent.
fn gzip(bytes: &[u8]) -> Bytes {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 8),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(bytes);
    Bytes::from(encoder.finish().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[tokio::test]
    async fn the_gzip_form_is_made_once_and_decodes_to_the_document() {
        let doc = Encoded::new(Bytes::from(vec![b'x'; 100_000]));
        let first = doc.gzip().await;
        assert!(first.len() < 1_000, "{}", first.len());
        let again = doc.gzip().await;
        assert_eq!(first.as_ptr(), again.as_ptr(), "compressed once");
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&first[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(plain, doc.bytes);
    }
}

//! What every document the gateway reads or serves shares, whatever its kind: how deep a parsed
//! one may nest, the ETag of a prepared one, and why one could not be prepared. A file of its
//! own so that the document code can be compiled alone (the fuzz targets in `gateway/fuzz`).

/// How deep a JSON document from a server may nest: serde_json's recursion limit, which every
/// document the gateway reads from the core or a backend is parsed with (a deeper one is a parse
/// error, never a stack overflow). Walks over parsed documents that follow their structure by
/// recursion (the protobuf and YAML writers) are bounded by it; walks that follow references
/// between definitions, which no parser bounds, use worklists.
pub const MAX_JSON_DEPTH: usize = 128;

/// Why a discovery document could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// Serialising a prepared document failed (cannot happen with the types used here, but
    /// serde's API is fallible and we do not panic).
    #[error("serialising the {document} discovery document: {source}")]
    Serialize {
        /// Which document: `/apis`, `/api`, `/apis/<group>`, `/openapi/v3`.
        document: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The quoted ETag kube-apiserver sends for a JSON body: `"` + uppercase hex SHA-512 + `"`
/// (`etag.go` in apiserver's aggregated discovery, and kube-openapi's handler3).
pub fn etag_for(json: &[u8]) -> String {
    use sha2::{Digest, Sha512};
    let digest = Sha512::digest(json);
    let mut out = String::with_capacity(130);
    out.push('"');
    out.push_str(&hex::encode_upper(digest));
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_is_quoted_uppercase_sha512() {
        let etag = etag_for(b"{}");
        assert_eq!(etag.len(), 130);
        assert!(etag.starts_with('"') && etag.ends_with('"'));
        let hex = &etag[1..129];
        assert!(hex
            .chars()
            .all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c)));
        // sha512("{}") — fixed value, so a change of algorithm or case shows up here.
        assert!(hex.starts_with("27C74670ADB75075FAD058D5CEAF7B20C4E7786C83BAE8A32F626F9782AF34C9"));
    }
}

//! Which discovery representation a request's `Accept` header asks for.
//!
//! `/api` and `/apis` answer either the aggregated `APIGroupDiscoveryList` or the legacy
//! documents, and clients (client-go, kubectl) only look at the response `Content-Type` to tell
//! them apart, so the choice must match kube-apiserver's (`discovery/aggregated/wrapper.go` +
//! `handlers/negotiation`):
//!
//! * clauses are split on `,`, parameters on `;`, whitespace around tokens ignored, parameter
//!   names and media types compared case-insensitively (values exactly);
//! * clauses are tried by descending `q` (default 1), then concrete types before `*`, otherwise in
//!   the client's order (a stable sort); `q=0` means "not acceptable" and is skipped;
//! * the first clause whose media range covers `application/json` (`application/json`,
//!   `application/*`, `*/*`) **and** carries `g=apidiscovery.k8s.io`, `v=v2` or `v=v2beta1`,
//!   `as=APIGroupDiscoveryList` (in any order) selects the aggregated document; a clause without
//!   those parameters never selects it, but does not stop the search either (kube's discovery
//!   endpoint restrictions reject it and move on);
//! * clauses we cannot honour are skipped: protobuf/YAML (we serve JSON only), `sv=...`,
//!   `stream=...`;
//! * a `profile` parameter does not disqualify a clause: kube-apiserver 1.36 reads it
//!   (`handlers/negotiation`) and serves `profile=nopeer` its own, not peer-merged, document
//!   (`discovery/aggregated/wrapper.go`). The gateway is one server with one merged document, so
//!   every profile selects that document (same bytes, same ETag), answered with kube's
//!   `Content-Type`, which names `g`/`v`/`as` and never the profile;
//! * nothing selected (including an empty or missing header) → legacy;
//! * `v=v2beta1` selects only while it is served ([`ServedVersions`]): kube-apiserver stopped
//!   serving it by default in 1.33 (its `AggregatedDiscoveryRemoveBetaType` gate) and for good in
//!   1.35, and from then on treats such a clause as one it cannot transform, so the search moves
//!   on to the next clause (kubectl 1.29's trailing `application/json` gets the legacy document).

/// `Content-Type` of an aggregated discovery answer in `apidiscovery.k8s.io/v2`.
pub const CONTENT_TYPE_AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// `Content-Type` of an aggregated discovery answer in `apidiscovery.k8s.io/v2beta1`.
pub const CONTENT_TYPE_AGGREGATED_V2BETA1: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
/// `Content-Type` of legacy discovery documents and the OpenAPI v3 root.
pub const CONTENT_TYPE_JSON: &str = "application/json";

const DISCOVERY_GROUP: &str = "apidiscovery.k8s.io";
const DISCOVERY_KIND: &str = "APIGroupDiscoveryList";

/// The representation of `/api` or `/apis` to serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Negotiated {
    /// `APIGroupDiscoveryList` in `apidiscovery.k8s.io/v2`.
    AggregatedV2,
    /// `APIGroupDiscoveryList` in `apidiscovery.k8s.io/v2beta1` (kubectl 1.29 and older).
    AggregatedV2Beta1,
    /// `APIVersions` / `APIGroupList` (for `/api` that means: let the core answer).
    Legacy,
}

// === impl Negotiated ===

impl Negotiated {
    /// The `Content-Type` to answer with.
    pub fn content_type(self) -> &'static str {
        match self {
            Negotiated::AggregatedV2 => CONTENT_TYPE_AGGREGATED_V2,
            Negotiated::AggregatedV2Beta1 => CONTENT_TYPE_AGGREGATED_V2BETA1,
            Negotiated::Legacy => CONTENT_TYPE_JSON,
        }
    }

    /// Whether this is one of the aggregated representations.
    pub fn is_aggregated(self) -> bool {
        !matches!(self, Negotiated::Legacy)
    }
}

/// The aggregated discovery versions `/api` and `/apis` answer in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServedVersions {
    /// `apidiscovery.k8s.io/v2` and `v2beta1`, as kube-apiserver 1.26–1.32 serves them.
    #[default]
    V2AndV2Beta1,
    /// `apidiscovery.k8s.io/v2` only, as kube-apiserver 1.33 on serves it.
    V2Only,
}

/// One parsed `Accept` clause.
struct Clause<'a> {
    ty: &'a str,
    subtype: &'a str,
    q: f32,
    /// Position in the header, so sorting is stable regardless of the sort algorithm.
    index: usize,
    params: &'a str,
}

// === impl Clause ===

impl Clause<'_> {
    /// `0` concrete type and subtype, `1` subtype wildcard, `2` full wildcard.
    fn wildness(&self) -> u8 {
        u8::from(self.ty == "*") + u8::from(self.subtype == "*")
    }

    fn covers_json(&self) -> bool {
        (self.ty == "*" && self.subtype == "*")
            || (self.ty.eq_ignore_ascii_case("application")
                && (self.subtype == "*" || self.subtype.eq_ignore_ascii_case("json")))
    }

    /// Whether the clause names a kind to convert to (`as`, `g` or `v`): kube's legacy handlers
    /// refuse every such clause, so one the aggregated handler did not take (v2beta1 on a server
    /// that no longer serves it) does not make the legacy document acceptable either.
    fn asks_for_conversion(&self) -> bool {
        self.params.split(';').any(|param| {
            param.split_once('=').is_some_and(|(key, _)| {
                let key = key.trim();
                ["as", "g", "v"].iter().any(|k| key.eq_ignore_ascii_case(k))
            })
        })
    }

    /// The aggregated representation this clause asks for, if it asks for one we can serve.
    fn aggregated(&self, served: ServedVersions) -> Option<Negotiated> {
        let (mut g, mut v, mut kind) = (None, None, None);
        for param in self.params.split(';') {
            let Some((key, value)) = param.split_once('=') else {
                continue;
            };
            let (key, value) = (key.trim(), value.trim().trim_matches('"'));
            if key.eq_ignore_ascii_case("g") {
                g = Some(value);
            } else if key.eq_ignore_ascii_case("v") {
                v = Some(value);
            } else if key.eq_ignore_ascii_case("as") {
                kind = Some(value);
            } else if (key.eq_ignore_ascii_case("sv") || key.eq_ignore_ascii_case("stream"))
                && !value.is_empty()
            {
                // A variant we do not implement: skip the whole clause. (`profile` is not one:
                // see the module docs.)
                return None;
            }
        }
        if g != Some(DISCOVERY_GROUP) || kind != Some(DISCOVERY_KIND) {
            return None;
        }
        match v {
            Some("v2") => Some(Negotiated::AggregatedV2),
            Some("v2beta1") if served == ServedVersions::V2AndV2Beta1 => {
                Some(Negotiated::AggregatedV2Beta1)
            }
            _ => None,
        }
    }
}

fn parse(header: &str) -> Vec<Clause<'_>> {
    let mut clauses = Vec::new();
    for (index, part) in header.split(',').enumerate() {
        let (range, rest) = match part.split_once(';') {
            Some((range, rest)) => (range.trim(), rest),
            None => (part.trim(), ""),
        };
        let (ty, subtype) = match range.split_once('/') {
            Some((t, s)) => (t.trim(), s.trim()),
            None if range == "*" => ("*", "*"),
            None => continue,
        };
        if ty.is_empty() || subtype.is_empty() {
            continue;
        }
        let mut q = 1.0f32;
        for param in rest.split(';') {
            if let Some((key, value)) = param.split_once('=') {
                if key.trim().eq_ignore_ascii_case("q") {
                    // An unparsable q counts as 0, like goautoneg's ParseFloat error path.
                    q = value.trim().parse().unwrap_or(0.0);
                }
            }
        }
        clauses.push(Clause {
            ty,
            subtype,
            q,
            index,
            params: rest,
        });
    }
    clauses.sort_by(|a, b| {
        b.q.total_cmp(&a.q)
            .then(a.wildness().cmp(&b.wildness()))
            .then(a.index.cmp(&b.index))
    });
    clauses
}

/// Picks the representation of `/api` or `/apis` for an `Accept` header, among the `served`
/// versions (module docs give the rules). Never fails: anything unrecognised means
/// [`Negotiated::Legacy`].
pub fn negotiate(accept: Option<&str>, served: ServedVersions) -> Negotiated {
    let Some(header) = accept else {
        return Negotiated::Legacy;
    };
    parse(header)
        .iter()
        .filter(|c| c.q > 0.0 && c.covers_json())
        .find_map(|c| c.aggregated(served))
        .unwrap_or(Negotiated::Legacy)
}

/// Whether a legacy JSON document is acceptable for this `Accept` header (missing or empty header,
/// or some clause with `q > 0` covering `application/json`). When it is not, the gateway's own
/// legacy handlers answer 406 like kube-apiserver.
pub fn accepts_legacy_json(accept: Option<&str>) -> bool {
    match accept {
        None => true,
        Some(h) if h.trim().is_empty() => true,
        Some(h) => parse(h)
            .iter()
            .any(|c| c.q > 0.0 && c.covers_json() && !c.asks_for_conversion()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a server that still serves v2beta1 negotiates.
    fn both(accept: Option<&str>) -> Negotiated {
        negotiate(accept, ServedVersions::V2AndV2Beta1)
    }

    /// kube-apiserver 1.33 on: a v2beta1 clause is passed over, as one the server cannot
    /// transform, and the search goes on (kubectl 1.29's trailing `application/json` wins).
    #[test]
    fn without_v2beta1_its_clauses_are_passed_over() {
        let v2_only = |h| negotiate(Some(h), ServedVersions::V2Only);
        assert_eq!(v2_only(KUBECTL_129), Negotiated::Legacy);
        assert_eq!(v2_only(KUBECTL_132), Negotiated::AggregatedV2);
        let beta_first = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        assert_eq!(v2_only(beta_first), Negotiated::AggregatedV2);
        assert_eq!(both(Some(beta_first)), Negotiated::AggregatedV2Beta1);
    }

    /// kubectl 1.30–1.33 (wire-formats.md §2.3, observed).
    const KUBECTL_132: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
    /// kubectl 1.29.14 (observed).
    const KUBECTL_129: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
    /// kubectl's legacy per-GV fetch and `kubectl get --raw /apis` (observed).
    const KUBECTL_RAW: &str = "application/json, */*";
    /// Python kubernetes client 37.0.2 (observed).
    const PYTHON: &str = "application/json";

    #[test]
    fn observed_clients() {
        assert_eq!(both(Some(KUBECTL_132)), Negotiated::AggregatedV2);
        assert_eq!(both(Some(KUBECTL_129)), Negotiated::AggregatedV2Beta1);
        assert_eq!(both(Some(KUBECTL_RAW)), Negotiated::Legacy);
        assert_eq!(both(Some(PYTHON)), Negotiated::Legacy);
        assert_eq!(
            both(Some(
                kube_core::discovery::v2::ACCEPT_AGGREGATED_DISCOVERY_V2
            )),
            Negotiated::AggregatedV2
        );
    }

    #[test]
    fn missing_or_empty_header_is_legacy() {
        assert_eq!(both(None), Negotiated::Legacy);
        assert_eq!(both(Some("")), Negotiated::Legacy);
        assert_eq!(both(Some(" , ;")), Negotiated::Legacy);
    }

    #[test]
    fn parameters_in_any_order_with_whitespace() {
        assert_eq!(
            both(Some(
                " application/json ; as=APIGroupDiscoveryList ; v=v2 ; g=apidiscovery.k8s.io "
            )),
            Negotiated::AggregatedV2
        );
        assert_eq!(
            both(Some(
                "Application/JSON;V=v2beta1;G=apidiscovery.k8s.io;AS=APIGroupDiscoveryList;charset=utf-8"
            )),
            Negotiated::AggregatedV2Beta1
        );
    }

    #[test]
    fn clauses_tried_in_client_order() {
        // v2beta1 first in the header → v2beta1, even though v2 is also offered.
        let h = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        assert_eq!(both(Some(h)), Negotiated::AggregatedV2Beta1);
        // A plain JSON clause first does not stop the search (kube rejects it for the aggregated
        // handler and keeps going).
        let h =
            "application/json,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        assert_eq!(both(Some(h)), Negotiated::AggregatedV2);
    }

    #[test]
    fn q_values_are_respected() {
        let h = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList;q=0.5,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;q=0.9";
        assert_eq!(both(Some(h)), Negotiated::AggregatedV2);
        let h = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;q=0,application/json";
        assert_eq!(both(Some(h)), Negotiated::Legacy);
    }

    #[test]
    fn a_profile_selects_the_same_aggregated_document() {
        // client-go 1.36 sends profile=nopeer first: kube 1.36 takes that clause (the local
        // document), so a later v2beta1 clause must not win.
        let h = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(both(Some(h)), Negotiated::AggregatedV2);
        for h in [
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer",
            "application/json;profile=nopeer;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=other",
        ] {
            assert_eq!(both(Some(h)), Negotiated::AggregatedV2, "{h}");
        }
        // A profile alone asks for no aggregated kind.
        assert_eq!(
            both(Some("application/json;profile=nopeer")),
            Negotiated::Legacy
        );
    }

    #[test]
    fn unsupported_clauses_fall_through() {
        // A server version (kube's discovery endpoints allow none) → skip to the next clause.
        let h = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;sv=v1,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(both(Some(h)), Negotiated::AggregatedV2Beta1);
        // Protobuf is not served: fall through to JSON.
        let h = "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
        assert_eq!(both(Some(h)), Negotiated::AggregatedV2Beta1);
        // Unknown discovery versions and wrong group/kind never select the aggregated document.
        for h in [
            "application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList",
            "application/json;g=apidiscovery.k8s.io;v=v2",
            "application/json;g=other.io;v=v2;as=APIGroupDiscoveryList",
            "application/yaml;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        ] {
            assert_eq!(both(Some(h)), Negotiated::Legacy, "{h}");
        }
    }

    #[test]
    fn wildcards_cover_json() {
        assert_eq!(
            both(Some(
                "*/*;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
            )),
            Negotiated::AggregatedV2
        );
        assert_eq!(
            both(Some(
                "application/*;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
            )),
            Negotiated::AggregatedV2Beta1
        );
    }

    #[test]
    fn legacy_acceptability() {
        assert!(accepts_legacy_json(None));
        assert!(accepts_legacy_json(Some(KUBECTL_RAW)));
        assert!(accepts_legacy_json(Some(PYTHON)));
        assert!(accepts_legacy_json(Some("*/*")));
        assert!(!accepts_legacy_json(Some("application/yaml")));
        assert!(!accepts_legacy_json(Some("application/json;q=0")));
        // A clause that asks for a kind is no clause for the legacy document.
        let v2beta1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
        assert!(!accepts_legacy_json(Some(v2beta1)));
        assert!(accepts_legacy_json(Some(KUBECTL_129)));
    }

    #[test]
    fn content_types() {
        assert_eq!(
            Negotiated::AggregatedV2.content_type(),
            CONTENT_TYPE_AGGREGATED_V2
        );
        assert_eq!(
            Negotiated::AggregatedV2Beta1.content_type(),
            CONTENT_TYPE_AGGREGATED_V2BETA1
        );
        assert_eq!(Negotiated::Legacy.content_type(), "application/json");
        assert!(!Negotiated::Legacy.is_aggregated());
    }
}

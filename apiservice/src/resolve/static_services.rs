//! Services reached at fixed URLs from the config file (`services:`), for backends outside any
//! cluster: no watch, no cache, nothing that changes after start.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use gateway_config::StaticService;

use super::{Endpoint, Endpoints, ResolveError, ServiceResolver};
use crate::model::ServiceRef;

/// A static service URL that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("services: {namespace}/{name}: url {url:?} {problem}")]
pub struct StaticServiceError {
    pub namespace: String,
    pub name: String,
    pub url: String,
    pub problem: &'static str,
}

// === impl StaticResolver ===

struct StaticEntry {
    /// `None` matches any port.
    port: Option<u16>,
    endpoints: Endpoints,
    next: AtomicUsize,
}

/// Services reached at fixed URLs from the config file (`services:`), for backends outside any
/// cluster. Several URLs for one service are used in turn.
pub struct StaticResolver {
    /// namespace → name → entries; nested so lookups borrow the `ServiceRef`'s strings.
    services: HashMap<String, HashMap<String, Vec<StaticEntry>>>,
}

impl StaticResolver {
    pub fn new(services: &[StaticService]) -> Result<Self, StaticServiceError> {
        let mut map: HashMap<String, HashMap<String, Vec<StaticEntry>>> = HashMap::new();
        for s in services {
            let endpoints = s
                .urls
                .iter()
                .map(|url| {
                    parse_https_url(url).map_err(|problem| StaticServiceError {
                        namespace: s.namespace.clone(),
                        name: s.name.clone(),
                        url: url.clone(),
                        problem,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            map.entry(s.namespace.clone())
                .or_default()
                .entry(s.name.clone())
                .or_default()
                .push(StaticEntry {
                    port: s.port,
                    endpoints: endpoints.into(),
                    next: AtomicUsize::new(0),
                });
        }
        Ok(Self { services: map })
    }

    /// The entry for exactly this port, else one that matches any port.
    fn entry(&self, svc: &ServiceRef) -> Option<&StaticEntry> {
        let entries = self.services.get(&svc.namespace)?.get(&svc.name)?;
        entries
            .iter()
            .find(|e| e.port == Some(svc.port))
            .or_else(|| entries.iter().find(|e| e.port.is_none()))
            .filter(|e| !e.endpoints.is_empty())
    }
}

impl ServiceResolver for StaticResolver {
    fn resolve(&self, svc: &ServiceRef) -> Result<Endpoint, ResolveError> {
        let entry = self
            .entry(svc)
            .ok_or_else(|| ResolveError::not_present(svc))?;
        let i = entry.next.fetch_add(1, Ordering::Relaxed) % entry.endpoints.len();
        Ok(entry.endpoints[i].clone())
    }

    fn endpoints(&self, svc: &ServiceRef) -> Result<Endpoints, ResolveError> {
        self.entry(svc)
            .map(|e| e.endpoints.clone())
            .ok_or_else(|| ResolveError::not_present(svc))
    }

    fn check_endpoints(&self, svc: &ServiceRef) -> Result<(), ResolveError> {
        self.entry(svc)
            .map(drop)
            .ok_or_else(|| ResolveError::not_present(svc))
    }
}

// === static URLs ===

/// `https://host[:port][/]` → endpoint (port 443 by default). Paths are refused: the proxy
/// forwards the client's path unchanged, so a path here would be silently ignored.
fn parse_https_url(url: &str) -> Result<Endpoint, &'static str> {
    let rest = url
        .strip_prefix("https://")
        .ok_or("must be an https:// URL")?;
    let authority = match rest.find(['/', '?', '#']) {
        Some(i) if &rest[i..] == "/" => &rest[..i],
        Some(_) => return Err("must not have a path, query or fragment"),
        None => rest,
    };
    if authority.contains('@') {
        return Err("must not contain user information");
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or("has an unclosed '[' in its host")?;
        match after {
            "" => (host, None),
            p => (
                host,
                Some(p.strip_prefix(':').ok_or("has junk after its IPv6 host")?),
            ),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => return Err("needs brackets around an IPv6 host"),
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("has no host");
    }
    let port = match port {
        None => 443,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err("has an invalid port"),
        },
    };
    Ok(Endpoint::new(host, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::fixtures::{err, static_service, svc_ref};
    use crate::resolve::ResolveReason;

    #[test]
    fn static_urls_rotate_and_port_none_matches_any() {
        let r = StaticResolver::new(&[
            static_service(None, &["https://a.example:8443", "https://[fd00::1]/"]),
            static_service(Some(9443), &["https://10.0.0.1"]),
        ])
        .unwrap();
        let picks: Vec<_> = (0..3).map(|_| r.resolve(&svc_ref(443)).unwrap()).collect();
        assert_eq!(
            picks,
            [
                Endpoint::new("a.example", 8443),
                Endpoint::new("fd00::1", 443),
                Endpoint::new("a.example", 8443)
            ]
        );
        assert_eq!(
            r.resolve(&svc_ref(9443)).unwrap(),
            Endpoint::new("10.0.0.1", 443)
        );
        assert_eq!(r.check_endpoints(&svc_ref(1)), Ok(()));
        let other = ServiceRef {
            name: "nope".into(),
            ..svc_ref(443)
        };
        assert_eq!(err(r.resolve(&other)).0, ResolveReason::ServiceNotFound);
    }

    #[test]
    fn static_url_errors() {
        for (url, problem) in [
            ("http://a", "must be an https:// URL"),
            ("https://a/apis", "must not have a path, query or fragment"),
            ("https://u@a", "must not contain user information"),
            ("https://fd00::1:443", "needs brackets around an IPv6 host"),
            ("https://[fd00::1", "has an unclosed '[' in its host"),
            ("https://a:0", "has an invalid port"),
            ("https://a:x", "has an invalid port"),
            ("https://:443", "has no host"),
        ] {
            let e = StaticResolver::new(&[static_service(None, &[url])])
                .err()
                .unwrap_or_else(|| panic!("{url} accepted"));
            assert_eq!(e.problem, problem, "{url}");
        }
    }
}

//! The request's context, which the listener inserts as the one extension of ours it adds
//! ([`RequestContext`]): the connection the request came on ([`ConnInfo`]) and where the router
//! sent it ([`RoutedTo`]). They sit below the listener, the stack and the router, so none of
//! those imports from a layer above it. (kube's request attributes, another extension, are
//! `crate::request_info`'s; the caller's identity is `crate::auth::Authenticated`.)

use std::sync::{Arc, OnceLock};

use http::HeaderValue;

/// Where the router sent a request; set in the request's context for the access log, metrics,
/// audit and tracing, which read it once the response is back.
#[derive(Clone, Debug)]
pub enum RoutedTo {
    Gateway,
    Core,
    /// A remote APIService's route, carrying its label `apiservice/<name>`. The label is built
    /// once per route (see `control::apiservices::RouteTarget`), so tagging a response only clones an `Arc`.
    ApiService(Arc<str>),
    /// A local APIService's route (served by the core), labelled the same way.
    LocalApiService(Arc<str>),
}

impl RoutedTo {
    /// The tag of an APIService's route; `local` when the core serves it.
    pub fn api_service(name: &str, local: bool) -> Self {
        let label = format!("apiservice/{name}").into();
        if local {
            Self::LocalApiService(label)
        } else {
            Self::ApiService(label)
        }
    }

    /// kube's `component` label: what kube-aggregator proxies is recorded as the aggregator's,
    /// everything else as the apiserver's.
    pub fn component(&self) -> &'static str {
        match self {
            Self::ApiService(_) => crate::metrics::AGGREGATOR,
            Self::Gateway | Self::Core | Self::LocalApiService(_) => crate::metrics::APISERVER,
        }
    }

    /// The `routed` field of the access log and the metrics label.
    pub fn label(&self) -> &str {
        match self {
            Self::Gateway => "gateway",
            Self::Core => "core",
            Self::ApiService(label) | Self::LocalApiService(label) => label,
        }
    }
}

/// Connection facts the listener attaches to every request.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub remote: std::net::SocketAddr,
    /// The verified client certificate chain, when the client presented one, with what
    /// authentication last concluded from it (shared by the connection's requests). The listener
    /// puts `auth::x509::PeerCertificates` here and authentication takes it back by downcast:
    /// erased, so this floor of the crate names nothing of the authentication layer above it.
    pub peer_certs: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// `remote`'s address as a header value (what `X-Forwarded-For` carries for it), written
    /// once for the connection: its requests share it instead of each copying the text.
    client_address: HeaderValue,
}

impl ConnInfo {
    /// A connection from `remote`, before its TLS handshake.
    pub fn new(remote: std::net::SocketAddr) -> Self {
        let client_address = HeaderValue::from_str(&remote.ip().to_string())
            .expect("an IP address is a valid header value");
        Self {
            remote,
            peer_certs: None,
            client_address,
        }
    }

    /// The client's address as a header value; cloning it copies no text.
    pub fn client_address(&self) -> &HeaderValue {
        &self.client_address
    }
}

/// One request's context: the connection it came on, and slots the layers set once when they
/// learn something the layers around them report on the way out.
///
/// The listener inserts it once per request, shared (`Arc`): a layer keeps its clone on the way
/// in and reads on the way out what the layers inside it set. So the route needs no extension
/// map of the response's own (a map, its table and a box for every request), and the response
/// of a layer that answers before the router leaves the route unset, which reads as the
/// gateway's.
#[derive(Debug)]
pub struct RequestContext {
    pub conn: ConnInfo,
    route: OnceLock<RoutedTo>,
}

impl RequestContext {
    /// The context of a request that came on `conn`; nothing is learnt yet.
    pub fn new(conn: ConnInfo) -> Arc<Self> {
        Arc::new(Self {
            conn,
            route: OnceLock::new(),
        })
    }

    /// The context the listener put in a request's extensions; `None` for a request that did
    /// not come through it (unit tests, built requests).
    pub fn of(extensions: &http::Extensions) -> Option<&Arc<Self>> {
        extensions.get::<Arc<Self>>()
    }

    /// The connection a request came on, from its extensions.
    pub fn conn_of(extensions: &http::Extensions) -> Option<&ConnInfo> {
        Self::of(extensions).map(|context| &context.conn)
    }

    /// Records where the router sent the request. A request is routed once; should it ever be
    /// routed again, the first route stays, as it is the one that answered.
    pub fn set_route(&self, route: RoutedTo) {
        let _ = self.route.set(route);
    }

    /// Where the router sent the request; `None` when a layer answered before it.
    pub fn route(&self) -> Option<&RoutedTo> {
        self.route.get()
    }
}

/// What a watch holds while it starts: its priority-and-fairness seats, given back once
/// (kube's watch initialization signal, `apf_context.go`).
///
/// Flow control puts one in a watch's extensions. The seats go back when the core's answer
/// arrives (the watch is accepted and streams), or sooner, when the router hands the watch to a
/// remote APIService: the request is delegated and the aggregated server's own flow control
/// takes it from there (kube-aggregator's `RequestDelegated`). A watch to a backend that has not
/// answered yet, or whose caller has not sent its body, then holds nothing here.
#[derive(Clone)]
pub struct WatchInitialization(Arc<std::sync::Mutex<Option<Box<dyn Send>>>>);

impl WatchInitialization {
    /// A signal that, when given, drops `held`.
    pub fn holding(held: impl Send + 'static) -> Self {
        Self(Arc::new(std::sync::Mutex::new(Some(Box::new(held)))))
    }

    /// The watch has started, or was delegated: what it held is given back. Later calls do
    /// nothing.
    pub fn signal(&self) {
        let held = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(held);
    }

    /// Whether it still holds what it was given (for tests and the dumps).
    pub fn is_holding(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    }

    /// Gives back what the watch in `extensions` holds, if it is one that holds anything: the
    /// request is delegated to another server.
    pub fn delegated(extensions: &http::Extensions) {
        if let Some(signal) = extensions.get::<Self>() {
            signal.signal();
        }
    }
}

impl std::fmt::Debug for WatchInitialization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchInitialization")
            .field("holding", &self.is_holding())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_gives_back_what_it_holds_once() {
        let held = Arc::new(());
        let signal = WatchInitialization::holding(held.clone());
        let mut extensions = http::Extensions::new();
        extensions.insert(signal.clone());
        assert_eq!(Arc::strong_count(&held), 2);
        WatchInitialization::delegated(&extensions);
        assert_eq!(
            Arc::strong_count(&held),
            1,
            "delegating gives the seats back"
        );
        assert!(!signal.is_holding());
        signal.signal();
        // A request that holds nothing is left alone.
        WatchInitialization::delegated(&http::Extensions::new());
    }

    #[test]
    fn labels_name_the_route() {
        assert_eq!(RoutedTo::Gateway.label(), "gateway");
        assert_eq!(RoutedTo::Core.label(), "core");
        assert_eq!(
            RoutedTo::api_service("v1alpha1.wardle.example.com", false).label(),
            "apiservice/v1alpha1.wardle.example.com"
        );
    }

    #[test]
    fn the_client_address_is_the_peer_ip() {
        let v4 = ConnInfo::new("10.1.2.3:4567".parse().unwrap());
        assert_eq!(v4.client_address(), "10.1.2.3");
        let v6 = ConnInfo::new("[2001:db8::1]:443".parse().unwrap());
        assert_eq!(v6.client_address(), "2001:db8::1");
    }

    #[test]
    fn the_context_keeps_the_first_route() {
        let context = RequestContext::new(ConnInfo::new("10.1.2.3:4567".parse().unwrap()));
        assert!(context.route().is_none());
        context.set_route(RoutedTo::Core);
        context.set_route(RoutedTo::Gateway);
        assert_eq!(context.route().map(RoutedTo::label), Some("core"));
        let mut extensions = http::Extensions::new();
        extensions.insert(context.clone());
        assert_eq!(
            RequestContext::conn_of(&extensions).map(|c| c.remote),
            Some("10.1.2.3:4567".parse().unwrap())
        );
    }
}

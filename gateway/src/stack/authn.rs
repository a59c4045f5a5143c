//! Authentication: decides who the caller is and puts a `UserInfo` into the request before
//! anything is routed. A verified client certificate names the user (CN) and groups (O);
//! everyone else is `system:anonymous`. (Token review, request-header identity and
//! impersonation extend this same layer.)

use std::collections::BTreeMap;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use super::{BoxFuture, ConnInfo};
use crate::body::{BoxError, Request, Response};
use crate::identity::UserInfo;

/// User and groups from a DER certificate's subject, as kube-apiserver's x509 authenticator reads
/// them (CN → user, every O → a group).
pub fn user_from_certificate(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    if name.is_empty() {
        return None;
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(UserInfo::authenticated(
        name,
        String::new(),
        groups,
        BTreeMap::new(),
    ))
}

#[derive(Clone, Default)]
pub struct AuthnLayer;

impl<S> Layer<S> for AuthnLayer {
    type Service = Authn<S>;
    fn layer(&self, inner: S) -> Authn<S> {
        Authn { inner }
    }
}

#[derive(Clone)]
pub struct Authn<S> {
    inner: S,
}

impl<S> Service<Request> for Authn<S>
where
    S: Service<Request, Response = Response, Error = BoxError> + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let user = req
            .extensions()
            .get::<ConnInfo>()
            .and_then(|c| c.peer_certs.as_ref())
            .and_then(|chain| chain.first())
            .and_then(|leaf| user_from_certificate(leaf))
            .unwrap_or_else(UserInfo::anonymous);
        req.extensions_mut().insert(user);
        Box::pin(self.inner.call(req))
    }
}

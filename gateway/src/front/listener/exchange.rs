//! The service hyper calls for each request on one client connection: it opens an exchange on
//! the connection's state, hands the request to the gateway's stack, and ties the exchange's end
//! to the response body.
//!
//! A hyper service of its own rather than a `service_fn` through `TowerToHyperService`: that
//! adapter clones the whole closure (the stack included) for every request before the closure
//! clones the stack again, and wraps the answer in two more futures.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tower::Service;

use super::connection::{self, ConnState, ExchangeGuard, Paced};
use crate::body::{self, Request, Response};
use crate::extensions::ConnInfo;

/// One connection's requests, served by `stack`.
pub struct Exchanges<S> {
    stack: S,
    state: Arc<ConnState>,
    info: ConnInfo,
}

impl<S> Exchanges<S> {
    pub fn new(stack: S, state: Arc<ConnState>, info: ConnInfo) -> Self {
        Exchanges { stack, state, info }
    }
}

impl<S> hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Exchanges<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone,
{
    type Response = http::Response<Paced>;
    type Error = Infallible;
    type Future = Exchange<S::Future>;

    fn call(&self, req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let exchange = self.state.begin();
        // A request without a body (most GETs) gets the empty body, which boxes nothing.
        let mut req = req.map(|b| match http_body::Body::is_end_stream(&b) {
            true => body::empty(),
            false => body::boxed(b),
        });
        req.extensions_mut()
            .insert(crate::extensions::RequestContext::new(self.info.clone()));
        Exchange {
            response: self.stack.clone().call(req),
            exchange: Some(exchange),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request on its way through the stack; its response body ends the exchange.
    pub struct Exchange<F> {
        #[pin]
        response: F,
        // Moved into the response body once the response is here.
        exchange: Option<ExchangeGuard>,
    }
}

impl<F> Future for Exchange<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<http::Response<Paced>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(resp) = ready!(this.response.poll(cx));
        let exchange = this.exchange.take().expect("polled after it was ready");
        if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            exchange.state().upgraded();
        }
        // The body ends the exchange when it is finished or dropped (and is paced on
        // HTTP/1.1): one unboxed wrapper for both protocols.
        let state = exchange.state().clone();
        Poll::Ready(Ok(resp.map(|b| connection::paced(b, state, exchange))))
    }
}

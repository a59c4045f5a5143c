//! The request timeout (kube-apiserver's --request-timeout, 60 s): an ordinary request that has
//! no response headers by then gets 504. A client's own `?timeout=` shortens it, never extends
//! it. Long-running requests (watch, exec, attach, portforward, log, proxy) are exempt.

use std::task::{Context, Poll};
use std::time::Duration;

use tower::layer::layer_fn;
use tower::{Layer, Service};

use super::BoxFuture;
use crate::body::{BoxError, Request, Response};
use crate::error::GatewayError;
use crate::request_info::RequestInfo;

#[derive(Clone)]
pub struct TimeoutService<S> {
    inner: S,
    limit: Duration,
}

impl<S> TimeoutService<S> {
    pub fn layer(limit: Duration) -> impl Layer<S, Service = Self> + Clone {
        layer_fn(move |inner| Self { inner, limit })
    }
}

/// `?timeout=` as a Go duration, when present and valid.
fn client_timeout(query: &str) -> Option<Duration> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("timeout="))
        .and_then(|v| v.parse::<gateway_config::GoDuration>().ok())
        .map(|d| d.0)
        .filter(|d| !d.is_zero())
}

impl<S> Service<Request> for TimeoutService<S>
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

    fn call(&mut self, req: Request) -> Self::Future {
        if req
            .extensions()
            .get::<RequestInfo>()
            .is_some_and(|i| i.long_running)
        {
            return Box::pin(self.inner.call(req));
        }
        let limit = client_timeout(req.uri().query().unwrap_or(""))
            .map_or(self.limit, |d| d.min(self.limit));
        let fut = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout(limit, fut).await {
                Ok(result) => result,
                Err(_) => Err(GatewayError::Timeout(limit).into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_timeout_is_parsed() {
        assert_eq!(client_timeout("timeout=32s"), Some(Duration::from_secs(32)));
        assert_eq!(
            client_timeout("limit=500&timeout=1m"),
            Some(Duration::from_secs(60))
        );
        assert_eq!(client_timeout("timeoutSeconds=5"), None);
        assert_eq!(client_timeout("timeout=bogus"), None);
    }
}

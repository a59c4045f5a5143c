//! Step 4, the stack: the tower layers every request crosses, outermost first (see
//! `crate::front::stack` for why each sits where it does), around the router. Built here with
//! what the layers need: the audit sink, the authorizer, the request tracer.

use std::convert::Infallible;
use std::sync::Arc;

use gateway_config::{AuditConfig, AuditLevel, AuthzConfig, Limits, TracingConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tower::{Service, ServiceBuilder};

use super::StartError;
use crate::auth::Authenticator;
use crate::backend::kube_client;
use crate::body::{Request, Response};
use crate::front::stack::{
    access_log::AccessLog,
    audit::{Audit, AuditCapture, AuditSink},
    authn::Authn,
    authz::{Authorizer, Authz},
    limits::LimitsService,
    priority_and_fairness::PriorityAndFairness,
    request_info::RequestInfoService,
    rescue::Rescue,
    timeout::TimeoutService,
    trace::{RequestTracer, Trace},
};
use crate::handlers::router::{Gateway, Router};
use crate::metrics::Metrics;

/// The stack around the router, ready for the listener.
pub fn build(
    (audit, authz, limits): (&AuditConfig, &AuthzConfig, &Limits),
    authenticator: Arc<Authenticator>,
    gateway: Arc<Gateway>,
    tracer_provider: Option<&SdkTracerProvider>,
) -> Result<
    impl Service<Request, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + 'static,
    StartError,
> {
    let metrics = gateway.metrics.clone();
    let audit = audit_sink(audit, &metrics)?;
    // The debug dumps of API Priority and Fairness are authorized whatever the two flags say:
    // they name the users, verbs and paths in flight, and kube-apiserver authorizes them like
    // every path (there is no flag there that makes them public). The flags turn off what the
    // gateway would review *on top of* the core (remote APIServices, `/metrics`); a kube user
    // turning them off does not expect who-asks-for-what to be served to `system:anonymous`.
    // So the dumps always cost a SubjectAccessReview on the core, as they would in kube.
    let dumps = gateway.flow_control.is_some();
    let authorizer = (authz.webhook || authz.authorize_metrics || dumps).then(|| {
        Arc::new(Authorizer::new(
            kube_client::client(gateway.core.clone()),
            gateway.routing.clone(),
            authz,
            dumps,
        ))
    });
    Ok(ServiceBuilder::new()
        .layer(AccessLog::layer(metrics.clone(), gateway.discovery.clone()))
        .layer(Audit::layer(audit))
        .layer(Trace::layer(
            tracer_provider.map(|p| Arc::new(RequestTracer::new(p))),
        ))
        .layer(Rescue::layer())
        .layer(RequestInfoService::layer(Some(gateway.routing.clone())))
        .layer(Authn::layer(authenticator))
        .layer(AuditCapture::layer())
        .layer(LimitsService::layer(
            limits,
            Some(gateway.routing.clone()),
            metrics,
        ))
        .layer(TimeoutService::layer(limits.request_timeout))
        .option_layer(
            gateway
                .flow_control
                .clone()
                .map(|fc| PriorityAndFairness::layer(fc, limits.request_timeout, &gateway.metrics)),
        )
        .layer(Authz::layer(authorizer))
        .service(Router::new(gateway)))
}

/// The audit log's writer, unless auditing is off.
fn audit_sink(
    audit: &AuditConfig,
    metrics: &Metrics,
) -> Result<Option<Arc<AuditSink>>, StartError> {
    match &audit.path {
        Some(path) if audit.level != AuditLevel::None => Ok(Some(
            AuditSink::start(
                path,
                metrics.audit_event_total.clone(),
                metrics.audit_error_total.clone(),
            )
            .map_err(|source| StartError::Audit {
                path: path.clone(),
                source,
            })?,
        )),
        _ => Ok(None),
    }
}

/// The OpenTelemetry provider of `--tracing-config-file`; flushed at shutdown.
pub fn tracer_provider(
    tracing: Option<&TracingConfig>,
) -> Result<Option<SdkTracerProvider>, StartError> {
    let Some(tracing) = tracing else {
        return Ok(None);
    };
    let provider = crate::otel::provider(tracing)?;
    tracing::info!(
        file = %tracing.file.display(),
        endpoint = %tracing.endpoint,
        sampling_rate_per_million = tracing.sampling_rate_per_million,
        "tracing requests: OTLP/gRPC export"
    );
    Ok(Some(provider))
}

//! Several resolvers as one, in order: how fixed URLs from the config file override the cluster.

use std::sync::Arc;

use super::{Changes, Endpoint, Endpoints, ResolveError, ResolveReason, ServiceResolver};
use crate::model::ServiceRef;

/// Asks each resolver in turn; the first that knows the Service answers. A resolver "does not
/// know" a Service when it says `ServiceNotFound`; any other error is final (the Service exists
/// there but is broken, and a later resolver must not paper over it). Typically
/// `[static, kube]`: fixed URLs from the config override the cluster.
pub struct ChainResolver(pub Vec<Arc<dyn ServiceResolver>>);

impl ChainResolver {
    fn first<T>(
        &self,
        svc: &ServiceRef,
        f: impl Fn(&dyn ServiceResolver) -> Result<T, ResolveError>,
    ) -> Result<T, ResolveError> {
        let mut last = None;
        for r in &self.0 {
            match f(r.as_ref()) {
                Err(e) if e.reason == ResolveReason::ServiceNotFound => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| ResolveError::not_present(svc)))
    }
}

impl ServiceResolver for ChainResolver {
    fn resolve(&self, svc: &ServiceRef) -> Result<Endpoint, ResolveError> {
        self.first(svc, |r| r.resolve(svc))
    }

    fn endpoints(&self, svc: &ServiceRef) -> Result<Endpoints, ResolveError> {
        self.first(svc, |r| r.endpoints(svc))
    }

    fn check_endpoints(&self, svc: &ServiceRef) -> Result<(), ResolveError> {
        self.first(svc, |r| r.check_endpoints(svc))
    }

    fn synced(&self) -> bool {
        self.0.iter().all(|r| r.synced())
    }

    fn changes(&self) -> Changes {
        self.0
            .iter()
            .fold(Changes::none(), |all, r| all.merge(r.changes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::fixtures::{
        cluster_ip, err, https_port, resolver, service, static_service, svc_ref,
    };
    use crate::resolve::StaticResolver;
    use serde_json::json;

    #[test]
    fn chain_falls_through_only_on_not_found() {
        let statics: Arc<dyn ServiceResolver> = Arc::new(
            StaticResolver::new(&[static_service(Some(443), &["https://static"])]).unwrap(),
        );
        let kube: Arc<dyn ServiceResolver> = Arc::new(resolver(
            vec![
                cluster_ip("10.0.0.1", https_port()),
                service("other", json!({"clusterIP": "None", "ports": https_port()})),
            ],
            vec![],
            false,
        ));
        let chain = ChainResolver(vec![statics, kube]);
        assert!(ServiceResolver::synced(&chain));
        assert_eq!(chain.resolve(&svc_ref(443)).unwrap().host, "static");
        // Port 8443 is not in the static map: the cluster answers, with its error.
        assert_eq!(
            err(chain.resolve(&svc_ref(8443))).0,
            ResolveReason::ServicePortError
        );
        let other = ServiceRef {
            name: "other".into(),
            ..svc_ref(443)
        };
        assert_eq!(err(chain.resolve(&other)).0, ResolveReason::Unroutable);
        let gone = ServiceRef {
            name: "gone".into(),
            ..svc_ref(443)
        };
        assert_eq!(
            err(chain.resolve(&gone)).1,
            r#"service/gone in "wardle" is not present"#
        );
        assert_eq!(
            err(ChainResolver(vec![]).resolve(&gone)).0,
            ResolveReason::ServiceNotFound
        );
    }
}

//! The configuration objects (`flowcontrol.apiserver.k8s.io/v1` FlowSchema and
//! PriorityLevelConfiguration) read into the forms the gateway decides on, with kube's defaults
//! applied and kube's validation checked.
//!
//! kube-apiserver validates these objects when they are written, and its configuration
//! controller (`apf_controller.go`) ignores the few broken states validation cannot exclude (a
//! priority level whose union is broken, a FlowSchema naming a level that does not exist). A core
//! that is not kube-apiserver validates nothing, so the gateway checks what kube's validation
//! (`pkg/apis/flowcontrol/validation`) would have refused as well: an object it would not have
//! stored is ignored, with the reason, as kube ignores a broken one. The mandatory objects must
//! keep their fixed specs (only `exempt`'s `spec.exempt` may change); one that does not is
//! ignored and the built-in one stands in.
//!
//! `level.rs` reads PriorityLevelConfigurations, `schema.rs` FlowSchemas.

mod level;
mod schema;

pub use level::{LevelSpec, LimitResponse, Queuing, MAX_QUEUES};
pub use schema::{
    Distinguisher, Name, NonResourceRule, NonResourceUrl, ResourceRule, ResourceSet, Rule,
    SchemaSpec, Set, SubjectSpec, MAX_MATCHING_PRECEDENCE,
};

/// Why an object is ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

fn invalid<T>(msg: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid(msg.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap;

    #[test]
    fn the_built_in_objects_are_valid() {
        for pl in bootstrap::mandatory_priority_levels()
            .iter()
            .chain(&bootstrap::suggested_priority_levels())
        {
            LevelSpec::from_api(pl).unwrap();
        }
        for fs in bootstrap::mandatory_flow_schemas()
            .iter()
            .chain(&bootstrap::suggested_flow_schemas())
        {
            SchemaSpec::from_api(fs).unwrap();
        }
    }
}

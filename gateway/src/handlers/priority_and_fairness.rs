//! kube's debug dumps of API Priority and Fairness (`apf_controller_debug.go`'s `Install`):
//! `/debug/api_priority_and_fairness/dump_priority_levels`, `dump_queues` and `dump_requests`
//! (`?includeRequestDetails=1` adds who asked for what), served from this gateway's own levels
//! and queues. The paths are non-resource URLs authorized like any other (`authz` reviews them);
//! kube's role for them is cluster-admin's or one naming
//! `/debug/api_priority_and_fairness/*`.

use gateway_flowcontrol::FlowControl;
use http::{header, HeaderValue};

use crate::body::{full, Response};
use crate::request_info::query_value;

/// Where the dumps live.
pub const PREFIX: &str = "/debug/api_priority_and_fairness/";

/// Whether `path` is one of the dumps.
pub fn is_dump(path: &str) -> bool {
    matches!(
        path.strip_prefix(PREFIX),
        Some("dump_priority_levels" | "dump_queues" | "dump_requests")
    )
}

/// The dump at `path`, or `None` for any other path (the router asks for `GET` and `HEAD`).
pub fn respond(flow_control: &FlowControl, path: &str, query: &str) -> Option<Response> {
    let text = match path.strip_prefix(PREFIX)? {
        "dump_priority_levels" => flow_control.dump_priority_levels(),
        "dump_queues" => flow_control.dump_queues(),
        "dump_requests" => {
            // kube: any non-empty value asks for the details.
            let details =
                query_value(query, "includeRequestDetails").is_some_and(|v| !v.is_empty());
            flow_control.dump_requests(details)
        }
        _ => return None,
    };
    let mut resp = Response::new(full(text));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Some(resp)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::BodyExt;

    use super::*;

    async fn text(resp: Response) -> String {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn the_three_dumps_answer_and_nothing_else_does() {
        let fc = FlowControl::new(100, Duration::from_secs(15), &prometheus::Registry::new());
        crate::control::flowcontrol::source::use_built_in(&fc);
        let levels =
            text(respond(&fc, &format!("{PREFIX}dump_priority_levels"), "").unwrap()).await;
        assert!(levels.starts_with("PriorityLevelName,"), "{levels}");
        assert!(levels.contains("\nworkload-low,"), "{levels}");
        let queues = text(respond(&fc, &format!("{PREFIX}dump_queues"), "").unwrap()).await;
        assert!(queues.starts_with("PriorityLevelName,"), "{queues}");
        let plain = text(respond(&fc, &format!("{PREFIX}dump_requests"), "").unwrap()).await;
        assert!(!plain.contains("UserName"), "{plain}");
        let detailed = text(
            respond(
                &fc,
                &format!("{PREFIX}dump_requests"),
                "includeRequestDetails=1",
            )
            .unwrap(),
        )
        .await;
        assert!(detailed.contains("UserName"), "{detailed}");
        for other in [
            PREFIX,
            "/debug/api_priority_and_fairness/dump_other",
            "/debug/pprof/",
        ] {
            assert!(respond(&fc, other, "").is_none(), "{other}");
            assert!(!is_dump(other), "{other}");
        }
    }
}

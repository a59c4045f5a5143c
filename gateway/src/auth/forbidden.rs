//! kube-apiserver's Forbidden answer, written once for the authorization layer and for refused
//! impersonation (kube's impersonation filter answers through the same
//! `responsewriters.Forbidden`).

use super::sar::Action;
use crate::status::StatusDetails;

/// Go's `%q` for the strings that appear in these messages.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// kube-apiserver's Forbidden answer (`responsewriters.Forbidden` + `apierrors.NewForbidden`):
/// the message and the Status details.
pub fn forbidden(user: &str, action: &Action<'_>, reason: &str) -> (String, StatusDetails) {
    let (what, group, resource, name) = match *action {
        Action::NonResource { path, verb } => (
            format!(
                "User {} cannot {verb} path {}",
                go_quote(user),
                go_quote(path)
            ),
            "",
            "",
            "",
        ),
        Action::Resource {
            verb,
            group,
            resource,
            subresource,
            namespace,
            name,
            ..
        } => {
            let full = if subresource.is_empty() {
                resource.to_owned()
            } else {
                format!("{resource}/{subresource}")
            };
            let scope = if namespace.is_empty() {
                "at the cluster scope".to_owned()
            } else {
                format!("in the namespace {}", go_quote(namespace))
            };
            (
                format!(
                    "User {} cannot {verb} resource {} in API group {} {scope}",
                    go_quote(user),
                    go_quote(&full),
                    go_quote(group)
                ),
                group,
                resource,
                name,
            )
        }
    };
    // kube's sanitizer: nothing in an error may look like HTML.
    let mut err = what
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    if !reason.is_empty() {
        err.push_str(": ");
        err.push_str(reason);
    }
    let qualified = if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    };
    let message = if qualified.is_empty() && group.is_empty() {
        format!("forbidden: {err}")
    } else if name.is_empty() {
        format!("{qualified} is forbidden: {err}")
    } else {
        format!("{qualified} {} is forbidden: {err}", go_quote(name))
    };
    let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let details = StatusDetails {
        name: some(name),
        group: some(group),
        kind: some(resource),
        ..Default::default()
    };
    (message, details)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource<'a>(verb: &'a str, ns: &'a str, name: &'a str, sub: &'a str) -> Action<'a> {
        Action::Resource {
            verb,
            group: "wardle.example.com",
            version: "v1alpha1",
            resource: "flunders",
            subresource: sub,
            namespace: ns,
            name,
        }
    }

    #[test]
    fn namespaced_list_reads_like_kube() {
        let (message, details) = forbidden("alice", &resource("list", "default", "", ""), "");
        assert_eq!(
            message,
            "flunders.wardle.example.com is forbidden: User \"alice\" cannot list resource \"flunders\" in API group \"wardle.example.com\" in the namespace \"default\""
        );
        assert_eq!(details.group.as_deref(), Some("wardle.example.com"));
        assert_eq!(details.kind.as_deref(), Some("flunders"));
        assert_eq!(details.name, None);
    }

    #[test]
    fn named_subresource_cluster_scope_and_reason() {
        let (message, details) =
            forbidden("bob", &resource("update", "", "f1", "status"), "no rule");
        assert_eq!(
            message,
            "flunders.wardle.example.com \"f1\" is forbidden: User \"bob\" cannot update resource \"flunders/status\" in API group \"wardle.example.com\" at the cluster scope: no rule"
        );
        assert_eq!(details.name.as_deref(), Some("f1"));
    }

    #[test]
    fn core_group_and_non_resource() {
        let pods = Action::Resource {
            verb: "get",
            group: "",
            version: "v1",
            resource: "pods",
            subresource: "",
            namespace: "kube-system",
            name: "p",
        };
        assert_eq!(
            forbidden("u", &pods, "").0,
            "pods \"p\" is forbidden: User \"u\" cannot get resource \"pods\" in API group \"\" in the namespace \"kube-system\""
        );
        let metrics = Action::NonResource {
            path: "/metrics",
            verb: "get",
        };
        let (message, details) = forbidden("system:anonymous", &metrics, "");
        assert_eq!(
            message,
            "forbidden: User \"system:anonymous\" cannot get path \"/metrics\""
        );
        assert!(details.kind.is_none() && details.group.is_none());
    }

    #[test]
    fn html_and_quotes_are_escaped() {
        let path = Action::NonResource {
            path: "/x<script>\"",
            verb: "get",
        };
        assert_eq!(
            forbidden("a&b", &path, "").0,
            "forbidden: User \"a&amp;b\" cannot get path \"/x&lt;script&gt;\\\"\""
        );
    }
}

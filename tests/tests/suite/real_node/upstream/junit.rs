//! Ginkgo's JUnit report, read back into specs with their status and seconds.

use std::collections::BTreeMap;

use super::Spec;

/// The specs of a Ginkgo JUnit report that ran (skipped ones and suite nodes left out):
/// `<testcase name="[It] <spec> [<labels>]" status="passed" time="12.3">`, by spec text.
pub fn parse_junit(xml: &str) -> BTreeMap<String, Spec> {
    let mut specs = BTreeMap::new();
    for case in xml.split("<testcase ").skip(1) {
        let head = case.split('>').next().unwrap_or_default();
        let attr = |name: &str| -> Option<String> {
            let start = head
                .find(&format!(" {name}=\""))
                .map(|i| i + name.len() + 3)
                .or_else(|| {
                    head.starts_with(&format!("{name}=\""))
                        .then_some(name.len() + 2)
                })?;
            let end = head[start..].find('"')? + start;
            Some(unescape(&head[start..end]))
        };
        let (Some(name), Some(status)) = (attr("name"), attr("status")) else {
            continue;
        };
        // Specs are `[It] <text> [<labels>]`; suite nodes (`[SynchronizedBeforeSuite]`) are not.
        let Some(name) = name.strip_prefix("[It] ") else {
            continue;
        };
        if status == "skipped" {
            continue;
        }
        let name = match name.rfind(" [sig-") {
            Some(labels) if name.ends_with(']') => &name[..labels],
            _ => name,
        }
        .to_owned();
        let seconds = attr("time").and_then(|t| t.parse().ok()).unwrap_or(0.0);
        specs.insert(name, Spec { status, seconds });
    }
    specs
}

fn unescape(text: &str) -> String {
    text.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

#[test]
fn junit_specs_are_read_with_status_and_time() {
    let xml = r#"<testsuites><testsuite name="Kubernetes e2e suite">
<testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.2"></testcase>
<testcase name="[It] [sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server using the current Aggregator [Conformance] [sig-api-machinery, Conformance]" classname="Kubernetes e2e suite" status="passed" time="12.5"></testcase>
<testcase name="[It] [sig-api-machinery] CustomResourcePublishOpenAPI [Privileged:ClusterAdmin] works for CRD with validation schema &quot;x&quot; [sig-api-machinery]" classname="Kubernetes e2e suite" status="failed" time="60.1"><failure message="x">y</failure></testcase>
<testcase name="[It] [sig-api-machinery] Discovery flaky [Flaky] [sig-api-machinery, Flaky]" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
</testsuite></testsuites>"#;
    let specs = parse_junit(xml);
    assert_eq!(specs.len(), 2, "{specs:?}");
    let failed = &specs["[sig-api-machinery] CustomResourcePublishOpenAPI [Privileged:ClusterAdmin] works for CRD with validation schema \"x\""];
    assert_eq!((failed.status.as_str(), failed.seconds), ("failed", 60.1));
}

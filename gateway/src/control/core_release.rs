//! The core's Kubernetes release, read from its `/version`, and the behaviours the gateway
//! follows for it: which aggregated discovery versions `/api` and `/apis` answer in, and whose
//! built-in flow-control objects stand in for a core that serves none.
//!
//! Read once the core has started and again every minute, so a core upgraded behind the gateway
//! is followed; one log line says what was read and what follows from it, and only when that
//! changes. A core newer than the newest release this gateway was tested with is followed as
//! that release, with a warning, never refused: kube keeps its API compatible within a major
//! version.

use std::sync::Arc;
use std::time::Duration;

use apiservice::discovery::ServedVersions;
use gateway_flowcontrol::{bootstrap, FlowControl};
use http::header;
use serde::Deserialize;

use crate::backend::core::CoreBackend;
use crate::control::core_readiness::CoreStarted;
use crate::control::discovery::fetch::{aggregated_version, FetchError, Source};
use crate::control::discovery::DiscoveryCache;
use crate::control::flowcontrol;

/// The newest minor release of Kubernetes 1 the project's suites run against.
pub const NEWEST_TESTED_MINOR: u32 = 36;
/// How often `/version` is read again.
const REREAD_INTERVAL: Duration = Duration::from_secs(60);
/// Limit for one `/version` or `/apis` answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// What kubectl 1.29 sends: v2beta1, else the legacy document.
const ACCEPT_V2BETA1: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// A Kubernetes release, as `/version` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// `gitVersion`, e.g. `v1.36.3` or `v1.33.5+k3s1`.
    pub git_version: String,
    /// The minor release of Kubernetes 1 (`36`).
    pub minor: u32,
}

impl Release {
    /// Reads `/version`'s document. `None` when it names no Kubernetes 1 release: another major
    /// version, or a Kubernetes-style server that reports something else.
    pub fn from_version_document(body: &[u8]) -> Option<Release> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Info {
            #[serde(default)]
            major: String,
            #[serde(default)]
            minor: String,
            #[serde(default)]
            git_version: String,
        }
        let info: Info = serde_json::from_slice(body).ok()?;
        // `gitVersion` first: `minor` carries a `+` on some providers' builds (`"27+"`).
        let from_git = info
            .git_version
            .strip_prefix('v')
            .and_then(|v| v.strip_prefix("1."))
            .and_then(leading_number);
        let from_fields =
            (info.major.trim_end_matches('+') == "1").then(|| leading_number(&info.minor));
        let minor = from_git.or(from_fields.flatten())?;
        let git_version = if info.git_version.is_empty() {
            format!("v1.{minor}")
        } else {
            info.git_version
        };
        Some(Release { git_version, minor })
    }

    /// The release whose behaviours the gateway follows for this core.
    pub fn followed_minor(&self) -> u32 {
        self.minor.min(NEWEST_TESTED_MINOR)
    }
}

fn leading_number(s: &str) -> Option<u32> {
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..digits].parse().ok()
}

/// What the gateway follows for the core it is in front of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Followed {
    /// `None`: `/version` named no Kubernetes release.
    pub release: Option<Release>,
    pub discovery: ServedVersions,
    pub flow_control: bootstrap::Release,
}

impl Followed {
    /// From the release and whether the core answered a v2beta1 request in v2beta1. kube stopped
    /// serving v2beta1 by default in 1.33 (`AggregatedDiscoveryRemoveBetaType`) and could not be
    /// told otherwise from 1.35; a core of 1.33 or 1.34 may still have the gate turned off, so
    /// the answer decides. Older cores and servers that are not kube keep both versions, as the
    /// gateway composes the aggregated documents itself.
    pub fn decide(release: Option<Release>, core_serves_v2beta1: bool) -> Followed {
        let minor = release.as_ref().map(Release::followed_minor);
        let discovery = match minor {
            Some(m) if m >= 33 && !core_serves_v2beta1 => ServedVersions::V2Only,
            _ => ServedVersions::V2AndV2Beta1,
        };
        let flow_control = minor.map_or(bootstrap::Release::Current, bootstrap::Release::of_minor);
        Followed {
            release,
            discovery,
            flow_control,
        }
    }

    /// The behaviours, in words, for the log line.
    fn describe(&self) -> String {
        let discovery = match self.discovery {
            ServedVersions::V2Only => "aggregated discovery in apidiscovery.k8s.io/v2 only",
            ServedVersions::V2AndV2Beta1 => {
                "aggregated discovery in apidiscovery.k8s.io/v2 and v2beta1"
            }
        };
        let flow_control = match self.flow_control {
            bootstrap::Release::Current => "built-in flow control of 1.34 and newer",
            bootstrap::Release::Before1_34 => "built-in flow control of 1.33 and older",
        };
        format!("{discovery}; {flow_control} where the core serves no FlowSchemas")
    }
}

/// Where the followed behaviours are put in force.
#[derive(Clone)]
pub struct Followers {
    pub discovery: Arc<DiscoveryCache>,
    pub flow_control: Option<Arc<FlowControl>>,
}

impl Followers {
    fn apply(&self, followed: &Followed) {
        self.discovery.serve_versions(followed.discovery);
        if let Some(fc) = &self.flow_control {
            flowcontrol::source::follow_release(fc, followed.flow_control);
        }
    }
}

/// Reads the core's release once it has started and every minute after, and puts what follows
/// from it in force.
pub async fn run(core: Arc<CoreBackend>, started: CoreStarted, followers: Followers) {
    started.wait().await;
    let source = Source::Core(core);
    let mut current: Option<Followed> = None;
    let mut unreadable_logged = false;
    let mut tick = tokio::time::interval(REREAD_INTERVAL);
    loop {
        tick.tick().await;
        let release = match read_release(&source).await {
            Ok(release) => release,
            Err(e) => {
                if !unreadable_logged {
                    tracing::warn!(error = %e, "cannot read the core server's release from /version; keeping what the gateway follows");
                    unreadable_logged = true;
                }
                continue;
            }
        };
        unreadable_logged = false;
        let serves_v2beta1 = match serves_v2beta1(&source).await {
            Some(answer) => answer,
            // No answer: keep what was decided, or assume kube's default for the release.
            None => current
                .as_ref()
                .is_some_and(|f| f.discovery == ServedVersions::V2AndV2Beta1),
        };
        let followed = Followed::decide(release, serves_v2beta1);
        if current.as_ref() != Some(&followed) {
            log(&followed);
            followers.apply(&followed);
            current = Some(followed);
        }
    }
}

fn log(followed: &Followed) {
    let behaviours = followed.describe();
    match &followed.release {
        Some(r) if r.minor > NEWEST_TESTED_MINOR => tracing::warn!(
            release = %r.git_version,
            "the core server is Kubernetes {}, newer than the newest release this gateway was \
             tested with (1.{NEWEST_TESTED_MINOR}): following 1.{NEWEST_TESTED_MINOR}: {behaviours}",
            r.git_version
        ),
        Some(r) => tracing::info!(
            release = %r.git_version,
            "the core server is Kubernetes {}: following 1.{}: {behaviours}",
            r.git_version,
            r.minor
        ),
        None => tracing::info!(
            "the core server's /version names no Kubernetes release: following \
             1.{NEWEST_TESTED_MINOR}: {behaviours}"
        ),
    }
}

/// The core's release; `Ok(None)` when `/version` is not there or names none.
async fn read_release(source: &Source) -> Result<Option<Release>, FetchError> {
    let fetched = source
        .get("/version", "application/json", None, FETCH_TIMEOUT)
        .await?;
    if !fetched.status.is_success() {
        return Ok(None);
    }
    Ok(Release::from_version_document(&fetched.body))
}

/// Whether the core answers a request for v2beta1 in v2beta1; `None` when it did not answer.
async fn serves_v2beta1(source: &Source) -> Option<bool> {
    let fetched = source
        .get("/apis", ACCEPT_V2BETA1, None, FETCH_TIMEOUT)
        .await
        .ok()?;
    let version = aggregated_version(fetched.headers.get(header::CONTENT_TYPE));
    Some(fetched.status.is_success() && version == Some("v2beta1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(doc: &str) -> Option<Release> {
        Release::from_version_document(doc.as_bytes())
    }

    #[test]
    fn releases_are_read_as_providers_report_them() {
        let kube = r#"{"major":"1","minor":"36","gitVersion":"v1.36.3"}"#;
        assert_eq!(release(kube).unwrap().minor, 36);
        let k3s = r#"{"major":"1","minor":"33","gitVersion":"v1.33.5+k3s1"}"#;
        assert_eq!(release(k3s).unwrap().git_version, "v1.33.5+k3s1");
        let gke = r#"{"major":"1","minor":"27+","gitVersion":""}"#;
        assert_eq!(release(gke).unwrap().minor, 27);
        assert_eq!(release(r#"{"major":"2","minor":"0"}"#), None);
        assert_eq!(release("not json"), None);
        assert_eq!(
            release(r#"{"gitVersion":"v1.37.0-alpha.1"}"#)
                .unwrap()
                .minor,
            37
        );
    }

    #[test]
    fn v2beta1_follows_the_core_from_1_33() {
        let r = |minor| {
            Some(Release {
                git_version: format!("v1.{minor}.0"),
                minor,
            })
        };
        assert_eq!(
            Followed::decide(r(36), false).discovery,
            ServedVersions::V2Only
        );
        assert_eq!(
            Followed::decide(r(33), true).discovery,
            ServedVersions::V2AndV2Beta1
        );
        assert_eq!(
            Followed::decide(r(32), false).discovery,
            ServedVersions::V2AndV2Beta1
        );
        assert_eq!(
            Followed::decide(None, false).discovery,
            ServedVersions::V2AndV2Beta1
        );
        assert_eq!(
            Followed::decide(r(40), false).discovery,
            ServedVersions::V2Only
        );
    }

    #[test]
    fn the_built_in_flow_schemas_follow_the_release() {
        let r = |minor| {
            Some(Release {
                git_version: String::new(),
                minor,
            })
        };
        assert_eq!(
            Followed::decide(r(33), false).flow_control,
            bootstrap::Release::Before1_34
        );
        assert_eq!(
            Followed::decide(r(34), false).flow_control,
            bootstrap::Release::Current
        );
        assert_eq!(
            Followed::decide(None, false).flow_control,
            bootstrap::Release::Current
        );
    }
}

//! The images Kubernetes' conformance specs run, built from local binaries under the exact names
//! the given `e2e.test` asks for (nothing can be pulled here).
//!
//! Each release's `test/utils/image/manifest.go` pins its own tags (v1.33 asks for agnhost 2.53,
//! v1.36 for 2.63.0, busybox 1.37.0-1, nginx 1.27-0, pause 3.10.2, ...), so the names are read
//! from the binary itself (`e2e.test --list-images`) rather than written here. One image is built
//! per kind, under the first name that asks for it, and tagged with every other name of that kind
//! (`ctr images tag`):
//!
//! - `agnhost`: the release's agnhost (`build-e2e-test` builds it beside `e2e.test`) at
//!   `/agnhost` (ENTRYPOINT, CMD `pause`, as upstream's image), `agnhost-2`, `/uploads`, and
//!   busybox applets for the specs that `exec` a shell in it;
//! - `busybox`: Debian's busybox-static with every applet in `/bin`, CMD `sh`;
//! - `nginx`, `httpd`: busybox `httpd -f -p 80` serving the page the real server serves from the
//!   real document root (the specs check that the Pod runs and answers, not the server's name);
//! - `pause`: the static `pause` of the node's binaries;
//! - `sample-apiserver`, `etcd`: the binaries the suite already runs (the Aggregator spec);
//! - `kitten`, `nautilus`: agnhost's `test-webserver` with the `data.json` the Update Demo spec
//!   reads, as upstream's images are built on agnhost.
//!
//! Every other listed image (DNS utilities, volume servers, ...) belongs to specs outside the
//! focus and is not built; [`ConformanceImages::missing`] names them.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::image::{Extra, ImageSpec};

/// Where Debian's busybox-static puts the static busybox.
pub const BUSYBOX: &str = "/bin/busybox";

/// The kinds of image this module can build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Agnhost,
    Busybox,
    Nginx,
    Httpd,
    Pause,
    SampleApiserver,
    Etcd,
    /// The Update Demo's two images (`kubectl rolling-update` from one to the other).
    Kitten,
    Nautilus,
}

impl Kind {
    /// The kind of `reference` (`registry.k8s.io/e2e-test-images/agnhost:2.63.0`), by the last
    /// path segment of its repository. Only `registry.k8s.io` images: the listed
    /// `gcr.io/k8s-authenticated-test/agnhost` and `invalid.registry.k8s.io/...` are there for
    /// specs that expect their pull to fail.
    pub fn of(reference: &str) -> Option<Kind> {
        let repository = reference.rsplit_once(':').map_or(reference, |(r, _)| r);
        repository.strip_prefix("registry.k8s.io/")?;
        match repository.rsplit('/').next()? {
            "agnhost" => Some(Kind::Agnhost),
            "busybox" => Some(Kind::Busybox),
            "nginx" => Some(Kind::Nginx),
            "httpd" => Some(Kind::Httpd),
            "pause" => Some(Kind::Pause),
            "sample-apiserver" => Some(Kind::SampleApiserver),
            "etcd" => Some(Kind::Etcd),
            "kitten" => Some(Kind::Kitten),
            "nautilus" => Some(Kind::Nautilus),
            _ => None,
        }
    }
}

/// The host files the images are built from.
#[derive(Clone, Debug)]
pub struct Sources {
    pub agnhost: PathBuf,
    pub busybox: PathBuf,
    pub pause: PathBuf,
    pub sample_apiserver: PathBuf,
    pub etcd: PathBuf,
}

/// What `e2e.test --list-images` asked for, grouped into what to build and what to tag.
#[derive(Debug)]
pub struct ConformanceImages {
    /// One spec per kind (its reference the first listed name of the kind) and the other names
    /// of that kind, to be tagged from it.
    pub builds: Vec<(ImageSpec, Vec<String>)>,
    /// Listed images this module does not build.
    pub missing: Vec<String>,
}

/// The image names `e2e` asks for, one per line of `e2e.test --list-images`.
pub fn listed_images(e2e: &Path) -> Result<Vec<String>, String> {
    let out = Command::new(e2e)
        .arg("--list-images")
        .output()
        .map_err(|e| format!("{}: {e}", e2e.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} --list-images: {}",
            e2e.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| l.contains(':') && !l.contains(' '))
        .map(str::to_owned)
        .collect())
}

impl ConformanceImages {
    /// The name built for `kind`, if `e2e.test` asked for one.
    pub fn built(&self, kind: Kind) -> Option<&str> {
        self.builds
            .iter()
            .map(|(spec, _)| spec.reference.as_str())
            .find(|r| Kind::of(r) == Some(kind))
    }

    /// The plan for `listed` (see [`listed_images`]) built from `sources`.
    pub fn plan(listed: &[String], sources: &Sources) -> Result<ConformanceImages, String> {
        let mut builds: Vec<(Kind, ImageSpec, Vec<String>)> = Vec::new();
        let mut missing = Vec::new();
        for name in listed {
            let Some(kind) = Kind::of(name) else {
                missing.push(name.clone());
                continue;
            };
            match builds.iter_mut().find(|(k, _, _)| *k == kind) {
                Some((_, _, tags)) => tags.push(name.clone()),
                None => builds.push((kind, spec(kind, name, sources)?, Vec::new())),
            }
        }
        Ok(ConformanceImages {
            builds: builds.into_iter().map(|(_, s, t)| (s, t)).collect(),
            missing,
        })
    }
}

fn spec(kind: Kind, reference: &str, s: &Sources) -> Result<ImageSpec, String> {
    let binary = |host: &Path| ImageSpec::binary(host, reference, 0, 0);
    Ok(match kind {
        Kind::Agnhost => {
            let mut spec = with_busybox(reference, &s.busybox)?;
            spec.binaries.push((s.agnhost.clone(), "/agnhost".into()));
            spec.entrypoint = vec!["/agnhost".into()];
            spec.cmd = vec!["pause".into()];
            spec.extras.push(link("/agnhost-2", "agnhost"));
            spec.extras.push(text("/uploads/.keep", ""));
            spec
        }
        Kind::Busybox => {
            let mut spec = with_busybox(reference, &s.busybox)?;
            spec.cmd = vec!["sh".into()];
            spec
        }
        Kind::Nginx => web(reference, &s.busybox, "/usr/share/nginx/html", NGINX_PAGE)?,
        Kind::Httpd => web(
            reference,
            &s.busybox,
            "/usr/local/apache2/htdocs",
            HTTPD_PAGE,
        )?,
        Kind::Pause => {
            let mut spec = ImageSpec::binary(&s.pause, reference, 65535, 65535);
            spec.binaries[0].1 = "/pause".into();
            spec.entrypoint = vec!["/pause".into()];
            spec
        }
        Kind::Kitten => update_demo(reference, s, "kitten")?,
        Kind::Nautilus => update_demo(reference, s, "nautilus")?,
        Kind::SampleApiserver => binary(&s.sample_apiserver),
        Kind::Etcd => binary(&s.etcd),
    })
}

/// agnhost's `test-webserver` serving `/<name>.jpg` and the `/data.json` naming it, which is
/// what the Update Demo spec reads back (through the API server's Pod proxy).
fn update_demo(reference: &str, s: &Sources, name: &str) -> Result<ImageSpec, String> {
    let mut spec = spec(Kind::Agnhost, reference, s)?;
    spec.cmd = vec!["test-webserver".into()];
    spec.extras.push(text(
        "/data.json",
        &format!("{{\n  \"image\": \"{name}.jpg\"\n}}\n"),
    ));
    spec.extras.push(text(&format!("/{name}.jpg"), name));
    Ok(spec)
}

const NGINX_PAGE: &str = "<title>Welcome to nginx!</title>\n";
const HTTPD_PAGE: &str = "<html><body><h1>It works!</h1></body></html>\n";

/// busybox `httpd` in the foreground on :80 serving `page` from `root`.
fn web(reference: &str, busybox: &Path, root: &str, page: &str) -> Result<ImageSpec, String> {
    let mut spec = with_busybox(reference, busybox)?;
    spec.extras.push(text(&format!("{root}/index.html"), page));
    spec.cmd = ["/bin/httpd", "-f", "-p", "80", "-h", root]
        .map(str::to_owned)
        .to_vec();
    Ok(spec)
}

/// A root image with busybox at `/bin/busybox`, every applet linked beside it, and the users and
/// groups upstream's test images define (`user-defined-in-image` 1000, `group-defined-in-image`).
fn with_busybox(reference: &str, busybox: &Path) -> Result<ImageSpec, String> {
    let out = Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(|e| format!("{}: {e} (Debian package busybox-static)", busybox.display()))?;
    let mut spec = ImageSpec::binary(busybox, reference, 0, 0);
    spec.binaries[0].1 = "/bin/busybox".into();
    spec.entrypoint = Vec::new();
    for applet in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if applet != "busybox" {
            spec.extras.push(link(&format!("/bin/{applet}"), "busybox"));
        }
    }
    spec.extras.push(link("/usr/bin/env", "/bin/env"));
    spec.extras.push(text(
        "/etc/passwd",
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n\
         user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n",
    ));
    spec.extras.push(text(
        "/etc/group",
        "root:x:0:\nnogroup:x:65534:\nuser-defined-in-image:x:1000:\n\
         group-defined-in-image:x:50000:user-defined-in-image\n",
    ));
    Ok(spec)
}

fn link(path: &str, target: &str) -> Extra {
    Extra::Link {
        path: path.into(),
        target: target.into(),
    }
}

fn text(path: &str, text: &str) -> Extra {
    Extra::Text {
        path: path.into(),
        text: text.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_read_from_the_repository_not_the_tag() {
        assert_eq!(
            Kind::of("registry.k8s.io/e2e-test-images/agnhost:2.63.0"),
            Some(Kind::Agnhost)
        );
        assert_eq!(Kind::of("registry.k8s.io/pause:3.10.2"), Some(Kind::Pause));
        assert_eq!(Kind::of("gcr.io/k8s-authenticated-test/agnhost:2.6"), None);
        assert_eq!(
            Kind::of("registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7"),
            None
        );
    }
}

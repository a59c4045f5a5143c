//! OCI images built from host binaries, for a node that cannot pull anything.
//!
//! One layer: the binary at its path in the image, the shared libraries `ldd` lists (so a glibc
//! binary runs as on distroless' `cc` base), `/etc/ssl/certs`, an `/etc/passwd` and `/etc/group`
//! naming the image's user, and a sticky world-writable `/tmp`. No shell. The layout is written
//! as an OCI image layout tar and imported into containerd's `k8s.io` namespace with `ctr`, where
//! the kubelet finds it by name (Pods use `imagePullPolicy: IfNotPresent` or `Never`).
//!
//! The gateway's image is [`ImageSpec::gateway`]: user, entrypoint and port from the Dockerfile's
//! final stage ([`crate::dockerfile::RuntimeStage`]), so the two cannot drift apart
//! (`tests/suite/dockerfile.rs` checks the content).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::dockerfile::RuntimeStage;

/// What goes into one image.
#[derive(Clone, Debug)]
pub struct ImageSpec {
    /// `registry/name:tag` as Pods name it (`localhost/...` or `registry.k8s.io/...`).
    pub reference: String,
    /// Host file → absolute path in the image, each with its shared libraries.
    pub binaries: Vec<(PathBuf, String)>,
    pub entrypoint: Vec<String>,
    /// `uid:gid`.
    pub user: String,
    pub exposed: Vec<String>,
    /// The image's CMD (none when empty).
    pub cmd: Vec<String>,
    /// More content, written after the defaults (so a `Text` of `/etc/passwd` replaces ours).
    pub extras: Vec<Extra>,
}

/// Content of an image beyond its binaries.
#[derive(Clone, Debug)]
pub enum Extra {
    /// A file with this text at an absolute path.
    Text { path: String, text: String },
    /// A symbolic link at `path` to `target`.
    Link { path: String, target: String },
    /// A host file copied as it is (no shared libraries), skipped when absent.
    Optional { host: PathBuf, path: String },
}

impl ImageSpec {
    /// One binary at `/usr/local/bin/<name>` as the entrypoint, run as `uid:gid`.
    pub fn binary(binary: &Path, reference: &str, uid: u32, gid: u32) -> ImageSpec {
        let name = binary
            .file_name()
            .expect("a binary file name")
            .to_string_lossy();
        let path = format!("/usr/local/bin/{name}");
        ImageSpec {
            reference: reference.to_owned(),
            binaries: vec![(binary.to_path_buf(), path.clone())],
            entrypoint: vec![path],
            user: format!("{uid}:{gid}"),
            exposed: Vec::new(),
            cmd: Vec::new(),
            extras: Vec::new(),
        }
    }

    /// The gateway's image: the binary where the Dockerfile's final stage copies it, with its
    /// USER, ENTRYPOINT and EXPOSE.
    pub fn gateway(binary: &Path, reference: &str) -> ImageSpec {
        let stage = RuntimeStage::of_repository();
        let (uid, gid) = stage.uid_gid();
        let target = stage
            .copied
            .iter()
            .find(|c| **c == stage.entrypoint[0])
            .unwrap_or_else(|| panic!("the Dockerfile copies no {}", stage.entrypoint[0]))
            .clone();
        ImageSpec {
            reference: reference.to_owned(),
            binaries: vec![(binary.to_path_buf(), target)],
            entrypoint: stage.entrypoint.clone(),
            user: format!("{uid}:{gid}"),
            exposed: stage
                .exposed
                .iter()
                .map(|p| {
                    if p.contains('/') {
                        p.clone()
                    } else {
                        format!("{p}/tcp")
                    }
                })
                .collect(),
            cmd: Vec::new(),
            extras: Vec::new(),
        }
    }
}

/// An OCI image layout on disk: `image.tar` (the layout, ready for `ctr images import`), the
/// layer and the config.
#[derive(Debug)]
pub struct ImageLayout {
    pub reference: String,
    pub tar: PathBuf,
    layer_tar: PathBuf,
    pub config: Value,
}

impl ImageLayout {
    /// Builds the image for `spec` in `work` (which must exist).
    pub fn build(spec: &ImageSpec, work: &Path) -> Result<ImageLayout, String> {
        let (uid, gid) = spec.user.split_once(':').ok_or("user must be uid:gid")?;
        let root = work.join("rootfs");
        for dir in ["etc/ssl", "tmp", "proc", "sys", "dev", "var/run"] {
            std::fs::create_dir_all(root.join(dir)).map_err(|e| format!("{dir}: {e}"))?;
        }
        set_mode(&root.join("tmp"), 0o1777)?;
        for (host, target) in &spec.binaries {
            copy_into(&root, host, target)?;
            for library in shared_libraries(host)? {
                let target = library.display().to_string();
                copy_into(&root, &library, &target)?;
            }
        }
        if Path::new("/etc/ssl/certs").is_dir() {
            run(Command::new("cp")
                .arg("-rL")
                .arg("/etc/ssl/certs")
                .arg(root.join("etc/ssl/certs")))?;
        }
        write(
            &root.join("etc/passwd"),
            &format!("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{uid}:{gid}:nonroot:/home/nonroot:/sbin/nologin\n"),
        )?;
        write(
            &root.join("etc/group"),
            &format!("root:x:0:\nnonroot:x:{gid}:\n"),
        )?;
        write(&root.join("etc/nsswitch.conf"), "hosts: files dns\n")?;
        for extra in &spec.extras {
            add_extra(&root, extra)?;
        }

        // The layer: reproducible (sorted, epoch mtimes, root-owned), then gzip.
        let layer_tar = work.join("layer.tar");
        run(Command::new("tar")
            .args([
                "--sort=name",
                "--mtime=@0",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "-C",
            ])
            .arg(&root)
            .arg("-cf")
            .arg(&layer_tar)
            .arg("."))?;
        let layer = std::fs::read(&layer_tar).map_err(|e| e.to_string())?;
        let diff_id = sha256(&layer);
        let mut gz = Vec::new();
        flate2::read::GzEncoder::new(&layer[..], flate2::Compression::fast())
            .read_to_end(&mut gz)
            .map_err(|e| e.to_string())?;

        let layout = work.join("oci");
        let blobs = layout.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).map_err(|e| e.to_string())?;
        let blob = |bytes: &[u8]| -> Result<(String, usize), String> {
            let digest = sha256(bytes);
            std::fs::write(blobs.join(&digest), bytes).map_err(|e| e.to_string())?;
            Ok((format!("sha256:{digest}"), bytes.len()))
        };
        let (layer_digest, layer_size) = blob(&gz)?;
        let exposed: BTreeMap<&str, Value> = spec
            .exposed
            .iter()
            .map(|p| (p.as_str(), json!({})))
            .collect();
        let config = json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "User": spec.user,
                "Entrypoint": (!spec.entrypoint.is_empty()).then_some(&spec.entrypoint),
                "Cmd": (!spec.cmd.is_empty()).then_some(&spec.cmd),
                "ExposedPorts": exposed,
                "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        });
        let (config_digest, config_size) = blob(config.to_string().as_bytes())?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": layer_digest, "size": layer_size}],
        });
        let (manifest_digest, manifest_size) = blob(manifest.to_string().as_bytes())?;
        let tag = spec.reference.rsplit_once(':').map_or("latest", |(_, t)| t);
        let index = json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest, "size": manifest_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": spec.reference,
                                "org.opencontainers.image.ref.name": tag},
            }],
        });
        write(&layout.join("index.json"), &index.to_string())?;
        write(
            &layout.join("oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#,
        )?;
        let tar = work.join("image.tar");
        run(Command::new("tar")
            .arg("-C")
            .arg(&layout)
            .arg("-cf")
            .arg(&tar)
            .arg("."))?;
        Ok(ImageLayout {
            reference: spec.reference.clone(),
            tar,
            layer_tar,
            config,
        })
    }

    /// Every path in the layer (without the leading `./`) with its mode bits.
    pub fn files(&self) -> Vec<(String, u32)> {
        let out = Command::new("tar")
            .args(["--numeric-owner", "-tvf"])
            .arg(&self.layer_tar)
            .output()
            .expect("tar -tvf");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                let mode = parse_mode(words.next()?)?;
                let path = words.nth(4)?.trim_start_matches("./").trim_end_matches('/');
                (!path.is_empty() && path != ".").then(|| (path.to_owned(), mode))
            })
            .collect()
    }

    /// The text of one file of the layer.
    pub fn file_text(&self, path: &str) -> String {
        let out = Command::new("tar")
            .arg("-xOf")
            .arg(&self.layer_tar)
            .arg(format!("./{path}"))
            .output()
            .expect("tar -xOf");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Imports the image into containerd's `k8s.io` namespace (`ctr` at `address`).
    pub fn import(&self, ctr: &Path, address: &Path) -> Result<(), String> {
        run(Command::new(ctr)
            .arg("--address")
            .arg(address)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&self.tar))
    }
}

/// Builds `spec` in a temporary directory and imports it; returns the reference.
pub fn build_and_import(spec: &ImageSpec, ctr: &Path, address: &Path) -> Result<String, String> {
    let work = tempfile::Builder::new()
        .prefix("image-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let layout = ImageLayout::build(spec, work.path())?;
    layout.import(ctr, address)?;
    Ok(layout.reference)
}

/// `-rwxr-xr-x` (or `drwxrwxrwt`) as mode bits.
fn parse_mode(text: &str) -> Option<u32> {
    let bits = text.get(1..10)?.as_bytes();
    let mut mode = 0;
    for (i, c) in bits.iter().enumerate() {
        let bit = 1 << (8 - i);
        match c {
            b'r' | b'w' | b'x' => mode |= bit,
            b's' | b't' => mode |= bit,
            _ => {}
        }
    }
    match bits[8] {
        b't' | b'T' => mode |= 0o1000,
        _ => {}
    }
    Some(mode)
}

/// The shared libraries `ldd` lists for `binary` (none for a static one).
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| format!("ldd: {e}"))?;
    if !out.status.success() {
        return Ok(Vec::new()); // "not a dynamic executable"
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

fn copy_into(root: &Path, host: &Path, target: &str) -> Result<(), String> {
    let to = root.join(target.trim_start_matches('/'));
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    // Follows symlinks (a library's soname link), keeps the mode.
    std::fs::copy(host, &to).map_err(|e| format!("copying {}: {e}", host.display()))?;
    Ok(())
}

fn add_extra(root: &Path, extra: &Extra) -> Result<(), String> {
    let at = |path: &str| {
        let to = root.join(path.trim_start_matches('/'));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        Ok::<_, String>(to)
    };
    match extra {
        Extra::Text { path, text } => write(&at(path)?, text),
        Extra::Link { path, target } => {
            let to = at(path)?;
            let _ = std::fs::remove_file(&to);
            std::os::unix::fs::symlink(target, &to).map_err(|e| format!("{path}: {e}"))
        }
        Extra::Optional { host, path } if host.is_file() => copy_into(root, host, path),
        Extra::Optional { .. } => Ok(()),
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_modes_parse() {
        assert_eq!(parse_mode("-rwxr-xr-x"), Some(0o755));
        assert_eq!(parse_mode("drwxrwxrwt"), Some(0o1777));
        assert_eq!(parse_mode("-rw-r--r--"), Some(0o644));
    }
}

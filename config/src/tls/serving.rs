//! The serving identity: the user's certificate files, or a self-signed pair generated at start,
//! kept in memory or written into `--cert-dir`, a directory that must be the gateway's own.

use std::path::{Path, PathBuf};

use super::{certs_from_pem, key_from_pem, Identity, TlsError};
use crate::config::{CertKeyPair, ServingConfig};

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum ServingIdentity {
    /// PEM files: the user's `--tls-cert-file`/`--tls-private-key-file`, or a self-signed pair
    /// the gateway wrote into `--cert-dir`. Re-read when they change.
    Files(CertKeyPair),
    /// A self-signed pair generated at start and never written anywhere (no `--cert-dir`).
    InMemory(Identity),
}

impl ServingIdentity {
    /// The certificate file, when there is one a client could be pointed at.
    pub fn cert_file(&self) -> Option<&Path> {
        match self {
            Self::Files(pair) => Some(&pair.cert_file),
            Self::InMemory(_) => None,
        }
    }

    pub(super) fn files(&self) -> Vec<PathBuf> {
        match self {
            Self::Files(pair) => vec![pair.cert_file.clone(), pair.key_file.clone()],
            Self::InMemory(_) => Vec::new(),
        }
    }

    pub(super) fn load(&self) -> Result<Identity, TlsError> {
        match self {
            Self::Files(pair) => Identity::load(pair),
            Self::InMemory(identity) => Ok(identity.clone()),
        }
    }
}

/// The serving identity to use: the user's files; else a self-signed pair, written into
/// `--cert-dir` when one is given (and reused from there when a previous run left a valid one,
/// like kube-apiserver's `--cert-dir`), kept in memory otherwise. The flag says whether the pair
/// is self-signed.
///
/// Why not a default directory: a shared one (`$TMPDIR/...`) lets anyone who can write there
/// plant the key pair the gateway then serves with, or a symlink the key is written through.
/// So generated material stays in memory unless the user names a directory, and that directory
/// must be the gateway's own (see [`check_private_dir`]).
pub fn ensure_serving_cert(serving: &ServingConfig) -> Result<(ServingIdentity, bool), TlsError> {
    if let Some(pair) = &serving.cert {
        return Ok((ServingIdentity::Files(pair.clone()), false));
    }
    let Some(dir) = &serving.cert_dir else {
        let (cert_pem, key_pem) = self_signed_pem()?;
        let identity = Identity {
            certs: certs_from_pem(cert_pem.as_bytes()).map_err(TlsError::Generate)?,
            key: key_from_pem(key_pem.as_bytes()).map_err(TlsError::Generate)?,
        };
        return Ok((ServingIdentity::InMemory(identity), true));
    };
    create_private_dir(dir)?;
    let pair = CertKeyPair {
        cert_file: dir.join("aggregation-gateway.crt"),
        key_file: dir.join("aggregation-gateway.key"),
    };
    if no_symlink(&pair.cert_file)? && no_symlink(&pair.key_file)? && Identity::load(&pair).is_ok()
    {
        return Ok((ServingIdentity::Files(pair), true));
    }
    let (cert_pem, key_pem) = self_signed_pem()?;
    write_private(&pair.key_file, key_pem.as_bytes())?;
    write_private(&pair.cert_file, cert_pem.as_bytes())?;
    Ok((ServingIdentity::Files(pair), true))
}

/// A self-signed serving certificate for `localhost`, 127.0.0.1 and ::1, and its key (PEM).
fn self_signed_pem() -> Result<(String, String), TlsError> {
    let key = rcgen::KeyPair::generate().map_err(|e| TlsError::Generate(e.to_string()))?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "aggregation-gateway self-signed");
    for ip in ["127.0.0.1", "::1"] {
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(ip.parse().expect("literal IP")));
    }
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    let cert = params
        .self_signed(&key)
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Creates `dir` (mode 0700) if missing, then refuses it unless it is a directory owned by this
/// user that nobody else can write: whoever can write there can swap the key pair.
fn create_private_dir(dir: &Path) -> Result<(), TlsError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|source| TlsError::Write {
        path: dir.to_owned(),
        source,
    })?;
    check_private_dir(dir)
}

/// `dir` is a directory owned by the current user (or root) and not writable by group or others.
pub fn check_private_dir(dir: &Path) -> Result<(), TlsError> {
    let meta = std::fs::metadata(dir).map_err(|source| TlsError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let unsafe_dir = |why: String| TlsError::UnsafeCertDir {
        path: dir.to_owned(),
        why,
    };
    if !meta.is_dir() {
        return Err(unsafe_dir("it is not a directory".into()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me && meta.uid() != 0 {
            return Err(unsafe_dir(format!(
                "it is owned by uid {}, not by this user (uid {me})",
                meta.uid()
            )));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(unsafe_dir(format!(
                "its mode {:o} lets other users write into it",
                meta.mode() & 0o7777
            )));
        }
    }
    Ok(())
}

/// `Ok(true)` when `path` is not a symlink (or does not exist): a generated key is only read from,
/// and written to, a plain file of the directory itself.
fn no_symlink(path: &Path) -> Result<bool, TlsError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => Ok(!m.file_type().is_symlink()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(source) => Err(TlsError::Write {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Writes `bytes` to `path` with mode 0600: into a new file (created exclusively, never through a
/// symlink), renamed over `path`, so a reader never sees half a key and a planted symlink at
/// `path` is replaced, not followed.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| TlsError::Write { path, source }
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    opts.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    opts.open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .map_err(err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(err(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{install_crypto_provider, ServerTlsSettings, DEFAULT_RESYNC};

    fn serving_in(dir: &Path) -> ServingConfig {
        ServingConfig {
            cert: None,
            cert_dir: Some(dir.to_owned()),
            cert_reload_interval: DEFAULT_RESYNC,
            tls13_only: false,
            cipher_suites: vec![],
            http2_max_streams: 100,
            max_client_connections: 0,
        }
    }

    fn files(identity: ServingIdentity) -> CertKeyPair {
        match identity {
            ServingIdentity::Files(pair) => pair,
            ServingIdentity::InMemory(_) => panic!("expected files"),
        }
    }

    #[test]
    fn self_signed_pair_is_generated_once_and_reused() {
        install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let (identity, generated) = ensure_serving_cert(&serving_in(dir.path())).unwrap();
        assert!(generated);
        let pair = files(identity.clone());
        let first = std::fs::read(&pair.cert_file).unwrap();
        let (again, _) = ensure_serving_cert(&serving_in(dir.path())).unwrap();
        assert_eq!(std::fs::read(&files(again).cert_file).unwrap(), first);
        let settings = ServerTlsSettings {
            serving: identity,
            client_ca_files: vec![],
            tls13_only: false,
            cipher_suites: vec![],
        };
        let (config, _) = settings.build().unwrap();
        assert_eq!(config.alpn_protocols[0], b"h2");
    }

    #[test]
    fn without_a_cert_dir_nothing_is_written() {
        install_crypto_provider();
        let mut serving = serving_in(Path::new("/nonexistent"));
        serving.cert_dir = None;
        let (identity, generated) = ensure_serving_cert(&serving).unwrap();
        assert!(generated);
        assert!(identity.cert_file().is_none());
        assert!(identity.files().is_empty());
        assert!(!Path::new("/nonexistent").exists());
    }

    #[cfg(unix)]
    #[test]
    fn generated_files_are_private_and_never_written_through_symlinks() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        std::fs::create_dir(&certs).unwrap();
        std::fs::set_permissions(&certs, std::fs::Permissions::from_mode(0o700)).unwrap();
        // A symlink planted where the key goes, pointing at a file of someone else's choosing.
        let target = dir.path().join("stolen-key");
        symlink(&target, certs.join("aggregation-gateway.key")).unwrap();
        let pair = files(ensure_serving_cert(&serving_in(&certs)).unwrap().0);
        assert!(!target.exists(), "the key was written through the symlink");
        for file in [&pair.cert_file, &pair.key_file] {
            let meta = std::fs::symlink_metadata(file).unwrap();
            assert!(meta.file_type().is_file(), "{file:?}");
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{file:?}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_cert_dir_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure_serving_cert(&serving_in(dir.path())).unwrap_err();
        assert!(matches!(err, TlsError::UnsafeCertDir { .. }), "{err}");
        assert!(err.to_string().contains("777"), "{err}");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }

    #[test]
    fn mismatched_key_is_refused() {
        install_crypto_provider();
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let pa = files(ensure_serving_cert(&serving_in(a.path())).unwrap().0);
        let pb = files(ensure_serving_cert(&serving_in(b.path())).unwrap().0);
        let err = Identity::load(&CertKeyPair {
            cert_file: pa.cert_file,
            key_file: pb.key_file,
        })
        .unwrap_err();
        assert!(matches!(err, TlsError::Pair { .. }), "{err}");
    }
}

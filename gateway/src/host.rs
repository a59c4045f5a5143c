//! This machine's host name: in a cluster, the Pod's name. Leader election's identity and the
//! `apiserver_id_hash` of the authentication metrics are made from it, as kube's are.

/// The machine's host name (a Pod's name), or `unknown`.
pub fn name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length, and gethostname writes at most that much.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".to_owned();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(name) if !name.is_empty() => name.to_owned(),
        _ => "unknown".to_owned(),
    }
}

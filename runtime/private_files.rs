//! Directories and files whose contents the server runs as native code:
//! ONNX Runtime's optimised graphs and wasmtime's precompiled plugins.
//!
//! Loading either is trusting it: a `.cwasm` is machine code wasmtime maps
//! and jumps into, outside the WebAssembly sandbox, and a graph can name
//! custom-op libraries. A cache directory is therefore the server's own —
//! owned by its user and closed to everyone else — and each file is
//! checked again just before it is loaded, because a directory that was
//! open once may hold a file another user planted then: it must be a
//! regular file (not a link to elsewhere), owned by the server's user, and
//! writable by no one else.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::error::{Error, Result};

fn server_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Creates `dir` when missing and makes sure it is the server's own: owned
/// by its user (refused otherwise) and closed to group and others (made
/// so when it was not). `what` names the directory in the error.
pub fn ensure_private_dir(dir: &Path, what: &str) -> Result<()> {
    let refuse = |why: String| Error::unavailable(format!("{what} {}: {why}", dir.display()));
    std::fs::create_dir_all(dir).map_err(|e| refuse(format!("cannot create it: {e}")))?;
    let meta = std::fs::symlink_metadata(dir).map_err(|e| refuse(format!("cannot read it: {e}")))?;
    if !meta.is_dir() {
        return Err(refuse("it is not a directory (a symbolic link is not accepted)".into()));
    }
    let me = server_uid();
    if meta.uid() != me {
        return Err(refuse(format!("it belongs to uid {}, not to this server (uid {me})", meta.uid())));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| refuse(format!("cannot make it owner-only: {e}")))?;
    }
    Ok(())
}

/// Whether `file` may be loaded as code: a regular file owned by the
/// server's user that no other user can write. The error says which of
/// these failed.
pub fn check_trusted_file(file: &Path) -> Result<()> {
    let refuse = |why: String| Error::unavailable(format!("{}: {why}; it is not loaded", file.display()));
    let meta = std::fs::symlink_metadata(file).map_err(|e| refuse(format!("cannot read it: {e}")))?;
    if !meta.file_type().is_file() {
        return Err(refuse("it is not a regular file".into()));
    }
    let me = server_uid();
    if meta.uid() != me {
        return Err(refuse(format!("it belongs to uid {}, not to this server (uid {me})", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refuse(format!("others may write it (mode {:o})", meta.mode() & 0o777)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_directory_is_closed_and_a_file_others_can_write_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).expect("mkdir");
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        ensure_private_dir(&cache, "test cache").expect("own directory");
        let mode = std::fs::metadata(&cache).expect("stat").mode() & 0o777;
        assert_eq!(mode, 0o700);

        let file = cache.join("code.bin");
        std::fs::write(&file, b"x").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        check_trusted_file(&file).expect("own private file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let error = check_trusted_file(&file).expect_err("world-writable").to_string();
        assert!(error.contains("others may write it (mode 666)"), "{error}");

        let link = cache.join("link.bin");
        std::os::unix::fs::symlink("/etc/hostname", &link).expect("symlink");
        let error = check_trusted_file(&link).expect_err("symlink").to_string();
        assert!(error.contains("not a regular file"), "{error}");
    }
}

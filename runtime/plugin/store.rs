//! Files written so that a crash never leaves a half-written one (a
//! temporary file in the same directory, synced, then renamed over the
//! target, then the directory synced), and the hash that names stored and
//! compiled plugins.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The SHA-256 of `bytes`, as 64 lower-case hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes))
}

/// Removes the temporaries in `dir` that a write cut short by a crash
/// (SIGKILL, power loss) left; answers how many. Call before anything
/// writes there.
pub fn remove_stale_temporaries(dir: &Path) -> usize {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.ends_with(".tmp") && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    // Owner-only: the compiled-plugin cache loads only files no one else
    // could have written (`private_files`).
    let written = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&temp).and_then(
        |mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        },
    );
    // A full or read-only disk leaves nothing behind.
    if let Err(e) = written.and_then(|()| std::fs::rename(&temp, path)) {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    // The rename is durable once the directory entry is.
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_temporaries_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".a.json.77.tmp"), b"half").unwrap();
        std::fs::write(dir.path().join("a.json"), b"whole").unwrap();
        assert_eq!(remove_stale_temporaries(dir.path()), 1);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

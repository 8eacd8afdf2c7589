//! Where the twin is made and how it becomes the next version. It is made
//! in a temporary directory (a conversion may run for minutes, and an
//! interrupted one must not leave anything in the model's base path);
//! publishing then fills a staging directory inside BASE (so the rename
//! stays on one filesystem) and renames it into place without replacing
//! anything, which a polling server sees as the whole version appearing.
//!
//! The staging directory's name is not a number, so neither sluice nor TF
//! Serving takes it for a version while it fills.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where the report goes in the published version, beside the warmup file.
pub const REPORT_FILE: &str = "assets.extra/sluice_twin_report.json";

/// A directory removed when dropped, unless it was renamed into place.
pub struct Stage {
    dir: PathBuf,
    published: bool,
}

/// Refuses early when `base/next` exists: the twin of version `next - 1`
/// is published as `next`, and an existing version is never replaced.
pub fn check_free(base: &Path, next: i64) -> Result<()> {
    let target = base.join(next.to_string());
    if target.exists() {
        return Err(Error::failed_precondition(format!(
            "{} exists: the twin of version {} is published as version {next}; remove it or twin the newest \
             version",
            target.display(),
            next - 1
        )));
    }
    Ok(())
}

impl Stage {
    /// A new temporary directory to make the twin in.
    pub fn new() -> Result<Stage> {
        Stage::at(std::env::temp_dir().join(format!("sluice-twin-{}", unique())))
    }

    fn at(dir: PathBuf) -> Result<Stage> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::failed_precondition(format!("cannot make {}: {e}", dir.display())))?;
        Ok(Stage { dir, published: false })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes this stage's `model.onnx` the version `base/next`: copies it
    /// into a staging directory in `base` with `saved`'s `assets.extra/`
    /// (the warmup file) and `report`, syncs every file and renames the
    /// directory into place. Answers the version's directory.
    pub fn publish(&self, base: &Path, saved: &Path, next: i64, report: &[u8]) -> Result<PathBuf> {
        let failed = |what: &str, e: std::io::Error| Error::internal(format!("publishing: {what}: {e}"));
        let mut staged = Stage::at(base.join(format!(".twin-{next}-{}", unique())))?;
        let model = crate::models::repository::MODEL_FILE;
        std::fs::copy(self.dir.join(model), staged.dir.join(model)).map_err(|e| failed("copying the model", e))?;
        let signatures = self.dir.join(crate::infer::onnx::SIGNATURES_DIR);
        if signatures.is_dir() {
            copy_dir(&signatures, &staged.dir.join(crate::infer::onnx::SIGNATURES_DIR))
                .map_err(|e| failed("copying the other signatures", e))?;
        }
        let extra = saved.join("assets.extra");
        if extra.is_dir() {
            copy_dir(&extra, &staged.dir.join("assets.extra")).map_err(|e| failed("copying assets.extra", e))?;
        }
        let report_path = staged.dir.join(REPORT_FILE);
        if let Some(parent) = report_path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| failed("making assets.extra", e))?;
        }
        std::fs::write(&report_path, report).map_err(|e| failed("writing the report", e))?;
        sync_tree(&staged.dir).map_err(|e| failed("syncing the version", e))?;
        let target = base.join(next.to_string());
        rename_no_replace(&staged.dir, &target).map_err(|e| match e.raw_os_error() {
            Some(libc::EEXIST | libc::ENOTEMPTY) => Error::failed_precondition(format!(
                "{} appeared while the twin was made; nothing was published",
                target.display()
            )),
            _ => failed(&format!("renaming into {}", target.display()), e),
        })?;
        staged.published = true;
        // The version is in place; a base path that cannot be synced only
        // means its name may not survive a crash of the machine.
        if let Err(e) = std::fs::File::open(base).and_then(|dir| dir.sync_all()) {
            tracing::warn!(base = %base.display(), "published, but syncing the base path failed: {e}");
        }
        Ok(target)
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn unique() -> String {
    format!("{}-{:08x}", std::process::id(), rand::random::<u32>())
}

/// rename(2) that fails with EEXIST instead of replacing an (empty)
/// directory another process made meanwhile.
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |path: &Path| {
        std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a path holds a NUL byte"))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: both strings are NUL-terminated and live for the call;
    // AT_FDCWD makes them relative to the working directory, as rename's.
    let status =
        unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if status == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Copies the directory tree `from` to `to`; links are not followed (a
/// version's assets are plain files).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()))?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// fsyncs every file and directory under `dir`, so the version is whole on
/// disk before its name appears.
fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_tree(&entry.path())?;
        } else {
            std::fs::File::open(entry.path())?.sync_all()?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::warmup::WARMUP_FILE;

    #[test]
    fn a_published_version_appears_whole_and_an_unpublished_stage_leaves_nothing() {
        let base = tempfile::tempdir().unwrap();
        let saved = base.path().join("1");
        std::fs::create_dir_all(saved.join("assets.extra")).unwrap();
        std::fs::write(saved.join(WARMUP_FILE), b"records").unwrap();

        let names = || -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(base.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into())
                .collect();
            names.sort();
            names
        };
        let stage = Stage::new().unwrap();
        let temporary = stage.dir().to_path_buf();
        std::fs::write(stage.dir().join("model.onnx"), b"onnx").unwrap();
        check_free(base.path(), 2).unwrap();
        let published = stage.publish(base.path(), &saved, 2, b"{}").unwrap();
        assert_eq!(published, base.path().join("2"));
        assert_eq!(std::fs::read(published.join("model.onnx")).unwrap(), b"onnx");
        assert_eq!(std::fs::read(published.join(WARMUP_FILE)).unwrap(), b"records");
        assert_eq!(std::fs::read(published.join(REPORT_FILE)).unwrap(), b"{}");
        assert_eq!(names(), vec!["1", "2"], "no staging directory is left");
        drop(stage);
        assert!(!temporary.exists(), "the temporary stage is removed");

        let again = check_free(base.path(), 2).unwrap_err();
        assert!(again.message().contains("exists"), "{again}");
        // A version that appears between the check and the rename, even an
        // empty directory, is never replaced.
        let stage = Stage::new().unwrap();
        std::fs::write(stage.dir().join("model.onnx"), b"onnx").unwrap();
        std::fs::create_dir(base.path().join("3")).unwrap();
        let raced = stage.publish(base.path(), &saved, 3, b"{}").unwrap_err();
        assert!(raced.message().contains("appeared while the twin was made"), "{raced}");
        assert_eq!(names(), vec!["1", "2", "3"], "the staging directory of the refused version is removed");
        assert!(std::fs::read_dir(base.path().join("3")).unwrap().next().is_none());
    }
}

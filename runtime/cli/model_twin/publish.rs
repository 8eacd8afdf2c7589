//! Where the twin is made and how it becomes the next version: a staging
//! directory (inside BASE when publishing, so the rename stays on one
//! filesystem; a temporary one otherwise), removed unless published, and
//! one rename that a polling server sees as the whole version appearing.
//!
//! The staging directory's name is not a number, so neither sluice nor TF
//! Serving takes it for a version while it fills.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where the report goes in the published version, beside the warmup file.
pub const REPORT_FILE: &str = "assets.extra/sluice_twin_report.json";

/// A directory the twin is made in.
pub struct Stage {
    dir: PathBuf,
    published: bool,
}

impl Stage {
    /// A new staging directory: in `base` (publishing version `next`), or
    /// a temporary one.
    pub fn new(base: Option<&Path>, next: i64) -> Result<Stage> {
        let unique = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
        let dir = match base {
            Some(base) => {
                let target = base.join(next.to_string());
                if target.exists() {
                    return Err(Error::failed_precondition(format!(
                        "{} exists: the twin of version {} is published as version {next}; remove it or twin \
                         the newest version",
                        target.display(),
                        next - 1
                    )));
                }
                base.join(format!(".twin-{next}-{unique}"))
            }
            None => std::env::temp_dir().join(format!("sluice-twin-{unique}")),
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::failed_precondition(format!("cannot make {}: {e}", dir.display())))?;
        Ok(Stage { dir, published: false })
    }

    /// The staging directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes the staged model `base/next`: copies `saved`'s `assets.extra/`
    /// (the warmup file) beside it, writes `report` there, syncs every
    /// file and renames the directory into place. Answers the version's
    /// directory.
    pub fn publish(mut self, base: &Path, saved: &Path, next: i64, report: &[u8]) -> Result<PathBuf> {
        let failed = |what: &str, e: std::io::Error| Error::internal(format!("publishing: {what}: {e}"));
        let extra = saved.join("assets.extra");
        if extra.is_dir() {
            copy_dir(&extra, &self.dir.join("assets.extra")).map_err(|e| failed("copying assets.extra", e))?;
        }
        let report_path = self.dir.join(REPORT_FILE);
        if let Some(parent) = report_path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| failed("making assets.extra", e))?;
        }
        std::fs::write(&report_path, report).map_err(|e| failed("writing the report", e))?;
        sync_tree(&self.dir).map_err(|e| failed("syncing the version", e))?;
        let target = base.join(next.to_string());
        // rename(2) replaces an empty directory; a version made meanwhile
        // is never replaced.
        if target.exists() {
            return Err(Error::failed_precondition(format!(
                "{} appeared while the twin was made; nothing was published",
                target.display()
            )));
        }
        std::fs::rename(&self.dir, &target).map_err(|e| failed(&format!("renaming into {}", target.display()), e))?;
        self.published = true;
        std::fs::File::open(base).and_then(|dir| dir.sync_all()).map_err(|e| failed("syncing the base path", e))?;
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

        let dropped = Stage::new(Some(base.path()), 2).unwrap();
        std::fs::write(dropped.dir().join("model.onnx"), b"onnx").unwrap();
        drop(dropped);
        let names: Vec<String> =
            std::fs::read_dir(base.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        assert_eq!(names, vec!["1".to_string()], "a stage not published is removed");

        let stage = Stage::new(Some(base.path()), 2).unwrap();
        assert!(stage.dir().file_name().unwrap().to_string_lossy().starts_with(".twin-2-"));
        std::fs::write(stage.dir().join("model.onnx"), b"onnx").unwrap();
        let published = stage.publish(base.path(), &saved, 2, b"{}").unwrap();
        assert_eq!(published, base.path().join("2"));
        assert_eq!(std::fs::read(published.join("model.onnx")).unwrap(), b"onnx");
        assert_eq!(std::fs::read(published.join(WARMUP_FILE)).unwrap(), b"records");
        assert_eq!(std::fs::read(published.join(REPORT_FILE)).unwrap(), b"{}");

        let again = Stage::new(Some(base.path()), 2).err().expect("version 2 exists");
        assert!(again.message().contains("exists"), "{again}");
    }
}

//! The config file as the whole store: the admin API's changes are written
//! back to it atomically, with the previous version kept beside it.

use std::path::{Path, PathBuf};

use gatehouse_config::yaml::Node as Doc;
use serde_json::{Value, json};

use gatehouse_config::{ConfigErrors, FieldError};

use super::{BoxFuture, Committed, Composed, Planned, Store, StoreError, Target, WriteError};
use crate::control::Control;

pub struct FileStore {
    path: PathBuf,
}

impl FileStore {
    pub fn new(path: &Path) -> Self {
        FileStore { path: path.to_path_buf() }
    }
}

impl Store for FileStore {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn describe(&self) -> Value {
        json!({ "type": "file", "path": self.path.display().to_string() })
    }

    fn compose(&self, local: &Doc) -> Result<Composed, StoreError> {
        Ok(Composed { doc: local.clone(), versions: None })
    }

    fn takes_documents(&self) -> bool {
        true
    }

    fn save(&self, doc: &Doc) -> Result<(), StoreError> {
        write_atomically(&self.path, &gatehouse_config::doc::emit(doc))
            .map_err(|error| StoreError::Write { path: self.path.clone(), error })
    }

    fn version_name(&self) -> &'static str {
        "config_version"
    }

    fn current(&self, control: &Control, kind: &'static str, name: &str) -> Option<(Value, u64)> {
        use gatehouse_config::doc;
        let loc = doc::locate(kind, name);
        let entry =
            doc::entries(&control.doc, kind, loc.scope).iter().find(|e| doc::entry_name(kind, e) == Some(loc.name))?;
        let version = control.versions.get(&(kind, name.to_string())).copied().unwrap_or(0);
        Some((gatehouse_config::doc::to_json(entry), version))
    }

    fn commit<'a>(&'a self, node: &'a dyn Target, plan: Planned) -> BoxFuture<'a, Result<Committed, WriteError>> {
        Box::pin(async move {
            let mut control = node.control();
            // Writes take turns, but a SIGHUP may have come in between.
            if node.version() != plan.base_version {
                return Err(WriteError::Conflict(format!(
                    "{}/{} could not be written: the config changed meanwhile; retry",
                    plan.kind, plan.name
                )));
            }
            let within = plan.within.clone();
            let config_version = node.apply(&mut control, plan.doc, true, within)?;
            let version = match plan.entry {
                Some(_) => control.versions.get(&(plan.kind, plan.name)).copied().unwrap_or(config_version),
                None => config_version,
            };
            Ok(Committed { version })
        })
    }
}

/// Reads and parses a config file into its document.
pub fn read_document(path: &Path) -> Result<Doc, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigErrors {
        file: path.to_path_buf(),
        errors: vec![FieldError { path: String::new(), message: format!("cannot read: {e}"), line: None }],
    })?;
    gatehouse_config::parse_document(&text, path)
}

/// The directory a config file's relative paths are relative to.
pub fn base_dir(path: &Path) -> PathBuf {
    path.parent().filter(|p| !p.as_os_str().is_empty()).map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Writes `text` to `path` so that a crash at any moment leaves either the
/// old file or the new one: a temporary file beside it, fsync, the old file
/// kept as `PATH.prev` (written the same way), rename over, fsync the
/// directory.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = base_dir(path);
    let name = path.file_name().map_or_else(|| "config".into(), |n| n.to_string_lossy().into_owned());
    // The new file keeps the old one's permissions (it may hold inline keys).
    let perms = std::fs::metadata(path).ok().map(|m| m.permissions());
    let put = |target: &Path, bytes: &[u8]| -> std::io::Result<()> {
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let mut f = std::fs::File::create(&tmp)?;
        if let Some(p) = &perms {
            f.set_permissions(p.clone())?;
        }
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, target)
    };
    if let Ok(old) = std::fs::read(path) {
        put(&dir.join(format!("{name}.prev")), &old)?;
    }
    put(path, text.as_bytes())?;
    std::fs::File::open(&dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_old_file_is_kept_and_the_new_one_replaces_it() {
        let dir = std::env::temp_dir().join(format!("gh-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("g.yaml");
        std::fs::write(&path, "one\n").expect("write");
        write_atomically(&path, "two\n").expect("first");
        write_atomically(&path, "three\n").expect("second");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "three\n");
        assert_eq!(std::fs::read_to_string(dir.join("g.yaml.prev")).expect("prev"), "two\n");
        let left: Vec<_> = std::fs::read_dir(&dir).expect("dir").filter_map(Result::ok).collect();
        assert_eq!(left.len(), 2, "no temporary file is left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

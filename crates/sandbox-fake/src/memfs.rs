//! The in-memory filesystem of one fake sandbox.
//!
//! A flat ordered map from normalised absolute path to node: listing a directory is a range
//! scan, and every path is already resolved with [`sandbox_core::resolve_path`] by the
//! caller. Symlinks are stored as nodes (`ln -s`); reads and writes of a path follow a
//! symlink in its *last* component (intermediate components are not resolved through
//! links). Downloads refuse links that would point outside the downloaded tree. There are
//! no device or kernel files (`/proc`, `/sys`, `/dev`): an in-process model has no kernel
//! to report on, and a constant derived from the config would prove nothing.

use std::collections::BTreeMap;
use std::time::SystemTime;

use bytes::Bytes;

/// Default permission bits of a regular file.
const FILE_MODE: u32 = 0o644;
/// Default permission bits of a directory.
const DIR_MODE: u32 = 0o755;

/// What a node is.
#[derive(Debug, Clone)]
pub(crate) enum NodeKind {
    /// A regular file.
    File(Vec<u8>),
    /// A directory.
    Dir,
    /// A symbolic link and its target as written.
    Symlink(String),
}

/// One filesystem entry.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) kind: NodeKind,
    pub(crate) mode: u32,
    pub(crate) mtime: SystemTime,
}

impl Node {
    pub(crate) fn is_dir(&self) -> bool {
        matches!(self.kind, NodeKind::Dir)
    }
    pub(crate) fn size(&self) -> u64 {
        match &self.kind {
            NodeKind::File(b) => b.len() as u64,
            NodeKind::Symlink(t) => t.len() as u64,
            _ => 0,
        }
    }
}

/// Why a filesystem operation failed (mapped to `SandboxError` or shell messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FsError {
    NotFound,
    IsADirectory,
    NotADirectory,
    Exists,
    NotEmpty,
    Busy,
    Loop,
}

type FsResult<T = ()> = Result<T, FsError>;

impl FsError {
    /// The errno text a busybox tool would print.
    pub(crate) fn errno_text(self) -> &'static str {
        match self {
            FsError::NotFound => "No such file or directory",
            FsError::IsADirectory => "Is a directory",
            FsError::NotADirectory => "Not a directory",
            FsError::Exists => "File exists",
            FsError::NotEmpty => "Directory not empty",
            FsError::Busy => "Resource busy",
            FsError::Loop => "Symbolic link loop",
        }
    }
}

/// The tree.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemFs {
    nodes: BTreeMap<String, Node>,
}

/// The parent directory of a normalised path (`None` for the root).
fn parent_of(path: &str) -> Option<&str> {
    let (parent, _) = path.rsplit_once('/').filter(|_| path != "/")?;
    Some(if parent.is_empty() { "/" } else { parent })
}

fn child_prefix(dir: &str) -> String {
    if dir == "/" {
        "/".to_string()
    } else {
        format!("{dir}/")
    }
}

/// The last component of a normalised path (`/` for the root).
pub(crate) fn base_name(path: &str) -> &str {
    path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("/")
}

/// `dir` joined with `name`.
pub(crate) fn join(dir: &str, name: &str) -> String {
    child_prefix(dir) + name
}

impl MemFs {
    /// The skeleton every fake sandbox starts with, including `workdir`.
    pub(crate) fn skeleton(workdir: &str, now: SystemTime) -> MemFs {
        let mut fs = MemFs::default();
        for d in [
            "/", "/bin", "/etc", "/home", "/root", "/tmp", "/usr", "/var",
        ] {
            let mode = if d == "/tmp" { 0o1777 } else { DIR_MODE };
            fs.insert(d, NodeKind::Dir, mode, now);
        }
        let _ = fs.mkdir(workdir, true, now);
        fs
    }

    fn insert(&mut self, path: &str, kind: NodeKind, mode: u32, mtime: SystemTime) {
        self.nodes
            .insert(path.to_string(), Node { kind, mode, mtime });
    }

    /// The node at `path` (a symlink itself, not its target).
    pub(crate) fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    /// `path` with symlinks in its last component followed (at most 8 hops).
    pub(crate) fn follow(&self, path: &str) -> FsResult<String> {
        let mut cur = path.to_string();
        for _ in 0..8 {
            match self.nodes.get(&cur).map(|n| &n.kind) {
                Some(NodeKind::Symlink(target)) => {
                    let dir = parent_of(&cur).unwrap_or("/");
                    cur = sandbox_core::resolve_path(dir, target).map_err(|_| FsError::NotFound)?;
                }
                _ => return Ok(cur),
            }
        }
        Err(FsError::Loop)
    }

    /// The node at `path` after following symlinks (what `stat(2)` sees).
    pub(crate) fn get_followed(&self, path: &str) -> Option<&Node> {
        self.nodes.get(&self.follow(path).ok()?)
    }

    /// Sets the permission bits (`0o7777`) of what `path` names, links followed.
    pub(crate) fn chmod(&mut self, path: &str, mode: u32) -> FsResult {
        let target = self.follow(path)?;
        let node = self.nodes.get_mut(&target).ok_or(FsError::NotFound)?;
        node.mode = mode & 0o7777;
        Ok(())
    }

    /// Creates a symbolic link at `path` pointing to `target`.
    pub(crate) fn symlink(&mut self, path: &str, target: &str, now: SystemTime) -> FsResult {
        if self.nodes.contains_key(path) {
            return Err(FsError::Exists);
        }
        self.require_parent_dir(path, false, now)?;
        self.insert(path, NodeKind::Symlink(target.to_string()), 0o777, now);
        Ok(())
    }

    fn require_parent_dir(&mut self, path: &str, create: bool, now: SystemTime) -> FsResult {
        let Some(parent) = parent_of(path) else {
            return Err(FsError::Busy);
        };
        match self.nodes.get(parent) {
            Some(n) if n.is_dir() => Ok(()),
            Some(_) => Err(FsError::NotADirectory),
            None if create => self.mkdir(parent, true, now),
            None => Err(FsError::NotFound),
        }
    }

    /// `mkdir` / `mkdir -p`.
    pub(crate) fn mkdir(&mut self, path: &str, parents: bool, now: SystemTime) -> FsResult {
        match self.nodes.get(path) {
            Some(n) if n.is_dir() && parents => return Ok(()),
            Some(_) => return Err(FsError::Exists),
            None => {}
        }
        self.require_parent_dir(path, parents, now)?;
        self.insert(path, NodeKind::Dir, DIR_MODE, now);
        Ok(())
    }

    /// Creates or replaces a regular file. With `parents`, missing directories are created.
    pub(crate) fn write(
        &mut self,
        path: &str,
        data: Vec<u8>,
        parents: bool,
        now: SystemTime,
    ) -> FsResult {
        self.put(path, parents, now, |b| *b = data)
    }

    /// Appends to a regular file, creating it when missing (its directory must exist).
    pub(crate) fn append(&mut self, path: &str, data: &[u8], now: SystemTime) -> FsResult {
        self.put(path, false, now, |b| b.extend_from_slice(data))
    }

    /// Applies `fill` to the content of the regular file at `path` (empty when it is
    /// created here).
    fn put(
        &mut self,
        path: &str,
        parents: bool,
        now: SystemTime,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> FsResult {
        let path = &self.follow(path)?;
        match self.nodes.get_mut(path) {
            Some(n) => match &mut n.kind {
                NodeKind::Dir => Err(FsError::IsADirectory),
                // `follow` gave up on it: a dangling or looping link.
                NodeKind::Symlink(_) => Err(FsError::Loop),
                NodeKind::File(b) => {
                    fill(b);
                    n.mtime = now;
                    Ok(())
                }
            },
            None => {
                self.require_parent_dir(path, parents, now)?;
                let mut data = Vec::new();
                fill(&mut data);
                self.insert(path, NodeKind::File(data), FILE_MODE, now);
                Ok(())
            }
        }
    }

    /// Reserves room for `additional` bytes in an existing regular file.
    pub(crate) fn reserve(&mut self, path: &str, additional: usize) {
        if let Some(Node {
            kind: NodeKind::File(b),
            ..
        }) = self.nodes.get_mut(path)
        {
            b.reserve_exact(additional);
        }
    }

    /// The content of the regular file at `path`.
    pub(crate) fn read(&self, path: &str) -> FsResult<Bytes> {
        self.read_range(path, 0, usize::MAX)
    }

    /// Up to `len` bytes of a regular file from `offset`; empty at the end.
    pub(crate) fn read_range(&self, path: &str, offset: usize, len: usize) -> FsResult<Bytes> {
        match self.nodes.get(&self.follow(path)?).map(|n| &n.kind) {
            None => Err(FsError::NotFound),
            Some(NodeKind::File(b)) => {
                let start = offset.min(b.len());
                let end = start.saturating_add(len).min(b.len());
                Ok(Bytes::copy_from_slice(&b[start..end]))
            }
            Some(NodeKind::Dir) => Err(FsError::IsADirectory),
            Some(NodeKind::Symlink(_)) => Err(FsError::Loop),
        }
    }

    /// Every entry strictly below `dir`, in path order (parents before children), each
    /// with its path relative to `dir`.
    fn below<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a str, &'a String, &'a Node)> {
        let prefix = child_prefix(dir);
        let len = prefix.len();
        self.nodes
            .range(prefix.clone()..)
            .take_while(move |(k, _)| k.starts_with(&prefix))
            .filter(move |(k, _)| k.len() > len)
            .map(move |(k, n)| (&k[len..], k, n))
    }

    /// Direct children of a directory, sorted by name.
    pub(crate) fn list(&self, dir: &str) -> FsResult<Vec<(String, Node)>> {
        match self.nodes.get(dir) {
            None => return Err(FsError::NotFound),
            Some(n) if !n.is_dir() => return Err(FsError::NotADirectory),
            Some(_) => {}
        }
        Ok(self
            .below(dir)
            .filter(|(name, _, _)| !name.contains('/'))
            .map(|(name, _, n)| (name.to_string(), n.clone()))
            .collect())
    }

    /// Every entry under `dir` (excluding `dir`), parents before children: its path, and
    /// for a symlink its target (`None` for a directory or a file, told apart by `is_dir`).
    pub(crate) fn walk(&self, dir: &str) -> Vec<(String, bool, Option<String>)> {
        self.below(dir)
            .map(|(_, k, n)| match &n.kind {
                NodeKind::Symlink(t) => (k.clone(), false, Some(t.clone())),
                _ => (k.clone(), n.is_dir(), None),
            })
            .collect()
    }

    /// Removes a file, or a directory (its whole tree when `recursive`).
    pub(crate) fn remove(&mut self, path: &str, recursive: bool) -> FsResult {
        let Some(node) = self.nodes.get(path) else {
            return Err(FsError::NotFound);
        };
        if path == "/" {
            return Err(FsError::Busy);
        }
        if node.is_dir() {
            if !recursive && self.below(path).next().is_some() {
                return Err(FsError::NotEmpty);
            }
            for (k, _, _) in self.walk(path) {
                self.nodes.remove(&k);
            }
        }
        self.nodes.remove(path);
        Ok(())
    }
}

//! Git gate settings (`CreateOptions::git_repo`): which host repositories a sandbox may
//! clone, fetch and (with read-write access) push to, and under which ref prefix its
//! pushes must land. The repository itself stays on the host; a backend that declares
//! [`Capability::GIT_GATE`](crate::Capability::GIT_GATE) serves it through a gate on the
//! host that checks a per-sandbox token and the prefix, outside the sandbox's reach.

use std::path::{Path, PathBuf};

use crate::{Result, SandboxError};

/// Most repositories one sandbox may be given.
pub const MAX_GIT_REPOS: usize = 8;

/// The environment variable holding the clone URL of the first repository in every
/// command; the others are `SANDBOX_GIT_URL_1`, `SANDBOX_GIT_URL_2`, … in the order given.
pub const GIT_URL_VAR: &str = "SANDBOX_GIT_URL";

/// The loopback port inside the sandbox the gate listens on. Fixed, so the URLs are known
/// before the sandbox starts (its label) and stay the same after a stop and start; the
/// agent binds it before any command of the sandbox runs.
pub const GATE_PORT: u16 = 7418;

/// The label listing the clone URLs without the token (what `sandbox ls --json` shows),
/// separated by spaces.
pub const LABEL_GIT_GATE: &str = "io.sandbox-rs.git-gate";

/// The names of `repos` in URLs (`http://127.0.0.1:7418/<name>.git`): each directory's
/// name without `.git`, reduced to letters, digits, `-` and `_`, made unique by its
/// position when two are alike.
pub fn url_names(repos: &[GitRepo]) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(repos.len());
    for (i, r) in repos.iter().enumerate() {
        let base = r
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let base = base.strip_suffix(".git").unwrap_or(&base);
        let mut name: String = base
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .take(64)
            .collect();
        if name.is_empty() {
            name = "repo".to_string();
        }
        if names.contains(&name) {
            name = format!("{name}-{i}");
        }
        names.push(name);
    }
    names
}

/// The clone URLs of `repos` without the token.
pub fn public_urls(repos: &[GitRepo]) -> Vec<String> {
    url_names(repos)
        .into_iter()
        .map(|n| format!("http://127.0.0.1:{GATE_PORT}/{n}.git"))
        .collect()
}

/// The variable naming the clone URL of repository `index` (0 for the first).
pub fn git_url_var(index: usize) -> String {
    if index == 0 {
        GIT_URL_VAR.to_string()
    } else {
        format!("{GIT_URL_VAR}_{index}")
    }
}

/// What the sandbox may do with a repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum GitAccess {
    /// Clone and fetch only; every push is refused.
    #[default]
    ReadOnly,
    /// Clone, fetch, and push refs under the prefix.
    ReadWrite,
}

impl GitAccess {
    /// `ro` or `rw`.
    pub fn as_str(self) -> &'static str {
        match self {
            GitAccess::ReadOnly => "ro",
            GitAccess::ReadWrite => "rw",
        }
    }
}

/// One repository of the host served to the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRepo {
    /// Host path of the repository (a work tree with `.git`, or a bare repository).
    pub path: PathBuf,
    /// What the sandbox may do with it.
    pub access: GitAccess,
    /// Refs a push may create, update or delete must start with this (it starts with
    /// `refs/` and ends with `/`). `None`: `refs/heads/sandbox/<sandbox id>/`.
    pub push_prefix: Option<String>,
}

impl GitRepo {
    /// The repository at `path` with `access` and the default prefix.
    pub fn new(path: impl Into<PathBuf>, access: GitAccess) -> Self {
        GitRepo {
            path: path.into(),
            access,
            push_prefix: None,
        }
    }

    /// Sets the push prefix.
    pub fn push_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.push_prefix = Some(prefix.into());
        self
    }

    /// The prefix in force for the sandbox `sandbox_id`.
    pub fn effective_prefix(&self, sandbox_id: &str) -> String {
        match &self.push_prefix {
            Some(p) => p.clone(),
            None => format!("refs/heads/sandbox/{sandbox_id}/"),
        }
    }

    /// Checks the prefix's shape and that `path` is a git repository (a work tree's
    /// `.git` directory or a bare repository: `HEAD`, `objects/` and `refs/`).
    pub fn validate(&self) -> Result<()> {
        if let Some(p) = &self.push_prefix {
            validate_prefix(p)?;
        }
        if git_dir(&self.path).is_none() {
            return Err(SandboxError::config(
                format!("git_repo: {} is not a git repository", self.path.display()),
                "give the path of a work tree (with .git) or of a bare repository \
                 (`git init --bare`)",
            ));
        }
        Ok(())
    }
}

/// Where git's smart-HTTP server (`git http-backend`, which the gate runs) is on this
/// host: in `git --exec-path`, else where Debian's `git` package puts it. `None` when git
/// is not installed.
pub fn http_backend() -> Option<PathBuf> {
    let exec_path = std::process::Command::new("git")
        .arg("--exec-path")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    exec_path
        .into_iter()
        .chain([PathBuf::from("/usr/lib/git-core")])
        .map(|d| d.join("git-http-backend"))
        .find(|c| c.is_file())
}

/// The git directory of the repository at `path`, if it is one.
pub fn git_dir(path: &Path) -> Option<PathBuf> {
    let is_git_dir = |d: &Path| {
        d.join("HEAD").is_file() && d.join("objects").is_dir() && d.join("refs").is_dir()
    };
    let dot = path.join(".git");
    if is_git_dir(&dot) {
        Some(dot)
    } else if is_git_dir(path) {
        Some(path.to_path_buf())
    } else {
        None
    }
}

/// A prefix is `refs/` then components `git check-ref-format` accepts, ending with `/`.
fn validate_prefix(p: &str) -> Result<()> {
    let bad = |why: &str| {
        SandboxError::config(
            format!("git_repo: push prefix {p:?} {why}"),
            "use a prefix like `refs/heads/sandbox/agent-1/` (refs/, then ref name \
             components, ending with /)",
        )
    };
    let body = p
        .strip_prefix("refs/")
        .ok_or_else(|| bad("does not start with refs/"))?;
    let body = body
        .strip_suffix('/')
        .ok_or_else(|| bad("does not end with /"))?;
    if body.is_empty() || p.len() > 200 {
        return Err(bad("names no namespace under refs/ (or is over 200 bytes)"));
    }
    for c in body.split('/') {
        if c.is_empty()
            || c.starts_with('.')
            || c.ends_with(".lock")
            || c.ends_with('.')
            || c.contains("..")
            || c.contains("@{")
            || c.chars()
                .any(|ch| ch.is_ascii_control() || " ~^:?*[\\".contains(ch) || ch == '\u{7f}')
        {
            return Err(bad(&format!("has the invalid component {c:?}")));
        }
    }
    Ok(())
}

/// Checks what can be checked of the list without the host's files: the count and each
/// prefix's shape (so a backend without the gate refuses it by capability first).
pub fn validate_options(repos: &[GitRepo]) -> Result<()> {
    if repos.len() > MAX_GIT_REPOS {
        return Err(SandboxError::config(
            format!(
                "git_repo: {} repositories given, at most {MAX_GIT_REPOS}",
                repos.len()
            ),
            "serve fewer repositories to one sandbox",
        ));
    }
    for r in repos {
        if let Some(p) = &r.push_prefix {
            validate_prefix(p)?;
        }
    }
    Ok(())
}

/// Checks the list of repositories of one create, each path included.
pub fn validate_repos(repos: &[GitRepo]) -> Result<()> {
    validate_options(repos)?;
    for r in repos {
        r.validate()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_ref_namespaces() {
        for ok in ["refs/heads/sandbox/x/", "refs/heads/a-b_c.d/"] {
            validate_prefix(ok).unwrap();
        }
        for bad in [
            "heads/x/",
            "refs/heads/x",
            "refs/",
            "refs/heads/../x/",
            "refs/heads/.x/",
            "refs/heads//x/",
            "refs/heads/x.lock/",
            "refs/heads/a b/",
            "refs/heads/a*/",
            "refs/heads/a@{1}/",
        ] {
            let e = validate_prefix(bad).unwrap_err();
            assert_eq!(e.code(), crate::ErrorCode::Configuration, "{bad}");
        }
    }

    #[test]
    fn the_default_prefix_names_the_sandbox() {
        let r = GitRepo::new("/x", GitAccess::ReadWrite);
        assert_eq!(r.effective_prefix("abc"), "refs/heads/sandbox/abc/");
        assert_eq!(git_url_var(0), "SANDBOX_GIT_URL");
        assert_eq!(git_url_var(2), "SANDBOX_GIT_URL_2");
        let repos = [
            GitRepo::new("/a/app", GitAccess::ReadOnly),
            GitRepo::new("/b/app.git", GitAccess::ReadOnly),
            GitRepo::new("/c/we ird", GitAccess::ReadOnly),
        ];
        assert_eq!(url_names(&repos), ["app", "app-1", "we-ird"]);
        assert_eq!(public_urls(&repos)[0], "http://127.0.0.1:7418/app.git");
    }

    #[test]
    fn a_directory_that_is_no_repository_is_refused() {
        let e = GitRepo::new(std::env::temp_dir(), GitAccess::ReadOnly)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("not a git repository"), "{e}");
        let many = vec![GitRepo::new("/x", GitAccess::ReadOnly); MAX_GIT_REPOS + 1];
        assert!(validate_repos(&many).is_err());
    }
}

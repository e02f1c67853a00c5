//! The bearer token of `sandbox mcp --http`: taken from the operator's environment
//! variable, or generated when the server starts (256 bits from the kernel's random
//! source) and handed to the operator through a file only they can read, which lives as
//! long as the server. Requests are checked against it in constant time. The value never
//! reaches `Debug`, an error or a log; the transport itself is in the sibling `http`.

use std::ffi::OsString;
use std::fmt;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper::header::HeaderValue;
use sandbox::SandboxError;

/// Bytes of randomness in a generated token.
const GENERATED_BYTES: usize = 32;

/// A bearer token. Its `Debug` never shows it, so it cannot reach a log by accident.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(***)")
    }
}

impl Token {
    /// The operator's own token (already trimmed and checked non-empty by the caller).
    pub fn new(value: &str) -> Token {
        Token(value.into())
    }

    /// A fresh token: 32 bytes from the kernel's CSPRNG (`/dev/urandom`, which never
    /// blocks once the pool is seeded at boot), as 64 hex digits so it fits a header as it
    /// is.
    pub fn generate() -> sandbox::Result<Token> {
        let mut bytes = [0u8; GENERATED_BYTES];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(|e| {
                SandboxError::config(
                    format!("cannot read /dev/urandom to generate the MCP bearer token: {e}"),
                    "pass --token-env NAME with a token of your own",
                )
            })?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Token(hex.into()))
    }

    /// The value, for the one place that hands it to the operator.
    pub fn reveal(&self) -> &str {
        &self.0
    }

    /// Whether an `Authorization` header carries this token. The bytes are compared in
    /// constant time, so response timing does not reveal a prefix; only whether the
    /// lengths match shows (a generated token's length is public anyway).
    pub fn admits(&self, header: Option<&HeaderValue>) -> bool {
        let Some(given) = header
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
        else {
            return false;
        };
        let (a, b) = (given.as_bytes(), self.0.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

/// The file holding a generated token: created anew with mode 0600 in a directory only
/// the operator can enter, removed when dropped (the server stopping, or failing after it
/// was written).
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
}

impl TokenFile {
    /// Writes `token` to `<dir>/mcp-<ip>-<port>.token`, `dir` being
    /// `$XDG_RUNTIME_DIR/sandbox-rs` (per user, in memory, emptied at logout), else
    /// `$XDG_CACHE_HOME/sandbox-rs`, else `$HOME/.cache/sandbox-rs`. Named after the
    /// address so a client finds it from the URL; `env` reads the environment (a parameter
    /// so the rules are testable).
    pub fn write(
        token: &Token,
        addr: SocketAddr,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> sandbox::Result<TokenFile> {
        let dir = private_dir(&env)?;
        let path = dir.join(format!("mcp-{}-{}.token", addr.ip(), addr.port()));
        let file = match create_new(&path) {
            // This server holds the address now, so a file named after it was left by one
            // that died without cleaning up (SIGKILL); the directory is private, so nobody
            // else put it there.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&path).and_then(|()| create_new(&path))
            }
            other => other,
        };
        let mut file = file.map_err(|e| cannot("create", &path, &e))?;
        // From here on the guard removes the file whatever fails.
        let written = TokenFile { path };
        file.write_all(format!("{}\n", token.reveal()).as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| cannot("write", &written.path, &e))?;
        // A directory owned by someone else could have the file swapped under us.
        let (dir_meta, file_meta) = (
            std::fs::symlink_metadata(&dir).map_err(|e| cannot("inspect", &dir, &e))?,
            file.metadata()
                .map_err(|e| cannot("inspect", &written.path, &e))?,
        );
        if dir_meta.uid() != file_meta.uid() {
            return Err(SandboxError::config(
                format!(
                    "{} belongs to another user: the generated MCP token cannot be kept there",
                    dir.display()
                ),
                "point XDG_RUNTIME_DIR at a directory of your own, or pass --token-env NAME",
            ));
        }
        Ok(written)
    }

    /// Where the token is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the MCP token file");
        }
    }
}

/// `create_new` never follows a symlink planted at the path and never reuses a file
/// someone else opened; the mode is set at creation, so there is no moment when the
/// token is readable by others.
fn create_new(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

fn cannot(what: &str, path: &Path, e: &std::io::Error) -> SandboxError {
    SandboxError::config(
        format!(
            "cannot {what} {} for the generated MCP token: {e}",
            path.display()
        ),
        "fix the directory's permissions, or pass --token-env NAME with a token of your own",
    )
}

/// The operator's private directory for runtime files, created 0700 when missing and
/// refused when others can enter it.
fn private_dir(env: &impl Fn(&str) -> Option<OsString>) -> sandbox::Result<PathBuf> {
    let absolute = |name: &str| env(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let dir = absolute("XDG_RUNTIME_DIR")
        .or_else(|| absolute("XDG_CACHE_HOME"))
        .or_else(|| absolute("HOME").map(|h| h.join(".cache")))
        .ok_or_else(|| {
            SandboxError::config(
                "no private directory for the generated MCP token: XDG_RUNTIME_DIR, XDG_CACHE_HOME and HOME are unset",
                "set XDG_RUNTIME_DIR, or pass --token-env NAME with a token of your own",
            )
        })?
        .join("sandbox-rs");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| cannot("create", &dir, &e))?;
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| cannot("inspect", &dir, &e))?;
    if !meta.is_dir() || meta.permissions().mode() & 0o077 != 0 {
        return Err(SandboxError::config(
            format!(
                "{} is not a directory only you can enter: the generated MCP token cannot be kept there",
                dir.display()
            ),
            format!("chmod 700 {}, or pass --token-env NAME", dir.display()),
        ));
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox::ErrorCode;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sbx-token-{name}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .expect("scratch");
        dir
    }

    fn runtime_dir(dir: &Path) -> impl Fn(&str) -> Option<OsString> + '_ {
        move |name| (name == "XDG_RUNTIME_DIR").then(|| dir.as_os_str().to_owned())
    }

    fn addr() -> SocketAddr {
        "127.0.0.1:8931".parse().expect("addr")
    }

    #[test]
    fn generated_tokens_are_long_distinct_and_hidden() {
        let (a, b) = (Token::generate().expect("a"), Token::generate().expect("b"));
        assert_eq!(a.reveal().len(), 2 * GENERATED_BYTES);
        assert!(a.reveal().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.reveal(), b.reveal());
        assert!(!format!("{a:?}").contains(a.reveal()));
    }

    #[test]
    fn only_the_exact_bearer_token_is_admitted() {
        let t = Token::new("s3cret-token");
        let h = |s: &'static str| HeaderValue::from_static(s);
        assert!(t.admits(Some(&h("Bearer s3cret-token"))));
        for bad in [
            "Bearer s3cret-toke",
            "Bearer s3cret-token2",
            "bearer s3cret-token",
            "Basic s3cret-token",
            "s3cret-token",
            "Bearer ",
        ] {
            assert!(!t.admits(Some(&h(bad))), "{bad}");
        }
        assert!(!t.admits(None));
    }

    #[test]
    fn the_token_file_is_private_and_removed_on_drop() {
        let dir = scratch("file");
        let t = Token::generate().expect("token");
        let f = TokenFile::write(&t, addr(), runtime_dir(&dir)).expect("write");
        assert_eq!(f.path(), dir.join("sandbox-rs/mcp-127.0.0.1-8931.token"));
        let meta = std::fs::metadata(f.path()).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let dir_mode = std::fs::metadata(dir.join("sandbox-rs"))
            .expect("dir")
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        assert_eq!(
            std::fs::read_to_string(f.path()).expect("read").trim(),
            t.reveal()
        );
        let path = f.path().to_path_buf();
        drop(f);
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_stale_file_is_replaced_and_a_planted_symlink_never_followed() {
        let dir = scratch("stale");
        let private = dir.join("sandbox-rs");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&private)
            .expect("dir");
        let victim = dir.join("victim");
        std::fs::write(&victim, "untouched").expect("victim");
        let path = private.join("mcp-127.0.0.1-8931.token");
        std::os::unix::fs::symlink(&victim, &path).expect("symlink");
        let t = Token::generate().expect("token");
        let f = TokenFile::write(&t, addr(), runtime_dir(&dir)).expect("write");
        assert!(
            !std::fs::symlink_metadata(f.path())
                .expect("meta")
                .is_symlink()
        );
        assert_eq!(
            std::fs::read_to_string(&victim).expect("victim"),
            "untouched"
        );
        drop(f);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_others_can_enter_is_refused() {
        let dir = scratch("open");
        let open = dir.join("sandbox-rs");
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&open)
            .expect("dir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let t = Token::generate().expect("token");
        let e = TokenFile::write(&t, addr(), runtime_dir(&dir)).expect_err("open dir");
        assert_eq!(e.code(), ErrorCode::Configuration);
        assert!(!e.render().contains(t.reveal()));
        assert!(!open.join("mcp-127.0.0.1-8931.token").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn without_any_home_the_operator_is_told_what_to_set() {
        let t = Token::generate().expect("token");
        let e = TokenFile::write(&t, addr(), |_| None).expect_err("no dir");
        assert_eq!(e.code(), ErrorCode::Configuration);
        assert!(e.render().contains("XDG_RUNTIME_DIR"), "{}", e.render());
    }
}

//! A wedged engine: a unix socket that accepts every connection and never answers, the
//! way a hung daemon behaves. Engine tests point an adapter at it to prove a wedged
//! engine fails fast instead of holding the caller for the full per-call bound.

use std::path::PathBuf;

use tokio::net::UnixListener;
use tokio::task::JoinHandle;

/// A listening socket that accepts and holds connections, answering nothing. Removed,
/// with its directory, when dropped.
#[derive(Debug)]
pub struct WedgedEngine {
    dir: PathBuf,
    path: PathBuf,
    accept: JoinHandle<()>,
}

impl WedgedEngine {
    /// Starts listening in a fresh private directory under the system temp directory.
    pub fn start() -> std::io::Result<WedgedEngine> {
        let dir = std::env::temp_dir().join(format!(
            "sbx-wedged-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        std::fs::create_dir(&dir)?;
        let path = dir.join("engine.sock");
        let listener = UnixListener::bind(&path)?;
        let accept = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                // Held open, never read from or written to.
                held.push(conn);
            }
        });
        Ok(WedgedEngine { dir, path, accept })
    }

    /// The endpoint to give an adapter: `unix://<socket>`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.path.display())
    }
}

impl Drop for WedgedEngine {
    fn drop(&mut self) {
        self.accept.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

//! One way of driving an engine: through sandbox-rs ("ours"), the engine crate written
//! plainly ("raw"), or the engine's CLI ("cli"). Every driver performs the same operations
//! with the same container settings, so their timings are comparable.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::Bytes;
use sandbox_core::{Sandbox, async_trait};
use serde::Serialize;

/// Which of the three implementations a measurement used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// sandbox-rs through its adapter.
    Ours,
    /// The engine crate (bollard / podman-api), called plainly.
    Raw,
    /// The engine CLI (`docker`, `podman`) as a child process.
    Cli,
}

impl Variant {
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Ours => "ours",
            Variant::Raw => "raw",
            Variant::Cli => "cli",
        }
    }

    pub fn parse(s: &str) -> Option<Variant> {
        match s {
            "ours" => Some(Variant::Ours),
            "raw" => Some(Variant::Raw),
            "cli" => Some(Variant::Cli),
            _ => None,
        }
    }
}

/// A live sandbox as a driver knows it.
#[derive(Debug)]
pub enum Handle {
    /// A sandbox-rs sandbox.
    Sandbox(Box<dyn Sandbox>),
    /// A container id (raw and CLI drivers).
    Container(String),
}

/// What the 1 MiB and 64 MiB file operations use inside the sandbox.
pub const WORKDIR: &str = "/work";
/// The streamed command: a first line at once, then a short pause before exit, so the
/// first chunk provably arrives before the process ends.
pub const STREAM_SCRIPT: &str = "echo ready; sleep 0.05";

/// The operations every driver implements.
#[async_trait]
pub trait Driver: Send + Sync {
    fn variant(&self) -> Variant;
    /// Creates a sandbox and returns once it is usable.
    async fn create(&self) -> Result<Handle>;
    /// Kills and removes it.
    async fn kill(&self, h: Handle) -> Result<()>;
    /// Runs `true` (no shell) and checks the exit code.
    async fn run_true(&self, h: &Handle) -> Result<()>;
    /// Runs `print(1)` in python3 and checks the output.
    async fn run_code(&self, h: &Handle) -> Result<()>;
    /// Whether this variant has stateful interpreter contexts (the raw engine crates and
    /// CLIs have none: there is nothing to compare a warm context with).
    fn has_contexts(&self) -> bool {
        false
    }
    /// Runs `print(1)` in the sandbox's stateful context `bench` (started by the first
    /// call, warm afterwards) and checks the output.
    async fn run_code_warm(&self, _h: &Handle) -> Result<()> {
        anyhow::bail!("{:?} has no stateful contexts", self.variant())
    }
    /// Starts `sh -c STREAM_SCRIPT`, returns the latency of its first output chunk, and
    /// drains the rest (not timed).
    async fn first_chunk(&self, h: &Handle) -> Result<Duration>;
    /// Freezes every process of the sandbox and thaws it again.
    async fn pause_resume(&self, h: &Handle) -> Result<()>;
    /// Writes `data` to `WORKDIR/<name>` and reads it back (checked).
    async fn write_read(&self, h: &Handle, name: &str, data: &Bytes) -> Result<()>;
    /// Uploads the host file `local` to `WORKDIR/<name>`.
    async fn upload(&self, h: &Handle, local: &Path, name: &str) -> Result<()>;
    /// Downloads `WORKDIR/<name>` to the host path `local` (a file).
    async fn download(&self, h: &Handle, name: &str, local: &Path) -> Result<()>;
}

/// Times a future.
pub async fn timed<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<(Duration, T)> {
    let t = Instant::now();
    let v = f.await?;
    Ok((t.elapsed(), v))
}

/// A tar archive holding one regular file `name` with `data`.
pub fn tar_one(name: &str, data: &[u8]) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::with_capacity(data.len() + 2048));
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mtime(0);
    b.append_data(&mut h, name, data)?;
    Ok(b.into_inner()?)
}

/// The contents of the first regular file in a tar archive.
pub fn untar_first(archive: &[u8]) -> Result<Vec<u8>> {
    let mut a = tar::Archive::new(archive);
    for e in a.entries()? {
        let mut e = e?;
        if e.header().entry_type().is_file() {
            let mut out = Vec::with_capacity(e.size() as usize);
            std::io::Read::read_to_end(&mut e, &mut out)?;
            return Ok(out);
        }
    }
    bail!("archive holds no regular file")
}

/// Fails unless `got` equals `want`.
pub fn check_same(got: &[u8], want: &[u8]) -> Result<()> {
    if got != want {
        bail!(
            "read back {} bytes that differ from the {} written",
            got.len(),
            want.len()
        );
    }
    Ok(())
}

/// Fails unless an exec's exit code and stdout are as expected.
pub fn check_exec(code: i64, stdout: &[u8], want_stdout: &[u8]) -> Result<()> {
    if code != 0 {
        bail!(
            "exited {code}: {}",
            String::from_utf8_lossy(stdout)
                .chars()
                .take(200)
                .collect::<String>()
        );
    }
    if stdout != want_stdout {
        bail!(
            "unexpected stdout {:?}",
            String::from_utf8_lossy(stdout)
                .chars()
                .take(200)
                .collect::<String>()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_round_trip() {
        let data: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        let t = tar_one("x.bin", &data).unwrap();
        assert_eq!(untar_first(&t).unwrap(), data);
    }

    #[test]
    fn exec_checks() {
        assert!(check_exec(0, b"1\n", b"1\n").is_ok());
        assert!(check_exec(1, b"", b"").is_err());
        assert!(check_exec(0, b"2\n", b"1\n").is_err());
    }
}

/// What every sandbox of one benchmark run is created with, whichever the driver.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Image (template).
    pub image: String,
    /// Lifetime: the main process is `sleep <lifetime>`, as in the adapters.
    pub lifetime: Duration,
    /// The run's id, in label `io.sandbox-rs.meta.bench`, so the final sweep finds every
    /// container this run (and its child processes) created.
    pub run_id: String,
}

/// The metadata key every benchmark container carries.
pub const BENCH_META_KEY: &str = "bench";

impl Spec {
    /// The options the "ours" driver creates with (defaults otherwise: 1 CPU, 512 MiB,
    /// 512 pids, network denied).
    pub fn options(&self) -> sandbox_core::CreateOptions {
        sandbox_core::CreateOptions::new(self.image.clone())
            .timeout(self.lifetime)
            .metadata(BENCH_META_KEY, self.run_id.clone())
    }

    /// The full sandbox-rs label set for a raw/CLI container (so the adapters' own sweeps
    /// and `sandbox reap` also see leftovers).
    pub fn labels(&self, backend: &str) -> std::collections::BTreeMap<String, String> {
        let deadline = sandbox_core::labels::unix_now() + self.lifetime.as_secs();
        let mut meta = std::collections::BTreeMap::new();
        meta.insert(BENCH_META_KEY.to_string(), self.run_id.clone());
        sandbox_core::labels::sandbox_labels(backend, deadline, &meta)
    }

    /// The label that marks this run's containers.
    pub fn run_label(&self) -> (String, String) {
        (
            format!(
                "{}{BENCH_META_KEY}",
                sandbox_core::labels::LABEL_META_PREFIX
            ),
            self.run_id.clone(),
        )
    }
}

/// A `Write` that sends 256 KiB chunks into a bounded channel (blocking; run it in
/// `spawn_blocking`), so a tar archive is produced while it is being sent.
pub struct ChunkSender {
    tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
    buf: Vec<u8>,
}

const STREAM_CHUNK: usize = 256 * 1024;

impl ChunkSender {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(STREAM_CHUNK),
        ));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::other("receiver dropped"))
    }
}

impl std::io::Write for ChunkSender {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= STREAM_CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// The tar archive of one host file, named `name`, as a stream produced on a blocking
/// thread (bounded memory), and the producer's handle.
pub fn tar_file_stream(
    local: &Path,
    name: &str,
) -> (
    futures::stream::BoxStream<'static, std::io::Result<Bytes>>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    use futures::StreamExt;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let (local, name) = (local.to_path_buf(), name.to_string());
    let producer = tokio::task::spawn_blocking(move || {
        let w = ChunkSender {
            tx,
            buf: Vec::with_capacity(STREAM_CHUNK),
        };
        let mut b = tar::Builder::new(w);
        b.append_path_with_name(&local, &name)?;
        let mut w = b.into_inner()?;
        std::io::Write::flush(&mut w)
    });
    (
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed(),
        producer,
    )
}

/// Writes the first regular file of a streamed tar archive to `local` (bounded memory).
pub async fn untar_stream_to_file(
    archive: futures::stream::BoxStream<'static, std::io::Result<Bytes>>,
    local: &Path,
) -> Result<()> {
    let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(archive));
    let local = local.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let mut a = tar::Archive::new(reader);
        let mut found = false;
        // To the archive's end, as any correct reader must: returning after the file
        // would stop timing before the engine has finished (and drop its response).
        for e in a.entries()? {
            let mut e = e?;
            if e.header().entry_type().is_file() && !found {
                let mut f = std::fs::File::create(&local)?;
                std::io::copy(&mut e, &mut f)?;
                found = true;
            }
        }
        if !found {
            bail!("archive holds no regular file")
        }
        Ok(())
    })
    .await?
}

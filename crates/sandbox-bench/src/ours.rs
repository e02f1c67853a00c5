//! The sandbox-rs driver: every operation through the `Backend`/`Sandbox` traits, exactly
//! as a user of the library writes it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use futures::StreamExt;
use sandbox_core::{
    Backend, CodeOptions, Command, CreateOptions, RunOptions, Sandbox, async_trait,
};

use crate::driver::{Driver, Handle, STREAM_SCRIPT, Variant, WORKDIR, check_exec, check_same};

/// Drives one backend through sandbox-rs.
pub struct Ours {
    pub backend: Arc<dyn Backend>,
    pub options: CreateOptions,
}

fn sandbox(h: &Handle) -> Result<&dyn Sandbox> {
    match h {
        Handle::Sandbox(s) => Ok(s.as_ref()),
        Handle::Container(id) => Err(anyhow!("{id} is not a sandbox-rs sandbox")),
    }
}

#[async_trait]
impl Driver for Ours {
    fn variant(&self) -> Variant {
        Variant::Ours
    }

    async fn create(&self) -> Result<Handle> {
        let s = self.backend.create(self.options.clone()).await?;
        Ok(Handle::Sandbox(s))
    }

    async fn kill(&self, h: Handle) -> Result<()> {
        sandbox(&h)?.kill().await?;
        Ok(())
    }

    async fn pause_resume(&self, h: &Handle) -> Result<()> {
        let sb = sandbox(h)?;
        sb.pause().await?;
        sb.resume().await?;
        Ok(())
    }

    async fn run_true(&self, h: &Handle) -> Result<()> {
        let r = sandbox(h)?
            .run(Command::from(vec!["true"]), RunOptions::default())
            .await?;
        check_exec(r.exit_code, &r.stdout, b"")
    }

    async fn run_code(&self, h: &Handle) -> Result<()> {
        let r = sandbox(h)?
            .run_code("print(1)", CodeOptions::default())
            .await?;
        check_exec(r.exit_code, &r.stdout, b"1\n")
    }

    fn has_contexts(&self) -> bool {
        true
    }

    async fn run_code_warm(&self, h: &Handle) -> Result<()> {
        let r = sandbox(h)?
            .run_code("print(1)", CodeOptions::default().context("bench"))
            .await?;
        check_exec(r.exit_code, &r.stdout, b"1\n")
    }

    async fn first_chunk(&self, h: &Handle) -> Result<Duration> {
        let t = Instant::now();
        let mut p = sandbox(h)?.stream(
            Command::from(vec!["sh", "-c", STREAM_SCRIPT]),
            RunOptions::default(),
        )?;
        let first = p.next().await.context("stream ended without output")??;
        let latency = t.elapsed();
        if first.data.is_empty() {
            return Err(anyhow!("empty first chunk"));
        }
        while let Some(c) = p.next().await {
            c?;
        }
        let r = p.wait().await?;
        check_exec(r.exit_code, b"", b"")?;
        Ok(latency)
    }

    async fn write_read(&self, h: &Handle, name: &str, data: &Bytes) -> Result<()> {
        let files = sandbox(h)?.files()?;
        let path = format!("{WORKDIR}/{name}");
        files.write(&path, data.clone()).await?;
        let back = files.read(&path).await?;
        check_same(&back, data)
    }

    async fn upload(&self, h: &Handle, local: &Path, name: &str) -> Result<()> {
        let files = sandbox(h)?.files()?;
        files.upload(local, &format!("{WORKDIR}/{name}")).await?;
        Ok(())
    }

    async fn download(&self, h: &Handle, name: &str, local: &Path) -> Result<()> {
        let files = sandbox(h)?.files()?;
        files.download(&format!("{WORKDIR}/{name}"), local).await?;
        Ok(())
    }
}

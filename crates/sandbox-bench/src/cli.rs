//! The CLI floor: `docker` / `podman` run as child processes, one per operation, as a user
//! scripting the engine would (`run -d`, `exec`, `cp`, `rm -f`), with the same container
//! settings as the adapters.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use sandbox_core::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::driver::{
    Driver, Handle, STREAM_SCRIPT, Spec, Variant, WORKDIR, check_exec, check_same, tar_one,
    untar_first,
};

/// Which engine CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Docker,
    Podman,
}

/// The engine's CLI.
pub struct Cli {
    pub program: PathBuf,
    pub engine: Engine,
    pub spec: Spec,
}

/// Debian's docker client at /usr/bin/docker when present (this machine also has a newer
/// one in /usr/local/bin), else whatever `PATH` finds.
pub fn find_program(engine: Engine) -> PathBuf {
    let name = match engine {
        Engine::Docker => "docker",
        Engine::Podman => "podman",
    };
    let debian = Path::new("/usr/bin").join(name);
    if debian.is_file() {
        return debian;
    }
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|c| c.is_file())
        })
        .unwrap_or_else(|| PathBuf::from(name))
}

fn container(h: &Handle) -> Result<&str> {
    match h {
        Handle::Container(id) => Ok(id),
        Handle::Sandbox(s) => Err(anyhow!("{} is not a CLI container", s.id())),
    }
}

impl Cli {
    pub fn new(engine: Engine, spec: Spec) -> Cli {
        Cli {
            program: find_program(engine),
            engine,
            spec,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.program);
        c.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if self.engine == Engine::Podman {
            // The CLI talks to the same storage as the API service; keep it quiet.
            c.env("PODMAN_IGNORE_CGROUPSV1_WARNING", "1");
        }
        c
    }

    /// Runs the CLI to completion; returns (exit code, stdout). Non-zero exits are errors
    /// unless `allow_fail`.
    async fn run(&self, args: &[&str], stdin: Option<Vec<u8>>) -> Result<(i64, Vec<u8>)> {
        let mut c = self.command(args);
        if stdin.is_some() {
            c.stdin(Stdio::piped());
        }
        let mut child = c
            .spawn()
            .with_context(|| format!("running {:?}", self.program))?;
        if let Some(data) = stdin {
            let mut w = child.stdin.take().context("no stdin")?;
            let feed = async move {
                w.write_all(&data).await?;
                w.shutdown().await
            };
            let (fed, out) = tokio::join!(feed, child.wait_with_output());
            fed?;
            let out = out?;
            return finish(args, out);
        }
        finish(args, child.wait_with_output().await?)
    }

    /// Executable version line, for the report.
    pub async fn version(&self) -> String {
        match self.run(&["--version"], None).await {
            Ok((_, out)) => format!(
                "{} ({})",
                String::from_utf8_lossy(&out).trim(),
                self.program.display()
            ),
            Err(e) => format!("unknown ({e})"),
        }
    }
}

fn finish(args: &[&str], out: std::process::Output) -> Result<(i64, Vec<u8>)> {
    let code = i64::from(out.status.code().unwrap_or(-1));
    if code != 0 {
        bail!(
            "`{}` exited {code}: {}",
            args.iter().take(2).copied().collect::<Vec<_>>().join(" "),
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .chars()
                .take(300)
                .collect::<String>()
        );
    }
    Ok((code, out.stdout))
}

#[async_trait]
impl Driver for Cli {
    fn variant(&self) -> Variant {
        Variant::Cli
    }

    async fn create(&self) -> Result<Handle> {
        let labels: Vec<String> = self
            .spec
            .labels(match self.engine {
                Engine::Docker => "docker",
                Engine::Podman => "podman",
            })
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let lifetime = self.spec.lifetime.as_secs().max(1).to_string();
        let mut args: Vec<&str> = vec![
            "run",
            "-d",
            "--rm",
            "--network",
            "none",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--pids-limit",
            "512",
            "--memory",
            "512m",
            "--memory-swap",
            "512m",
            "--cpus",
            "1",
            "--init",
            "-w",
            WORKDIR,
            "--entrypoint",
            "sleep",
        ];
        if self.engine == Engine::Docker {
            args.extend(["--runtime", "runc"]);
        }
        for l in &labels {
            args.extend(["--label", l.as_str()]);
        }
        args.extend([self.spec.image.as_str(), lifetime.as_str()]);
        let (_, out) = self.run(&args, None).await?;
        let id = String::from_utf8_lossy(&out).trim().to_string();
        if id.is_empty() {
            bail!("`run -d` printed no id");
        }
        Ok(Handle::Container(id))
    }

    async fn kill(&self, h: Handle) -> Result<()> {
        let id = container(&h)?;
        let args: &[&str] = match self.engine {
            Engine::Docker => &["rm", "-f", id],
            Engine::Podman => &["rm", "-f", "-t", "0", id],
        };
        self.run(args, None).await.map(|_| ())
    }

    async fn pause_resume(&self, h: &Handle) -> Result<()> {
        let id = container(h)?;
        for verb in ["pause", "unpause"] {
            let (code, out) = self.run(&[verb, id], None).await?;
            anyhow::ensure!(
                code == 0,
                "{verb} exited {code}: {}",
                String::from_utf8_lossy(&out)
            );
        }
        Ok(())
    }

    async fn run_true(&self, h: &Handle) -> Result<()> {
        let (code, out) = self
            .run(&["exec", "-w", WORKDIR, container(h)?, "true"], None)
            .await?;
        check_exec(code, &out, b"")
    }

    async fn run_code(&self, h: &Handle) -> Result<()> {
        let (code, out) = self
            .run(
                &[
                    "exec",
                    "-w",
                    WORKDIR,
                    container(h)?,
                    "python3",
                    "-c",
                    "print(1)",
                ],
                None,
            )
            .await?;
        check_exec(code, &out, b"1\n")
    }

    async fn first_chunk(&self, h: &Handle) -> Result<Duration> {
        let t = Instant::now();
        let mut child = self
            .command(&[
                "exec",
                "-w",
                WORKDIR,
                container(h)?,
                "sh",
                "-c",
                STREAM_SCRIPT,
            ])
            .spawn()?;
        let mut stdout = child.stdout.take().context("no stdout")?;
        let mut buf = [0u8; 256];
        let n = stdout.read(&mut buf).await?;
        let latency = t.elapsed();
        if n == 0 {
            bail!("no output");
        }
        let mut rest = Vec::new();
        stdout.read_to_end(&mut rest).await?;
        let status = child.wait().await?;
        if !status.success() {
            bail!("streamed exec exited {status}");
        }
        Ok(latency)
    }

    async fn write_read(&self, h: &Handle, name: &str, data: &Bytes) -> Result<()> {
        let id = container(h)?;
        let tar = tar_one(name, data)?;
        let dest = format!("{id}:{WORKDIR}");
        self.run(&["cp", "-", &dest], Some(tar)).await?;
        let src = format!("{id}:{WORKDIR}/{name}");
        let (_, archive) = self.run(&["cp", &src, "-"], None).await?;
        check_same(&untar_first(&archive)?, data)
    }

    async fn upload(&self, h: &Handle, local: &Path, name: &str) -> Result<()> {
        let dest = format!("{}:{WORKDIR}/{name}", container(h)?);
        let local = local.to_string_lossy();
        self.run(&["cp", &local, &dest], None).await.map(|_| ())
    }

    async fn download(&self, h: &Handle, name: &str, local: &Path) -> Result<()> {
        let src = format!("{}:{WORKDIR}/{name}", container(h)?);
        let local = local.to_string_lossy();
        self.run(&["cp", &src, &local], None).await.map(|_| ())
    }
}

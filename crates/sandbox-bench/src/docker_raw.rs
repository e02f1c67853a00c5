//! The Docker floor: bollard calls written plainly, with the adapter's container settings
//! (network none, cap_drop ALL, no-new-privileges, pids, memory == memory+swap, CPU quota,
//! init, auto-remove, labels) and the adapter's readiness condition (started; `/work` is
//! the container's working directory, which the engine creates).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    DownloadFromContainerOptions, ListContainersOptions, RemoveContainerOptions,
    UploadToContainerOptions,
};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use sandbox_core::async_trait;

use crate::driver::{
    Driver, Handle, STREAM_SCRIPT, Spec, Variant, WORKDIR, check_exec, check_same, tar_file_stream,
    tar_one, untar_first, untar_stream_to_file,
};

/// bollard, plainly.
pub struct DockerRaw {
    pub client: Docker,
    pub spec: Spec,
}

impl DockerRaw {
    /// Connects like the adapter does (`DOCKER_HOST` or the default socket, negotiated).
    pub async fn connect(spec: Spec) -> Result<DockerRaw> {
        let client = Docker::connect_with_defaults()?.negotiate_version().await?;
        Ok(DockerRaw { client, spec })
    }

    fn body(&self) -> ContainerCreateBody {
        let memory: i64 = 512 * 1024 * 1024;
        ContainerCreateBody {
            image: Some(self.spec.image.clone()),
            entrypoint: Some(vec!["sleep".into()]),
            cmd: Some(vec![format!("{:.3}", self.spec.lifetime.as_secs_f64())]),
            working_dir: Some(WORKDIR.into()),
            labels: Some(self.spec.labels("docker").into_iter().collect()),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                pids_limit: Some(512),
                memory: Some(memory),
                memory_swap: Some(memory),
                nano_cpus: Some(1_000_000_000),
                init: Some(true),
                auto_remove: Some(true),
                runtime: Some("runc".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// create_exec + start_exec (attached, output collected) + inspect until not running.
    pub(crate) async fn exec(&self, id: &str, argv: &[&str]) -> Result<(i64, Vec<u8>)> {
        let exec = self
            .client
            .create_exec(
                id,
                CreateExecOptions {
                    cmd: Some(argv.to_vec()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    working_dir: Some(WORKDIR),
                    ..Default::default()
                },
            )
            .await?;
        let mut stdout = Vec::new();
        match self.client.start_exec(&exec.id, None).await? {
            StartExecResults::Attached { mut output, .. } => {
                while let Some(m) = output.next().await {
                    if let LogOutput::StdOut { message } = m? {
                        stdout.extend_from_slice(&message);
                    }
                }
            }
            StartExecResults::Detached => bail!("exec started detached"),
        }
        let code = self.exit_code(&exec.id).await?;
        Ok((code, stdout))
    }

    async fn exit_code(&self, exec_id: &str) -> Result<i64> {
        loop {
            let i = self.client.inspect_exec(exec_id).await?;
            if i.running != Some(true) {
                return i.exit_code.context("exec inspect has no exit code");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Force-removes every container carrying this run's label; returns how many.
    pub async fn sweep(&self) -> Result<usize> {
        let (k, v) = self.spec.run_label();
        let mut filters = HashMap::new();
        filters.insert("label".to_string(), vec![format!("{k}={v}")]);
        let list = self
            .client
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await?;
        let mut n = 0;
        for c in list {
            if let Some(id) = c.id
                && remove(&self.client, &id).await.is_ok()
            {
                n += 1;
            }
        }
        Ok(n)
    }

    /// The engine's version string.
    pub async fn engine_version(&self) -> String {
        match self.client.version().await {
            Ok(v) => format!(
                "Docker Engine {} (API {})",
                v.version.unwrap_or_default(),
                v.api_version.unwrap_or_default()
            ),
            Err(e) => format!("unknown ({e})"),
        }
    }
}

async fn remove(client: &Docker, id: &str) -> Result<()> {
    let opts = RemoveContainerOptions {
        force: true,
        ..Default::default()
    };
    match client.remove_container(id, Some(opts)).await {
        Ok(()) => Ok(()),
        // Auto-remove may win the race: already gone is fine.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404 | 409,
            ..
        }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn container(h: &Handle) -> Result<&str> {
    match h {
        Handle::Container(id) => Ok(id),
        Handle::Sandbox(s) => Err(anyhow!("{} is not a raw container", s.id())),
    }
}

#[async_trait]
impl Driver for DockerRaw {
    fn variant(&self) -> Variant {
        Variant::Raw
    }

    async fn create(&self) -> Result<Handle> {
        let created = self.client.create_container(None, self.body()).await?;
        if let Err(e) = self.client.start_container(&created.id, None).await {
            let _ = remove(&self.client, &created.id).await;
            return Err(e.into());
        }
        Ok(Handle::Container(created.id))
    }

    async fn kill(&self, h: Handle) -> Result<()> {
        remove(&self.client, container(&h)?).await
    }

    async fn pause_resume(&self, h: &Handle) -> Result<()> {
        let id = container(h)?;
        self.client.pause_container(id).await?;
        self.client.unpause_container(id).await?;
        Ok(())
    }

    async fn run_true(&self, h: &Handle) -> Result<()> {
        let (code, out) = self.exec(container(h)?, &["true"]).await?;
        check_exec(code, &out, b"")
    }

    async fn run_code(&self, h: &Handle) -> Result<()> {
        let (code, out) = self
            .exec(container(h)?, &["python3", "-c", "print(1)"])
            .await?;
        check_exec(code, &out, b"1\n")
    }

    async fn first_chunk(&self, h: &Handle) -> Result<Duration> {
        let id = container(h)?;
        let t = Instant::now();
        let exec = self
            .client
            .create_exec(
                id,
                CreateExecOptions {
                    cmd: Some(vec!["sh", "-c", STREAM_SCRIPT]),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    working_dir: Some(WORKDIR),
                    ..Default::default()
                },
            )
            .await?;
        let StartExecResults::Attached { mut output, .. } =
            self.client.start_exec(&exec.id, None).await?
        else {
            bail!("exec started detached");
        };
        output.next().await.context("no output")??;
        let latency = t.elapsed();
        while let Some(m) = output.next().await {
            m?;
        }
        let code = self.exit_code(&exec.id).await?;
        check_exec(code, b"", b"")?;
        Ok(latency)
    }

    async fn write_read(&self, h: &Handle, name: &str, data: &Bytes) -> Result<()> {
        let id = container(h)?;
        let tar = tar_one(name, data)?;
        self.client
            .upload_to_container(
                id,
                Some(UploadToContainerOptions {
                    path: WORKDIR.into(),
                    ..Default::default()
                }),
                bollard::body_full(tar.into()),
            )
            .await?;
        let archive: Vec<Bytes> = self
            .client
            .download_from_container(
                id,
                Some(DownloadFromContainerOptions {
                    path: format!("{WORKDIR}/{name}"),
                }),
            )
            .try_collect()
            .await?;
        check_same(&untar_first(&archive.concat())?, data)
    }

    /// Streamed upload: the tar archive produced while it is sent (bounded memory).
    async fn upload(&self, h: &Handle, local: &Path, name: &str) -> Result<()> {
        let (body, producer) = tar_file_stream(local, name);
        let sent = self
            .client
            .upload_to_container(
                container(h)?,
                Some(UploadToContainerOptions {
                    path: WORKDIR.into(),
                    ..Default::default()
                }),
                bollard::body_try_stream(body),
            )
            .await;
        producer.await??;
        sent?;
        Ok(())
    }

    /// Streamed download: the archive unpacked while it arrives (bounded memory).
    async fn download(&self, h: &Handle, name: &str, local: &Path) -> Result<()> {
        let stream = self
            .client
            .download_from_container(
                container(h)?,
                Some(DownloadFromContainerOptions {
                    path: format!("{WORKDIR}/{name}"),
                }),
            )
            .map_err(std::io::Error::other)
            .boxed();
        untar_stream_to_file(stream, local).await
    }
}

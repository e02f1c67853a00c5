//! The Podman floor: podman-api calls written plainly, with the adapter's container
//! settings (network none, cap_drop ALL, pids, memory == memory+swap, CPU quota, init,
//! remove-on-exit, create_working_dir, labels) and its readiness condition (started).
//!
//! One known difference: podman-api 0.11 can only send `no_new_privilages` (sic), which
//! Podman ignores, so the plain floor runs without no-new-privileges while the adapter
//! patches the spec to apply it. The flag costs nothing measurable at create.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use podman_api::Podman;
use podman_api::api::Exec;
use podman_api::conn::TtyChunk;
use podman_api::models;
use podman_api::opts::{
    ContainerCreateOpts, ContainerDeleteOpts, ContainerListFilter, ContainerListOpts,
    ExecCreateOpts,
};
use sandbox_core::async_trait;

use crate::driver::{
    Driver, Handle, STREAM_SCRIPT, Spec, Variant, WORKDIR, check_exec, check_same, tar_file_stream,
    tar_one, untar_first, untar_stream_to_file,
};

/// podman-api, plainly.
pub struct PodmanRaw {
    pub client: Podman,
    pub spec: Spec,
}

/// The endpoint the adapter uses: `CONTAINER_HOST`, else the default socket.
pub fn endpoint() -> String {
    std::env::var(sandbox_podman::ENDPOINT_ENV)
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| sandbox_podman::DEFAULT_ENDPOINT.to_string())
}

fn container(h: &Handle) -> Result<&str> {
    match h {
        Handle::Container(id) => Ok(id),
        Handle::Sandbox(s) => Err(anyhow!("{} is not a raw container", s.id())),
    }
}

impl PodmanRaw {
    pub fn connect(spec: Spec) -> Result<PodmanRaw> {
        Ok(PodmanRaw {
            client: Podman::new(endpoint())?,
            spec,
        })
    }

    fn create_opts(&self) -> ContainerCreateOpts {
        let memory: i64 = 512 * 1024 * 1024;
        let resources = models::LinuxResources {
            block_io: None,
            cpu: Some(models::LinuxCpu {
                cpus: None,
                mems: None,
                period: Some(100_000),
                quota: Some(100_000),
                realtime_period: None,
                realtime_runtime: None,
                shares: None,
            }),
            devices: None,
            hugepage_limits: None,
            memory: Some(models::LinuxMemory {
                disable_oom_killer: None,
                kernel: None,
                kernel_tcp: None,
                limit: Some(memory),
                reservation: None,
                swap: Some(memory),
                swappiness: None,
                use_hierarchy: None,
            }),
            network: None,
            pids: Some(models::LinuxPids { limit: Some(512) }),
            rdma: None,
            unified: None,
        };
        ContainerCreateOpts::builder()
            .image(&self.spec.image)
            .command([
                "sleep".to_string(),
                self.spec.lifetime.as_secs().max(1).to_string(),
            ])
            .init(true)
            .labels(self.spec.labels("podman"))
            .work_dir(WORKDIR)
            .create_working_dir(true)
            .remove(true)
            .drop_capabilities(["ALL"])
            .no_new_privilages(true)
            .net_namespace(models::Namespace {
                nsmode: Some("none".into()),
                value: None,
            })
            .resource_limits(resources)
            .stop_timeout(1u64)
            .build()
    }

    /// create_exec + start (attached, output collected) + inspect until not running.
    pub(crate) async fn exec(&self, id: &str, argv: &[&str]) -> Result<(i64, Vec<u8>)> {
        let c = self.client.containers().get(id);
        let exec = c
            .create_exec(
                &ExecCreateOpts::builder()
                    .command(argv.iter().map(|s| s.to_string()))
                    .attach_stdout(true)
                    .attach_stderr(true)
                    .working_dir(WORKDIR)
                    .build(),
            )
            .await?;
        let mut stdout = Vec::new();
        {
            let opts = Default::default();
            let mux = exec.start(&opts).await?.context("no exec stream")?;
            let (mut reader, _writer) = mux.split();
            while let Some(chunk) = reader.next().await {
                if let TtyChunk::StdOut(v) = chunk? {
                    stdout.extend_from_slice(&v);
                }
            }
        }
        let code = exit_code(&exec).await?;
        Ok((code, stdout))
    }

    /// Force-removes every container carrying this run's label; returns how many.
    pub async fn sweep(&self) -> Result<usize> {
        let (k, v) = self.spec.run_label();
        let list = self
            .client
            .containers()
            .list(
                &ContainerListOpts::builder()
                    .all(true)
                    .filter([ContainerListFilter::LabelKeyVal(k, v)])
                    .build(),
            )
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
                "Podman {} (API {})",
                v.version.unwrap_or_default(),
                v.api_version.unwrap_or_default()
            ),
            Err(e) => format!("unknown ({e})"),
        }
    }
}

async fn exit_code(exec: &Exec) -> Result<i64> {
    loop {
        let v = exec.inspect().await?;
        if v.get("Running").and_then(|r| r.as_bool()) == Some(false) {
            return v
                .get("ExitCode")
                .and_then(|c| c.as_i64())
                .context("exec inspect has no ExitCode");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn remove(client: &Podman, id: &str) -> Result<()> {
    let opts = ContainerDeleteOpts::builder()
        .force(true)
        .timeout(0)
        .build();
    match client.containers().get(id).delete(&opts).await {
        Ok(()) => Ok(()),
        Err(e) if e.to_string().contains("no such container") => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[async_trait]
impl Driver for PodmanRaw {
    fn variant(&self) -> Variant {
        Variant::Raw
    }

    async fn create(&self) -> Result<Handle> {
        let created = self.client.containers().create(&self.create_opts()).await?;
        if let Err(e) = self.client.containers().get(&created.id).start(None).await {
            let _ = remove(&self.client, &created.id).await;
            return Err(e.into());
        }
        Ok(Handle::Container(created.id))
    }

    async fn kill(&self, h: Handle) -> Result<()> {
        remove(&self.client, container(&h)?).await
    }

    async fn pause_resume(&self, h: &Handle) -> Result<()> {
        let c = self.client.containers().get(container(h)?);
        c.pause().await?;
        c.unpause().await?;
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
        let c = self.client.containers().get(container(h)?);
        let t = Instant::now();
        let exec = c
            .create_exec(
                &ExecCreateOpts::builder()
                    .command(["sh", "-c", STREAM_SCRIPT])
                    .attach_stdout(true)
                    .attach_stderr(true)
                    .working_dir(WORKDIR)
                    .build(),
            )
            .await?;
        let latency = {
            let opts = Default::default();
            let mux = exec.start(&opts).await?.context("no exec stream")?;
            let (mut reader, _writer) = mux.split();
            reader.next().await.context("no output")??;
            let latency = t.elapsed();
            while let Some(c) = reader.next().await {
                c?;
            }
            latency
        };
        let code = exit_code(&exec).await?;
        check_exec(code, b"", b"")?;
        Ok(latency)
    }

    async fn write_read(&self, h: &Handle, name: &str, data: &Bytes) -> Result<()> {
        let c = self.client.containers().get(container(h)?);
        let tar = tar_one(name, data)?;
        c.copy_to(WORKDIR, tar.into()).await?;
        let path = format!("{WORKDIR}/{name}");
        let archive: Vec<Vec<u8>> = c.copy_from(&path).try_collect().await?;
        check_same(&untar_first(&archive.concat())?, data)
    }

    /// Streamed upload: the tar archive produced while it is sent (bounded memory).
    async fn upload(&self, h: &Handle, local: &Path, name: &str) -> Result<()> {
        let c = self.client.containers().get(container(h)?);
        let (body, producer) = tar_file_stream(local, name);
        let sent = c.copy_to(WORKDIR, hyper::Body::wrap_stream(body)).await;
        producer.await??;
        sent?;
        Ok(())
    }

    /// Streamed download: the archive unpacked while it arrives (bounded memory).
    async fn download(&self, h: &Handle, name: &str, local: &Path) -> Result<()> {
        let id = container(h)?.to_string();
        let client = self.client.clone();
        let path = format!("{WORKDIR}/{name}");
        // copy_from borrows its container handle: pump it from a task into a channel.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
        let pump = tokio::spawn(async move {
            let c = client.containers().get(&id);
            let mut s = c.copy_from(&path).boxed();
            while let Some(chunk) = s.next().await {
                let item = chunk.map(Bytes::from).map_err(std::io::Error::other);
                if tx.send(item).await.is_err() {
                    break;
                }
            }
        });
        let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed();
        let r = untar_stream_to_file(stream, local).await;
        let _ = pump.await;
        r
    }
}

//! The volumes an image declares (`VOLUME`), read from the engine and vetted before a
//! disk-limited create. Each becomes one of the spec's scratch paths, a sized RAM-backed
//! filesystem: left to the engine, it would be an anonymous volume on the engine's own
//! disk, which no limit bounds.

use sandbox_core::{Result, SandboxError};

use crate::AGENT_PATH;
use crate::engine::{ContainerEngine, EngineErrorKind};
use crate::error;
use crate::provision::backend::ContainerBackend;
use crate::spec::mounts::normalize_target;

/// At most this many declared volumes under a disk limit: each is one more mount, and one
/// more `disk_mb` a sandbox may fill (of its memory). An image declaring more is refused
/// rather than a create that mounts hundreds of filesystems.
pub const MAX_IMAGE_VOLUMES: usize = 32;

impl<E: ContainerEngine> ContainerBackend<E> {
    /// The volumes `image` declares, vetted ([`vet`]). An engine that cannot say is
    /// refused: a volume it then created would sit on its disk, outside `disk_mb`.
    pub(super) async fn image_volumes(&self, image: &str) -> Result<Vec<String>> {
        let eng = &*self.engine;
        match self.call("image volumes", eng.image_volumes(image)).await {
            Ok(declared) => vet(image, declared),
            Err(e) if e.kind == EngineErrorKind::InvalidRequest => Err(SandboxError::config(
                format!(
                    "resources.disk_mb cannot keep the volumes image `{image}` may declare off \
                     the engine's disk: {}",
                    error::bounded_text(&e.message)
                ),
                "leave disk_mb unset on this engine, or implement ContainerEngine::image_volumes \
                 in its adapter",
            )
            .with_source(e)),
            Err(e) => Err(error::on_create(eng, image, "inspect image volumes", e)),
        }
    }
}

/// The declared volumes, normalised as the engines clean them (`/data/` → `/data`),
/// sorted, each once. Refused, naming the volumes and the fix, when one cannot be a
/// scratch filesystem (relative, `.` or `..` in it, covering `/`, `/proc`, `/sys`, `/dev`
/// or the agent's path), or when there are more than [`MAX_IMAGE_VOLUMES`].
pub(crate) fn vet(image: &str, declared: Vec<String>) -> Result<Vec<String>> {
    let shown = |v: &[String]| {
        let mut s: Vec<String> = v
            .iter()
            .take(8)
            .map(|p| format!("{:?}", p.chars().take(128).collect::<String>()))
            .collect();
        if v.len() > 8 {
            s.push(format!("and {} more", v.len() - 8));
        }
        s.join(", ")
    };
    let fix = "use an image without these VOLUME declarations (build one FROM it), or leave \
               disk_mb unset (the volumes then live on the engine's disk, unlimited)";
    let mut volumes = Vec::with_capacity(declared.len());
    let mut refused = Vec::new();
    for v in declared {
        match normalize_target(&v) {
            Some(p) if !covers_agent(&p) => volumes.push(p),
            _ => refused.push(v),
        }
    }
    if !refused.is_empty() {
        return Err(SandboxError::config(
            format!(
                "image `{image}` declares volumes that resources.disk_mb cannot replace with a \
                 bounded scratch filesystem: {}",
                shown(&refused)
            ),
            fix,
        ));
    }
    volumes.sort_unstable();
    volumes.dedup();
    if volumes.len() > MAX_IMAGE_VOLUMES {
        return Err(SandboxError::config(
            format!(
                "image `{image}` declares {} volumes, more than the {MAX_IMAGE_VOLUMES} \
                 resources.disk_mb mounts a scratch filesystem for: {}",
                volumes.len(),
                shown(&volumes)
            ),
            fix,
        ));
    }
    Ok(volumes)
}

/// Whether a scratch filesystem at `path` would cover the agent binary.
fn covers_agent(path: &str) -> bool {
    path == AGENT_PATH || path.starts_with(&format!("{AGENT_PATH}/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use sandbox_core::{Capability, CreateOptions, ErrorCode, IsolationTier, Resources};

    use crate::engine::{EngineError, EngineFacts, EngineResult};
    use crate::{
        ArchiveBody, ContainerConfig, ContainerInfo, ContainerSpec, ExecRequest, ExecState,
        ExecStream, PathStat,
    };

    /// An engine whose image declares `volumes` (`None`: the trait's default, it cannot
    /// say). It records each spec it is asked to create and refuses it, so a create ends
    /// there.
    #[derive(Debug, Default)]
    struct Declaring {
        volumes: Option<Vec<String>>,
        created: Mutex<Vec<ContainerSpec>>,
    }

    fn no<T>() -> EngineResult<T> {
        Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
    }

    #[async_trait::async_trait]
    impl ContainerEngine for Declaring {
        fn backend(&self) -> &'static str {
            "declaring"
        }
        fn tier(&self) -> IsolationTier {
            IsolationTier::Container
        }
        fn capabilities(&self) -> Capability {
            Capability::all()
        }
        fn endpoint(&self) -> &str {
            "memory://declaring"
        }
        async fn image_volumes(&self, image: &str) -> EngineResult<Vec<String>> {
            match &self.volumes {
                Some(v) => Ok(v.clone()),
                None => Err(EngineError::new(
                    EngineErrorKind::InvalidRequest,
                    format!("cannot read {image}"),
                )),
            }
        }
        async fn create(&self, spec: &ContainerSpec) -> EngineResult<String> {
            self.created.lock().unwrap().push(spec.clone());
            Err(EngineError::new(EngineErrorKind::InvalidRequest, "refused"))
        }
        async fn start(&self, _: &str) -> EngineResult<()> {
            no()
        }
        async fn inspect(&self, _: &str) -> EngineResult<ContainerInfo> {
            no()
        }
        async fn remove(&self, _: &str) -> EngineResult<bool> {
            Ok(false)
        }
        async fn list(
            &self,
            _: &std::collections::BTreeMap<String, String>,
        ) -> EngineResult<Vec<ContainerInfo>> {
            Ok(Vec::new())
        }
        async fn exec(&self, _: &str, _: ExecRequest) -> EngineResult<ExecStream> {
            no()
        }
        async fn exec_state(&self, _: &str) -> EngineResult<ExecState> {
            no()
        }
        async fn put_archive(&self, _: &str, _: &str, _: ArchiveBody) -> EngineResult<()> {
            no()
        }
        async fn get_archive(&self, _: &str, _: &str) -> EngineResult<ArchiveBody> {
            no()
        }
        async fn stat_path(&self, _: &str, _: &str) -> EngineResult<PathStat> {
            no()
        }
        async fn ping(&self) -> EngineResult<()> {
            Ok(())
        }
        async fn facts(&self) -> EngineFacts {
            EngineFacts::default()
        }
    }

    async fn create(engine: Declaring, disk_mb: Option<u64>) -> (SandboxError, Vec<ContainerSpec>) {
        let b =
            ContainerBackend::new(engine, ContainerConfig::new("img").startup_sweep(false)).await;
        let mut r = Resources::default();
        if let Some(mb) = disk_mb {
            r = r.disk_mb(mb);
        }
        let e = b
            .create_container(CreateOptions::new("img").workdir("/work").resources(r))
            .await
            .expect_err("the engine refuses every create");
        let created = b.engine().created.lock().unwrap().clone();
        (e, created)
    }

    /// An image's `VOLUME` reaches the engine as bounded scratch under a disk limit, and
    /// not at all without one (the engine keeps its default).
    #[tokio::test]
    async fn a_disk_limited_create_mounts_scratch_at_each_declared_volume() {
        let declaring = || Declaring {
            volumes: Some(v(&["/var/lib/db/", "/data"])),
            ..Default::default()
        };
        let (_, created) = create(declaring(), Some(8)).await;
        let spec = created.last().expect("a create reached the engine");
        assert_eq!(spec.image_volumes, ["/data", "/var/lib/db"]);
        assert_eq!(
            spec.scratch_paths(),
            ["/work", "/tmp", "/data", "/var/lib/db"]
        );
        let (_, created) = create(declaring(), None).await;
        assert!(created.iter().all(|s| s.image_volumes.is_empty()));
    }

    /// An engine that cannot say which volumes an image declares cannot keep them off its
    /// disk: a disk-limited create is refused before anything is created.
    #[tokio::test]
    async fn an_engine_that_cannot_read_volumes_refuses_a_disk_limit() {
        let (e, created) = create(Declaring::default(), Some(8)).await;
        assert_eq!(e.code(), ErrorCode::Configuration, "{}", e.render());
        assert!(e.to_string().contains("disk_mb"), "{e}");
        assert!(e.hint().contains("image_volumes"), "{}", e.hint());
        assert!(created.is_empty(), "refused before any create");
        let (e, created) = create(Declaring::default(), None).await;
        assert_ne!(
            e.code(),
            ErrorCode::Configuration,
            "no disk limit: not asked"
        );
        assert!(!created.is_empty());
    }

    /// A hostile image's volume list is refused before anything is created.
    #[tokio::test]
    async fn a_volume_over_the_proc_filesystem_is_refused_before_create() {
        let engine = Declaring {
            volumes: Some(v(&["/proc/sys"])),
            ..Default::default()
        };
        let (e, created) = create(engine, Some(8)).await;
        assert_eq!(e.code(), ErrorCode::Configuration, "{}", e.render());
        assert!(created.is_empty());
    }

    fn v(paths: &[&str]) -> Vec<String> {
        paths.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn declared_volumes_are_normalised_sorted_and_once() {
        let got = vet("img", v(&["/var/lib/db/", "//data", "/data", "/tmp"])).unwrap();
        assert_eq!(got, ["/data", "/tmp", "/var/lib/db"]);
        assert!(vet("img", Vec::new()).unwrap().is_empty());
    }

    /// A hostile image's volume list: each entry that cannot be a scratch filesystem
    /// refuses the create with the volumes named, never a mount at a kernel interface, at
    /// `/` or over the agent.
    #[test]
    fn volumes_that_cannot_be_scratch_are_refused_by_name() {
        for bad in [
            "/",
            "data",
            "/proc",
            "/sys/fs",
            "/dev/shm",
            "/work/../etc",
            "/a/./b",
            "/.sandbox-agent",
            "/a,b",
            "/a\nb",
        ] {
            let e = vet("evil", v(&["/ok", bad])).unwrap_err();
            assert_eq!(e.code(), ErrorCode::Configuration, "{bad:?}");
            let msg = e.to_string();
            assert!(
                msg.contains("evil") && msg.contains(&format!("{bad:?}")),
                "{msg}"
            );
            assert!(
                !msg.contains("\"/ok\""),
                "only the refused ones are named: {msg}"
            );
            assert!(e.hint().contains("disk_mb"), "{}", e.hint());
        }
    }

    #[test]
    fn too_many_volumes_are_refused() {
        let many: Vec<String> = (0..=MAX_IMAGE_VOLUMES).map(|i| format!("/v{i}")).collect();
        let e = vet("img", many.clone()).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Configuration);
        assert!(e.to_string().contains("and 25 more"), "{e}");
        assert_eq!(
            vet("img", many[1..].to_vec()).unwrap().len(),
            MAX_IMAGE_VOLUMES
        );
    }
}

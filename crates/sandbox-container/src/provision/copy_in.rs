//! The sealed copy-in of [`MountMode::Copy`](crate::spec::mounts::MountMode::Copy) mounts: the
//! host tree lands at its sandbox target in a created container, before it starts, through
//! the engine's archive upload; missing parents become directories, existing ones keep
//! their modes, and no bind mount is left behind.

use std::path::{Path, PathBuf};

use crate::files::tar_stream::{CHUNKS_IN_FLIGHT, ChannelWriter};
use bytes::Bytes;
use tokio::sync::mpsc;

use crate::engine::{ArchiveBody, ContainerEngine, EngineError, EngineErrorKind, EngineResult};
use crate::spec::mounts::Mount;

/// Injects `mount`'s host tree into the created (not started) container `id`. Host path
/// and target are vetted again here, so the upload never carries a path other than the
/// one checked.
pub async fn copy_in<E: ContainerEngine + ?Sized>(
    engine: &E,
    id: &str,
    mount: &Mount,
) -> EngineResult<()> {
    let refused = |e: sandbox_core::SandboxError| {
        EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("copy mount: {e}; {}", e.hint()),
        )
        .with_source(e)
    };
    let host = mount.resolved_host().map_err(refused)?;
    let target = mount.normalized_target().map_err(refused)?;
    // Deepest existing ancestor: only missing components get directory entries, so
    // existing directories keep their modes.
    let mut missing: Vec<String> = Vec::new();
    let mut anchor = target;
    loop {
        match engine
            .stat_path(id, if anchor.is_empty() { "/" } else { &anchor })
            .await
        {
            Ok(_) => break,
            Err(e) if e.kind == EngineErrorKind::NotFound && !anchor.is_empty() => {}
            Err(e) => return Err(e),
        }
        let Some((parent, name)) = anchor.rsplit_once('/') else {
            break;
        };
        missing.insert(0, name.to_string());
        anchor = parent.to_string();
    }
    let anchor = if anchor.is_empty() {
        "/".into()
    } else {
        anchor
    };
    engine.put_archive(id, &anchor, tar_of(host, missing)).await
}

/// The archive to extract at the deepest existing ancestor of the target: a directory
/// entry (mode 0755) for each `missing` component but the last of a file, then the host
/// tree's *contents* (a directory) or the file itself, named by the last component.
///
/// Built on a blocking thread through a bounded channel (bounded memory for any tree).
/// Symlinks are copied as links, never followed. A host read error poisons the stream, so
/// the engine sees a broken upload instead of accepting a truncated tree as complete.
fn tar_of(host: PathBuf, missing: Vec<String>) -> ArchiveBody {
    let (tx, mut rx) = mpsc::channel::<std::io::Result<Bytes>>(CHUNKS_IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        let mut b = tar::Builder::new(ChannelWriter::new(tx));
        b.follow_symlinks(false);
        match append(&mut b, &host, &missing) {
            Ok(()) => {
                if let Ok(mut w) = b.into_inner() {
                    let _ = std::io::Write::flush(&mut w);
                }
            }
            Err(e) => b.get_mut().fail(e),
        }
    });
    Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

fn append(
    b: &mut tar::Builder<ChannelWriter>,
    host: &Path,
    missing: &[String],
) -> std::io::Result<()> {
    let host_is_dir = std::fs::symlink_metadata(host)?.is_dir();
    let dirs = if host_is_dir {
        missing.len()
    } else {
        missing.len().saturating_sub(1)
    };
    let mut prefix = PathBuf::new();
    for name in missing.iter().take(dirs) {
        prefix.push(name);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_mtime(sandbox_core::labels::unix_now());
        b.append_data(&mut h, &prefix, std::io::empty())?;
    }
    if host_is_dir {
        let at = if prefix.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            prefix
        };
        return b.append_dir_all(at, host);
    }
    let Some(name) = missing.last() else {
        return Err(std::io::Error::other(
            "the target of a file copy mount already exists in the image",
        ));
    };
    prefix.push(name);
    let mut f = std::fs::File::open(host)?;
    b.append_file(&prefix, &mut f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    async fn entries(body: ArchiveBody) -> Vec<(String, tar::EntryType)> {
        let chunks: Vec<_> = body.collect().await;
        let mut data = Vec::new();
        for c in chunks {
            data.extend_from_slice(&c.unwrap());
        }
        let mut a = tar::Archive::new(&data[..]);
        a.entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path()
                        .unwrap()
                        .to_string_lossy()
                        .trim_end_matches('/')
                        .to_string(),
                    e.header().entry_type(),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn missing_parents_become_directories_and_contents_land_at_the_target() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("inner")).unwrap();
        std::fs::write(d.path().join("inner/f"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("link")).unwrap();
        let e = entries(tar_of(d.path().into(), vec!["deep".into(), "seed".into()])).await;
        let names: Vec<&str> = e.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.starts_with(&["deep", "deep/seed"]), "{names:?}");
        assert!(names.contains(&"deep/seed/inner/f"));
        let link = e.iter().find(|(n, _)| n == "deep/seed/link").unwrap();
        assert_eq!(link.1, tar::EntryType::Symlink, "links are never followed");
    }

    #[tokio::test]
    async fn a_file_onto_an_existing_path_poisons_the_stream() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let items: Vec<_> = tar_of(f, vec![]).collect().await;
        assert!(items.iter().any(|i| i.is_err()));
    }
}

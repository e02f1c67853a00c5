//! Contract trials: `Sandbox::files` (round trips, relative paths, directory operations,
//! typed errors, host isolation, large streamed transfers, directory trees, tar escapes).

use std::hash::Hasher;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, ErrorCode, FileSystem};

use crate::ctx::{Ctx, Need, Sbx, must_code, run, run_ok, sbx, token};

const AREA: &str = "files";

/// Size of the large-transfer file.
pub const LARGE_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Allowed growth of this process's resident memory while transferring it.
pub const LARGE_FILE_RSS_BOUND: u64 = 32 * 1024 * 1024;

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let f = Need::Cap(C::FILESYSTEM);
    let fr = Need::Cap(C::FILESYSTEM | C::RUN_COMMAND);
    let ud = Need::Cap(C::FILESYSTEM | C::UPLOAD_DOWNLOAD);
    vec![
        ctx.trial(AREA, "text_round_trip", &[f], text_round_trip),
        ctx.trial(
            AREA,
            "binary_round_trip_all_bytes",
            &[f],
            binary_round_trip_all_bytes,
        ),
        ctx.trial(
            AREA,
            "relative_path_is_run_workdir",
            &[fr],
            relative_path_is_run_workdir,
        ),
        ctx.trial(AREA, "ls_lists_entries", &[f], ls_lists_entries),
        ctx.trial(
            AREA,
            "ls_name_with_a_newline_is_one_entry",
            &[f],
            ls_name_with_a_newline_is_one_entry,
        ),
        ctx.trial(AREA, "mkdir_parents", &[f], mkdir_parents),
        ctx.trial(AREA, "remove_file_and_tree", &[f], remove_file_and_tree),
        ctx.trial(AREA, "stat_size_and_kind", &[f], stat_size_and_kind),
        ctx.trial(AREA, "stat_mode_and_modified", &[f], stat_mode_and_modified),
        ctx.trial(
            AREA,
            "stat_keeps_special_mode_bits",
            &[fr],
            stat_keeps_special_mode_bits,
        ),
        ctx.trial(
            AREA,
            "missing_read_is_path_not_found",
            &[f],
            missing_read_is_path_not_found,
        ),
        ctx.trial(
            AREA,
            "missing_stat_is_path_not_found",
            &[f],
            missing_stat_is_path_not_found,
        ),
        ctx.trial(
            AREA,
            "missing_remove_is_path_not_found",
            &[f],
            missing_remove_is_path_not_found,
        ),
        ctx.trial(
            AREA,
            "read_of_dir_is_typed_error",
            &[f],
            read_of_dir_is_typed_error,
        ),
        ctx.trial(AREA, "never_host_paths", &[f], never_host_paths),
        ctx.trial(
            AREA,
            "large_transfer_bounded_memory",
            &[ud],
            large_transfer_bounded_memory,
        ),
        ctx.trial(
            AREA,
            "upload_download_directory_tree",
            &[ud],
            upload_download_directory_tree,
        ),
        ctx.trial(
            AREA,
            "download_rejects_tar_path_escape",
            &[ud, Need::Cap(C::RUN_COMMAND), Need::Symlinks],
            download_rejects_tar_path_escape,
        ),
        ctx.trial(
            AREA,
            "upload_never_follows_links_out",
            &[ud],
            upload_never_follows_links_out,
        ),
        ctx.trial(
            AREA,
            "entry_point_honours_declaration",
            &[],
            entry_point_honours_declaration,
        ),
        ctx.trial(
            AREA,
            "transfer_honours_declaration",
            &[],
            transfer_honours_declaration,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

fn fs(sb: &Sbx) -> anyhow::Result<&dyn FileSystem> {
    sbx(sb.files(), "files()")
}

/// Text written is read back unchanged.
async fn text_round_trip(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("text_round_trip")).await?;
    let f = fs(&sb)?;
    let text = "hello, sandbox ✓\nsecond line\n";
    sbx(f.write("/work/t.txt", Bytes::from(text)).await, "write")?;
    let back = sbx(f.read("/work/t.txt").await, "read")?;
    ensure!(back == text.as_bytes(), "read back {back:?}");
    // Overwrite replaces.
    sbx(
        f.write("/work/t.txt", Bytes::from("short")).await,
        "overwrite",
    )?;
    let back = sbx(f.read("/work/t.txt").await, "read")?;
    ensure!(back == "short".as_bytes(), "after overwrite {back:?}");
    sb.kill().await
}

/// All 256 byte values survive a write/read round trip.
async fn binary_round_trip_all_bytes(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("binary_round_trip_all_bytes")).await?;
    let f = fs(&sb)?;
    let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    sbx(
        f.write("/work/all.bin", Bytes::from(all.clone())).await,
        "write",
    )?;
    let back = sbx(f.read("/work/all.bin").await, "read")?;
    ensure!(
        back[..] == all[..],
        "binary round trip differs ({} bytes)",
        back.len()
    );
    let info = sbx(f.stat("/work/all.bin").await, "stat")?;
    ensure!(info.size == 512, "stat size {}", info.size);
    sb.kill().await
}

/// Relative file paths resolve against the same workdir as `run`.
async fn relative_path_is_run_workdir(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("relative_path_is_run_workdir")).await?;
    let f = fs(&sb)?;
    sbx(
        f.write("rel.txt", Bytes::from("from-files")).await,
        "write rel.txt",
    )?;
    let out = run_ok(&*sb, ["cat", "rel.txt"]).await?;
    ensure!(out == "from-files", "run sees {out:?}");
    let out = run_ok(&*sb, ["cat", "/work/rel.txt"]).await?;
    ensure!(out == "from-files", "absolute path sees {out:?}");
    run_ok(&*sb, "echo from-run > rel2.txt").await?;
    let back = sbx(f.read("rel2.txt").await, "read rel2.txt")?;
    ensure!(back == "from-run\n".as_bytes(), "files sees {back:?}");
    sb.kill().await
}

/// `ls` lists files and directories with names, paths and kinds.
async fn ls_lists_entries(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("ls_lists_entries")).await?;
    let f = fs(&sb)?;
    sbx(f.mkdir("/work/lsd/sub", true).await, "mkdir")?;
    sbx(
        f.write("/work/lsd/a.txt", Bytes::from("aaa")).await,
        "write",
    )?;
    let mut entries = sbx(f.ls("/work/lsd").await, "ls")?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
    ensure!(names == ["a.txt", "sub"], "ls names {names:?}");
    ensure!(
        !entries[0].is_dir && entries[0].size == 3 && entries[0].path == "/work/lsd/a.txt",
        "{:?}",
        entries[0]
    );
    ensure!(entries[1].is_dir, "{:?}", entries[1]);
    must_code(f.ls("/work/no-such-dir").await, ErrorCode::PathNotFound)?;
    sb.kill().await
}

/// A name with a newline in it is one entry with that name: a file named like a listing
/// line (`"x\n0 41ed 0 .."`) never forges a `..` entry or a second file, and a name
/// with a trailing newline keeps it.
async fn ls_name_with_a_newline_is_one_entry(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("ls_name_with_a_newline_is_one_entry"))
        .await?;
    let f = fs(&sb)?;
    sbx(f.mkdir("/work/lsn", true).await, "mkdir")?;
    let odd = ["x\n0 41ed 0 ..", "y\n", "plain"];
    for (i, name) in odd.iter().enumerate() {
        let body = Bytes::from(vec![b'a'; i + 1]);
        sbx(f.write(&format!("/work/lsn/{name}"), body).await, "write")?;
    }
    let mut entries = sbx(f.ls("/work/lsn").await, "ls")?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
    ensure!(
        names == ["plain", "x\n0 41ed 0 ..", "y\n"],
        "ls names {names:?}"
    );
    for e in &entries {
        let i = odd.iter().position(|n| *n == e.name).unwrap_or(usize::MAX);
        ensure!(
            !e.is_dir && e.size == i as u64 + 1 && e.path == format!("/work/lsn/{}", e.name),
            "{e:?}"
        );
    }
    sb.kill().await
}

/// `mkdir(parents = true)` creates missing parents and tolerates an existing directory;
/// without `parents`, a missing parent is `PathNotFound` and nothing is created.
async fn mkdir_parents(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("mkdir_parents")).await?;
    let f = fs(&sb)?;
    sbx(f.mkdir("/work/a/b/c", true).await, "mkdir -p")?;
    sbx(f.mkdir("/work/a/b/c", true).await, "mkdir -p again")?;
    let info = sbx(f.stat("/work/a/b/c").await, "stat")?;
    ensure!(info.is_dir, "{info:?}");
    must_code(f.mkdir("/work/x/y/z", false).await, ErrorCode::PathNotFound)
        .context("mkdir without parents under a missing parent")?;
    must_code(f.stat("/work/x").await, ErrorCode::PathNotFound)
        .context("mkdir without parents created a missing parent")?;
    sb.kill().await
}

/// `remove` deletes a file and a whole tree.
async fn remove_file_and_tree(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("remove_file_and_tree")).await?;
    let f = fs(&sb)?;
    sbx(f.write("/work/rm/one.txt", Bytes::from("1")).await, "write")?;
    sbx(
        f.write("/work/rm/d/two.txt", Bytes::from("2")).await,
        "write",
    )?;
    sbx(f.remove("/work/rm/one.txt").await, "remove file")?;
    must_code(f.stat("/work/rm/one.txt").await, ErrorCode::PathNotFound)?;
    sbx(f.remove("/work/rm").await, "remove tree")?;
    must_code(f.stat("/work/rm").await, ErrorCode::PathNotFound)?;
    must_code(f.stat("/work/rm/d/two.txt").await, ErrorCode::PathNotFound)?;
    sb.kill().await
}

/// `stat` reports a recent modification time and the permission bits of a file just
/// written (owner may read and write it; nothing beyond `0o7777` and the file type).
async fn stat_mode_and_modified(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("stat_mode_and_modified")).await?;
    let f = fs(&sb)?;
    sbx(f.write("/work/mode.txt", Bytes::from("x")).await, "write")?;
    let info = sbx(f.stat("/work/mode.txt").await, "stat")?;
    ensure!(
        info.mode & 0o600 == 0o600,
        "mode {:o} of a file just written lacks owner read/write",
        info.mode
    );
    ensure!(
        info.mode & !0o177_777 == 0,
        "mode {:o} has bits beyond the file type and permissions",
        info.mode
    );
    let modified = info
        .modified
        .context("stat of a file just written has no modification time")?;
    let age = SystemTime::now()
        .duration_since(modified)
        .unwrap_or_else(|e| e.duration());
    // The engine's clock is this machine's (or a VM's close to it).
    ensure!(
        age < Duration::from_secs(300),
        "modification time {modified:?} is {age:?} away from now"
    );
    sb.kill().await
}

/// `stat` reports the setuid, setgid and sticky bits a command set (`chmod 4755`, `2755`,
/// `1777`): an engine reports them at other bit positions than Unix, and a mode read
/// without converting them hides a setuid binary from the caller.
async fn stat_keeps_special_mode_bits(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("stat_keeps_special_mode_bits")).await?;
    let f = fs(&sb)?;
    sbx(f.write("/work/modes/suid", Bytes::from("x")).await, "write")?;
    sbx(f.write("/work/modes/sgid", Bytes::from("x")).await, "write")?;
    sbx(f.mkdir("/work/modes/sticky", false).await, "mkdir")?;
    for (mode, path) in [
        ("4755", "/work/modes/suid"),
        ("2755", "/work/modes/sgid"),
        ("1777", "/work/modes/sticky"),
    ] {
        let r = run(&*sb, ["chmod", mode, path]).await?;
        ensure!(
            r.exit_code == 0,
            "`chmod {mode} {path}` failed ({}): {}",
            r.exit_code,
            r.stderr_text()
        );
        let want = u32::from_str_radix(mode, 8)?;
        let info = sbx(f.stat(path).await, "stat")?;
        ensure!(
            info.mode & 0o7777 == want,
            "stat of {path} after `chmod {mode}` reports mode {:o}",
            info.mode & 0o7777
        );
    }
    sb.kill().await
}

/// `stat` reports size, kind and path.
async fn stat_size_and_kind(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("stat_size_and_kind")).await?;
    let f = fs(&sb)?;
    sbx(
        f.write("/work/st/f.bin", Bytes::from(vec![7u8; 1234]))
            .await,
        "write",
    )?;
    let fi = sbx(f.stat("/work/st/f.bin").await, "stat file")?;
    ensure!(
        fi.size == 1234 && !fi.is_dir && fi.name == "f.bin" && fi.path == "/work/st/f.bin",
        "{fi:?}"
    );
    let di = sbx(f.stat("/work/st").await, "stat dir")?;
    ensure!(di.is_dir && di.name == "st", "{di:?}");
    let wi = sbx(f.stat("st/f.bin").await, "stat relative")?;
    ensure!(
        wi.path == "/work/st/f.bin",
        "relative stat path {:?}",
        wi.path
    );
    sb.kill().await
}

/// Reading a missing path is `PathNotFound`.
async fn missing_read_is_path_not_found(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("missing_read_is_path_not_found")).await?;
    must_code(
        fs(&sb)?.read("/work/nope.txt").await,
        ErrorCode::PathNotFound,
    )?;
    must_code(
        fs(&sb)?.read("nope/deeper.txt").await,
        ErrorCode::PathNotFound,
    )?;
    sb.kill().await
}

/// `stat` of a missing path is `PathNotFound`.
async fn missing_stat_is_path_not_found(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("missing_stat_is_path_not_found")).await?;
    must_code(fs(&sb)?.stat("/work/nope").await, ErrorCode::PathNotFound)?;
    sb.kill().await
}

/// Removing a missing path is `PathNotFound`.
async fn missing_remove_is_path_not_found(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("missing_remove_is_path_not_found"))
        .await?;
    must_code(fs(&sb)?.remove("/work/nope").await, ErrorCode::PathNotFound)?;
    sb.kill().await
}

/// Reading a directory is the typed `IsADirectory` error.
async fn read_of_dir_is_typed_error(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("read_of_dir_is_typed_error")).await?;
    let f = fs(&sb)?;
    sbx(f.mkdir("/work/adir", true).await, "mkdir")?;
    must_code(f.read("/work/adir").await, ErrorCode::IsADirectory)?;
    must_code(f.read("/work").await, ErrorCode::IsADirectory)?;
    sb.kill().await
}

/// Paths are sandbox-internal: writing `/tmp/x` never touches the host, and a host-only
/// file is not readable.
async fn never_host_paths(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("never_host_paths")).await?;
    let f = fs(&sb)?;
    let name = format!("/tmp/{}", token("sbx-contract-"));
    sbx(
        f.write(&name, Bytes::from("inside")).await,
        "write /tmp path",
    )?;
    ensure!(
        !Path::new(&name).exists(),
        "writing {name} in the sandbox created it on the host"
    );
    let back = sbx(f.read(&name).await, "read back")?;
    ensure!(back == "inside".as_bytes(), "read back {back:?}");
    let host_only = tempfile::NamedTempFile::new().context("host temp file")?;
    std::fs::write(host_only.path(), "host-only").context("write host file")?;
    let host_path = host_only.path().to_string_lossy().to_string();
    must_code(f.read(&host_path).await, ErrorCode::PathNotFound)?;
    sb.kill().await
}

pub(crate) fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Samples this process's RSS every 2 ms until stopped; reports the peak.
pub(crate) struct RssSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    pub(crate) fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(rss_bytes()));
        let (s, p) = (stop.clone(), peak.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                p.fetch_max(rss_bytes(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        RssSampler {
            stop,
            peak,
            thread: Some(thread),
        }
    }

    pub(crate) fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::SeqCst).max(rss_bytes())
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Writes `len` bytes of a non-repeating-per-MiB pattern to `path`, streamed; returns the
/// hash.
fn write_pattern(path: &Path, len: u64) -> anyhow::Result<u64> {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut block = vec![0u8; 1 << 20];
    let mut written = 0u64;
    let mut i = 0u64;
    while written < len {
        for (j, b) in block.iter_mut().enumerate() {
            *b = ((j as u64).wrapping_mul(31).wrapping_add(i * 7) % 251) as u8;
        }
        let n = (len - written).min(block.len() as u64) as usize;
        file.write_all(&block[..n])?;
        h.write(&block[..n]);
        written += n as u64;
        i += 1;
    }
    file.flush()?;
    Ok(h.finish())
}

/// Hashes a file streamed in the same 1 MiB blocks as [`write_pattern`].
fn hash_file(path: &Path) -> anyhow::Result<(u64, u64)> {
    let mut file = std::fs::File::open(path)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    // `Hasher::write` is not chunking-independent, so hash fixed 1 MiB blocks.
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            let n = file.read(&mut buf[filled..])?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            break;
        }
        h.write(&buf[..filled]);
        total += filled as u64;
        if filled < buf.len() {
            break;
        }
    }
    Ok((h.finish(), total))
}

/// A ≥64 MiB file uploads and downloads intact while this process's memory grows by at
/// most 32 MiB (transfers stream).
async fn large_transfer_bounded_memory(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("large_transfer_bounded_memory")).await?;
    let f = fs(&sb)?;
    let _heavy = ctx.heavy_lock.lock().await;
    let dir = tempfile::tempdir().context("tempdir")?;
    let src = dir.path().join("big.bin");
    let dst = dir.path().join("back.bin");
    let src2 = src.clone();
    let want =
        tokio::task::spawn_blocking(move || write_pattern(&src2, LARGE_FILE_BYTES)).await??;
    let stored = if ctx.probes.in_process_storage() {
        LARGE_FILE_BYTES
    } else {
        0
    };
    let bound = LARGE_FILE_RSS_BOUND + stored;

    let base = rss_bytes();
    let sampler = RssSampler::start();
    sbx(f.upload(&src, "/work/big.bin").await, "upload")?;
    let up_growth = sampler.finish().saturating_sub(base);
    let info = sbx(f.stat("/work/big.bin").await, "stat uploaded")?;
    ensure!(info.size == LARGE_FILE_BYTES, "uploaded size {}", info.size);

    let base = rss_bytes();
    let sampler = RssSampler::start();
    sbx(f.download("/work/big.bin", &dst).await, "download")?;
    let down_growth = sampler.finish().saturating_sub(base);
    let dst2 = dst.clone();
    let (got, len) = tokio::task::spawn_blocking(move || hash_file(&dst2)).await??;
    ensure!(len == LARGE_FILE_BYTES, "downloaded {len} bytes");
    ensure!(got == want, "downloaded content differs");
    let mib = |b: u64| b as f64 / 1048576.0;
    ensure!(
        up_growth <= bound,
        "upload grew RSS by {:.1} MiB (bound {:.1} MiB): not streamed",
        mib(up_growth),
        mib(bound)
    );
    ensure!(
        down_growth <= bound,
        "download grew RSS by {:.1} MiB (bound {:.1} MiB): not streamed",
        mib(down_growth),
        mib(bound)
    );
    sbx(f.remove("/work/big.bin").await, "remove")?;
    sb.kill().await
}

fn write_tree(root: &Path) -> anyhow::Result<Vec<(PathBuf, Vec<u8>)>> {
    let files = vec![
        (PathBuf::from("top.txt"), b"top\n".to_vec()),
        (PathBuf::from("a/b/c.txt"), b"deep\n".to_vec()),
        (PathBuf::from("a/bin.dat"), (0..=255u8).collect()),
        (PathBuf::from("empty/.keep"), Vec::new()),
    ];
    for (rel, data) in &files {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().context("parent")?)?;
        std::fs::write(&p, data)?;
    }
    Ok(files)
}

/// A directory tree uploads (the remote path becomes that directory) and downloads back
/// (the local path becomes that directory) intact.
async fn upload_download_directory_tree(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("upload_download_directory_tree")).await?;
    let f = fs(&sb)?;
    let dir = tempfile::tempdir().context("tempdir")?;
    let src = dir.path().join("tree");
    let files = write_tree(&src)?;
    sbx(f.upload(&src, "/work/up").await, "upload dir")?;
    for (rel, data) in &files {
        let remote = format!("/work/up/{}", rel.display());
        let back = sbx(f.read(&remote).await, &format!("read {remote}"))?;
        ensure!(back[..] == data[..], "{remote} differs after upload");
    }
    let info = sbx(f.stat("/work/up/a/b").await, "stat uploaded dir")?;
    ensure!(info.is_dir, "{info:?}");
    let out = dir.path().join("down");
    sbx(f.download("/work/up", &out).await, "download dir")?;
    for (rel, data) in &files {
        let local = out.join(rel);
        let back = std::fs::read(&local).with_context(|| format!("read {}", local.display()))?;
        ensure!(back == *data, "{} differs after download", local.display());
    }
    sb.kill().await
}

fn symlinks_escaping(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut bad = Vec::new();
    let canon_root = root.canonicalize()?;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p)?;
            if meta.file_type().is_symlink() {
                match p.canonicalize() {
                    Ok(t) if t.starts_with(&canon_root) => {}
                    Ok(t) => bad.push(format!("{} -> {}", p.display(), t.display())),
                    // Dangling: judge the literal target.
                    Err(_) => {
                        let t = std::fs::read_link(&p)?;
                        if t.is_absolute() || t.components().any(|c| c.as_os_str() == "..") {
                            bad.push(format!("{} -> {}", p.display(), t.display()));
                        }
                    }
                }
            } else if meta.is_dir() {
                stack.push(p);
            }
        }
    }
    Ok(bad)
}

/// Downloading a directory whose symlinks point outside it is refused
/// (`UnsafeArchiveEntry`) or writes nothing that escapes the local target.
async fn download_rejects_tar_path_escape(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("download_rejects_tar_path_escape"))
        .await?;
    let f = fs(&sb)?;
    sbx(
        f.write("/work/dl/sub/ok.txt", Bytes::from("ok")).await,
        "write",
    )?;
    for (target, link) in [
        ("/", "/work/dl/escape"),
        ("../../../../../../..", "/work/dl/up"),
        ("/etc/passwd", "/work/dl/sub/passwd"),
    ] {
        let r = run(&*sb, ["ln", "-s", target, link]).await?;
        ensure!(
            r.exit_code == 0,
            "`ln -s {target} {link}` failed ({}): {}; set Probes::symlinks to false if the \
             adapter cannot hold symlinks",
            r.exit_code,
            r.stderr_text()
        );
    }
    let dir = tempfile::tempdir().context("tempdir")?;
    let target = dir.path().join("out");
    match f.download("/work/dl", &target).await {
        Err(e) if e.code() == ErrorCode::UnsafeArchiveEntry => {}
        Err(e) => bail!(
            "download failed with {:?} instead of UnsafeArchiveEntry: {}",
            e.code(),
            e.render()
        ),
        Ok(()) => {
            let bad = symlinks_escaping(&target)?;
            ensure!(
                bad.is_empty(),
                "download wrote symlinks escaping the target: {bad:?}"
            );
        }
    }
    for e in std::fs::read_dir(dir.path())? {
        let name = e?.file_name();
        ensure!(
            name == "out",
            "download wrote {name:?} outside the target directory"
        );
    }
    sb.kill().await
}

/// Uploading a local tree never copies what its symlinks point at outside it: a link
/// with an absolute target and one climbing out with `..` are refused
/// (`UnsafeArchiveEntry`) or arrive as links, never as the host file's content.
async fn upload_never_follows_links_out(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("upload_never_follows_links_out")).await?;
    let f = fs(&sb)?;
    let dir = tempfile::tempdir().context("tempdir")?;
    let secret = token("sbx-host-only-");
    let outside = dir.path().join("host-secret.txt");
    std::fs::write(&outside, &secret)?;
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree)?;
    std::fs::write(tree.join("a.txt"), "a")?;
    std::os::unix::fs::symlink(&outside, tree.join("abs"))?;
    std::os::unix::fs::symlink("../host-secret.txt", tree.join("up"))?;
    match f.upload(&tree, "/work/up").await {
        Err(e) if e.code() == ErrorCode::UnsafeArchiveEntry => {}
        Err(e) => bail!(
            "upload failed with {:?} instead of UnsafeArchiveEntry: {}",
            e.code(),
            e.render()
        ),
        Ok(()) => {
            let a = sbx(f.read("/work/up/a.txt").await, "read a.txt")?;
            ensure!(a == "a", "a.txt arrived as {a:?}");
            for link in ["/work/up/abs", "/work/up/up"] {
                if let Ok(data) = f.read(link).await {
                    ensure!(
                        !String::from_utf8_lossy(&data).contains(&secret),
                        "{link} holds the host file it pointed at: the upload followed a \
                         symlink out of the uploaded tree"
                    );
                }
            }
        }
    }
    sb.kill().await
}

/// `files()` honours the declaration: with `FILESYSTEM` it is `Ok` and a write/read round
/// trip works; without it, `files()` itself is `CapabilityNotSupported`.
async fn entry_point_honours_declaration(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("entry_point_honours_declaration"))
        .await?;
    let declared = sb.capabilities().contains(C::FILESYSTEM);
    match (declared, sb.files()) {
        (true, Ok(f)) => {
            sbx(f.write("/work/decl.txt", Bytes::from("d")).await, "write")?;
            let back = sbx(f.read("decl.txt").await, "read")?;
            ensure!(back == "d".as_bytes(), "read back {back:?}");
        }
        (true, Err(e)) => bail!("FILESYSTEM is declared but files() fails: {}", e.render()),
        (false, Ok(_)) => bail!("files() returned a filesystem although FILESYSTEM is undeclared"),
        (false, Err(e)) => ensure!(
            e.code() == ErrorCode::CapabilityNotSupported,
            "files() without FILESYSTEM: {}",
            e.render()
        ),
    }
    sb.kill().await
}

/// `upload`/`download` honour the declaration: with `UPLOAD_DOWNLOAD` a file uploads and
/// downloads back intact; without it both are `CapabilityNotSupported` (or unreachable,
/// when `files()` itself is refused).
async fn transfer_honours_declaration(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("transfer_honours_declaration")).await?;
    let caps = sb.capabilities();
    let declared = caps.contains(C::UPLOAD_DOWNLOAD);
    let f = match sb.files() {
        Ok(f) => f,
        Err(e) => {
            ensure!(
                !declared,
                "UPLOAD_DOWNLOAD is declared but files() fails: {}",
                e.render()
            );
            ensure!(
                e.code() == ErrorCode::CapabilityNotSupported && !caps.contains(C::FILESYSTEM),
                "files() without FILESYSTEM: {}",
                e.render()
            );
            return sb.kill().await;
        }
    };
    let dir = tempfile::tempdir().context("tempdir")?;
    let local = dir.path().join("x.txt");
    let payload = token("transfer-");
    std::fs::write(&local, &payload)?;
    let back = dir.path().join("back.txt");
    if declared {
        sbx(f.upload(&local, "/work/x.txt").await, "upload")?;
        let inside = sbx(f.read("/work/x.txt").await, "read uploaded")?;
        ensure!(inside == payload.as_bytes(), "uploaded {inside:?}");
        sbx(f.download("/work/x.txt", &back).await, "download")?;
        let got = std::fs::read(&back).context("read downloaded")?;
        ensure!(got == payload.as_bytes(), "downloaded {got:?}");
    } else {
        must_code(
            f.upload(&local, "/work/x.txt").await,
            ErrorCode::CapabilityNotSupported,
        )?;
        sbx(f.write("/work/y.txt", Bytes::from("y")).await, "write")?;
        must_code(
            f.download("/work/y.txt", &back).await,
            ErrorCode::CapabilityNotSupported,
        )?;
        ensure!(
            !back.exists(),
            "a refused download wrote {}",
            back.display()
        );
    }
    sb.kill().await
}

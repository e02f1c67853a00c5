//! Where the time goes: every engine request of one operation, ours vs raw, seen through
//! a logging unix-socket proxy in front of the engine socket, plus the in-container cost of
//! the adapters' exec wrapper. The proxy adds the same small delay to both variants; the
//! figures to compare are request counts, new connections and per-request latencies.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::docker_raw::DockerRaw;
use crate::driver::{Driver, Handle, Spec, timed};
use crate::ours::Ours;
use crate::podman_raw::PodmanRaw;
use crate::report::{Op, Recorder};
use crate::stats::median;
use crate::suite::{Plan, payload};

/// Repetitions of each profiled sequence.
const REPS: usize = 5;

#[derive(Debug, Clone)]
struct Req {
    at: Instant,
    line: String,
    latency: Option<Duration>,
}

#[derive(Debug, Default)]
struct Log {
    reqs: Vec<Req>,
    connections: usize,
}

type SharedLog = Arc<Mutex<Log>>;

fn lock(l: &SharedLog) -> std::sync::MutexGuard<'_, Log> {
    l.lock().unwrap_or_else(|p| p.into_inner())
}

/// `POST /v1.41/containers/abc…/start?x=y HTTP/1.1` → `POST /containers/{id}/start`.
pub fn normalize(first_line: &str) -> Option<String> {
    let mut parts = first_line.split(' ');
    let method = parts.next()?;
    if !matches!(method, "GET" | "POST" | "PUT" | "HEAD" | "DELETE") {
        return None;
    }
    let target = parts.next()?;
    let path = target.split('?').next().unwrap_or(target);
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .enumerate()
        .filter(|(i, s)| {
            !(*i == 0
                && s.starts_with('v')
                && s[1..].chars().all(|c| c.is_ascii_digit() || c == '.'))
        })
        .map(|(_, s)| {
            let idlike = s.len() >= 20 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
            if idlike {
                "{id}".to_string()
            } else {
                s.to_string()
            }
        })
        .collect();
    Some(format!("{method} /{}", segs.join("/")))
}

async fn pump_requests(
    mut from: tokio::net::unix::OwnedReadHalf,
    mut to: tokio::net::unix::OwnedWriteHalf,
    log: SharedLog,
    pending: Arc<Mutex<VecDeque<usize>>>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let head = &buf[..n.min(512)];
        let first = head.split(|b| *b == b'\r').next().unwrap_or(head);
        if let Some(line) = normalize(&String::from_utf8_lossy(first)) {
            let mut l = lock(&log);
            l.reqs.push(Req {
                at: Instant::now(),
                line,
                latency: None,
            });
            let idx = l.reqs.len() - 1;
            pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(idx);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

async fn pump_responses(
    mut from: tokio::net::unix::OwnedReadHalf,
    mut to: tokio::net::unix::OwnedWriteHalf,
    log: SharedLog,
    pending: Arc<Mutex<VecDeque<usize>>>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let idx = pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        if let Some(idx) = idx {
            let mut l = lock(&log);
            if let Some(r) = l.reqs.get_mut(idx) {
                r.latency = Some(r.at.elapsed());
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A logging proxy from `listen` to `upstream`; runs until the task is aborted.
async fn proxy(
    listen: PathBuf,
    upstream: PathBuf,
    log: SharedLog,
) -> Result<tokio::task::JoinHandle<()>> {
    let _ = std::fs::remove_file(&listen);
    let listener =
        UnixListener::bind(&listen).with_context(|| format!("binding {}", listen.display()))?;
    Ok(tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = UnixStream::connect(&upstream).await else {
                continue;
            };
            lock(&log).connections += 1;
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let pending = Arc::new(Mutex::new(VecDeque::new()));
            tokio::spawn(pump_requests(cr, sw, log.clone(), pending.clone()));
            tokio::spawn(pump_responses(sr, cw, log.clone(), pending));
        }
    }))
}

fn upstream_socket(backend: &str) -> PathBuf {
    let endpoint = match backend {
        "docker" => std::env::var(sandbox_docker::ENDPOINT_ENV)
            .ok()
            .filter(|h| h.starts_with("unix://"))
            .unwrap_or_else(|| sandbox_docker::DEFAULT_ENDPOINT.to_string()),
        _ => crate::podman_raw::endpoint(),
    };
    PathBuf::from(endpoint.trim_start_matches("unix://"))
}

/// What one variant's profiled sequence saw for one operation, over the repetitions.
#[derive(Debug, Default)]
struct OpProfile {
    /// Per repetition: the requests in order, with latencies (ms).
    reps: Vec<Vec<(String, Option<f64>)>>,
    connections: Vec<usize>,
    totals_ms: Vec<f64>,
}

impl OpProfile {
    fn describe(&self) -> String {
        let Some(last) = self.reps.last() else {
            return "not measured".into();
        };
        // Distinct request kinds in order of first appearance, with median count and latency.
        let mut kinds: Vec<String> = Vec::new();
        for (l, _) in last {
            if !kinds.contains(l) {
                kinds.push(l.clone());
            }
        }
        let parts: Vec<String> = kinds
            .iter()
            .map(|k| {
                let counts: Vec<f64> = self
                    .reps
                    .iter()
                    .map(|r| r.iter().filter(|(l, _)| l == k).count() as f64)
                    .collect();
                let lats: Vec<f64> = self
                    .reps
                    .iter()
                    .flat_map(|r| r.iter().filter(|(l, _)| l == k).filter_map(|(_, t)| *t))
                    .collect();
                let c = median(&counts).unwrap_or(0.0);
                let lat = median(&lats)
                    .map(|v| format!("{v:.1} ms"))
                    .unwrap_or_else(|| "–".into());
                if c == 1.0 {
                    format!("`{k}` {lat}")
                } else {
                    format!("`{k}` ×{c} ({lat} each)")
                }
            })
            .collect();
        let n: Vec<f64> = self.reps.iter().map(|r| r.len() as f64).collect();
        let conns: Vec<f64> = self.connections.iter().map(|c| *c as f64).collect();
        format!(
            "{} requests, {} new connections, {:.1} ms: {}",
            median(&n).unwrap_or(0.0),
            median(&conns).unwrap_or(0.0),
            median(&self.totals_ms).unwrap_or(0.0),
            parts.join(", ")
        )
    }
}

const PROFILED: [Op; 7] = [
    Op::Create,
    Op::RunCodeFresh,
    Op::RunCode,
    Op::RunTrue,
    Op::FirstChunk,
    Op::WriteRead1M,
    Op::Kill,
];

async fn sequence(d: &dyn Driver, log: &SharedLog, out: &mut [OpProfile; 7]) -> Result<()> {
    let data = payload(1024 * 1024);
    let mut handle: Option<Handle> = None;
    for (k, op) in PROFILED.iter().enumerate() {
        {
            let mut l = lock(log);
            l.reqs.clear();
            l.connections = 0;
        }
        let t = Instant::now();
        match op {
            Op::Create => handle = Some(d.create().await?),
            Op::Kill => d.kill(handle.take().context("no sandbox")?).await?,
            _ => {
                let h = handle.as_ref().context("no sandbox")?;
                match op {
                    Op::RunCodeFresh | Op::RunCode => d.run_code(h).await?,
                    Op::RunTrue => d.run_true(h).await?,
                    Op::FirstChunk => {
                        d.first_chunk(h).await?;
                    }
                    _ => d.write_read(h, "bench-profile.bin", &data).await?,
                }
            }
        }
        let total = t.elapsed();
        // Let in-flight responses (e.g. a last inspect) be attributed before reading.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let l = lock(log);
        out[k].reps.push(
            l.reqs
                .iter()
                .map(|r| (r.line.clone(), r.latency.map(|d| d.as_secs_f64() * 1000.0)))
                .collect(),
        );
        out[k].connections.push(l.connections);
        out[k].totals_ms.push(total.as_secs_f64() * 1000.0);
    }
    Ok(())
}

/// Profile lines for the report (empty for the fake).
pub async fn run(plan: &Plan, drivers: &[Arc<dyn Driver>], rec: &Recorder) -> Vec<String> {
    let _ = drivers;
    if plan.backend != "docker" && plan.backend != "podman" {
        return Vec::new();
    }
    match profile(plan, rec).await {
        Ok(lines) => lines,
        Err(e) => vec![format!("profile failed: {e:#}")],
    }
}

async fn profile(plan: &Plan, rec: &Recorder) -> Result<Vec<String>> {
    let _ = rec;
    let sock = plan.scratch.join(format!("proxy-{}.sock", plan.backend));
    let log: SharedLog = Arc::default();
    let task = proxy(sock.clone(), upstream_socket(&plan.backend), log.clone()).await?;
    let r = profile_through(plan, &sock, &log).await;
    task.abort();
    let _ = std::fs::remove_file(&sock);
    r
}

async fn profile_through(plan: &Plan, sock: &Path, log: &SharedLog) -> Result<Vec<String>> {
    let endpoint = format!("unix://{}", sock.display());
    let spec: Spec = plan.spec.clone();
    let (ours, raw): (Arc<dyn Driver>, Arc<dyn Driver>) = match plan.backend.as_str() {
        "docker" => {
            let b = sandbox_docker::DockerBackend::connect(
                sandbox_docker::DockerConfig::from_env()
                    .endpoint(endpoint.clone())
                    .startup_sweep(false),
            )
            .await?;
            let client = bollard::Docker::connect_with_unix(
                &sock.to_string_lossy(),
                120,
                bollard::API_DEFAULT_VERSION,
            )?
            .negotiate_version()
            .await?;
            (
                Arc::new(Ours {
                    backend: Arc::new(b),
                    options: spec.options(),
                }),
                Arc::new(DockerRaw {
                    client,
                    spec: spec.clone(),
                }),
            )
        }
        _ => {
            let b = sandbox_podman::PodmanBackend::connect(
                sandbox_podman::PodmanConfig::from_env()
                    .endpoint(endpoint.clone())
                    .startup_sweep(false),
            )
            .await?;
            (
                Arc::new(Ours {
                    backend: Arc::new(b),
                    options: spec.options(),
                }),
                Arc::new(PodmanRaw {
                    client: podman_api::Podman::unix(sock),
                    spec: spec.clone(),
                }),
            )
        }
    };
    let mut ours_p: [OpProfile; 7] = Default::default();
    let mut raw_p: [OpProfile; 7] = Default::default();
    for i in 0..REPS {
        if i % 2 == 0 {
            sequence(ours.as_ref(), log, &mut ours_p).await?;
            sequence(raw.as_ref(), log, &mut raw_p).await?;
        } else {
            sequence(raw.as_ref(), log, &mut raw_p).await?;
            sequence(ours.as_ref(), log, &mut ours_p).await?;
        }
    }
    let mut lines = vec![format!(
        "Engine requests per operation, through a logging proxy on the engine socket \
         ({REPS} repetitions, medians; latency = request sent → first response byte; the \
         proxy adds the same small delay to both):"
    )];
    for (k, op) in PROFILED.iter().enumerate() {
        let label = op.label(plan.transfer_mib, (0, 0));
        lines.push(format!(
            "{label}: ours {}; raw {}",
            ours_p[k].describe(),
            raw_p[k].describe()
        ));
    }
    lines.extend(wrapper_cost(plan).await?);
    Ok(lines)
}

/// Raw exec of `true` vs the same under the adapter's pid-recording `sh` wrapper, and the
/// adapter's per-sandbox interpreter probe, on one container (interleaved, medians).
async fn wrapper_cost(plan: &Plan) -> Result<Vec<String>> {
    const N: usize = 15;
    let (wrapper, probe): (Vec<&str>, Vec<&str>) = match plan.backend.as_str() {
        "docker" => (
            vec![
                "sh",
                "-c",
                "echo $$ > /dev/shm/.sbx.bench 2>/dev/null; exec \"$@\"",
                "true",
                "true",
            ],
            vec!["sh", "-c", "command -v python3 >/dev/null 2>&1"],
        ),
        _ => (
            vec!["sh", "-c", "echo \"$$\"; exec \"$@\"", "sh", "true"],
            vec!["sh", "-c", "command -v python3 >/dev/null 2>&1"],
        ),
    };
    let spec = plan.spec.clone();
    let mut plain = Vec::new();
    let mut wrapped = Vec::new();
    let mut probed = Vec::new();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    macro_rules! measure {
        ($raw:expr) => {{
            let raw = $raw;
            let h = raw.create().await?;
            let id = match &h {
                Handle::Container(id) => id.clone(),
                Handle::Sandbox(_) => unreachable!("raw drivers return container ids"),
            };
            let r: Result<()> = async {
                for i in 0..N + 2 {
                    let (a, _) = timed(raw.exec(&id, &["true"])).await?;
                    let (b, out) = timed(raw.exec(&id, &wrapper)).await?;
                    let (c, _) = timed(raw.exec(&id, &probe)).await?;
                    let _ = out;
                    if i >= 2 {
                        plain.push(ms(a));
                        wrapped.push(ms(b));
                        probed.push(ms(c));
                    }
                }
                Ok(())
            }
            .await;
            let _ = raw.kill(h).await;
            r?;
        }};
    }
    match plan.backend.as_str() {
        "docker" => measure!(DockerRaw::connect(spec).await?),
        _ => measure!(PodmanRaw::connect(spec)?),
    }
    let (p, w, c) = (
        median(&plain).unwrap_or(0.0),
        median(&wrapped).unwrap_or(0.0),
        median(&probed).unwrap_or(0.0),
    );
    let mut lines = vec![format!(
        "In-container cost of the adapter's exec wrapper (raw exec, {N} interleaved runs, \
         medians): `true` {p:.1} ms; `true` under the wrapper `{}` {w:.1} ms ({:+.1} ms).",
        wrapper[2],
        w - p
    )];
    lines.push(format!(
        "The adapter's once-per-sandbox interpreter probe (`{}`): on the engine's exec path \
         (`SBX_AGENT=off`) one extra exec, {c:.1} ms, paid by the first run_code of every \
         sandbox; through the agent a spawn costing about what run([\"true\"]) costs.",
        probe[2]
    ));
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_normalized() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(
            normalize(&format!("POST /v1.41/containers/{id}/start HTTP/1.1")).as_deref(),
            Some("POST /containers/{id}/start")
        );
        assert_eq!(
            normalize("GET /v4.3.1/libpod/exec/abcdefabcdefabcdefabcdef/json?x=1 HTTP/1.1")
                .as_deref(),
            Some("GET /libpod/exec/{id}/json")
        );
        assert_eq!(normalize("\x16\x03 binary"), None);
    }
}

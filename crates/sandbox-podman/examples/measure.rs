//! Medians over 30 runs (create, `run(["true"])`, `run_code("print(1)")`, 1 MiB
//! write+read) and the conmon processes left on the host after 200 execs.
//!
//! `cargo run -p sandbox-rs-podman --example measure`
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use sandbox_core::{Backend, CreateOptions, SandboxExt};
use sandbox_podman::{PodmanBackend, PodmanConfig};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn conmon_count() -> usize {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "conmon")
                })
                .count()
        })
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let b = PodmanBackend::connect(PodmanConfig::from_env()).await?;
    let opts = || CreateOptions::new("sandbox-rs/python:3.11").metadata("measure", "1");
    let n = 30;
    let mut create = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let sb = b.create(opts()).await?;
        create.push(t.elapsed());
        sb.kill().await?;
    }
    let sb = b.create(opts()).await?;
    let (mut run, mut code, mut rw) = (Vec::new(), Vec::new(), Vec::new());
    let mib = Bytes::from(vec![7u8; 1 << 20]);
    for _ in 0..n {
        let t = Instant::now();
        sb.exec(["true"]).await?;
        run.push(t.elapsed());
        let t = Instant::now();
        sb.code("print(1)").await?;
        code.push(t.elapsed());
        let t = Instant::now();
        let fs = sb.files()?;
        fs.write("m.bin", mib.clone()).await?;
        let back = fs.read("m.bin").await?;
        rw.push(t.elapsed());
        anyhow::ensure!(back.len() == 1 << 20);
    }
    println!(
        "median create (create+start, /work ready): {:?}",
        median(create)
    );
    println!(
        "median run([\"true\"]):                      {:?}",
        median(run)
    );
    println!(
        "median run_code(\"print(1)\"):               {:?}",
        median(code)
    );
    println!(
        "median 1 MiB write+read:                   {:?}",
        median(rw)
    );

    let base = conmon_count();
    let t = Instant::now();
    for _ in 0..200 {
        sb.exec(["true"]).await?;
    }
    let took = t.elapsed();
    let after = conmon_count();
    println!("conmon before 200 execs: {base}, right after: {after} ({took:?} for 200 execs)");
    for wait in [5u64, 10] {
        tokio::time::sleep(Duration::from_secs(5)).await;
        println!("conmon {wait} s later: {}", conmon_count());
    }
    sb.kill().await?;
    Ok(())
}

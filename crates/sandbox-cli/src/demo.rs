//! `sandbox demo [DSN]`: create, run_code, stream, egress-denied proof, teardown — each
//! step timed.

use std::time::{Duration, Instant};

use futures::StreamExt;
use sandbox::{Command, CreateOptions, ErrorCode, RunOptions, SandboxExt, StreamKind};
use serde::Serialize;

use crate::cli::DemoArgs;
use crate::egress::{self, EgressProof};
use crate::exit_code;
use crate::output::{Out, ms};

/// One timed step.
#[derive(Debug, Serialize)]
struct Step {
    step: &'static str,
    ok: bool,
    ms: u64,
    detail: String,
}

/// `demo --json` payload.
#[derive(Debug, Serialize)]
struct DemoReport {
    dsn: String,
    backend: Option<String>,
    sandbox_id: Option<String>,
    tier: Option<String>,
    ok: bool,
    total_ms: u64,
    steps: Vec<Step>,
    egress: Option<EgressProof>,
}

pub async fn demo(args: DemoArgs, out: Out) -> sandbox::Result<u8> {
    let total = Instant::now();
    let mut report = DemoReport {
        dsn: args.dsn.clone(),
        backend: None,
        sandbox_id: None,
        tier: None,
        ok: false,
        total_ms: 0,
        steps: vec![],
        egress: None,
    };
    if !out.json {
        out.line(out.bold(&format!("sandbox demo on {}", args.dsn)));
    }

    // 1. create
    let t = Instant::now();
    let options = CreateOptions::default()
        .timeout(Duration::from_secs(120))
        .metadata("tool", "sandbox-cli")
        .metadata("command", "demo");
    let created = {
        let _progress = out.progress("creating sandbox");
        sandbox::create(args.dsn.as_str(), options).await
    };
    let sb = match created {
        Ok(sb) => sb,
        Err(e) if !out.json => return Err(e),
        Err(e) => {
            push(&mut report, &out, "create", false, t, e.render());
            return finish(report, total, &out);
        }
    };
    report.backend = Some(sb.backend().to_string());
    report.sandbox_id = Some(sb.id().to_string());
    report.tier = Some(sb.isolation().to_string());
    if !out.json {
        out.line(format!("  sandbox {}", sb.id()));
    }
    push(
        &mut report,
        &out,
        "create",
        true,
        t,
        format!(
            "created on {} (isolation: {}, network: deny)",
            sb.backend(),
            sb.isolation()
        ),
    );

    // 2. run_code
    let t = Instant::now();
    let (ok, detail) = match sb.code("print(6 * 7)").await {
        Ok(r) if r.ok() && r.stdout_text().trim() == "42" => {
            (true, "print(6 * 7) printed 42".to_string())
        }
        Ok(r) => (
            false,
            format!(
                "print(6 * 7) exited {} with stdout {:?}",
                r.exit_code,
                r.stdout_text().trim()
            ),
        ),
        Err(e) => (false, e.render()),
    };
    push(&mut report, &out, "run_code", ok, t, detail);

    // 3. stream
    let t = Instant::now();
    let (ok, detail) = stream_step(&*sb).await;
    push(&mut report, &out, "stream", ok, t, detail);

    // 4. egress denied
    let t = Instant::now();
    let (ok, detail) = match egress::prove_denied(&*sb).await {
        Ok(p) => {
            let detail = if p.denied {
                format!(
                    "only `lo` inside; dialing this host's own listener failed: {}",
                    p.dial_error
                )
            } else {
                format!(
                    "NOT proven: interfaces {:?}, dial exit {} ({:?}), listener connected: {}",
                    p.interfaces, p.dial_exit_code, p.dial_error, p.listener_connected
                )
            };
            let ok = p.denied;
            report.egress = Some(p);
            (ok, detail)
        }
        Err(e) => (false, e.render()),
    };
    push(&mut report, &out, "egress_denied", ok, t, detail);

    // 5. teardown
    let t = Instant::now();
    let id = sb.id().to_string();
    let (ok, detail) = match sb.kill().await {
        Ok(()) => {
            drop(sb);
            match sandbox::connect(args.dsn.as_str(), &id).await {
                Err(e) if e.code() == ErrorCode::Connect => (
                    true,
                    format!("killed and removed (connect now fails with {})", e.code()),
                ),
                Err(e) => (
                    false,
                    format!("after kill, connect failed oddly: {}", e.render()),
                ),
                Ok(_) => (
                    false,
                    "after kill, connect still finds the sandbox".to_string(),
                ),
            }
        }
        Err(e) => (false, e.render()),
    };
    push(&mut report, &out, "teardown", ok, t, detail);
    finish(report, total, &out)
}

/// A command whose first line arrives well before it ends, proving output is live.
async fn stream_step(sb: &dyn sandbox::Sandbox) -> (bool, String) {
    let cmd = Command::Argv(vec![
        "sh".into(),
        "-c".into(),
        "echo one; sleep 0.3; echo two".into(),
    ]);
    let started = Instant::now();
    let mut process = match sb.stream(cmd, RunOptions::default().timeout(Duration::from_secs(10))) {
        Ok(p) => p,
        Err(e) => return (false, e.render()),
    };
    let mut stdout = String::new();
    let mut first: Option<Duration> = None;
    while let Some(chunk) = process.next().await {
        match chunk {
            Ok(c) if c.stream == StreamKind::Stdout => {
                first.get_or_insert_with(|| started.elapsed());
                stdout.push_str(&String::from_utf8_lossy(&c.data));
            }
            Ok(_) => {}
            Err(e) => return (false, e.render()),
        }
    }
    let end = started.elapsed();
    let code = match process.wait().await {
        Ok(r) => r.exit_code,
        Err(e) => return (false, e.render()),
    };
    let lines: Vec<&str> = stdout.lines().collect();
    let live = first.is_some_and(|f| f + Duration::from_millis(150) <= end);
    let ok = code == 0 && lines == ["one", "two"] && live;
    let detail = if ok {
        "`one` arrived before `two` was written (output is live, in order)".to_string()
    } else {
        format!("exit {code}, lines {lines:?}, first chunk before the end: {live}")
    };
    (ok, detail)
}

fn push(
    report: &mut DemoReport,
    out: &Out,
    step: &'static str,
    ok: bool,
    t: Instant,
    detail: String,
) {
    let elapsed = ms(t.elapsed());
    if !out.json {
        out.line(format!(
            "  {:<14} {:>4} {:>6} ms  {}",
            step,
            out.status(ok),
            elapsed,
            // The detail quotes sandbox output and error text.
            crate::terminal::escape_text(&detail)
        ));
    }
    report.steps.push(Step {
        step,
        ok,
        ms: elapsed,
        detail,
    });
}

fn finish(mut report: DemoReport, total: Instant, out: &Out) -> sandbox::Result<u8> {
    report.total_ms = ms(total.elapsed());
    report.ok = report.steps.len() == 5 && report.steps.iter().all(|s| s.ok);
    if out.json {
        out.json_value(&report);
    } else {
        out.line(format!(
            "{} in {} ms",
            if report.ok {
                out.green("demo passed")
            } else {
                out.red("demo failed")
            },
            report.total_ms
        ));
    }
    Ok(if report.ok {
        exit_code::OK
    } else {
        exit_code::FAILURE
    })
}

//! Contract trials: observability — every operation of the backend under test, through
//! core's enforcement layer, emits its `tracing` span and exactly one audit record, and no
//! secret or env value reaches a span field, a log line or a record.
//!
//! Spans and events are captured by [`SpanCapture`], which the capture module installs
//! into the suite's global subscriber. Trials run concurrently, so they find their own
//! spans by sandbox id and their own values by unique tokens.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::layer::{AuditRecord, AuditSink, JsonLinesSink, Layer, MemorySink};
use sandbox_core::{Backend, BoxError, Capability as C, CodeOptions, ErrorCode, RunOptions};

use crate::capture;
use crate::ctx::{CASE_LABEL, Ctx, Sbx, must_code, sbx, token};

// Public paths of the span capture, which lives with the suite's subscriber in `capture`.
pub use crate::capture::{CapturedLine, CapturedSpan, SpanCapture, lines, spans};

const AREA: &str = "observability";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    vec![
        ctx.trial(
            AREA,
            "every_operation_has_one_span_and_one_audit_record",
            &[],
            every_operation_has_one_span_and_one_audit_record,
        ),
        ctx.trial(
            AREA,
            "no_secret_in_spans_logs_or_audit",
            &[],
            no_secret_in_spans_logs_or_audit,
        ),
        ctx.trial(
            AREA,
            "strict_failing_sink_is_e1601",
            &[],
            strict_failing_sink_is_e1601,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// How many spans have closed so far: spans of an earlier run in the same process (the fake
/// numbers its sandboxes per backend, so ids repeat across backends) come before it.
fn span_mark() -> usize {
    capture::closed_span_count()
}

/// Spans of sandbox `id` that closed after `mark`.
fn spans_of(id: &str, mark: usize) -> Vec<CapturedSpan> {
    spans()
        .into_iter()
        .skip(mark)
        .filter(|s| s.name.starts_with("sandbox.") && s.target == sandbox_core::layer::TARGET)
        .filter(|s| s.fields.get("sandbox_id").is_some_and(|v| v == id))
        .collect()
}

/// A sink that fails every write.
#[derive(Debug)]
struct FailingSink;

impl AuditSink for FailingSink {
    fn record(&self, _record: &AuditRecord) -> Result<(), BoxError> {
        Err("audit destination unavailable (contract trial)".into())
    }
}

/// Runs one operation of every kind on `sb` (refused ones included: a refusal is an
/// operation too) and returns the span names expected, in order.
async fn every_operation(
    backend: &Arc<dyn Backend>,
    sb: &Sbx,
    ctx: &Ctx,
    scratch: &Path,
) -> anyhow::Result<Vec<&'static str>> {
    let caps = sb.capabilities();
    let mut ops = vec!["sandbox.create"];
    let _ = sb.run(["true"].into(), RunOptions::default()).await;
    ops.push("sandbox.run");
    let _ = sb.run_code("print(6 * 7)", CodeOptions::default()).await;
    ops.push("sandbox.run_code");
    if let Ok(mut p) = sb.stream(["echo", "streamed"].into(), RunOptions::default()) {
        let _ = p.wait().await;
    }
    ops.push("sandbox.stream");
    match sb.files() {
        Ok(fs) => {
            let _ = fs.write("obs.txt", Bytes::from_static(b"observed")).await;
            let _ = fs.read("obs.txt").await;
            let _ = fs.ls(".").await;
            let _ = fs.mkdir("obs-dir/sub", true).await;
            let _ = fs.stat("obs-dir").await;
            let _ = fs.remove("obs-dir").await;
            let local = scratch.join("up.txt");
            std::fs::write(&local, b"uploaded").context("scratch file")?;
            let _ = fs.upload(&local, "up.txt").await;
            let _ = fs.download("up.txt", &scratch.join("down.txt")).await;
            ops.extend([
                "sandbox.files.write",
                "sandbox.files.read",
                "sandbox.files.ls",
                "sandbox.files.mkdir",
                "sandbox.files.stat",
                "sandbox.files.remove",
                "sandbox.files.upload",
                "sandbox.files.download",
            ]);
        }
        Err(_) => {
            ensure!(
                !caps.contains(C::FILESYSTEM),
                "files() refused though FILESYSTEM is declared"
            );
            ops.push("sandbox.files");
        }
    }
    let other = Sbx::new(
        sbx(backend.connect(sb.id()).await, "connect")?,
        ctx.background_kills.clone(),
    );
    ops.push("sandbox.connect");
    let _ = other.run(["true"].into(), RunOptions::default()).await;
    ops.push("sandbox.run");
    sbx((**sb).kill().await, "kill")?;
    sbx((**sb).kill().await, "second kill")?;
    ops.extend(["sandbox.kill", "sandbox.kill"]);
    other.kill().await?;
    ops.push("sandbox.kill");
    Ok(ops)
}

/// Every operation — create, connect, run, run_code, stream, each file operation, kill,
/// a second kill — emits exactly one span named for it (with backend, sandbox id, tier and
/// duration) and exactly one audit record, refused operations included.
async fn every_operation_has_one_span_and_one_audit_record(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("every_operation_has_one_span_and_one_audit_record");
    ensure!(
        ctx.backend.as_enforced().is_some(),
        "the suite's backend is not wrapped in the enforcement layer"
    );
    let sink = Arc::new(MemorySink::new());
    let mark = span_mark();
    let backend = Layer::new().audit(sink.clone()).wrap(ctx.backend.clone());
    ensure!(
        backend
            .as_enforced()
            .is_some_and(|e| e.inner().as_enforced().is_none()),
        "adding a sink wrapped the layer in a second layer"
    );
    let sb = Sbx::new(
        sbx(
            backend.create(ctx.opts(&c).metadata(CASE_LABEL, &c)).await,
            "create",
        )?,
        ctx.background_kills.clone(),
    );
    let id = sb.id().to_string();
    let scratch = tempfile::tempdir().context("scratch dir")?;
    let expected = every_operation(&backend, &sb, &ctx, scratch.path()).await?;

    let records: Vec<AuditRecord> = sink
        .records()
        .into_iter()
        .filter(|r| r.sandbox_id.as_deref() == Some(id.as_str()))
        .collect();
    let recorded: Vec<&str> = records.iter().map(|r| r.operation).collect();
    ensure!(
        recorded == expected,
        "audit records {recorded:?}\n  expected {expected:?}"
    );
    let noops: Vec<bool> = records
        .iter()
        .filter(|r| r.operation == "sandbox.kill")
        .map(|r| r.noop)
        .collect();
    ensure!(
        noops == [false, true, false],
        "kill records (noop flags) {noops:?}: the second kill on a handle must not reach the adapter"
    );

    let spans = spans_of(&id, mark);
    let names: Vec<&str> = spans.iter().map(|s| s.name).collect();
    ensure!(
        names == expected,
        "spans {names:?}\n  expected {expected:?}"
    );
    let tier = ctx.tier.to_string();
    for s in &spans {
        let f = &s.fields;
        ensure!(
            f.get("backend").map(String::as_str) == Some(ctx.backend.name()),
            "{} backend field {:?}",
            s.name,
            f.get("backend")
        );
        ensure!(
            f.get("tier") == Some(&tier),
            "{} tier field {:?}",
            s.name,
            f.get("tier")
        );
        ensure!(
            f.contains_key("duration_us"),
            "{} has no duration_us",
            s.name
        );
    }
    let run = spans
        .iter()
        .find(|s| s.name == "sandbox.run")
        .context("no run span")?;
    ensure!(
        run.fields.get("exit_code").map(String::as_str) == Some("0"),
        "run span exit_code {:?}",
        run.fields.get("exit_code")
    );
    ensure!(
        run.fields
            .get("command_sha256")
            .is_some_and(|h| h.len() == 64),
        "run span has no command_sha256"
    );
    if sb.capabilities().contains(C::FILESYSTEM) {
        let write = spans
            .iter()
            .find(|s| s.name == "sandbox.files.write")
            .context("no files.write span")?;
        ensure!(
            write.fields.get("bytes").map(String::as_str) == Some("8"),
            "files.write bytes {:?}",
            write.fields.get("bytes")
        );
    }
    Ok(())
}

/// A secret, an env value, a per-call env value and a token inside code never appear in
/// any captured span field, any log line (any target), an audit record in memory or a
/// JSON-lines audit file; code is represented by its SHA-256 only.
async fn no_secret_in_spans_logs_or_audit(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("no_secret_in_spans_logs_or_audit");
    let secret = token("sbx-obs-secret-");
    let env_val = token("sbx-obs-env-");
    let call_env = token("sbx-obs-call-");
    let code_tok = token("sbx-obs-code-");
    let scratch = tempfile::tempdir().context("scratch dir")?;
    let file_path = scratch.path().join("audit.jsonl");
    let memory = Arc::new(MemorySink::new());
    let file = Arc::new(sbx(JsonLinesSink::open(&file_path), "open audit file")?);
    let backend = Layer::new()
        .audit(memory.clone())
        .audit(file)
        .wrap(ctx.backend.clone());
    let opts = ctx
        .opts(&c)
        .metadata(CASE_LABEL, &c)
        .secret("SBX_OBS_SECRET", secret.as_str())
        .env("SBX_OBS_PLAIN", env_val.as_str());
    let sb = Sbx::new(
        sbx(backend.create(opts).await, "create")?,
        ctx.background_kills.clone(),
    );
    let id = sb.id().to_string();
    let r = sbx(
        sb.run(["printenv", "SBX_OBS_SECRET"].into(), RunOptions::default())
            .await,
        "run printenv",
    )?;
    ensure!(
        r.stdout_text().contains(&secret),
        "the secret did not reach the command (stdout {:?}); the trial would prove nothing",
        r.stdout_text()
    );
    let _ = sb
        .run(
            ["printenv", "SBX_OBS_CALL"].into(),
            RunOptions::default().env("SBX_OBS_CALL", call_env.as_str()),
        )
        .await;
    let code = format!("print('{code_tok}')");
    let _ = sb.run_code(&code, CodeOptions::default()).await;
    if let Ok(fs) = sb.files() {
        let _ = fs
            .write("obs-secret.txt", Bytes::from(secret.clone().into_bytes()))
            .await;
        let _ = fs.read(&format!("missing-{secret}")).await;
    }
    // A failing command whose argv carries the per-call env value.
    let _ = sb
        .run(
            ["sh", "-c", &format!("exit 3 # {call_env}")].into(),
            RunOptions::default().env("SBX_OBS_CALL", call_env.as_str()),
        )
        .await;
    sb.kill().await?;

    let values = [&secret, &env_val, &call_env, &code_tok];
    for s in spans() {
        let text = format!("{:?}", s.fields);
        for v in values {
            ensure!(
                !text.contains(v.as_str()),
                "span {} (target {}) carries a secret/env/code value: {text}",
                s.name,
                s.target
            );
        }
    }
    for l in lines() {
        let text = format!("{:?}", l.fields);
        for v in values {
            ensure!(
                !text.contains(v.as_str()),
                "log line (target {}) carries a secret/env/code value: {text}",
                l.target
            );
        }
    }
    let records: Vec<AuditRecord> = memory
        .records()
        .into_iter()
        .filter(|r| r.sandbox_id.as_deref() == Some(id.as_str()))
        .collect();
    ensure!(
        records.len() >= 5,
        "expected a record per operation, got {}",
        records.len()
    );
    for r in &records {
        let json = r.to_json();
        for v in values {
            ensure!(
                !json.contains(v.as_str()),
                "audit record carries a secret/env/code value: {json}"
            );
        }
    }
    let code_record = records
        .iter()
        .find(|r| r.operation == "sandbox.run_code")
        .context("no run_code record")?;
    ensure!(
        code_record
            .code_sha256
            .as_ref()
            .is_some_and(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit())),
        "run_code record has no SHA-256 of the code: {code_record:?}"
    );
    ensure!(
        code_record.code.is_none(),
        "code text recorded without opt-in"
    );
    let on_disk = std::fs::read_to_string(&file_path).context("read audit file")?;
    let lines_for_id = on_disk.lines().filter(|l| l.contains(&id)).count();
    ensure!(
        lines_for_id == records.len(),
        "audit file has {lines_for_id} lines for {id}, memory sink {}",
        records.len()
    );
    for v in values {
        ensure!(
            !on_disk.contains(v.as_str()),
            "audit file carries a secret/env/code value"
        );
    }
    Ok(())
}

/// With a strict layer, a sink that cannot record fails the operation with `SBX_E1601`
/// (`AuditSink`), and a `create` that could not be recorded leaves no sandbox behind.
async fn strict_failing_sink_is_e1601(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("strict_failing_sink_is_e1601");
    let backend = Layer::new()
        .audit(Arc::new(FailingSink))
        .strict(true)
        .wrap(ctx.backend.clone());
    let r = backend.create(ctx.opts(&c).metadata(CASE_LABEL, &c)).await;
    let e = must_code(r, ErrorCode::AuditSink)?;
    ensure!(e.code().as_str() == "SBX_E1601", "code {}", e.code());
    ensure!(
        std::error::Error::source(&e).is_some(),
        "the sink's error is not kept as the source"
    );
    if ctx.backend.as_reapable().is_some() {
        ctx.wait_unlisted(&c, std::time::Duration::from_secs(2))
            .await
            .context("the unrecorded sandbox was not killed")?;
    }
    // A lenient layer with the same sink keeps the operation's own result.
    let lenient = Layer::new()
        .audit(Arc::new(FailingSink))
        .wrap(ctx.backend.clone());
    let sb = Sbx::new(
        sbx(
            lenient.create(ctx.opts(&c).metadata(CASE_LABEL, &c)).await,
            "lenient create",
        )?,
        ctx.background_kills.clone(),
    );
    let outcome = sb.kill().await;
    if let Err(e) = outcome {
        bail!("lenient layer failed the kill: {e:#}");
    }
    Ok(())
}

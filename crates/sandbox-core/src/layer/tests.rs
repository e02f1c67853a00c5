//! The layer against a tiny in-test backend that records every call it receives.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::op::sha256_hex;
use super::*;
use crate::options::MAX_SANDBOX_TIMEOUT;
use crate::{
    Capability, CodeOptions, Command, CreateOptions, ErrorCode, ExecResult, FileInfo, FileSystem,
    IsolationTier, NetworkPolicy, Process, Resources, Result, RunOptions, Sandbox, SandboxError,
};

/// Serialises the tests that hit the layer's span callsites: `tracing` caches a callsite's
/// interest when it is first hit, and a test registering a callsite on another thread while
/// the capturing test installs its dispatcher can cache "never" and hide spans from it.
pub(crate) static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SECRET: &str = "s3cr3t-token-value";
const ENV_VALUE: &str = "env-value-private";

#[derive(Debug, Default)]
struct Calls {
    log: Mutex<Vec<String>>,
    timeouts: Mutex<Vec<Option<Duration>>>,
    kills: AtomicUsize,
}

impl Calls {
    fn push(&self, what: &str) {
        self.log.lock().unwrap().push(what.to_string());
    }
    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

#[derive(Debug)]
struct Tiny {
    caps: Capability,
    tier: IsolationTier,
    sandbox_tier: IsolationTier,
    calls: Arc<Calls>,
}

impl Tiny {
    fn new(caps: Capability) -> Self {
        Tiny {
            caps,
            tier: IsolationTier::Container,
            sandbox_tier: IsolationTier::Container,
            calls: Arc::default(),
        }
    }
    fn sandbox(&self, id: &str) -> Box<dyn Sandbox> {
        Box::new(TinySandbox {
            id: id.into(),
            caps: self.caps,
            tier: self.sandbox_tier,
            calls: self.calls.clone(),
        })
    }
}

#[async_trait]
impl Backend for Tiny {
    fn name(&self) -> &str {
        "tiny"
    }
    fn capabilities(&self) -> Capability {
        self.caps
    }
    fn isolation(&self) -> IsolationTier {
        self.tier
    }
    async fn create(&self, _options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        self.calls.push("create");
        Ok(self.sandbox("tiny-1"))
    }
    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        self.calls.push("connect");
        if id == "tiny-1" {
            Ok(self.sandbox(id))
        } else {
            Err(SandboxError::connect(id, "no such sandbox"))
        }
    }
}

#[derive(Debug)]
struct TinySandbox {
    id: String,
    caps: Capability,
    tier: IsolationTier,
    calls: Arc<Calls>,
}

#[async_trait]
impl Sandbox for TinySandbox {
    fn id(&self) -> &str {
        &self.id
    }
    fn backend(&self) -> &str {
        "tiny"
    }
    fn capabilities(&self) -> Capability {
        self.caps
    }
    fn isolation(&self) -> IsolationTier {
        self.tier
    }
    async fn run(&self, _cmd: Command, options: RunOptions) -> Result<ExecResult> {
        self.calls.push("run");
        self.calls.timeouts.lock().unwrap().push(options.timeout);
        Ok(ExecResult::new(3, "out", "err"))
    }
    async fn run_code(&self, _code: &str, options: CodeOptions) -> Result<ExecResult> {
        self.calls.push("run_code");
        self.calls.timeouts.lock().unwrap().push(options.timeout);
        Ok(ExecResult::new(0, "42", ""))
    }
    fn stream(&self, _cmd: Command, _options: RunOptions) -> Result<Process> {
        self.calls.push("stream");
        Err(SandboxError::engine("tiny", "streams are not modelled"))
    }
    fn files(&self) -> Result<&dyn FileSystem> {
        self.calls.push("files");
        Ok(self)
    }
    async fn kill(&self) -> Result<()> {
        self.calls.push("kill");
        self.calls.kills.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn native(&self) -> &dyn Any {
        self
    }
}

#[async_trait]
impl FileSystem for TinySandbox {
    async fn read(&self, path: &str) -> Result<Bytes> {
        self.calls.push("read");
        Err(SandboxError::path_not_found(path))
    }
    async fn write(&self, _path: &str, _data: Bytes) -> Result<()> {
        self.calls.push("write");
        Ok(())
    }
    async fn upload(&self, _local: &Path, _remote: &str) -> Result<()> {
        self.calls.push("upload");
        Ok(())
    }
    async fn download(&self, _remote: &str, _local: &Path) -> Result<()> {
        self.calls.push("download");
        Ok(())
    }
    async fn ls(&self, _path: &str) -> Result<Vec<FileInfo>> {
        self.calls.push("ls");
        Ok(vec![])
    }
    async fn mkdir(&self, _path: &str, _parents: bool) -> Result<()> {
        self.calls.push("mkdir");
        Ok(())
    }
    async fn remove(&self, _path: &str) -> Result<()> {
        self.calls.push("remove");
        Ok(())
    }
    async fn stat(&self, path: &str) -> Result<FileInfo> {
        self.calls.push("stat");
        Ok(FileInfo::new(path, 0, false, 0o644, None))
    }
}

/// A sink whose every write fails.
#[derive(Debug)]
struct BrokenSink;

impl AuditSink for BrokenSink {
    fn record(&self, _record: &AuditRecord) -> std::result::Result<(), crate::BoxError> {
        Err("disk full".into())
    }
}

fn wrap(tiny: Tiny) -> (Arc<dyn Backend>, Arc<Calls>, Arc<MemorySink>) {
    let calls = tiny.calls.clone();
    let sink = Arc::new(MemorySink::new());
    let b = Layer::new().audit(sink.clone()).wrap(Arc::new(tiny));
    (b, calls, sink)
}

fn basic() -> Capability {
    Capability::RUN_COMMAND | Capability::NETWORK_POLICY
}

fn unsupported_cap(e: SandboxError) -> Capability {
    match e {
        SandboxError::CapabilityNotSupported { capability, .. } => capability,
        other => panic!("expected CapabilityNotSupported, got {other:?}"),
    }
}

#[tokio::test]
async fn undeclared_capability_never_reaches_the_adapter() {
    let _serial = SERIAL.lock().await;
    let (b, calls, _) = wrap(Tiny::new(basic()));
    let sb = b.create(CreateOptions::default()).await.unwrap();
    let e = sb.run_code("print(1)", CodeOptions::default()).await;
    assert_eq!(unsupported_cap(e.unwrap_err()), Capability::RUN_CODE);
    let e = sb.stream("echo".into(), RunOptions::default()).unwrap_err();
    assert_eq!(unsupported_cap(e), Capability::STREAMING);
    let e = sb.files().err().expect("files refused");
    assert_eq!(unsupported_cap(e), Capability::FILESYSTEM);
    let e = sb.ingress_address(80).unwrap_err();
    assert_eq!(unsupported_cap(e), Capability::INGRESS_PORTS);
    assert_eq!(
        calls.log(),
        ["create"],
        "nothing but create reached the adapter"
    );
}

#[tokio::test]
async fn stateful_code_and_transfers_need_their_flags() {
    let _serial = SERIAL.lock().await;
    let caps = basic() | Capability::RUN_CODE | Capability::FILESYSTEM;
    let (b, calls, _) = wrap(Tiny::new(caps));
    let sb = b.create(CreateOptions::default()).await.unwrap();
    assert!(sb.run_code("1", CodeOptions::default()).await.is_ok());
    let e = sb.run_code("1", CodeOptions::default().context("c1")).await;
    assert_eq!(unsupported_cap(e.unwrap_err()), Capability::STATEFUL_CODE);
    let fs = sb.files().unwrap();
    let e = fs.upload(Path::new("/nonexistent"), "x").await.unwrap_err();
    assert_eq!(unsupported_cap(e), Capability::UPLOAD_DOWNLOAD);
    let e = fs.download("x", Path::new("/tmp/x")).await.unwrap_err();
    assert_eq!(unsupported_cap(e), Capability::UPLOAD_DOWNLOAD);
    assert!(fs.ls(".").await.is_ok());
    assert_eq!(calls.log(), ["create", "run_code", "files", "ls"]);
}

#[tokio::test]
async fn create_refusals_happen_before_provisioning() {
    let _serial = SERIAL.lock().await;
    let (b, calls, _) = wrap(Tiny::new(basic()));
    let refused = [
        CreateOptions::default().require_isolation(IsolationTier::Gvisor),
        CreateOptions::default().network(NetworkPolicy::allow_list(["pypi.org"])),
        CreateOptions::default().resources(Resources::default().gpu(1)),
        CreateOptions::default().timeout(Duration::ZERO),
        CreateOptions::default().env("BAD=KEY", "v"),
    ];
    for o in refused {
        let e = b.create(o).await.unwrap_err();
        assert!(
            matches!(
                e.code(),
                ErrorCode::Configuration | ErrorCode::CapabilityNotSupported
            ),
            "{e:?}"
        );
    }
    assert!(calls.log().is_empty(), "adapter called: {:?}", calls.log());
    // Without NETWORK_POLICY even the default (deny) policy cannot be honoured.
    let (b, calls, _) = wrap(Tiny::new(Capability::RUN_COMMAND));
    let e = b.create(CreateOptions::default()).await.unwrap_err();
    assert_eq!(unsupported_cap(e), Capability::NETWORK_POLICY);
    assert!(calls.log().is_empty());
}

#[tokio::test(start_paused = true)]
async fn none_timeout_resolves_to_the_remaining_lifetime() {
    let _serial = SERIAL.lock().await;
    let (b, calls, _) = wrap(Tiny::new(basic() | Capability::RUN_CODE));
    let sb = b
        .create(CreateOptions::default().timeout(Duration::from_secs(100)))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(40)).await;
    sb.run("true".into(), RunOptions::default()).await.unwrap();
    sb.run_code("1", CodeOptions::default()).await.unwrap();
    sb.run(
        "true".into(),
        RunOptions::default().timeout(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    // Past the lifetime: still bounded, never zero, so the adapter can say "gone".
    tokio::time::advance(Duration::from_secs(100)).await;
    sb.run("true".into(), RunOptions::default()).await.unwrap();
    let seen = calls.timeouts.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            Some(Duration::from_secs(60)),
            Some(Duration::from_secs(60)),
            Some(Duration::from_secs(5)),
            Some(MIN_INHERITED_TIMEOUT),
        ]
    );
}

#[tokio::test]
async fn connected_sandbox_timeout_is_still_bounded() {
    let _serial = SERIAL.lock().await;
    let (b, calls, _) = wrap(Tiny::new(basic()));
    let sb = b.connect("tiny-1").await.unwrap();
    sb.run("true".into(), RunOptions::default()).await.unwrap();
    assert_eq!(
        calls.timeouts.lock().unwrap().clone(),
        [Some(MAX_SANDBOX_TIMEOUT)]
    );
    assert_eq!(
        b.connect("nope").await.unwrap_err().code(),
        ErrorCode::Connect
    );
}

#[tokio::test]
async fn zero_timeout_and_bad_commands_are_refused_before_the_adapter() {
    let _serial = SERIAL.lock().await;
    let (b, calls, _) = wrap(Tiny::new(basic() | Capability::RUN_CODE));
    let sb = b.create(CreateOptions::default()).await.unwrap();
    let zero = RunOptions::default().timeout(Duration::ZERO);
    let e = sb.run("true".into(), zero).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
    let e = sb
        .run_code("1", CodeOptions::default().timeout(Duration::ZERO))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
    let e = sb
        .run(Command::Argv(vec![]), RunOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
    assert_eq!(calls.log(), ["create"]);
}

#[tokio::test]
async fn double_kill_calls_the_adapter_once_and_later_calls_are_gone() {
    let _serial = SERIAL.lock().await;
    let (b, calls, sink) = wrap(Tiny::new(basic() | Capability::FILESYSTEM));
    let sb = b.create(CreateOptions::default()).await.unwrap();
    sb.kill().await.unwrap();
    sb.kill().await.unwrap();
    assert_eq!(calls.kills.load(Ordering::SeqCst), 1);
    let e = sb.run("true".into(), RunOptions::default()).await;
    assert_eq!(e.unwrap_err().code(), ErrorCode::SandboxGone);
    let e = sb.files().unwrap().read("a").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxGone);
    assert_eq!(calls.log(), ["create", "kill"]);
    let kills: Vec<bool> = sink
        .records()
        .iter()
        .filter(|r| r.operation == "sandbox.kill")
        .map(|r| r.noop)
        .collect();
    assert_eq!(
        kills,
        [false, true],
        "each kill is recorded; the second as a no-op"
    );
}

#[tokio::test]
async fn concurrent_kills_call_the_adapter_once() {
    let _serial = SERIAL.lock().await;
    let (b, calls, _) = wrap(Tiny::new(basic()));
    let sb = b.create(CreateOptions::default()).await.unwrap();
    let (a, c) = tokio::join!(sb.kill(), sb.kill());
    assert!(a.is_ok() && c.is_ok());
    assert_eq!(calls.kills.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn strict_audit_failure_is_e1601_and_kills_the_new_sandbox() {
    let _serial = SERIAL.lock().await;
    let tiny = Tiny::new(basic());
    let calls = tiny.calls.clone();
    let b = Layer::new()
        .audit(Arc::new(BrokenSink))
        .strict(true)
        .wrap(Arc::new(tiny));
    let e = b.create(CreateOptions::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::AuditSink);
    assert_eq!(e.code().as_str(), "SBX_E1601");
    assert!(std::error::Error::source(&e).is_some(), "sink error kept");
    assert_eq!(
        calls.log(),
        ["create", "kill"],
        "the unrecorded sandbox is killed"
    );
}

#[tokio::test]
async fn lenient_audit_failure_keeps_the_result() {
    let _serial = SERIAL.lock().await;
    let tiny = Tiny::new(basic());
    let b = Layer::new()
        .audit(Arc::new(BrokenSink))
        .wrap(Arc::new(tiny));
    let sb = b.create(CreateOptions::default()).await.unwrap();
    assert_eq!(
        sb.run("true".into(), RunOptions::default())
            .await
            .unwrap()
            .exit_code,
        3
    );
}

#[tokio::test]
async fn sandbox_tier_must_equal_backend_tier() {
    let _serial = SERIAL.lock().await;
    let mut tiny = Tiny::new(basic());
    tiny.tier = IsolationTier::Gvisor;
    let (b, calls, _) = wrap(tiny);
    let e = b.create(CreateOptions::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Creation);
    assert_eq!(calls.log(), ["create", "kill"]);
    let kills = calls.kills.load(Ordering::SeqCst);
    let e = b.connect("tiny-1").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Connect);
    assert_eq!(
        calls.kills.load(Ordering::SeqCst),
        kills,
        "connect never kills"
    );
}

#[tokio::test]
async fn wrapping_twice_is_detected_and_merges_sinks() {
    let _serial = SERIAL.lock().await;
    let (b, _, first) = wrap(Tiny::new(basic()));
    assert!(Arc::ptr_eq(&b, &enforce(b.clone())));
    let second = Arc::new(MemorySink::new());
    let b2 = Layer::new().audit(second.clone()).wrap(b.clone());
    assert!(!Arc::ptr_eq(&b, &b2));
    let inner_is_adapter = b2.as_enforced().unwrap().inner().as_enforced().is_none();
    assert!(inner_is_adapter, "one layer, not two");
    let sb = b2.create(CreateOptions::default()).await.unwrap();
    sb.run("true".into(), RunOptions::default()).await.unwrap();
    for sink in [&first, &second] {
        let ops: Vec<_> = sink.records().iter().map(|r| r.operation).collect();
        assert_eq!(ops, ["sandbox.create", "sandbox.run"]);
    }
    // `native()` still reaches the adapter's object.
    assert!(sb.native().downcast_ref::<TinySandbox>().is_some());
}

#[tokio::test]
async fn one_record_per_operation_with_hashes_never_text() {
    let _serial = SERIAL.lock().await;
    let caps = basic()
        | Capability::RUN_CODE
        | Capability::FILESYSTEM
        | Capability::UPLOAD_DOWNLOAD
        | Capability::STREAMING;
    let (b, _, sink) = wrap(Tiny::new(caps));
    let sb = b
        .create(
            CreateOptions::default()
                .secret("TOKEN", SECRET)
                .env("PLAIN", ENV_VALUE),
        )
        .await
        .unwrap();
    let code = format!("print('{SECRET}')");
    sb.run_code(&code, CodeOptions::default()).await.unwrap();
    sb.run(
        format!("echo {SECRET}").into(),
        RunOptions::default().env("X", ENV_VALUE),
    )
    .await
    .unwrap();
    let _ = sb.stream("echo".into(), RunOptions::default());
    let fs = sb.files().unwrap();
    fs.write(&format!("/work/{SECRET}.txt"), Bytes::from_static(b"abc"))
        .await
        .unwrap();
    let _ = fs.read(&format!("/work/{ENV_VALUE}")).await;
    fs.ls("/work").await.unwrap();
    fs.mkdir("/work/d", true).await.unwrap();
    fs.stat("/work/d").await.unwrap();
    fs.remove("/work/d").await.unwrap();
    sb.kill().await.unwrap();
    let records = sink.records();
    let ops: Vec<_> = records.iter().map(|r| r.operation).collect();
    assert_eq!(
        ops,
        [
            "sandbox.create",
            "sandbox.run_code",
            "sandbox.run",
            "sandbox.stream",
            "sandbox.files.write",
            "sandbox.files.read",
            "sandbox.files.ls",
            "sandbox.files.mkdir",
            "sandbox.files.stat",
            "sandbox.files.remove",
            "sandbox.kill",
        ]
    );
    for r in &records {
        assert_eq!(r.sandbox_id.as_deref(), Some("tiny-1"), "{r:?}");
        let json = r.to_json();
        assert!(
            !json.contains(SECRET) && !json.contains(ENV_VALUE),
            "leak in {json}"
        );
    }
    let run_code = &records[1];
    assert_eq!(
        run_code.code_sha256.as_deref(),
        Some(sha256_hex(code.as_bytes()).as_str())
    );
    assert_eq!(run_code.code, None, "code text only when opted in");
    assert_eq!((records[2].exit_code, records[2].bytes), (Some(3), Some(6)));
    assert_eq!(records[4].bytes, Some(3));
    assert_eq!(records[5].error_code, Some("SBX_E1701"));
    assert_eq!(records[3].error_code, Some("SBX_E1800"));
}

#[tokio::test]
async fn recorded_code_is_redacted() {
    let _serial = SERIAL.lock().await;
    let sink = Arc::new(MemorySink::new());
    let b = Layer::new()
        .audit(sink.clone())
        .record_code(true)
        .wrap(Arc::new(Tiny::new(basic() | Capability::RUN_CODE)));
    let sb = b
        .create(CreateOptions::default().secret("TOKEN", SECRET))
        .await
        .unwrap();
    sb.run_code(&format!("x = '{SECRET}'"), CodeOptions::default())
        .await
        .unwrap();
    let code = sink.records()[1].code.clone();
    assert_eq!(code.as_deref(), Some("x = '***'"));
}

#[tokio::test]
async fn support_directory_fills_refusals() {
    let _serial = SERIAL.lock().await;
    fn dir(c: Capability) -> Vec<String> {
        if c == Capability::STREAMING {
            vec!["docker".into()]
        } else {
            vec![]
        }
    }
    let b = Layer::new()
        .support_directory(dir)
        .wrap(Arc::new(Tiny::new(basic())));
    let sb = b.create(CreateOptions::default()).await.unwrap();
    match sb.stream("x".into(), RunOptions::default()).unwrap_err() {
        SandboxError::CapabilityNotSupported { supported_by, .. } => {
            assert_eq!(supported_by, ["docker"])
        }
        other => panic!("{other:?}"),
    }
}

mod spans {
    //! A minimal in-memory subscriber: enough to see span names and recorded fields.

    use super::*;
    use std::sync::atomic::AtomicU64;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    #[derive(Default)]
    pub(super) struct Capture {
        next: AtomicU64,
        pub(super) spans: Mutex<Vec<(String, BTreeMap<String, String>)>>,
        pub(super) events: Mutex<Vec<BTreeMap<String, String>>>,
    }

    struct Fields<'a>(&'a mut BTreeMap<String, String>);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.0
                .insert(field.name().to_string(), format!("{value:?}"));
        }
    }

    impl Subscriber for Capture {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, attrs: &Attributes<'_>) -> Id {
            let mut fields = BTreeMap::new();
            attrs.record(&mut Fields(&mut fields));
            let mut spans = self.spans.lock().unwrap();
            spans.push((attrs.metadata().name().to_string(), fields));
            self.next.fetch_add(1, Ordering::SeqCst);
            Id::from_u64(spans.len() as u64)
        }
        fn record(&self, id: &Id, values: &Record<'_>) {
            let mut spans = self.spans.lock().unwrap();
            if let Some((_, fields)) = spans.get_mut(id.into_u64() as usize - 1) {
                values.record(&mut Fields(fields));
            }
        }
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut fields = BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            self.events.lock().unwrap().push(fields);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
}

#[test]
fn every_operation_has_one_span_with_its_fields_and_no_secret() {
    let _serial = SERIAL.blocking_lock();
    let capture = Arc::new(spans::Capture::default());
    let dispatch = tracing::Dispatch::from(capture.clone());
    tracing::dispatcher::with_default(&dispatch, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let caps = basic() | Capability::RUN_CODE | Capability::FILESYSTEM;
            let b = Layer::new()
                .audit(Arc::new(BrokenSink))
                .wrap(Arc::new(Tiny::new(caps)));
            let sb = b
                .create(CreateOptions::default().secret("TOKEN", SECRET))
                .await
                .unwrap();
            sb.run("true".into(), RunOptions::default().env("X", ENV_VALUE))
                .await
                .unwrap();
            sb.run_code(&format!("print('{SECRET}')"), CodeOptions::default())
                .await
                .unwrap();
            sb.files()
                .unwrap()
                .write("/work/a", Bytes::from_static(b"12345"))
                .await
                .unwrap();
            sb.kill().await.unwrap();
        });
    });
    let spans = capture.spans.lock().unwrap().clone();
    let names: Vec<_> = spans.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "sandbox.create",
            "sandbox.run",
            "sandbox.run_code",
            "sandbox.files.write",
            "sandbox.kill"
        ]
    );
    for (name, fields) in &spans {
        assert_eq!(fields["backend"], "tiny", "{name}");
        assert_eq!(fields["sandbox_id"], "\"tiny-1\"", "{name}");
        assert_eq!(fields["tier"], "container", "{name}");
        assert!(fields.contains_key("duration_us"), "{name}");
        let all = format!("{fields:?}");
        assert!(!all.contains(SECRET) && !all.contains(ENV_VALUE), "{all}");
    }
    assert_eq!(spans[1].1["exit_code"], "3");
    assert_eq!(spans[1].1["bytes"], "6");
    assert_eq!(spans[3].1["bytes"], "5");
    assert_eq!(spans[3].1["path"], "\"/work/a\"");
    assert_eq!(spans[2].1["code_sha256"].len(), 64 + 2);
    // The lenient sink failure was logged without the record's contents.
    let events = capture.events.lock().unwrap().clone();
    assert_eq!(events.len(), 5, "one warning per failed record: {events:?}");
    assert!(!format!("{events:?}").contains(SECRET));
}

/// The digest in spans and audit records is SHA-256 as 64 lower-case hex digits (NIST vectors).
#[test]
fn sha256_hex_matches_nist_vectors() {
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
    assert_eq!(
        sha256_hex(&vec![b'a'; 1_000_000]),
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
    );
    // 55, 56 and 64 bytes straddle the one-or-two padding block edge.
    assert_eq!(
        sha256_hex(&[b'a'; 55]),
        "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"
    );
    assert_eq!(
        sha256_hex(&[b'a'; 56]),
        "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"
    );
    assert_eq!(
        sha256_hex(&[b'a'; 64]),
        "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"
    );
}

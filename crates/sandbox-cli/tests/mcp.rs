//! `sandbox mcp` driven end to end by rmcp's client over stdio: the real binary as a child
//! process, the real protocol. Against the fake (always) and Docker (skipped with a printed
//! reason when Docker is absent; failing instead under `CI=true`).

mod common;

use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

const TOOLS: &[&str] = &[
    "sandbox_create",
    "sandbox_run",
    "sandbox_run_code",
    "sandbox_write_file",
    "sandbox_read_file",
    "sandbox_list_files",
    "sandbox_pause",
    "sandbox_resume",
    "sandbox_stop",
    "sandbox_start",
    "sandbox_extend",
    "sandbox_set_egress",
    "sandbox_fork",
    "sandbox_kill",
];

type Client = RunningService<RoleClient, ()>;

/// The flags that let the Docker tests name the small test image beside the default one.
const TEST_IMAGES: &[&str] = &[
    "--allow-image",
    "sandbox-rs/python:3.11",
    "--allow-image",
    "sandbox-rs/busybox:latest",
];

async fn start() -> Client {
    start_with(&[]).await
}

async fn start_with(flags: &[&str]) -> Client {
    start_with_env(flags, &[]).await
}

async fn start_with_env(flags: &[&str], env: &[(&str, &str)]) -> Client {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sandbox"));
    cmd.arg("mcp")
        .args(flags)
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .env_remove("SANDBOX_LOG");
    let transport = TokioChildProcess::new(cmd).expect("spawn sandbox mcp");
    tokio::time::timeout(Duration::from_secs(30), ().serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize")
}

async fn call(client: &Client, tool: &str, args: Value) -> (bool, Value) {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    let r: CallToolResult = tokio::time::timeout(
        Duration::from_secs(120),
        client.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args)),
    )
    .await
    .expect("tool call in time")
    .expect("tool call");
    let failed = r.is_error == Some(true);
    let body = r.structured_content.clone().expect("structured content");
    // The text content is the same JSON (what hosts show a model).
    let text = r
        .content
        .first()
        .and_then(|c| c.as_text())
        .expect("text content");
    assert_eq!(
        serde_json::from_str::<Value>(&text.text).expect("text is JSON"),
        body
    );
    (failed, body)
}

/// The tool list, each with an object schema naming its required arguments.
async fn assert_tools(client: &Client) {
    let tools = client.list_all_tools().await.expect("list tools");
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    let mut want = TOOLS.to_vec();
    want.sort();
    assert_eq!(names, want);
    let run = tools.iter().find(|t| t.name == "sandbox_run").expect("run");
    let schema = Value::Object((*run.input_schema).clone());
    assert_eq!(schema["type"], "object");
    let required: Vec<&str> = schema["required"]
        .as_array()
        .expect("required")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        required.contains(&"sandbox_id") && required.contains(&"command"),
        "{schema}"
    );
    for t in &tools {
        assert!(
            t.description.as_deref().is_some_and(|d| d.len() > 20),
            "{}",
            t.name
        );
    }
}

/// list tools → create → print(6*7) → 42 → files → kill → kill again; returns the id.
async fn round_trip(client: &Client, engine: &str, image: Option<&str>) -> String {
    assert_tools(client).await;
    let mut args = json!({"engine": engine, "timeout_s": 120, "max_lifetime_s": 300});
    if let Some(i) = image {
        args["image"] = json!(i);
    }
    let (failed, created) = call(client, "sandbox_create", args).await;
    assert!(!failed, "{created}");
    let id = created["sandbox_id"]
        .as_str()
        .expect("sandbox_id")
        .to_string();

    let (failed, r) = call(
        client,
        "sandbox_run_code",
        json!({"sandbox_id": id, "code": "print(6*7)"}),
    )
    .await;
    assert!(!failed, "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "42\n", "{r}");

    let (failed, r) = call(
        client,
        "sandbox_run",
        json!({"sandbox_id": id, "command": ["echo", "hi there"]}),
    )
    .await;
    assert!(!failed, "{r}");
    assert_eq!(
        (r["exit_code"].clone(), r["stdout"].clone()),
        (json!(0), json!("hi there\n"))
    );

    let (failed, r) = call(
        client,
        "sandbox_run",
        json!({"sandbox_id": id, "command": ["cat"], "stdin": "fed in\n"}),
    )
    .await;
    assert!(!failed, "{r}");
    assert_eq!(r["stdout"], "fed in\n", "{r}");

    let (failed, r) = call(
        client,
        "sandbox_run",
        json!({"sandbox_id": id, "command": "exit 3"}),
    )
    .await;
    assert!(!failed, "{r}");
    assert_eq!(r["exit_code"], 3, "{r}");

    let (failed, r) = call(
        client,
        "sandbox_write_file",
        json!({"sandbox_id": id, "path": "note.txt", "content": "hello\n"}),
    )
    .await;
    assert!(!failed, "{r}");
    let (failed, r) = call(
        client,
        "sandbox_read_file",
        json!({"sandbox_id": id, "path": "note.txt"}),
    )
    .await;
    assert!(!failed, "{r}");
    assert_eq!(r["content"], "hello\n", "{r}");
    let (failed, r) = call(
        client,
        "sandbox_list_files",
        json!({"sandbox_id": id, "path": "."}),
    )
    .await;
    assert!(!failed, "{r}");
    assert!(
        r["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .any(|e| e["name"] == "note.txt"),
        "{r}"
    );

    // A failure carries the SBX code and a hint.
    let (failed, r) = call(
        client,
        "sandbox_read_file",
        json!({"sandbox_id": id, "path": "missing.txt"}),
    )
    .await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1701", "{r}");
    assert!(
        r["error"]["hint"].as_str().is_some_and(|h| !h.is_empty()),
        "{r}"
    );

    // Paused, every other tool fails at once with SBX_E1206; resumed, it works again.
    let (failed, r) = call(client, "sandbox_pause", json!({"sandbox_id": id})).await;
    assert!(!failed && r["state"] == "paused", "{r}");
    let (failed, r) = call(
        client,
        "sandbox_run",
        json!({"sandbox_id": id, "command": "echo hi"}),
    )
    .await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1206", "{r}");
    let (failed, r) = call(client, "sandbox_resume", json!({"sandbox_id": id})).await;
    assert!(!failed && r["state"] == "running", "{r}");
    let (failed, r) = call(
        client,
        "sandbox_run",
        json!({"sandbox_id": id, "command": "echo hi"}),
    )
    .await;
    assert!(!failed, "{r}");

    // More time, up to the maximum of create; beyond it nothing moves.
    let (failed, r) = call(
        client,
        "sandbox_extend",
        json!({"sandbox_id": id, "seconds": 60}),
    )
    .await;
    assert!(!failed, "{r}");
    let left = r["expires_in_s"].as_u64().expect("expires_in_s");
    assert!((150..=181).contains(&left), "120 s + 60 s from create: {r}");
    let (failed, r) = call(
        client,
        "sandbox_extend",
        json!({"sandbox_id": id, "seconds": 600}),
    )
    .await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1402", "{r}");
    assert!(
        r["error"]["hint"]
            .as_str()
            .is_some_and(|h| h.contains("max_lifetime_s")),
        "{r}"
    );

    // Stopped, every other tool fails at once with SBX_E1207; started, its files are
    // still there and commands run again.
    let (failed, r) = call(
        client,
        "sandbox_write_file",
        json!({"sandbox_id": id, "path": "kept.txt", "content": "kept"}),
    )
    .await;
    assert!(!failed, "{r}");
    let (failed, r) = call(client, "sandbox_stop", json!({"sandbox_id": id})).await;
    assert!(!failed && r["state"] == "stopped", "{r}");
    let (failed, r) = call(
        client,
        "sandbox_run",
        json!({"sandbox_id": id, "command": "echo hi"}),
    )
    .await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1207", "{r}");
    let (failed, r) = call(client, "sandbox_start", json!({"sandbox_id": id})).await;
    assert!(!failed && r["state"] == "running", "{r}");
    let (failed, r) = call(
        client,
        "sandbox_run",
        json!({"sandbox_id": id, "command": "cat kept.txt"}),
    )
    .await;
    assert!(!failed, "{r}");
    assert_eq!(r["stdout"], "kept", "{r}");

    let (failed, r) = call(client, "sandbox_kill", json!({"sandbox_id": id})).await;
    assert!(!failed, "{r}");
    assert_eq!(r["killed"], true);
    let (failed, r) = call(client, "sandbox_kill", json!({"sandbox_id": id})).await;
    assert!(!failed && r["killed"] == false, "kill is idempotent: {r}");
    let (failed, r) = call(
        client,
        "sandbox_run",
        json!({"sandbox_id": id, "command": "true"}),
    )
    .await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1202", "{r}");
    id
}

#[tokio::test]
async fn mcp_client_round_trip_on_the_fake() {
    let client = start().await;
    round_trip(&client, "fake", None).await;
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn mcp_bad_arguments_are_tool_errors_with_codes() {
    let client = start().await;
    let (failed, r) = call(&client, "sandbox_create", json!({"engine": "nosuch"})).await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1001", "{r}");
    let (failed, r) = call(
        &client,
        "sandbox_run",
        json!({"sandbox_id": "nope", "command": "true"}),
    )
    .await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1202", "{r}");
    client.cancel().await.expect("close");
}

/// Egress is the operator's call: refused by default, granted by `--allow-egress`.
#[tokio::test]
async fn mcp_egress_needs_allow_egress() {
    let client = start().await;
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "fake", "network": "allow"}),
    )
    .await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1401", "{r}");
    client.cancel().await.expect("close");

    let client = start_with(&["--allow-egress"]).await;
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "fake", "network": "allow"}),
    )
    .await;
    assert!(!failed, "{r}");
    client.cancel().await.expect("close");
}

/// Credentials are the operator's: `sandbox mcp --credential` offers one by its variable,
/// a tool call binds it by that name (an unknown name is refused with the ones offered),
/// and no answer ever holds the value. The fake cannot broker, so the bound create is
/// refused with SBX_E1101 — the credential reached the backend.
#[tokio::test]
async fn mcp_credentials_are_offered_by_the_operator_and_bound_by_name() {
    const SECRET: &str = "sk-mcp-test-4f1d2a9c";
    let client = start_with_env(
        &[
            "--allow-egress",
            "--credential",
            "api.example.com:Authorization=Bearer {SBX_MCP_TEST_KEY}",
        ],
        &[("SBX_MCP_TEST_KEY", SECRET)],
    )
    .await;
    let create = |names: Value| json!({"engine": "fake", "allow_hosts": ["api.example.com"], "credentials": names});
    let mut answers = Vec::new();
    let (failed, r) = call(&client, "sandbox_create", create(json!(["OTHER_KEY"]))).await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1000", "{r}");
    assert!(
        r.to_string().contains("SBX_MCP_TEST_KEY"),
        "names what is offered: {r}"
    );
    answers.push(r);
    let (failed, r) = call(
        &client,
        "sandbox_create",
        create(json!(["SBX_MCP_TEST_KEY"])),
    )
    .await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1101", "{r}");
    assert!(r.to_string().contains("CREDENTIALS"), "{r}");
    answers.push(r);
    // Without credentials the same create works.
    let (failed, r) = call(&client, "sandbox_create", create(json!([]))).await;
    assert!(!failed, "{r}");
    answers.push(r);
    for a in &answers {
        assert!(!a.to_string().contains(SECRET), "{a}");
    }
    client.cancel().await.expect("close");
}

/// `sandbox_set_egress` narrows a sandbox's egress whatever the server allows, and widens
/// it only within the operator's `--egress-host` bound.
#[tokio::test]
async fn mcp_set_egress_narrows_and_widens_only_within_bounds() {
    let client = start_with(&["--allow-egress", "--egress-host", "*.example.com"]).await;
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "fake", "allow_hosts": ["api.example.com"]}),
    )
    .await;
    assert!(!failed, "{r}");
    let id = r["sandbox_id"].as_str().expect("id").to_string();
    let (failed, r) = call(
        &client,
        "sandbox_set_egress",
        json!({"sandbox_id": id, "deny_hosts": ["api.example.com"]}),
    )
    .await;
    assert!(!failed, "{r}");
    assert_eq!(
        r["egress"], "default deny; allow api.example.com; deny api.example.com",
        "{r}"
    );
    let (failed, r) = call(
        &client,
        "sandbox_set_egress",
        json!({"sandbox_id": id, "allow_hosts": ["pypi.org"]}),
    )
    .await;
    assert!(failed, "a widening outside the bound: {r}");
    assert_eq!(r["error"]["code"], "SBX_E1401", "{r}");
    let (failed, r) = call(
        &client,
        "sandbox_set_egress",
        json!({"sandbox_id": id, "allow_hosts": ["www.example.com"]}),
    )
    .await;
    assert!(!failed, "{r}");
    let (failed, r) = call(
        &client,
        "sandbox_set_egress",
        json!({"sandbox_id": id, "close": true}),
    )
    .await;
    assert!(!failed, "{r}");
    assert_eq!(r["egress"], "deny", "{r}");
    let (failed, r) = call(&client, "sandbox_kill", json!({"sandbox_id": id})).await;
    assert!(!failed, "{r}");
    client.cancel().await.expect("close");
}

/// A client cannot open what every sandbox is kept from: an allowlist entry inside the
/// metadata service, or one wider than any destination, is refused (`Configuration`)
/// before anything is created, even on a server that allows egress.
#[tokio::test]
async fn mcp_allowlist_cannot_open_the_blocked_set() {
    let client = start_with(&["--allow-egress"]).await;
    for bad in ["169.254.169.254/32", "0.0.0.0/0"] {
        let (failed, r) = call(
            &client,
            "sandbox_create",
            json!({"engine": "fake", "allow_hosts": [bad]}),
        )
        .await;
        assert!(failed, "{bad}: {r}");
        assert_eq!(r["error"]["code"], "SBX_E1000", "{bad}: {r}");
    }
    // An ordinary allowlist is still granted.
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "fake", "allow_hosts": ["10.0.0.0/8", "pypi.org"]}),
    )
    .await;
    assert!(!failed, "{r}");
    client.cancel().await.expect("close");
}

/// A client names only images the operator allows: any other (in `image` or in the
/// engine's DSN) is refused with `Configuration` naming `--allow-image`, before the engine
/// is asked for anything. Without the flag only the default image is allowed.
#[tokio::test]
async fn mcp_create_refuses_an_image_not_on_the_allowlist() {
    let client = start().await;
    for args in [
        json!({"engine": "fake", "image": "evil/miner:latest"}),
        json!({"engine": "fake://evil/miner:latest"}),
        json!({"engine": "fake", "image": "sandbox-rs/python:3.11-evil"}),
    ] {
        let (failed, r) = call(&client, "sandbox_create", args.clone()).await;
        assert!(failed, "{args}: {r}");
        assert_eq!(r["error"]["code"], "SBX_E1000", "{args}: {r}");
        assert!(
            r["error"]["hint"]
                .as_str()
                .is_some_and(|h| h.contains("--allow-image")),
            "{r}"
        );
    }
    for allowed in [
        json!({"engine": "fake"}),
        json!({"engine": "fake", "image": "sandbox-rs/python:3.11"}),
        json!({"engine": "fake", "image": "docker.io/sandbox-rs/python:3.11"}),
    ] {
        let (failed, r) = call(&client, "sandbox_create", allowed.clone()).await;
        assert!(!failed, "{allowed}: {r}");
    }
    client.cancel().await.expect("close");

    let client = start_with(&["--allow-image", "evil/*:*"]).await;
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "fake", "image": "evil/miner:latest"}),
    )
    .await;
    assert!(!failed, "allowed by the operator: {r}");
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "fake", "image": "sandbox-rs/python:3.11"}),
    )
    .await;
    assert!(failed, "the flag replaces the default: {r}");
    client.cancel().await.expect("close");
}

/// On a real engine a refused image is never pulled: the registry that serves it sees no
/// request, and the engine does not hold it afterwards.
#[tokio::test]
async fn mcp_a_refused_image_is_not_pulled_on_docker() {
    if !common::docker_available("mcp_a_refused_image_is_not_pulled_on_docker") {
        return;
    }
    let archive = sandbox_testkit::registry::source_archive("docker").expect("source archive");
    let reg =
        sandbox_testkit::registry::TestRegistry::start(&archive, &[("sbx-mcp/refused", "1")], None)
            .await
            .expect("registry");
    let image = format!("{}/sbx-mcp/refused:1", reg.host());
    let _cleanup = sandbox_testkit::engine_cli::ImageCleanup::new("docker", vec![image.clone()]);
    let client = start().await;
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "docker", "image": image, "timeout_s": 60}),
    )
    .await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1000", "{r}");
    client.cancel().await.expect("close");
    assert_eq!(reg.requests(), 0, "the registry was asked for the image");
    assert!(
        !sandbox_testkit::engine_cli::image_present("docker", &image),
        "the image was pulled"
    );
}

fn managed_containers(engine: &str, id: &str) -> String {
    let o = std::process::Command::new(engine)
        .args([
            "ps",
            "-a",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("id={id}"),
        ])
        .output()
        .expect("engine cli");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[tokio::test]
async fn mcp_client_round_trip_on_docker() {
    if !common::docker_available("mcp_client_round_trip_on_docker") {
        return;
    }
    let client = start().await;
    let id = round_trip(&client, "docker", Some("sandbox-rs/python:3.11")).await;
    client.cancel().await.expect("close");
    assert_eq!(
        managed_containers("docker", &id),
        "",
        "container left behind"
    );
}

/// The session owns its sandboxes: closing stdin (the host quits) kills the ones still
/// alive.
#[tokio::test]
async fn mcp_session_end_kills_its_sandboxes_on_docker() {
    if !common::docker_available("mcp_session_end_kills_its_sandboxes_on_docker") {
        return;
    }
    let client = start_with(TEST_IMAGES).await;
    let (failed, created) = call(
        &client,
        "sandbox_create",
        json!({"engine": "docker://sandbox-rs/busybox:latest", "timeout_s": 120}),
    )
    .await;
    assert!(!failed, "{created}");
    let id = created["sandbox_id"].as_str().expect("id").to_string();
    assert_eq!(
        managed_containers("docker", &id),
        id,
        "it runs while the session lives"
    );
    // Closes stdin and waits for the server to exit (it tears down first).
    client.cancel().await.expect("close");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !managed_containers("docker", &id).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        managed_containers("docker", &id),
        "",
        "session end left the container"
    );
}

/// SIGTERM to the server (the host is shutting down) kills the session's sandboxes too.
#[tokio::test]
async fn mcp_sigterm_kills_its_sandboxes_on_docker() {
    if !common::docker_available("mcp_sigterm_kills_its_sandboxes_on_docker") {
        return;
    }
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sandbox"));
    cmd.arg("mcp")
        .args(TEST_IMAGES)
        .env("NO_COLOR", "1")
        .env_remove("SANDBOX_LOG");
    let transport = TokioChildProcess::new(cmd).expect("spawn sandbox mcp");
    let pid = transport.id().expect("pid");
    let client = ().serve(transport).await.expect("initialize");
    let (failed, created) = call(
        &client,
        "sandbox_create",
        json!({"engine": "docker://sandbox-rs/busybox:latest", "timeout_s": 120}),
    )
    .await;
    assert!(!failed, "{created}");
    let id = created["sandbox_id"].as_str().expect("id").to_string();
    assert_eq!(managed_containers("docker", &id), id);
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !managed_containers("docker", &id).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        managed_containers("docker", &id),
        "",
        "SIGTERM left the container"
    );
    drop(client);
}

// ---- streamable HTTP (`sandbox mcp --http`) ----

/// A `sandbox mcp --http 127.0.0.1:0` child, its endpoint URL, its stderr, and the
/// private directory given to it as `XDG_RUNTIME_DIR` (where a generated token goes).
struct HttpServer {
    child: tokio::process::Child,
    url: String,
    stderr: tokio::task::JoinHandle<String>,
    runtime_dir: std::path::PathBuf,
}

/// A fresh 0700 directory for one server's runtime files.
fn private_dir() -> std::path::PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("sbx-mcp-test-{}-{nanos}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .expect("private dir");
    dir
}

impl HttpServer {
    /// Starts the server with `flags` and `env`; returns once it printed its URL.
    async fn start(flags: &[&str], env: &[(&str, &str)]) -> HttpServer {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
        let runtime_dir = private_dir();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sandbox"));
        cmd.args(["mcp", "--http", "127.0.0.1:0"])
            .args(flags)
            .env("XDG_RUNTIME_DIR", &runtime_dir)
            .envs(env.iter().copied())
            .env("NO_COLOR", "1")
            .env_remove("SANDBOX_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(level) = env.iter().find(|(k, _)| *k == "SANDBOX_LOG") {
            cmd.env("SANDBOX_LOG", level.1);
        }
        let mut child = cmd.spawn().expect("spawn sandbox mcp --http");
        let mut stderr = child.stderr.take().expect("stderr");
        let stderr = tokio::spawn(async move {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s).await;
            s
        });
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let url = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("URL in time")
            .expect("read stdout")
            .expect("a URL line");
        assert!(
            url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
            "{url}"
        );
        HttpServer {
            child,
            url,
            stderr,
            runtime_dir,
        }
    }

    /// Where a server started without token flags stores the token it generated.
    fn token_file(&self) -> std::path::PathBuf {
        let authority = self
            .url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp");
        let (ip, port) = authority.rsplit_once(':').expect("ip:port");
        self.runtime_dir
            .join("sandbox-rs")
            .join(format!("mcp-{ip}-{port}.token"))
    }

    /// The token the server generated, read from its file.
    fn generated_token(&self) -> String {
        let t = std::fs::read_to_string(self.token_file()).expect("the token file");
        t.trim().to_string()
    }

    /// A reqwest client that never goes through a proxy.
    fn http() -> reqwest::Client {
        reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .build()
            .expect("reqwest client")
    }

    /// rmcp's streamable HTTP client, initialised against this server.
    async fn client(&self, token: Option<&str>) -> Result<Client, String> {
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.url.as_str());
        if let Some(t) = token {
            config = config.auth_header(t);
        }
        let transport = StreamableHttpClientTransport::with_client(Self::http(), config);
        tokio::time::timeout(Duration::from_secs(30), ().serve(transport))
            .await
            .expect("initialize in time")
            .map_err(|e| e.to_string())
    }

    /// SIGTERM, then the exit code and everything it wrote on stderr.
    async fn stop(mut self) -> (Option<i32>, String) {
        let pid = self.child.id().expect("pid");
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(killed.success());
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("exits in time after SIGTERM")
            .expect("wait");
        let stderr = self.stderr.await.expect("stderr");
        let _ = std::fs::remove_dir_all(&self.runtime_dir);
        (status.code(), stderr)
    }
}

/// A random-enough token for one test run (never a real credential).
fn test_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("test-token-{}-{nanos}", std::process::id())
}

/// The same round trip as over stdio (tools listed, `print(6*7)` is 42, files, codes,
/// idempotent kill), over streamable HTTP with a bearer token.
#[tokio::test]
async fn mcp_http_round_trip_on_the_fake() {
    let token = test_token();
    let server = HttpServer::start(
        &["--token-env", "SBX_MCP_TEST_TOKEN"],
        &[("SBX_MCP_TEST_TOKEN", &token)],
    )
    .await;
    let client = server.client(Some(&token)).await.expect("initialize");
    round_trip(&client, "fake", None).await;
    client.cancel().await.expect("close");
    let (code, _) = server.stop().await;
    assert_eq!(code, Some(130), "SIGTERM is an interrupted exit");
}

/// Without the token (or with a wrong one) nothing gets past HTTP: 401 with a Bearer
/// challenge, and rmcp's client cannot even initialise. The token never reaches the
/// server's logs, even at trace level.
#[tokio::test]
async fn mcp_http_bearer_token_is_required_and_never_logged() {
    let token = test_token();
    let server = HttpServer::start(
        &["--token-env", "SBX_MCP_TEST_TOKEN"],
        &[("SBX_MCP_TEST_TOKEN", &token), ("SANDBOX_LOG", "trace")],
    )
    .await;
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "0"}}
    });
    for auth in [None, Some("Bearer wrong".to_string()), Some(token.clone())] {
        let mut req = HttpServer::http()
            .post(&server.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(init.to_string());
        if let Some(a) = &auth {
            req = req.header("authorization", a);
        }
        let r = req.send().await.expect("send");
        assert_eq!(r.status(), 401, "{auth:?}");
        assert_eq!(
            r.headers()
                .get("www-authenticate")
                .map(|v| v.to_str().unwrap_or("")),
            Some("Bearer")
        );
    }
    assert!(server.client(None).await.is_err(), "no token, no session");
    let client = server.client(Some(&token)).await.expect("the right token");
    let (failed, r) = call(&client, "sandbox_create", json!({"engine": "fake"})).await;
    assert!(!failed, "{r}");
    client.cancel().await.expect("close");
    let (_, stderr) = server.stop().await;
    assert!(!stderr.is_empty(), "trace logging was on");
    assert!(!stderr.contains(&token), "the token leaked into the logs");
}

/// The endpoint is `/mcp`; anything else is 404, before any token check or MCP handling.
#[tokio::test]
async fn mcp_http_serves_only_its_endpoint() {
    let server = HttpServer::start(&[], &[]).await;
    let other = server.url.replace("/mcp", "/other");
    let r = HttpServer::http().get(&other).send().await.expect("send");
    assert_eq!(r.status(), 404);
    server.stop().await;
}

/// A non-loopback address is refused before anything listens: without
/// --allow-non-loopback, and with it but without a token. A token variable that is unset
/// is named in the error.
#[test]
fn mcp_http_refuses_non_loopback_and_unset_tokens() {
    for (args, env) in [
        (&["mcp", "--http", "0.0.0.0:0"][..], None),
        (
            &["mcp", "--http", "0.0.0.0:0", "--allow-non-loopback"][..],
            None,
        ),
        (
            &[
                "mcp",
                "--http",
                "127.0.0.1:0",
                "--token-env",
                "SBX_MCP_UNSET_TOKEN",
            ][..],
            Some("SBX_MCP_UNSET_TOKEN"),
        ),
    ] {
        let o = common::sandbox(args)
            .env_remove("SBX_MCP_UNSET_TOKEN")
            .output()
            .expect("spawn");
        assert_eq!(common::code(&o), 2, "{args:?}: {}", common::stderr(&o));
        let err = common::stderr(&o);
        assert!(err.contains("SBX_E1000"), "{args:?}: {err}");
        if let Some(var) = env {
            assert!(err.contains(var), "{err}");
        }
        assert!(common::stdout(&o).is_empty(), "no URL: nothing listened");
    }
    // A token is a NAME: a value pasted by mistake is refused and not echoed.
    let o = common::run(&["mcp", "--http", "--token-env", "sk-live-abc"]);
    assert_eq!(common::code(&o), 2);
    assert!(!common::stderr(&o).contains("sk-live-abc"));
}

/// Over HTTP on Docker: a real container runs `print(6*7)`; a session that closes takes
/// its sandboxes with it; SIGTERM to the server kills the sandboxes of the sessions still
/// open.
#[tokio::test]
async fn mcp_http_round_trip_and_sigterm_teardown_on_docker() {
    if !common::docker_available("mcp_http_round_trip_and_sigterm_teardown_on_docker") {
        return;
    }
    let server = HttpServer::start(TEST_IMAGES, &[]).await;
    let token = server.generated_token();
    let client = server.client(Some(&token)).await.expect("initialize");
    let id = round_trip(&client, "docker", Some("sandbox-rs/python:3.11")).await;
    assert_eq!(
        managed_containers("docker", &id),
        "",
        "killed by sandbox_kill"
    );
    let busybox = json!({"engine": "docker://sandbox-rs/busybox:latest", "timeout_s": 120});
    let (failed, created) = call(&client, "sandbox_create", busybox.clone()).await;
    assert!(!failed, "{created}");
    let closed = created["sandbox_id"].as_str().expect("id").to_string();
    // The client closes its session without killing it: nobody else may use it, so the
    // server kills it.
    client.cancel().await.expect("close");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !managed_containers("docker", &closed).is_empty() && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        managed_containers("docker", &closed),
        "",
        "the closed session left its container"
    );

    let open = server.client(Some(&token)).await.expect("initialize");
    let (failed, created) = call(&open, "sandbox_create", busybox).await;
    assert!(!failed, "{created}");
    let left = created["sandbox_id"].as_str().expect("id").to_string();
    assert_eq!(
        managed_containers("docker", &left),
        left,
        "alive while its session is"
    );
    let (code, stderr) = server.stop().await;
    assert_eq!(code, Some(130), "{stderr}");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !managed_containers("docker", &left).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        managed_containers("docker", &left),
        "",
        "SIGTERM left the container"
    );
    drop(open);
}

/// The request an MCP client opens with, as raw HTTP.
fn initialize_request() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "0"}}
    })
}

/// Started with no token flags, the HTTP server is not open to every local user: it
/// generates a token, stores it in a 0600 file under `XDG_RUNTIME_DIR` (created anew,
/// removed on exit), names the file on stderr, and refuses every request without it. The
/// value never reaches stderr when stderr is not a terminal.
#[tokio::test]
async fn mcp_http_without_token_flags_requires_a_generated_token() {
    use std::os::unix::fs::PermissionsExt;
    let server = HttpServer::start(&[], &[("SANDBOX_LOG", "trace")]).await;
    for auth in [
        None,
        Some("Bearer ".to_string()),
        Some("Bearer x".to_string()),
    ] {
        let mut req = HttpServer::http()
            .post(&server.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(initialize_request().to_string());
        if let Some(a) = &auth {
            req = req.header("authorization", a);
        }
        let r = req.send().await.expect("send");
        assert_eq!(
            r.status(),
            401,
            "{auth:?}: an unauthenticated request got in"
        );
    }
    assert!(server.client(None).await.is_err(), "no token, no session");

    let file = server.token_file();
    let meta = std::fs::symlink_metadata(&file).expect("token file exists");
    assert!(meta.is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{file:?}");
    let token = server.generated_token();
    assert!(token.len() >= 43, "at least 256 bits: {}", token.len());
    let client = server
        .client(Some(&token))
        .await
        .expect("the generated token");
    let (failed, r) = call(&client, "sandbox_create", json!({"engine": "fake"})).await;
    assert!(!failed, "{r}");
    client.cancel().await.expect("close");

    // A second server gets another token.
    let other = HttpServer::start(&[], &[]).await;
    assert_ne!(other.generated_token(), token);
    other.stop().await;

    let (code, stderr) = server.stop().await;
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains(&file.display().to_string()),
        "the file is named: {stderr}"
    );
    assert!(!stderr.contains(&token), "the token leaked into stderr");
    assert!(!file.exists(), "the token file outlived the server");
}

/// Two HTTP sessions holding the same token: B cannot run in, read, write or kill A's
/// sandbox; it gets the answer an unknown id gets, and A's sandbox survives B's kill.
#[tokio::test]
async fn mcp_http_sessions_cannot_touch_each_others_sandboxes() {
    let token = test_token();
    let server = HttpServer::start(
        &["--token-env", "SBX_MCP_TEST_TOKEN"],
        &[("SBX_MCP_TEST_TOKEN", &token)],
    )
    .await;
    let a = server.client(Some(&token)).await.expect("session A");
    let b = server.client(Some(&token)).await.expect("session B");
    let (failed, created) = call(&a, "sandbox_create", json!({"engine": "fake"})).await;
    assert!(!failed, "{created}");
    let id = created["sandbox_id"].as_str().expect("id").to_string();

    let (_, unknown) = call(
        &b,
        "sandbox_run",
        json!({"sandbox_id": "no-such-sandbox", "command": "true"}),
    )
    .await;
    for (tool, args) in [
        (
            "sandbox_run",
            json!({"sandbox_id": id, "command": ["echo", "hi"]}),
        ),
        (
            "sandbox_run_code",
            json!({"sandbox_id": id, "code": "print(6*7)"}),
        ),
        ("sandbox_read_file", json!({"sandbox_id": id, "path": "."})),
        ("sandbox_list_files", json!({"sandbox_id": id, "path": "."})),
        (
            "sandbox_write_file",
            json!({"sandbox_id": id, "path": "x", "content": "y"}),
        ),
    ] {
        let (failed, r) = call(&b, tool, args).await;
        assert!(failed, "{tool}: session B used session A's sandbox: {r}");
        // Word for word what an unknown id gets, the id it names aside.
        let expected: Value =
            serde_json::from_str(&unknown.to_string().replace("no-such-sandbox", &id))
                .expect("json");
        assert_eq!(r, expected, "{tool}: not the answer an unknown id gets");
    }
    let (failed, r) = call(&b, "sandbox_kill", json!({"sandbox_id": id})).await;
    assert!(!failed, "{r}");
    assert_eq!(
        r["killed"], false,
        "session B killed session A's sandbox: {r}"
    );

    let (failed, r) = call(
        &a,
        "sandbox_run",
        json!({"sandbox_id": id, "command": ["echo", "still here"]}),
    )
    .await;
    assert!(!failed, "A's sandbox is alive: {r}");
    assert_eq!(r["stdout"], "still here\n", "{r}");
    let (failed, r) = call(&a, "sandbox_kill", json!({"sandbox_id": id})).await;
    assert!(!failed && r["killed"] == true, "{r}");
    a.cancel().await.expect("close A");
    b.cancel().await.expect("close B");
    server.stop().await;
}

/// The server holds all its live sandboxes to a total of 8 GiB and 8 CPUs by default,
/// whatever each call asks within its own bound: creating past it is refused with
/// `SBX_E1402` naming the limit, and a kill gives the room back.
#[tokio::test]
async fn mcp_create_past_the_total_budget_is_refused() {
    let client = start().await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (failed, r) = call(
            &client,
            "sandbox_create",
            json!({"engine": "fake", "memory_mb": 4096, "cpus": 1.0}),
        )
        .await;
        assert!(!failed, "{r}");
        ids.push(r["sandbox_id"].as_str().expect("id").to_string());
    }
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "fake", "memory_mb": 64}),
    )
    .await;
    assert!(failed, "a create past 8 GiB in total was accepted: {r}");
    assert_eq!(r["error"]["code"], "SBX_E1402", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("memory")),
        "{r}"
    );
    let (failed, r) = call(&client, "sandbox_kill", json!({"sandbox_id": ids[0]})).await;
    assert!(!failed, "{r}");
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "fake", "memory_mb": 64, "cpus": 4.0}),
    )
    .await;
    assert!(!failed, "the kill gave the memory back: {r}");
    // 1 + 4 CPUs live; 4 more would be 9 of 8.
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "fake", "memory_mb": 64, "cpus": 4.0}),
    )
    .await;
    assert!(failed, "a create past 8 CPUs in total was accepted: {r}");
    assert_eq!(r["error"]["code"], "SBX_E1402", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("cpu")),
        "{r}"
    );
    client.cancel().await.expect("close");
}

/// `--total-memory-mb` and `--total-cpus` set the budget; the defaults apply otherwise.
#[tokio::test]
async fn mcp_total_budget_flags_set_the_limit() {
    let client = start_with(&["--total-memory-mb", "1024", "--total-cpus", "1.5"]).await;
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "fake", "memory_mb": 1024}),
    )
    .await;
    assert!(!failed, "{r}");
    let (failed, r) = call(
        &client,
        "sandbox_create",
        json!({"engine": "fake", "memory_mb": 6, "cpus": 0.25}),
    )
    .await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1402", "{r}");
    client.cancel().await.expect("close");
    for bad in [
        &["mcp", "--total-memory-mb", "0"][..],
        &["mcp", "--total-cpus", "0"][..],
        &["mcp", "--total-cpus", "nan"][..],
    ] {
        let o = common::run(bad);
        assert_eq!(common::code(&o), 2, "{bad:?}: {}", common::stderr(&o));
    }
}

/// A session that closes gives back what its sandboxes held: another session can use the
/// budget at once (the closed session's sandboxes are killed, nobody else could use them).
#[tokio::test]
async fn mcp_http_a_closed_session_gives_its_budget_back() {
    let token = test_token();
    let server = HttpServer::start(
        &[
            "--token-env",
            "SBX_MCP_TEST_TOKEN",
            "--total-memory-mb",
            "4096",
        ],
        &[("SBX_MCP_TEST_TOKEN", &token)],
    )
    .await;
    let big = json!({"engine": "fake", "memory_mb": 4096});
    let a = server.client(Some(&token)).await.expect("session A");
    let (failed, r) = call(&a, "sandbox_create", big.clone()).await;
    assert!(!failed, "{r}");
    let b = server.client(Some(&token)).await.expect("session B");
    let (failed, r) = call(&b, "sandbox_create", big.clone()).await;
    assert!(failed, "the budget is shared by all sessions: {r}");
    assert_eq!(r["error"]["code"], "SBX_E1402", "{r}");
    a.cancel().await.expect("close A");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let r = loop {
        let (failed, r) = call(&b, "sandbox_create", big.clone()).await;
        if !failed || std::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        r["sandbox_id"].is_string(),
        "A's room was not given back: {r}"
    );
    b.cancel().await.expect("close B");
    server.stop().await;
}

/// A request of the sessionless protocol revision (no `initialize`, no `Mcp-Session-Id`)
/// has no session to own a sandbox: it is refused, whatever it claims about itself.
#[tokio::test]
async fn mcp_http_requests_outside_a_session_create_nothing() {
    let token = test_token();
    let server = HttpServer::start(
        &["--token-env", "SBX_MCP_TEST_TOKEN"],
        &[("SBX_MCP_TEST_TOKEN", &token)],
    )
    .await;
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"}
    });
    for params in [
        json!({"name": "sandbox_create", "arguments": {"engine": "fake"}, "_meta": meta}),
        json!({"name": "sandbox_create", "arguments": {"engine": "fake"}}),
    ] {
        let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params});
        let r = HttpServer::http()
            .post(&server.url)
            .header("authorization", format!("Bearer {token}"))
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "sandbox_create")
            .body(body.to_string())
            .send()
            .await
            .expect("send");
        let text = r.text().await.expect("body");
        assert!(
            !text.contains("sandbox_id"),
            "a sessionless request created a sandbox: {text}"
        );
        assert!(text.contains("error"), "{text}");
    }
    server.stop().await;
}

/// A client that opens connections and never finishes its request headers cannot hold the
/// server: an unfinished header is cut after the header timeout, and connections past
/// the cap are closed at once, so a normal client is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_http_slow_or_many_connections_cannot_hold_the_server() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = HttpServer::start(&[], &[]).await;
    let authority = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string();
    // One connection that starts a request and never ends its headers.
    let mut slow = tokio::net::TcpStream::connect(&authority).await.unwrap();
    slow.write_all(b"POST /mcp HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let cut = tokio::time::timeout(Duration::from_secs(20), slow.read(&mut buf)).await;
    assert!(
        matches!(cut, Ok(Ok(_)) | Ok(Err(_))),
        "an unfinished request header held its connection for 20 s"
    );
    // Many idle connections: those past the cap are closed by the server.
    let mut idle = Vec::new();
    for _ in 0..200 {
        match tokio::net::TcpStream::connect(&authority).await {
            Ok(c) => idle.push(c),
            Err(_) => break,
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut closed = 0;
    for c in &mut idle {
        let mut b = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(20), c.read(&mut b)).await
        {
            closed += 1;
        }
    }
    assert!(closed > 0, "200 idle connections were all held open");
    server.stop().await;
}

/// `sandbox_fork` on the fake (which forks files and contexts): each fork is a sandbox of
/// the session with the context's variable, and the forks diverge; a bad count is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_fork_branches_a_context_on_the_fake() {
    let client = start().await;
    let (failed, r) = call(&client, "sandbox_create", json!({"engine": "fake"})).await;
    assert!(!failed, "{r}");
    let id = r["sandbox_id"].as_str().unwrap().to_string();
    let (failed, r) = call(
        &client,
        "sandbox_run_code",
        json!({"sandbox_id": id, "code": "x = 41", "context_id": "c"}),
    )
    .await;
    assert!(!failed, "{r}");
    let (failed, r) = call(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": id, "count": 9}),
    )
    .await;
    assert!(failed, "{r}");
    assert_eq!(r["error"]["code"], "SBX_E1000", "{r}");
    let (failed, r) = call(
        &client,
        "sandbox_fork",
        json!({"sandbox_id": id, "count": 2}),
    )
    .await;
    assert!(!failed, "{r}");
    let forks: Vec<String> = r["forks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    assert_eq!(forks.len(), 2, "{r}");
    // Each fork has the variable; a change in one does not reach the other.
    let code = |sb: &str, code: &str| json!({"sandbox_id": sb, "code": code, "context_id": "c"});
    let (failed, r) = call(&client, "sandbox_run_code", code(&forks[0], "x = 100")).await;
    assert!(!failed, "{r}");
    let (failed, r) = call(&client, "sandbox_run_code", code(&forks[1], "print(x + 1)")).await;
    assert!(
        !failed && r["stdout"].as_str().unwrap().trim() == "42",
        "{r}"
    );
    let (failed, r) = call(&client, "sandbox_run_code", code(&forks[0], "print(x)")).await;
    assert!(
        !failed && r["stdout"].as_str().unwrap().trim() == "100",
        "{r}"
    );
    let (failed, r) = call(&client, "sandbox_run_code", code(&id, "print(x)")).await;
    assert!(
        !failed && r["stdout"].as_str().unwrap().trim() == "41",
        "the original goes on: {r}"
    );
    for sb in forks.iter().chain([&id]) {
        let (failed, r) = call(&client, "sandbox_kill", json!({"sandbox_id": sb})).await;
        assert!(!failed && r["killed"] == true, "{r}");
    }
    client.cancel().await.unwrap();
}

//! JSON forms of the public types: round trips, the bytes encoding, and secrets that never
//! reach the output.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use serde_json::{Value, json};

use crate::{
    Capability, CodeOptions, Command, CreateOptions, Egress, EngineReport, ExecResult, FileInfo,
    IsolationTier, Language, ManagedSandbox, NetworkPolicy, OutputChunk, Resources, RichResult,
    RunOptions, SandboxError, SandboxState, Secret,
};

fn round_trip<T>(v: &T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let text = serde_json::to_string(v).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn utf8_output_is_a_plain_string_and_round_trips() {
    let r = ExecResult::new(3, "héllo\n", "warn\n");
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["stdout"], "héllo\n");
    assert_eq!(v["stderr"], "warn\n");
    assert_eq!(round_trip(&r), r);
}

#[test]
fn non_utf8_output_is_base64_and_no_byte_is_lost() {
    let raw: &[u8] = &[0xff, 0xfe, 0x00, b'a', 0x80];
    let r = ExecResult::new(0, Bytes::from_static(raw), Bytes::new());
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["stdout"], json!({ "base64": "//4AYYA=" }));
    assert_eq!(round_trip(&r).stdout.as_ref(), raw);
}

#[test]
fn rich_results_and_chunks_round_trip() {
    let mut r = ExecResult::streamed(0);
    r.results.push(RichResult::new(
        "image/png",
        &[0x89u8, b'P', b'N', b'G'][..],
    ));
    assert_eq!(round_trip(&r), r);
    for chunk in [
        OutputChunk::stdout("out"),
        OutputChunk::stderr(&[0xc3u8, 0x28][..]),
    ] {
        assert_eq!(round_trip(&chunk), chunk);
    }
    assert_eq!(
        serde_json::to_value(OutputChunk::stderr("e")).unwrap(),
        json!({ "stream": "stderr", "data": "e" })
    );
}

#[test]
fn bad_base64_is_an_error_not_a_panic() {
    let bad = r#"{"exit_code":0,"stdout":{"base64":"!!"}}"#;
    assert!(serde_json::from_str::<ExecResult>(bad).is_err());
}

#[test]
fn secret_value_never_appears_in_json() {
    let value = "hunter2-very-secret";
    let opts = CreateOptions::new("img")
        .env("PLAIN", "visible")
        .secret("API_TOKEN", value);
    let text = serde_json::to_string(&opts).unwrap();
    assert!(!text.contains(value), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["secrets"], json!({ "API_TOKEN": "***" }));
    assert_eq!(
        serde_json::to_string(&Secret::new(value)).unwrap(),
        "\"***\""
    );
    // A round trip keeps everything but the secret, which never travels through JSON.
    let back: CreateOptions = serde_json::from_str(&text).unwrap();
    assert!(back.secrets.is_empty());
    // Even a JSON that carries a secret value does not smuggle it in.
    let mut injected = v.clone();
    injected["secrets"] = json!({ "API_TOKEN": value });
    let back: CreateOptions = serde_json::from_value(injected).unwrap();
    assert!(back.secrets.is_empty());
}

#[test]
fn env_values_never_appear_in_json_but_deserialise() {
    let value = "env-value-private";
    let create = CreateOptions::new("img").env("DB_URL", value);
    let run = RunOptions::default().env("DB_URL", value);
    for v in [
        serde_json::to_value(&create).unwrap(),
        serde_json::to_value(&run).unwrap(),
    ] {
        assert!(!v.to_string().contains(value), "{v}");
        assert_eq!(v["env_keys"], json!(["DB_URL"]));
        assert!(v.get("env").is_none());
    }
    let back: CreateOptions =
        serde_json::from_value(json!({ "template": "img", "env": { "DB_URL": value } })).unwrap();
    assert_eq!(back, create);
    let back: RunOptions = serde_json::from_value(json!({ "env": { "DB_URL": value } })).unwrap();
    assert_eq!(back, run);
}

#[test]
fn options_round_trip() {
    let create = CreateOptions::new("sandbox-rs/python:3.11")
        .resources(Resources::default().cpu(0.5).memory_mb(256).pids(64))
        .network(NetworkPolicy::allow_list(["pypi.org", "10.0.0.0/8"]).ingress_port(8080))
        .timeout(Duration::from_secs(90))
        .metadata("task", "t1")
        .require_isolation(IsolationTier::Container)
        .workdir("/work");
    assert_eq!(round_trip(&create), create);
    let run = RunOptions::default()
        .timeout(Duration::from_millis(1500))
        .workdir("/tmp")
        .output_cap(1024);
    assert_eq!(round_trip(&run), run);
    let code = CodeOptions::default()
        .language(Language::Python)
        .context("ctx")
        .timeout(Duration::from_secs(5));
    assert_eq!(round_trip(&code), code);
    for egress in [
        Egress::Deny,
        Egress::Allow,
        Egress::AllowList(vec!["x.org".into()]),
    ] {
        assert_eq!(round_trip(&egress), egress);
    }
    for cmd in [
        Command::Argv(vec!["echo".into(), "hi".into()]),
        Command::Shell("echo hi | wc".into()),
    ] {
        assert_eq!(round_trip(&cmd), cmd);
    }
}

#[test]
fn options_deserialise_from_partial_json_with_defaults() {
    let opts: CreateOptions = serde_json::from_value(json!({ "template": "img" })).unwrap();
    assert_eq!(opts, CreateOptions::new("img"));
    let net: NetworkPolicy = serde_json::from_value(json!({ "egress": "allow" })).unwrap();
    assert_eq!(net, NetworkPolicy::allow());
    let code: CodeOptions = serde_json::from_value(json!({ "language": "python" })).unwrap();
    assert_eq!(code, CodeOptions::default());
    assert!(serde_json::from_value::<Language>(json!("cobol")).is_err());
}

#[test]
fn capability_serialises_as_flag_names() {
    let caps = Capability::RUN_COMMAND | Capability::RUN_CODE;
    assert_eq!(
        serde_json::to_value(caps).unwrap(),
        json!("RUN_COMMAND | RUN_CODE")
    );
    assert_eq!(round_trip(&caps), caps);
}

#[test]
fn error_serialises_as_code_message_hint_url() {
    let e = SandboxError::config("timeout must be positive", "use e.g. 30s");
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(
        v,
        json!({
            "code": e.code().as_str(),
            "message": e.to_string(),
            "hint": e.hint(),
            "url": e.url(),
        })
    );
    assert!(v["code"].as_str().unwrap().starts_with("SBX_E"));
}

#[test]
fn file_info_round_trips() {
    let f = FileInfo::new(
        "/work/a.txt",
        12,
        false,
        0o644,
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
    );
    assert_eq!(round_trip(&f), f);
}

#[test]
fn reports_serialise() {
    let report = EngineReport::new("docker", "unix:///var/run/docker.sock");
    let v = serde_json::to_value(&report).unwrap();
    assert_eq!(v["backend"], "docker");
    assert_eq!(v["tier"], "unknown");
    let managed = ManagedSandbox::new(
        "abc",
        "docker",
        SandboxState::Running,
        None,
        Default::default(),
    );
    assert_eq!(serde_json::to_value(&managed).unwrap()["state"], "running");
}

#[test]
fn run_stdin_serialises_as_its_length_only() {
    let run = RunOptions::default().stdin("password=hunter2\n");
    let v = serde_json::to_value(&run).unwrap();
    assert_eq!(v["stdin_len"], 17);
    assert!(!v.to_string().contains("hunter2"), "{v}");
    assert!(!format!("{run:?}").contains("hunter2"));
    let back: RunOptions = serde_json::from_value(json!({ "stdin": "abc" })).unwrap();
    assert_eq!(back.stdin.as_deref(), Some(&b"abc"[..]));
    let back: RunOptions =
        serde_json::from_value(json!({ "stdin": { "base64": "AP8=" } })).unwrap();
    assert_eq!(back.stdin.as_deref(), Some(&[0u8, 255][..]));
    let none: RunOptions = serde_json::from_value(json!({})).unwrap();
    assert_eq!(none.stdin, None);
}

/// An override of the blocked set exists only in Rust: it is never written out and never
/// read in, so no JSON configuration or wire message can open the blocked set. Dropped on
/// the way, it fails closed (its network is simply not reachable).
#[test]
fn blocked_set_overrides_never_serialise() {
    let metadata = crate::BlockedSetOverride::network("169.254.169.254").unwrap();
    let net = NetworkPolicy::allow_list(["pypi.org"]).through_blocked_set(metadata);
    let v = serde_json::to_value(&net).unwrap();
    assert!(!v.to_string().contains("169.254"), "{v}");
    assert_eq!(round_trip(&net), NetworkPolicy::allow_list(["pypi.org"]));
    let back: NetworkPolicy = serde_json::from_value(json!({
        "egress": { "allow_list": ["pypi.org"] },
        "blocked_set_overrides": ["169.254.169.254/32"],
    }))
    .unwrap();
    assert!(back.blocked_set_overrides.is_empty());
}

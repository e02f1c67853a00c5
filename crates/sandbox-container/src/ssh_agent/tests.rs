//! The relay's answers and audit records against a stand-in host agent on a unix socket
//! that signs anything it is asked to (the filter decides what reaches it).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sandbox_core::layer::{AuditRecord, Outcome};
use sandbox_core::ssh_agent::fingerprint_of;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::filter::{FAILURE, Identity, REQUEST_IDENTITIES, SIGN_REQUEST, SIGN_RESPONSE};
use super::{EventReporter, HostAgent};

fn string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s);
}

fn key(n: u8) -> Identity {
    let mut blob = Vec::new();
    string(&mut blob, b"ssh-ed25519");
    string(&mut blob, &[n; 32]);
    Identity {
        blob,
        comment: format!("key{n}@host").into_bytes(),
    }
}

fn sign(blob: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = vec![SIGN_REQUEST];
    string(&mut m, blob);
    string(&mut m, data);
    m.extend_from_slice(&0u32.to_be_bytes());
    m
}

/// A host agent that answers every message with a signature, or with a failure when
/// `fail` is set; counts the messages it received.
async fn stand_in(dir: &std::path::Path, fail: bool) -> (std::path::PathBuf, Arc<AtomicUsize>) {
    let socket = dir.join("agent.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut len = [0u8; 4];
                if s.read_exact(&mut len).await.is_err() {
                    return;
                }
                let mut m = vec![0u8; u32::from_be_bytes(len) as usize];
                if s.read_exact(&mut m).await.is_err() {
                    return;
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let mut a = if fail {
                    vec![FAILURE]
                } else {
                    vec![SIGN_RESPONSE]
                };
                if !fail {
                    string(&mut a, b"signature-bytes");
                }
                let mut framed = (a.len() as u32).to_be_bytes().to_vec();
                framed.extend_from_slice(&a);
                let _ = s.write_all(&framed).await;
            });
        }
    });
    (socket, seen)
}

fn relay(socket: std::path::PathBuf, events: EventReporter) -> HostAgent {
    HostAgent {
        socket,
        selected: Arc::new(vec![key(1)]),
        events,
    }
}

fn requests(sink: &sandbox_core::layer::MemorySink) -> Vec<AuditRecord> {
    sink.records()
        .into_iter()
        .filter(|r| r.operation == "ssh_agent.request")
        .collect()
}

#[tokio::test]
async fn every_message_is_one_record_naming_its_type_and_key_never_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, seen) = stand_in(dir.path(), false).await;
    let (events, sink) = crate::test_events::audited().await;
    let host = relay(socket, events);
    let list = host.handle(&[REQUEST_IDENTITIES], "sb1").await;
    assert_eq!(list[0], super::filter::IDENTITIES_ANSWER);
    let signed = host
        .handle(&sign(&key(1).blob, b"data to sign"), "sb1")
        .await;
    assert_eq!(signed[0], SIGN_RESPONSE);
    let other = host
        .handle(&sign(&key(2).blob, b"data to sign"), "sb1")
        .await;
    let mut add = vec![17];
    string(&mut add, b"ssh-ed25519");
    string(&mut add, b"private-key-bytes");
    let added = host.handle(&add, "sb1").await;
    let unknown = host.handle(&[200, 1, 2], "sb1").await;
    assert_eq!(
        (other, added, unknown),
        (vec![FAILURE], vec![FAILURE], vec![FAILURE])
    );
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "only the selected key's sign reached it"
    );

    let records = requests(&sink);
    let shown: Vec<String> = records.iter().map(AuditRecord::to_json).collect();
    assert_eq!(records.len(), 5, "{shown:#?}");
    let b64 = |b: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(b)
    };
    for json in &shown {
        for never in [
            "data to sign",
            "signature-bytes",
            "private-key-bytes",
            "key1@host",
            &b64(&key(1).blob),
            &b64(&key(2).blob),
        ] {
            assert!(!json.contains(never), "{never:?} in {json}");
        }
    }
    for r in &records {
        assert_eq!(r.sandbox_id.as_deref(), Some("sb1"));
    }
    let kinds: Vec<(&str, Outcome, Option<&str>)> = records
        .iter()
        .map(|r| (r.request.as_deref().unwrap(), r.outcome, r.error_code))
        .collect();
    assert_eq!(
        kinds,
        [
            ("list", Outcome::Ok, None),
            ("sign", Outcome::Ok, None),
            ("sign", Outcome::Error, Some("SBX_E1401")),
            ("add_identity", Outcome::Error, Some("SBX_E1401")),
            ("type_200", Outcome::Error, Some("SBX_E1401")),
        ]
    );
    assert_eq!(records[1].key, Some(fingerprint_of(&key(1).blob)));
    assert_eq!(records[2].key, Some(fingerprint_of(&key(2).blob)));
    assert!(
        records[2]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("not selected"))
    );
    assert_eq!(records[0].key, None);
    assert_eq!(records[3].key, None);
}

#[tokio::test]
async fn a_sign_the_host_agent_refuses_is_an_error_without_a_code() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, seen) = stand_in(dir.path(), true).await;
    let (events, sink) = crate::test_events::audited().await;
    let host = relay(socket, events);
    let answer = host.handle(&sign(&key(1).blob, b"x"), "sb1").await;
    assert_eq!(answer, vec![FAILURE]);
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    let records = requests(&sink);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].outcome, Outcome::Error);
    assert_eq!(records[0].error_code, None);
    assert_eq!(records[0].key, Some(fingerprint_of(&key(1).blob)));
}

#[tokio::test]
async fn without_a_sink_the_relay_answers_all_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, _) = stand_in(dir.path(), false).await;
    let host = relay(socket, EventReporter::default());
    assert_eq!(
        host.handle(&sign(&key(1).blob, b"x"), "sb1").await[0],
        SIGN_RESPONSE
    );
    assert_eq!(host.handle(&[19], "sb1").await, vec![FAILURE]);
}

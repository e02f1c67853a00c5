//! `sandbox run --allow-host` and the doctor's allowlist line, on the fake (in process,
//! no engine): the listed address is reached, an unlisted one is not, a bad entry and a
//! conflicting `--network` are refused. The only server dialed is this test's own, on
//! loopback.

mod common;

use std::io::Write as _;
use std::net::TcpListener;

use common::{code, json, run, stderr, stdout};

/// A loopback server that answers every connection with `token`.
fn canary(token: &'static str) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let _ = s.write_all(format!("{token}\n").as_bytes());
        }
    });
    port
}

#[test]
fn allow_host_reaches_the_listed_address_and_nothing_else() {
    let port = canary("sbx-cli-canary").to_string();
    let o = run(&[
        "run",
        "fake://",
        "--allow-host",
        "127.0.0.1",
        "--",
        "nc",
        "-w",
        "3",
        "127.0.0.1",
        &port,
    ]);
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
    assert!(stdout(&o).contains("sbx-cli-canary"));
    let o = run(&[
        "run",
        "fake://",
        "--allow-host",
        "192.0.2.1",
        "--",
        "nc",
        "-w",
        "3",
        "127.0.0.1",
        &port,
    ]);
    assert_ne!(code(&o), 0);
    assert!(!stdout(&o).contains("sbx-cli-canary"));
}

#[test]
fn allow_host_refuses_bad_entries_and_takes_tiers_over_allow() {
    let o = run(&[
        "run",
        "fake://",
        "--allow-host",
        "exa_mple.com",
        "--",
        "true",
    ]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("SBX_E1000"), "{}", stderr(&o));
    let o = run(&[
        "run",
        "fake://",
        "--network",
        "allow",
        "--allow-host",
        "a.org",
        "--",
        "true",
    ]);
    // Hosts over `--network allow` are tiers over an open default (deny and exception
    // entries are what carve that default; an allow entry there is accepted), not a
    // conflict.
    assert_eq!(code(&o), 0, "tiers over allow: {}", stderr(&o));
}

#[test]
fn doctor_reports_whether_allowlists_are_available() {
    let o = run(&["doctor", "--engine", "fake", "--json"]);
    let v = json(&o);
    assert_eq!(v["engines"][0]["egress_allowlist"], true, "{v}");
}

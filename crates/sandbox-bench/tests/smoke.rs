//! A cheap end-to-end run of the binary on the in-process fake backend.

use std::process::Command;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sandbox-bench"))
}

#[test]
fn quick_fake_run_prints_a_table_and_writes_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("bench.md");
    let out = bench()
        .args(["--quick", "--backend", "fake", "--report"])
        .arg(&report)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    for row in [
        "create (until usable)",
        "run([\"true\"])",
        "1 MiB write+read",
        "kill",
    ] {
        assert!(table.contains(row), "missing {row} in:\n{table}");
    }
    assert!(!table.contains("error"), "no operation failed:\n{table}");
    let md = std::fs::read_to_string(&report).unwrap();
    assert!(md.starts_with("# Benchmarks"));
    assert!(md.contains("## fake") && md.contains("| operation |"));
    assert!(md.contains("Machine:"));
}

#[test]
fn quick_fake_run_json_has_every_figure() {
    let out = bench()
        .args(["--quick", "--backend", "fake", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["backends"][0]["rows"].as_array().unwrap();
    let ops: Vec<&str> = rows.iter().filter_map(|r| r["op"].as_str()).collect();
    for op in [
        "create",
        "run_true",
        "run_code",
        "first_chunk",
        "write_read_1mib",
        "kill",
        "transfer",
        "transfer_rss",
        "concurrent_small",
        "pool_acquire",
    ] {
        assert!(ops.contains(&op), "missing {op} in {ops:?}");
    }
    for r in rows {
        assert!(
            r["ours"]["summary"]["median"].as_f64().is_some(),
            "no median for {}",
            r["op"]
        );
    }
}

#[test]
fn unknown_backend_is_refused() {
    let out = bench().args(["--backend", "lxc"]).output().unwrap();
    assert!(!out.status.success());
}

#[test]
fn the_regular_run_keeps_the_load_section_of_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("bench.md");
    let section =
        "<!-- load section: written by `cargo xtask bench --load` -->\n\n## Under load\n\nN = 7\n";
    std::fs::write(&report, format!("# Benchmarks\n\nold figures\n\n{section}")).unwrap();
    let out = bench()
        .args(["--quick", "--backend", "fake", "--report"])
        .arg(&report)
        .output()
        .unwrap();
    assert!(out.status.success());
    let md = std::fs::read_to_string(&report).unwrap();
    assert!(
        !md.contains("old figures"),
        "the regular figures are rewritten"
    );
    assert!(md.contains("## fake"));
    assert!(
        md.ends_with(section),
        "the load section is kept at the end:\n{md}"
    );
}

#[test]
fn the_load_run_refuses_an_unknown_engine_before_touching_any() {
    let out = bench()
        .args(["load", "--engines", "lxc", "--population", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown engine"));
}

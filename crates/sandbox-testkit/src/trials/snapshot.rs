//! What a snapshot image holds, read from outside the sandbox through the engine's own
//! tools: no secret the sandbox was created with (in its configuration, its history or
//! any file), no agent (not even a hard link to it made from inside), no label of the
//! sandbox it was made from (owner, session, deadline, metadata) and no create-time env;
//! only the files the sandbox wrote. The image is removed at the end, whatever happened.

use sandbox_core::{ReapableBackend, RunOptions};

use crate::tagged::test_options;

/// What the engine shows of an image: its inspect and history as text, and its
/// filesystem as one flat tar archive (a container created from it, exported).
#[derive(Debug, Clone)]
pub struct ImageEvidence {
    /// Inspect and history output.
    pub metadata: String,
    /// The image's filesystem, a tar archive.
    pub filesystem: Vec<u8>,
}

/// The names in a tar archive (leading `./` and `/` dropped) with their link targets.
fn entries(archive: &[u8]) -> Vec<(String, Option<String>)> {
    let mut a = tar::Archive::new(archive);
    a.entries()
        .expect("the image's filesystem is a tar archive")
        .map(|e| {
            let e = e.expect("a tar entry");
            let name = e
                .path()
                .expect("an entry name")
                .to_string_lossy()
                .into_owned();
            let name = name
                .trim_start_matches("./")
                .trim_start_matches('/')
                .to_string();
            let link = e
                .link_name()
                .ok()
                .flatten()
                .map(|l| l.to_string_lossy().into_owned());
            (name, link)
        })
        .collect()
}

/// Creates a sandbox with a secret and create-time env, lets it see the secret, write a
/// file, install a program and hard-link the agent, snapshots it, and reads the image
/// through `evidence` (the adapter's view of an image by reference).
pub async fn snapshot_image_holds_no_secret_no_agent_and_only_its_own_labels(
    b: &dyn ReapableBackend,
    template: &str,
    evidence: impl Fn(&str) -> ImageEvidence,
) {
    let secret = format!("snapshot-secret-{}", sandbox_core::labels::session_id());
    let opts = test_options(template, "snapshot-image")
        .secret("SBX_SNAPSHOT_SECRET", secret.clone())
        .env("SBX_CREATE_ENV", "create-time-value");
    let s = b.create(opts).await.expect("create");
    let seen = s
        .run(
            ["sh", "-c", "printenv SBX_SNAPSHOT_SECRET; mkdir -p /usr/local/bin && echo 'echo tool' > /usr/local/bin/sbx-tool && echo note > /work/note.txt; ln /.sandbox-agent /tmp/agent-link 2>/dev/null; true"].into(),
            RunOptions::default(),
        )
        .await
        .expect("run");
    assert_eq!(
        String::from_utf8_lossy(&seen.stdout).trim(),
        secret,
        "the secret reached the sandbox"
    );
    let snap = s.snapshot().await.expect("snapshot");
    s.kill().await.expect("kill");
    let image = evidence(&snap.template);
    let removed = b.remove_snapshot(&snap.template).await;
    assert!(
        removed.expect("remove the snapshot"),
        "the snapshot was removed"
    );

    assert!(
        !image.metadata.contains(&secret),
        "the secret is in the image's configuration or history"
    );
    assert!(
        !image.metadata.contains("create-time-value"),
        "the sandbox's create-time env is in the image: {}",
        image.metadata
    );
    for label in [
        "io.sandbox-rs.owner",
        "io.sandbox-rs.session",
        "io.sandbox-rs.deadline",
        "io.sandbox-rs.meta.",
        "io.sandbox-rs.exec-path",
    ] {
        assert!(
            !image.metadata.contains(label),
            "the sandbox's label {label} is in the image: {}",
            image.metadata
        );
    }
    for label in [
        "io.sandbox-rs.managed",
        "io.sandbox-rs.snapshot-of",
        "io.sandbox-rs.created",
    ] {
        assert!(
            image.metadata.contains(label),
            "the snapshot's label {label} is missing"
        );
    }
    let needle = secret.as_bytes();
    assert!(
        !image.filesystem.windows(needle.len()).any(|w| w == needle),
        "the secret is in a file of the image"
    );
    let names = entries(&image.filesystem);
    for (name, link) in &names {
        assert!(
            name != ".sandbox-agent"
                && link.as_deref().map(|l| l.trim_start_matches('/')) != Some(".sandbox-agent"),
            "the agent is in the image: {name} {link:?}"
        );
    }
    assert!(
        !names.iter().any(|(n, _)| n == "tmp/agent-link"),
        "a hard link to the agent made inside is in the image"
    );
    for wrote in ["work/note.txt", "usr/local/bin/sbx-tool"] {
        assert!(
            names.iter().any(|(n, _)| n == wrote),
            "{wrote} is missing from the image"
        );
    }
}

/// [`ImageEvidence`] through an engine's CLI (`docker` or `podman`): `image inspect`,
/// `history`, and the export of a container created from the image (then removed).
pub fn cli_evidence(cli: &str, image: &str) -> ImageEvidence {
    let out = |args: &[&str]| {
        let o = std::process::Command::new(cli)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{cli} {args:?}: {e}"));
        assert!(
            o.status.success(),
            "{cli} {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    };
    let mut metadata = String::from_utf8_lossy(&out(&["image", "inspect", image])).into_owned();
    metadata.push_str(&String::from_utf8_lossy(&out(&[
        "history",
        "--no-trunc",
        image,
    ])));
    let id = String::from_utf8_lossy(&out(&["create", image, "true"]))
        .trim()
        .to_string();
    let filesystem = std::process::Command::new(cli)
        .args(["export", &id])
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    out(&["rm", "-f", &id]);
    ImageEvidence {
        metadata,
        filesystem,
    }
}

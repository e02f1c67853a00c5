//! Where the egress policy in force for each sandbox is kept: on the host, outside every
//! sandbox, in files only root can write (`/run/sandbox-rs/egress/<container id>.*`).
//!
//! A container's labels cannot change after create, and anything inside the sandbox (the
//! agent, a file) is in reach of root inside, so neither can say what the policy is now.
//! These files can: `<id>.json` holds the policy, the blocked-set overrides, the resolver
//! the rules send DNS to, the namespace they were loaded into and a generation that every
//! change increments; `<id>.pins` lists the names the resolver answered and the addresses
//! it pinned for them (appended, one line each), so a change re-pins the names that stay
//! allowed; `<id>.lock` orders them: a change holds it exclusively from the load of the new
//! rules to the state written, the resolver holds it shared from reading the policy to its
//! pin, so no answer decided under the old policy is pinned into the new rules.
//!
//! Any process of the library on this host reads and changes them (a reattached handle,
//! the CLI); the resolver of the process that loaded the rules reads the policy from them
//! on every query. They are removed with the sandbox.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use sandbox_core::{Egress, EgressDefault, EgressRule, EgressTiers, HostPort};
use serde::{Deserialize, Serialize};

/// The directory of every sandbox's egress state on this host.
pub(crate) const STATE_DIR: &str = "/run/sandbox-rs/egress";

/// Which set a pinned address went into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PinTier {
    /// Granted by an exception (evaluated before the deny networks).
    Except,
    /// Granted by the allow list or the default.
    Allow,
}

/// One answer the resolver pinned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Pin {
    pub name: String,
    pub addrs: Vec<IpAddr>,
}

/// The egress policy as stored (entries as their canonical text; parsed again on read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredEgress {
    kind: String,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    except: Vec<String>,
    #[serde(default)]
    default_allow: bool,
    /// Granted host ports (tiers only; a state written before they existed has none).
    #[serde(default)]
    host_ports: Vec<u16>,
}

fn texts(rules: &[EgressRule]) -> Vec<String> {
    rules.iter().map(|r| r.as_str().to_string()).collect()
}

fn parsed(texts: &[String]) -> Result<Vec<EgressRule>, String> {
    texts
        .iter()
        .map(|t| EgressRule::parse(t).map_err(|e| e.to_string()))
        .collect()
}

impl StoredEgress {
    fn of(e: &Egress) -> Result<StoredEgress, String> {
        let t = e.tiers().map_err(|e| e.to_string())?;
        let kind = match e {
            Egress::Deny => "deny",
            Egress::Allow => "allow",
            Egress::AllowList(_) => "allow_list",
            _ => "tiers",
        };
        // An allowlist keeps its entries as given (they were validated), so it reads
        // back equal to what was set.
        let allow = match e {
            Egress::AllowList(entries) => entries.clone(),
            _ => texts(&t.allow),
        };
        Ok(StoredEgress {
            kind: kind.into(),
            allow,
            deny: texts(&t.deny),
            except: texts(&t.except),
            default_allow: t.default == EgressDefault::Allow,
            host_ports: t.host_ports.iter().map(|p| p.get()).collect(),
        })
    }

    fn egress(&self) -> Result<Egress, String> {
        Ok(match self.kind.as_str() {
            "deny" => Egress::Deny,
            "allow" => Egress::Allow,
            "allow_list" => Egress::AllowList(self.allow.clone()),
            "tiers" => {
                let mut t = if self.default_allow {
                    EgressTiers::allow_by_default()
                } else {
                    EgressTiers::deny_by_default()
                };
                for r in parsed(&self.allow)? {
                    t = t.allow(r);
                }
                for r in parsed(&self.deny)? {
                    t = t.deny(r);
                }
                for r in parsed(&self.except)? {
                    t = t.except(r);
                }
                for p in &self.host_ports {
                    t = t.host_port(HostPort::new(*p).map_err(|e| e.to_string())?);
                }
                Egress::Tiers(t)
            }
            other => return Err(format!("unknown egress kind `{other}` in the state")),
        })
    }
}

/// What `<id>.json` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct State {
    egress: StoredEgress,
    /// The networks of the create's blocked-set overrides (kept across changes).
    pub exempt: Vec<String>,
    /// Where the rules send DNS.
    pub resolver: SocketAddr,
    /// The container's first process and its network namespace when the rules were
    /// loaded.
    pub pid: u32,
    pub ns_inode: u64,
    /// Incremented by every change.
    pub generation: u64,
    /// The credentials proxy of a sandbox with brokered credentials (kept across
    /// changes and restarts: the rules of every load redirect to it).
    #[serde(default)]
    pub proxy: Option<Proxied>,
}

/// A sandbox's credentials proxy as the rules and the resolver need it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Proxied {
    /// The proxy's port on the host's address on the sandbox's network.
    pub port: u16,
    /// The bound host names, answered by the resolver with `addrs`.
    pub hosts: Vec<String>,
    /// The bound hosts' IPv4 addresses, resolved at create.
    pub addrs: Vec<std::net::Ipv4Addr>,
}

impl State {
    pub(crate) fn new(
        egress: &Egress,
        exempt: Vec<String>,
        resolver: SocketAddr,
        pid: u32,
        ns_inode: u64,
    ) -> Result<State, String> {
        Ok(State {
            egress: StoredEgress::of(egress)?,
            exempt,
            resolver,
            pid,
            ns_inode,
            generation: 0,
            proxy: None,
        })
    }

    /// The policy in force.
    pub(crate) fn egress(&self) -> Result<Egress, String> {
        self.egress.egress()
    }

    /// Replaces the policy (the generation moves on).
    pub(crate) fn set_egress(&mut self, egress: &Egress) -> Result<(), String> {
        self.egress = StoredEgress::of(egress)?;
        self.generation += 1;
        Ok(())
    }
}

/// The state files of one sandbox, in one directory (tests use their own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Files {
    dir: PathBuf,
    id: String,
}

/// A held lock on a sandbox's state (released on drop).
#[derive(Debug)]
pub(crate) struct Held(#[allow(dead_code)] File);

impl Files {
    /// The files of container `id` in [`STATE_DIR`].
    pub(crate) fn of(id: &str) -> Files {
        Files::in_dir(Path::new(STATE_DIR), id)
    }

    pub(crate) fn in_dir(dir: &Path, id: &str) -> Files {
        Files {
            dir: dir.to_path_buf(),
            id: id.to_string(),
        }
    }

    fn path(&self, ext: &str) -> PathBuf {
        // A container id is hex; anything else could walk out of the directory.
        let safe: String = self
            .id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        self.dir.join(format!("{safe}.{ext}"))
    }

    fn ensure_dir(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
    }

    fn lock_file(&self) -> std::io::Result<File> {
        self.ensure_dir()?;
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.path("lock"))
    }

    /// The exclusive lock (a change), waited for off the async threads.
    pub(crate) async fn lock_exclusive(&self) -> Result<Held, String> {
        let f = self.clone();
        tokio::task::spawn_blocking(move || {
            let file = f.lock_file()?;
            rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
            Ok::<_, std::io::Error>(Held(file))
        })
        .await
        .map_err(|e| format!("locking the egress state: {e}"))?
        .map_err(|e| format!("locking the egress state of {}: {e}", self.id))
    }

    /// The shared lock (an answer of the resolver).
    pub(crate) async fn lock_shared(&self) -> Result<Held, String> {
        let f = self.clone();
        tokio::task::spawn_blocking(move || {
            let file = f.lock_file()?;
            rustix::fs::flock(&file, rustix::fs::FlockOperation::LockShared)?;
            Ok::<_, std::io::Error>(Held(file))
        })
        .await
        .map_err(|e| format!("locking the egress state: {e}"))?
        .map_err(|e| format!("locking the egress state of {}: {e}", self.id))
    }

    /// The state, `None` when the sandbox has none (created without rules).
    pub(crate) fn read(&self) -> Result<Option<State>, String> {
        match std::fs::read(self.path("json")) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| format!("the egress state of {} is unreadable: {e}", self.id)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("reading the egress state of {}: {e}", self.id)),
        }
    }

    /// Writes the state (aside, then renamed into place: a reader never sees half).
    pub(crate) fn write(&self, state: &State) -> Result<(), String> {
        let run = || -> std::io::Result<()> {
            self.ensure_dir()?;
            let tmp = self.path("json.tmp");
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&serde_json::to_vec(state).map_err(std::io::Error::other)?)?;
            f.sync_all()?;
            std::fs::rename(&tmp, self.path("json"))
        };
        run().map_err(|e| format!("writing the egress state of {}: {e}", self.id))
    }

    /// The pins recorded since the last change, by tier.
    pub(crate) fn pins(&self) -> Vec<(PinTier, Pin)> {
        let Ok(text) = std::fs::read_to_string(self.path("pins")) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|l| serde_json::from_str::<(PinTier, Pin)>(l).ok())
            .collect()
    }

    /// Records one answer's pin (one appended line).
    pub(crate) fn add_pin(&self, tier: PinTier, pin: &Pin) -> Result<(), String> {
        let run = || -> std::io::Result<()> {
            self.ensure_dir()?;
            let mut line = serde_json::to_vec(&(tier, pin)).map_err(std::io::Error::other)?;
            line.push(b'\n');
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(self.path("pins"))?
                .write_all(&line)
        };
        run().map_err(|e| format!("recording a pin of {}: {e}", self.id))
    }

    /// Replaces the recorded pins (after a change kept these).
    pub(crate) fn set_pins(&self, pins: &[(PinTier, Pin)]) -> Result<(), String> {
        let mut text = Vec::new();
        for p in pins {
            text.extend(serde_json::to_vec(p).map_err(|e| e.to_string())?);
            text.push(b'\n');
        }
        std::fs::write(self.path("pins"), text)
            .map_err(|e| format!("writing the pins of {}: {e}", self.id))
    }

    /// Removes every file of the sandbox (gone is fine).
    pub(crate) fn remove(&self) {
        for ext in ["json", "pins", "lock", "json.tmp"] {
            let _ = std::fs::remove_file(self.path(ext));
        }
    }
}

/// The container ids that have state in [`STATE_DIR`].
pub(crate) fn ids() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(STATE_DIR) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .map(str::to_string)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_round_trips_through_the_state() {
        let tiers = EgressTiers::allow_by_default()
            .deny(EgressRule::parse("*.example.com").unwrap())
            .except(EgressRule::parse("api.example.com").unwrap())
            .allow(EgressRule::parse("10.9.0.0/16").unwrap());
        for e in [
            Egress::Deny,
            Egress::Allow,
            Egress::AllowList(vec![
                "pypi.org".into(),
                "10.0.0.0/8".into(),
                "192.0.2.1".into(),
            ]),
            Egress::Tiers(tiers.clone()),
            Egress::Tiers(EgressTiers::deny_by_default()),
            // Host ports are part of the policy: a state that dropped them would load
            // rules without them (and the resolver would not answer their name).
            Egress::Tiers(
                tiers
                    .host_port(HostPort::new(8080).unwrap())
                    .host_port(HostPort::new(9000).unwrap()),
            ),
            Egress::Tiers(EgressTiers::deny_by_default().host_port(HostPort::new(1).unwrap())),
        ] {
            let s = State::new(&e, vec![], "172.30.0.1:53".parse().unwrap(), 1, 2).unwrap();
            let back: State = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
            assert_eq!(back.egress().unwrap(), e);
        }
    }

    /// A state written before host ports existed reads as none; one holding port 0 (no
    /// writer of this library makes one) is refused, not read as a grant.
    #[test]
    fn stored_host_ports_are_checked_on_read() {
        let s = State::new(
            &Egress::Tiers(EgressTiers::deny_by_default()),
            vec![],
            "172.30.0.1:53".parse().unwrap(),
            1,
            2,
        )
        .unwrap();
        let mut v = serde_json::to_value(&s).unwrap();
        v["egress"].as_object_mut().unwrap().remove("host_ports");
        let old: State = serde_json::from_value(v.clone()).unwrap();
        assert!(old.egress().unwrap().host_ports().is_empty());
        v["egress"]["host_ports"] = serde_json::json!([0]);
        let bad: State = serde_json::from_value(v).unwrap();
        assert!(bad.egress().is_err());
    }

    #[test]
    fn files_lock_read_write_and_go() {
        let dir = std::env::temp_dir().join(format!("sbx-egress-state-{}", std::process::id()));
        let f = Files::in_dir(&dir, "abc123");
        assert_eq!(f.read().unwrap(), None);
        let mut s = State::new(
            &Egress::Allow,
            vec![],
            "127.0.0.1:53".parse().unwrap(),
            1,
            2,
        )
        .unwrap();
        f.write(&s).unwrap();
        s.set_egress(&Egress::Deny).unwrap();
        f.write(&s).unwrap();
        let back = f.read().unwrap().unwrap();
        assert_eq!(back.generation, 1);
        assert_eq!(back.egress().unwrap(), Egress::Deny);
        let pin = Pin {
            name: "a.test".into(),
            addrs: vec!["198.18.0.1".parse().unwrap()],
        };
        f.add_pin(PinTier::Allow, &pin).unwrap();
        assert_eq!(f.pins(), vec![(PinTier::Allow, pin)]);
        // A path-like id stays inside the directory.
        assert!(Files::in_dir(&dir, "../x").path("json").starts_with(&dir));
        f.remove();
        assert_eq!(f.read().unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

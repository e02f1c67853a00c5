//! From command-line settings to the facade: the backend target (a DSN, or an engine
//! configuration when `--runtime` asks for one) and the `CreateOptions`.

use std::time::Duration;

use sandbox::{
    CreateOptions, Dsn, Egress, EgressRule, EgressTiers, HostPort, IsolationTier, NetworkPolicy,
    Resources, SandboxError, Target,
};

use crate::cli::{HostTiers, NetworkArg, PullArg, RuntimeArg, SandboxArgs, TierArg};

// One enum shared by both engines (sandbox-container's), reachable through either.
#[cfg(feature = "docker")]
use sandbox::docker::Runtime;
#[cfg(all(feature = "podman", not(feature = "docker")))]
use sandbox::podman::Runtime;

/// The target and the options of a new sandbox. The DSN's template and `?timeout=` are
/// applied on top of `options` here, so they win over the defaults as with `sandbox::create`.
/// A malformed DSN is refused here, before any engine or holder is involved.
pub fn resolve(
    dsn: &str,
    args: &SandboxArgs,
    options: CreateOptions,
) -> sandbox::Result<(Target, CreateOptions)> {
    let options = apply_sandbox_args(args, options)?;
    // Applied here, not left to `sandbox::create`: the `create` holder calls
    // `Backend::create` itself, which knows nothing of DSNs.
    let parsed = Dsn::parse(dsn)?;
    let options = parsed.apply(options);
    let target = match args.runtime {
        None => Target::from(parsed),
        Some(runtime) => runtime_target(&parsed.scheme, runtime)?,
    };
    Ok((target, options))
}

/// The egress policy the flags say: `--network` alone is `Deny`, `Allow` or (`closed`)
/// tiers that deny everything; allow hosts alone an allowlist; any deny or exception
/// entry, or hosts over `--network allow`, tiers over that default. An entry that is not
/// a host, wildcard or CIDR is a `Configuration` error naming it.
pub fn egress_of(network: NetworkArg, hosts: &HostTiers) -> sandbox::Result<Egress> {
    let parse = |list: &[String]| -> sandbox::Result<Vec<EgressRule>> {
        list.iter().map(|h| EgressRule::parse(h)).collect()
    };
    let (allow, deny, except) = (
        parse(&hosts.allow_hosts)?,
        parse(&hosts.deny_hosts)?,
        parse(&hosts.except_hosts)?,
    );
    let ports = hosts
        .host_ports
        .iter()
        .map(|p| HostPort::new(*p))
        .collect::<sandbox::Result<Vec<_>>>()?;
    Ok(match network {
        NetworkArg::Deny | NetworkArg::Closed
            if deny.is_empty() && except.is_empty() && ports.is_empty() && !allow.is_empty() =>
        {
            Egress::AllowList(hosts.allow_hosts.clone())
        }
        NetworkArg::Deny if hosts.is_empty() => Egress::Deny,
        NetworkArg::Allow if hosts.is_empty() => Egress::Allow,
        _ => {
            let mut t = match network {
                NetworkArg::Allow => EgressTiers::allow_by_default(),
                _ => EgressTiers::deny_by_default(),
            };
            for r in allow {
                t = t.allow(r);
            }
            for r in deny {
                t = t.deny(r);
            }
            for r in except {
                t = t.except(r);
            }
            for p in ports {
                t = t.host_port(p);
            }
            Egress::Tiers(t)
        }
    })
}

fn apply_sandbox_args(args: &SandboxArgs, base: CreateOptions) -> sandbox::Result<CreateOptions> {
    let mut resources = Resources::default();
    if let Some(m) = args.memory {
        resources = resources.memory_mb(m);
    }
    if let Some(c) = args.cpus {
        resources = resources.cpu(c);
    }
    if let Some(d) = args.disk_mb {
        resources = resources.disk_mb(d);
    }
    let mut network = NetworkPolicy::deny();
    network.egress = egress_of(args.network, &args.hosts)?;
    let mut o = base
        .resources(resources)
        .network(network)
        .pull(match args.pull {
            PullArg::Missing => sandbox::PullPolicy::Missing,
            PullArg::Always => sandbox::PullPolicy::Always,
            PullArg::Never => sandbox::PullPolicy::Never,
        });
    for (k, v) in &args.env {
        o = o.env(k.clone(), v.clone());
    }
    if let Some(h) = &args.hostname {
        o = o.hostname(h.clone());
    }
    if let Some(agent) = ssh_agent_of(&args.ssh_agent)? {
        o = o.ssh_agent(agent);
    }
    for repo in &args.git_repo {
        o = o.git_repo(git_repo_of(repo)?);
    }
    for c in &args.credential {
        o = o.credential(credential_of(c)?);
    }
    if let Some(t) = args.require_isolation {
        o = o.require_isolation(match t {
            TierArg::Container => IsolationTier::Container,
            TierArg::Gvisor => IsolationTier::Gvisor,
            TierArg::Microvm => IsolationTier::MicroVm,
        });
    }
    Ok(o)
}

/// One `--credential` value: `HOSTS:HEADER=VALUE` or `HOSTS:?PARAM=VALUE`, where VALUE is
/// an environment variable's name or a template holding `{NAME}` once. The secret is
/// that variable's value in this process's environment. Errors never repeat the argument
/// (a value pasted by mistake would be a secret).
pub(crate) fn credential_of(arg: &str) -> sandbox::Result<sandbox::Credential> {
    let bad = |why: &str| {
        SandboxError::config(
            format!("--credential: {why} (the argument is not shown: it may hold a secret)"),
            "give HOST:HEADER=ENV_VAR (e.g. `api.example.com:X-Api-Key=API_KEY`, or \
             `'api.example.com:Authorization=Bearer {API_KEY}'`, or `api.example.com:?key=API_KEY` \
             for a query parameter); the value is read from ENV_VAR in this shell",
        )
    };
    let (hosts, rest) = arg
        .split_once(':')
        .ok_or_else(|| bad("no `:` after the host"))?;
    let hosts: Vec<&str> = hosts.split(',').collect();
    let (query, rest) = match rest.strip_prefix('?') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let (name, value) = rest
        .split_once('=')
        .ok_or_else(|| bad("no `=` between the header and the variable"))?;
    let (var, template) = match (value.find('{'), value.find('}')) {
        (None, None) => (value.to_string(), "{}".to_string()),
        (Some(open), Some(close)) if open < close => {
            let var = &value[open + 1..close];
            let template = format!("{}{{}}{}", &value[..open], &value[close + 1..]);
            if template.matches('{').count() != 1 || template.matches('}').count() != 1 {
                return Err(bad("the value names more than one variable"));
            }
            (var.to_string(), template)
        }
        _ => return Err(bad("the value's `{NAME}` is not closed")),
    };
    crate::secret_env::check_name("--credential", &var)?;
    let secret = std::env::var(&var).map_err(|_| {
        SandboxError::config(
            format!("--credential: the environment variable {var} is not set (or not UTF-8)"),
            format!("export {var}=… in the calling shell (the value is never passed on the command line)"),
        )
    })?;
    let placement = if query {
        if template != "{}" {
            return Err(bad(
                "a query parameter takes the variable alone, not a template",
            ));
        }
        sandbox::Placement::query(name)
    } else {
        sandbox::Placement::header_template(name, template)
    };
    let c = sandbox::Credential::new(var, secret, hosts, placement);
    c.validate()?;
    Ok(c)
}

/// The `--ssh-agent` values: `*` (the bare flag) for every key, else fingerprints or
/// public key files.
fn ssh_agent_of(values: &[String]) -> sandbox::Result<Option<sandbox::SshAgentOptions>> {
    if values.is_empty() {
        return Ok(None);
    }
    if values.iter().all(|v| v == "*") {
        return Ok(Some(sandbox::SshAgentOptions::all_keys()));
    }
    let mut keys = Vec::new();
    for v in values.iter().filter(|v| *v != "*") {
        let key = if v.starts_with("SHA256:") {
            sandbox::SshKey::fingerprint(v)?
        } else {
            let line = std::fs::read_to_string(v).map_err(|e| {
                SandboxError::config(
                    format!("--ssh-agent={v}: not a fingerprint, and not a readable public key file: {e}"),
                    "give a fingerprint as `ssh-add -l` prints it (SHA256:…), or a .pub file",
                )
            })?;
            sandbox::SshKey::public_key(line.trim())?
        };
        keys.push(key);
    }
    Ok(Some(sandbox::SshAgentOptions::keys(keys)))
}

/// A `--git-repo` value: `PATH` (read-only) or `PATH:rw` (`PATH:ro` is read-only too).
/// The path is made absolute, so the gate serves what the user named from here.
pub(crate) fn git_repo_of(value: &str) -> sandbox::Result<sandbox::GitRepo> {
    let (path, access) = match value.rsplit_once(':') {
        Some((p, "rw")) => (p, sandbox::GitAccess::ReadWrite),
        Some((p, "ro")) => (p, sandbox::GitAccess::ReadOnly),
        _ => (value, sandbox::GitAccess::ReadOnly),
    };
    if path.is_empty() {
        return Err(SandboxError::config(
            format!("--git-repo={value}: no path"),
            "give a repository's path, with `:rw` to allow pushes under the sandbox's prefix",
        ));
    }
    let path = std::path::absolute(path).map_err(|e| {
        SandboxError::config(
            format!("--git-repo={value}: {e}"),
            "give a repository's path, with `:rw` to allow pushes under the sandbox's prefix",
        )
    })?;
    let repo = sandbox::GitRepo::new(path, access);
    repo.validate()?;
    Ok(repo)
}

pub(crate) fn runtime_target(scheme: &str, runtime: RuntimeArg) -> sandbox::Result<Target> {
    #[cfg(any(feature = "docker", feature = "podman"))]
    let rt = match runtime {
        RuntimeArg::Runc => Runtime::Runc,
        RuntimeArg::Crun => Runtime::Crun,
        RuntimeArg::Runsc => Runtime::Runsc,
        RuntimeArg::Krun => Runtime::Krun,
    };
    match scheme {
        #[cfg(feature = "docker")]
        "docker" => Ok(Target::from(
            sandbox::docker::DockerConfig::from_env().runtime(rt),
        )),
        #[cfg(feature = "podman")]
        "podman" => Ok(Target::from(
            sandbox::podman::PodmanConfig::from_env()
                .options(sandbox::podman::PodmanOptions::new().runtime(rt)),
        )),
        other => {
            let _ = runtime;
            Err(SandboxError::config(
                format!("--runtime applies to docker and podman, not `{other}`"),
                "drop --runtime, or use a docker:// or podman:// DSN",
            ))
        }
    }
}

/// `options` with `require_agent` set wherever `target`'s backend offers the agent
/// (declares `AGENT`), unless `allow_engine_exec`: a create whose agent cannot start then
/// fails instead of quietly running on the engine's exec path. A backend without an agent
/// (the fake, or an engine whose agent the operator switched off with `SBX_AGENT=off`)
/// creates as it always does, and the sandbox reports its path (`sandbox ls`, `--json`).
pub async fn require_agent_where_offered(
    options: CreateOptions,
    target: &Target,
    allow_engine_exec: bool,
) -> sandbox::Result<CreateOptions> {
    if allow_engine_exec {
        return Ok(options);
    }
    // Backends are built once per process: the create below reuses this one.
    let backend = sandbox::backend(target.clone()).await?;
    let offered = backend.capabilities().contains(sandbox::Capability::AGENT);
    Ok(options.require_agent(offered))
}

/// The lifetime of a sandbox made by `sandbox create` when `--timeout` is not given:
/// modest, because it outlives the command that made it.
pub const DEFAULT_SESSION_LIFETIME: Duration = Duration::from_secs(600);

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(allow: &[&str], deny: &[&str], except: &[&str]) -> HostTiers {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        HostTiers {
            allow_hosts: v(allow),
            deny_hosts: v(deny),
            except_hosts: v(except),
            host_ports: vec![],
        }
    }

    /// `--credential` forms: a variable, a template, a query parameter, several hosts;
    /// the secret is the variable's value here (PATH: always set, never a real secret).
    #[test]
    fn credential_flags_become_credentials() {
        let path = std::env::var("PATH").unwrap();
        let c = credential_of("api.example.com:Authorization=Bearer {PATH}").unwrap();
        assert_eq!(c.env_var, "PATH");
        assert_eq!(c.secret.expose(), path);
        assert_eq!(c.hosts, ["api.example.com"]);
        assert_eq!(
            c.placement,
            sandbox::Placement::header_template("Authorization", "Bearer {}")
        );
        let c = credential_of("a.example,B.example:X-Api-Key=PATH").unwrap();
        assert_eq!(c.hosts, ["a.example", "b.example"]);
        assert_eq!(c.placement, sandbox::Placement::header("X-Api-Key"));
        let c = credential_of("a.example:?key=PATH").unwrap();
        assert_eq!(c.placement, sandbox::Placement::query("key"));
        for bad in [
            "a.example",
            "a.example:X-Api-Key",
            "a.example:A={PATH} {PATH}",
            "a.example:A={PATH",
            "a.example:?key=x{PATH}",
            "a.example:A=1BAD",
            ":A=PATH",
        ] {
            let e = credential_of(bad).unwrap_err();
            assert!(!e.render().contains(&path), "{bad}");
        }
    }

    /// `--host-port` grants the port over the default the other flags say (alone, over
    /// deny: the only way out); a repeat is merged; port 0 is refused.
    #[test]
    fn host_port_flags_become_tiers() {
        let p = |n: u16| HostPort::new(n).unwrap();
        let with = |h: HostTiers, ports: &[u16]| HostTiers {
            host_ports: ports.to_vec(),
            ..h
        };
        assert_eq!(
            egress_of(NetworkArg::Deny, &with(hosts(&[], &[], &[]), &[8080, 8080])).unwrap(),
            Egress::Tiers(EgressTiers::deny_by_default().host_port(p(8080)))
        );
        let r = |s: &str| EgressRule::parse(s).unwrap();
        assert_eq!(
            egress_of(
                NetworkArg::Deny,
                &with(hosts(&["pypi.org"], &[], &[]), &[8080, 9000])
            )
            .unwrap(),
            Egress::Tiers(
                EgressTiers::deny_by_default()
                    .allow(r("pypi.org"))
                    .host_port(p(8080))
                    .host_port(p(9000))
            )
        );
        let e = egress_of(NetworkArg::Deny, &with(hosts(&[], &[], &[]), &[0])).unwrap_err();
        assert_eq!(e.code(), sandbox::ErrorCode::Configuration);
    }

    /// The flags name the policy: bare `--network` values, an allowlist, tiers over the
    /// default `--network` says, and a bad entry refused with the entry named.
    #[test]
    fn egress_flags_name_the_policy() {
        let none = hosts(&[], &[], &[]);
        assert_eq!(egress_of(NetworkArg::Deny, &none).unwrap(), Egress::Deny);
        assert_eq!(egress_of(NetworkArg::Allow, &none).unwrap(), Egress::Allow);
        assert_eq!(
            egress_of(NetworkArg::Closed, &none).unwrap(),
            Egress::Tiers(EgressTiers::deny_by_default())
        );
        assert_eq!(
            egress_of(NetworkArg::Deny, &hosts(&["pypi.org"], &[], &[])).unwrap(),
            Egress::AllowList(vec!["pypi.org".into()])
        );
        let r = |s: &str| EgressRule::parse(s).unwrap();
        assert_eq!(
            egress_of(NetworkArg::Allow, &hosts(&[], &["evil.test"], &[])).unwrap(),
            Egress::Tiers(EgressTiers::allow_by_default().deny(r("evil.test")))
        );
        assert_eq!(
            egress_of(
                NetworkArg::Deny,
                &hosts(&["*.example.com"], &["*.example.com"], &["api.example.com"])
            )
            .unwrap(),
            Egress::Tiers(
                EgressTiers::deny_by_default()
                    .allow(r("*.example.com"))
                    .deny(r("*.example.com"))
                    .except(r("api.example.com"))
            )
        );
        let e = egress_of(NetworkArg::Deny, &hosts(&[], &["bad host"], &[])).unwrap_err();
        assert_eq!(e.code(), sandbox::ErrorCode::Configuration);
        assert!(e.to_string().contains("bad host"), "{e}");
    }
}

//! Admission checks before provisioning: option validity, required isolation, and the
//! capabilities the requested policy needs.
//!
//! The enforcement layer runs [`check_create`] before every `create` reaches an adapter,
//! and [`require`] before every later call; where admission runs, and why first-party
//! adapters run it again, is written down once in [`crate::layer`]'s module doc.

use crate::{Capability, CreateOptions, EffectiveResources, IsolationTier, Result, SandboxError};

/// Refuses `options` unless a backend with `caps` and `tier` can honour all of it, and
/// returns the effective resources. What the layer runs before `create`, so nothing is
/// provisioned for a refused request.
pub fn check_create(
    backend: &str,
    caps: Capability,
    tier: IsolationTier,
    options: &CreateOptions,
) -> Result<EffectiveResources> {
    let resources = options.validate()?;
    if let Some(min) = options.require_isolation
        && !tier.satisfies(min)
    {
        return Err(SandboxError::config(
            format!("backend `{backend}` provides isolation `{tier}`, `{min}` was required"),
            match min {
                IsolationTier::Gvisor => {
                    "use the runsc runtime (e.g. docker with DockerConfig::runtime(Runtime::Runsc)) or lower require_isolation"
                }
                _ => "choose a backend with a stronger isolation tier, or lower require_isolation",
            },
        ));
    }
    require(caps, Capability::NETWORK_POLICY, backend)?;
    // Before the allowlist a credential's create may also carry: the refusal names what
    // was asked for.
    if !options.credentials.is_empty() {
        require(caps, Capability::CREDENTIALS, backend)?;
    }
    // The most specific need first: a host port needs the rules too, but the refusal
    // should name what was asked for.
    if !options.network.egress.host_ports().is_empty() {
        require(caps, Capability::HOST_PORTS, backend)?;
    }
    // Tiers without an entry are Deny or Allow by other means; anything listed needs the
    // rules and the resolver.
    if options.network.egress.lists_entries() {
        require(caps, Capability::EGRESS_ALLOWLIST, backend)?;
    }
    if !options.network.ingress_ports.is_empty() {
        require(caps, Capability::INGRESS_PORTS, backend)?;
    }
    if resources.gpu > 0 {
        require(caps, Capability::GPU, backend)?;
    }
    if resources.disk_mb.is_some() {
        require(caps, Capability::DISK_LIMIT, backend)?;
    }
    if options.require_agent {
        require(caps, Capability::AGENT, backend)?;
    }
    // A maximum beyond the lifetime is only meaningful where the deadline can move:
    // elsewhere it would be a setting silently ignored.
    if options.effective_max_lifetime() > options.timeout {
        require(caps, Capability::EXTEND_LIFETIME, backend)?;
    }
    if options.idle_timeout.is_some() {
        require(caps, Capability::IDLE_TIMEOUT, backend)?;
    }
    if options.ssh_agent.is_some() {
        require(caps, Capability::SSH_AGENT, backend)?;
    }
    if !options.git_repos.is_empty() {
        require(caps, Capability::GIT_GATE, backend)?;
    }
    Ok(resources)
}

/// `Ok` when `caps` contains `needed`, else `CapabilityNotSupported`.
pub fn require(caps: Capability, needed: Capability, backend: &str) -> Result<()> {
    if caps.contains(needed) {
        Ok(())
    } else {
        Err(SandboxError::unsupported(needed, backend))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorCode, NetworkPolicy, Resources};

    #[test]
    fn refusals() {
        let caps = Capability::RUN_COMMAND | Capability::NETWORK_POLICY;
        let t = IsolationTier::Container;
        let code = |o: CreateOptions| check_create("x", caps, t, &o).unwrap_err().code();
        assert_eq!(
            code(CreateOptions::default().network(NetworkPolicy::allow_list(["a.b"]))),
            ErrorCode::CapabilityNotSupported
        );
        assert_eq!(
            code(CreateOptions::default().network(NetworkPolicy::deny().ingress_port(80))),
            ErrorCode::CapabilityNotSupported
        );
        assert_eq!(
            code(CreateOptions::default().resources(Resources::default().gpu(1))),
            ErrorCode::CapabilityNotSupported
        );
        assert_eq!(
            code(CreateOptions::default().resources(Resources::default().disk_mb(8))),
            ErrorCode::CapabilityNotSupported
        );
        assert_eq!(
            code(CreateOptions::default().require_agent(true)),
            ErrorCode::CapabilityNotSupported
        );
        assert_eq!(
            code(CreateOptions::default().ssh_agent(crate::SshAgentOptions::all_keys())),
            ErrorCode::CapabilityNotSupported
        );
        assert_eq!(
            code(
                CreateOptions::default()
                    .network(crate::NetworkPolicy::allow())
                    .credential(crate::Credential::new(
                        "API_KEY",
                        "v",
                        ["api.example.com"],
                        crate::Placement::header("X-Api-Key"),
                    ))
            ),
            ErrorCode::CapabilityNotSupported
        );
        // The refusal says how to get on: drop the requirement, or turn an agent on.
        let hint = check_create("x", caps, t, &CreateOptions::default().require_agent(true))
            .unwrap_err()
            .hint();
        assert!(
            hint.contains("require_agent") && hint.contains("SBX_AGENT"),
            "{hint}"
        );
        assert!(
            check_create(
                "x",
                caps | Capability::AGENT,
                t,
                &CreateOptions::default().require_agent(true)
            )
            .is_ok()
        );
        assert_eq!(
            code(CreateOptions::default().require_isolation(IsolationTier::Gvisor)),
            ErrorCode::Configuration
        );
        assert!(check_create("x", caps, t, &CreateOptions::default()).is_ok());
        assert_eq!(
            check_create("x", Capability::RUN_COMMAND, t, &CreateOptions::default())
                .unwrap_err()
                .code(),
            ErrorCode::CapabilityNotSupported
        );
    }
}

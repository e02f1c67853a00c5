//! What a leftover sandbox's labels prove about it, decided once for every tool that
//! removes leftovers (an adapter's startup sweep, `sandbox reap`).
//!
//! The engine's label filter proves nothing: any image or any user of the engine can put
//! `io.sandbox-rs.managed=true` on a container. So a leftover is ours to judge only when
//! its labels are the set sandbox-rs writes, written as it writes them: a session id of 16
//! lowercase hex digits, an owner label that parses, and a deadline that fits the
//! container's creation time (an image's baked-in deadline does not, so an image cannot
//! mark its containers as expired). Anything else is [`Provenance::Foreign`] and is never
//! removed. Engine-specific marks a label cannot forge (the container name prefix an
//! adapter gives, the backend label) are the caller's to check first.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::labels::{
    LABEL_DEADLINE, LABEL_MANAGED, LABEL_MAX_DEADLINE, LABEL_OWNER, LABEL_SESSION, Owner,
};
use crate::options::MAX_SANDBOX_TIMEOUT;

/// Clock difference tolerated between the creating client (which computes the deadline)
/// and the engine (which stamps the creation time).
pub const CLOCK_SLACK: Duration = Duration::from_secs(120);

/// The verdict on one leftover sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Provenance {
    /// Ours, and its owner process is proven gone (same host, boot and pid namespace;
    /// see [`Owner::is_proven_gone`]): safe to remove.
    OwnerGone,
    /// Ours, and its deadline (plus the caller's grace) has passed: safe to remove.
    Expired,
    /// Ours, owner alive or unverifiable (another host or namespace), deadline ahead:
    /// removed only on an explicit request.
    Live,
    /// Labels not as sandbox-rs writes them: never removed.
    Foreign,
}

impl Provenance {
    /// Judges a sandbox from its `labels` and the engine's creation time at `now`. A
    /// deadline counts as passed once `deadline + expiry_grace <= now`, where the deadline
    /// is the latest one extensions can reach (`LABEL_MAX_DEADLINE`): the labelled
    /// deadline may have been moved since, and nothing outside the owner knows by how
    /// much.
    pub fn of(
        labels: &BTreeMap<String, String>,
        created_at: Option<SystemTime>,
        now: SystemTime,
        expiry_grace: Duration,
    ) -> Provenance {
        let Some((owner, deadline)) = ours(labels, created_at) else {
            return Provenance::Foreign;
        };
        if owner.is_proven_gone() {
            Provenance::OwnerGone
        } else if unix_secs(now)
            .is_some_and(|n| deadline.saturating_add(expiry_grace.as_secs()) <= n)
        {
            Provenance::Expired
        } else {
            Provenance::Live
        }
    }

    /// Whether a cleanup removes it without an explicit request.
    pub fn is_removable(self) -> bool {
        matches!(self, Provenance::OwnerGone | Provenance::Expired)
    }
}

/// The owner and latest deadline of a sandbox whose labels are as sandbox-rs writes them.
fn ours(labels: &BTreeMap<String, String>, created_at: Option<SystemTime>) -> Option<(Owner, u64)> {
    let get = |k: &str| labels.get(k).map(String::as_str);
    if get(LABEL_MANAGED) != Some("true") {
        return None;
    }
    // `labels::session_id` is 16 lowercase hex digits.
    let session = get(LABEL_SESSION)?;
    if session.len() != 16
        || !session
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    {
        return None;
    }
    let owner = Owner::parse(get(LABEL_OWNER)?)?;
    let deadline: u64 = get(LABEL_DEADLINE)?.parse().ok()?;
    // The deadline is the creation time plus a lifetime of at most MAX_SANDBOX_TIMEOUT.
    // Without a creation time it cannot be checked at all.
    let created = unix_secs(created_at?)?;
    let slack = CLOCK_SLACK.as_secs();
    let earliest = created.saturating_sub(slack);
    let latest = created
        .saturating_add(MAX_SANDBOX_TIMEOUT.as_secs())
        .saturating_add(slack);
    let fits = |d: u64| (earliest..=latest).contains(&d);
    if !fits(deadline) {
        return None;
    }
    // The maximum, when written, is at least the deadline and fits the creation time the
    // same way (an image cannot bake in a far one to keep its containers from sweeps).
    let latest_deadline = match get(LABEL_MAX_DEADLINE) {
        None => deadline,
        Some(m) => {
            let max: u64 = m.parse().ok()?;
            (fits(max) && max >= deadline).then_some(max)?
        }
    };
    Some((owner, latest_deadline))
}

fn unix_secs(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::{sandbox_labels, unix_now};

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// Labels sandbox-rs writes for a sandbox of this process with `deadline`.
    fn mine(deadline: u64) -> BTreeMap<String, String> {
        sandbox_labels("fake", deadline, &BTreeMap::new())
    }

    #[test]
    fn a_live_sandbox_of_this_process_is_live_until_its_deadline_and_grace() {
        let now = unix_now();
        let labels = mine(now + 60);
        let created = Some(at(now));
        assert_eq!(
            Provenance::of(&labels, created, at(now), Duration::ZERO),
            Provenance::Live
        );
        assert_eq!(
            Provenance::of(&labels, created, at(now + 60), Duration::ZERO),
            Provenance::Expired
        );
        let grace = Duration::from_secs(60);
        assert_eq!(
            Provenance::of(&labels, created, at(now + 60), grace),
            Provenance::Live
        );
        assert_eq!(
            Provenance::of(&labels, created, at(now + 120), grace),
            Provenance::Expired
        );
    }

    #[test]
    fn labels_an_image_could_bake_in_are_foreign() {
        let now = unix_now();
        let created = Some(at(now));
        // A deadline far from the creation time: an image's label, not ours.
        let baked = mine(now - 10 * 24 * 3600);
        assert_eq!(
            Provenance::of(&baked, created, at(now), Duration::ZERO),
            Provenance::Foreign
        );
        // No creation time: the deadline cannot be checked.
        assert_eq!(
            Provenance::of(&mine(now + 60), None, at(now), Duration::ZERO),
            Provenance::Foreign
        );
        // Only the managed label.
        let mut bare = BTreeMap::new();
        bare.insert(LABEL_MANAGED.to_string(), "true".to_string());
        assert_eq!(
            Provenance::of(&bare, created, at(now), Duration::ZERO),
            Provenance::Foreign
        );
        // A session id that is not 16 lowercase hex digits.
        let mut odd = mine(now + 60);
        odd.insert(LABEL_SESSION.to_string(), "ABCDEF0123456789".to_string());
        assert_eq!(
            Provenance::of(&odd, created, at(now), Duration::ZERO),
            Provenance::Foreign
        );
    }

    /// A sandbox that may have been extended is judged by the latest deadline it can
    /// reach: another process's sweep never removes it at its stale labelled deadline.
    #[test]
    fn an_extendable_sandbox_expires_at_its_maximum_deadline() {
        let now = unix_now();
        let created = Some(at(now));
        let mut labels = mine(now + 60);
        crate::labels::add_lifetime_limits(&mut labels, now + 600, None);
        assert_eq!(
            Provenance::of(&labels, created, at(now + 120), Duration::ZERO),
            Provenance::Live,
            "swept at its labelled deadline although extensions could have moved it"
        );
        assert_eq!(
            Provenance::of(&labels, created, at(now + 600), Duration::ZERO),
            Provenance::Expired
        );
        // A maximum before the deadline, or far from the creation time, is not ours.
        let mut before = mine(now + 60);
        crate::labels::add_lifetime_limits(&mut before, now + 30, None);
        assert_eq!(
            Provenance::of(&before, created, at(now), Duration::ZERO),
            Provenance::Foreign
        );
        let mut far = mine(now + 60);
        crate::labels::add_lifetime_limits(&mut far, now + 10 * 24 * 3600, None);
        assert_eq!(
            Provenance::of(&far, created, at(now), Duration::ZERO),
            Provenance::Foreign
        );
    }

    #[test]
    fn only_owner_gone_and_expired_are_removable() {
        assert!(Provenance::OwnerGone.is_removable());
        assert!(Provenance::Expired.is_removable());
        assert!(!Provenance::Live.is_removable());
        assert!(!Provenance::Foreign.is_removable());
    }
}

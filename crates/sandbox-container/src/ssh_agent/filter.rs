//! What a message from the sandbox's ssh-agent socket may do, decided on the host: the
//! sandbox's side of the relay is written by hostile code, so every message is parsed
//! strictly and anything not exactly a list of identities or a signature with a selected
//! key is answered with a failure here, without reaching the host agent.

use sandbox_agent::protocol::SSH_AGENT_MAX_MESSAGE;
use sandbox_core::ssh_agent::MAX_SSH_KEY_BLOB;

/// `SSH_AGENT_FAILURE`.
pub(crate) const FAILURE: u8 = 5;
/// `SSH_AGENTC_REQUEST_IDENTITIES`.
pub(crate) const REQUEST_IDENTITIES: u8 = 11;
/// `SSH_AGENT_IDENTITIES_ANSWER`.
pub(crate) const IDENTITIES_ANSWER: u8 = 12;
/// `SSH_AGENTC_SIGN_REQUEST`.
pub(crate) const SIGN_REQUEST: u8 = 13;
/// `SSH_AGENT_SIGN_RESPONSE`.
pub(crate) const SIGN_RESPONSE: u8 = 14;

/// Longest key comment passed on (the host agent's own; real ones are a user and host).
const MAX_COMMENT: usize = 1024;

/// One key the sandbox may use: its public key blob and the host agent's comment for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) blob: Vec<u8>,
    pub(crate) comment: Vec<u8>,
}

/// What to do with one message from the sandbox.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Answer this, without asking the host agent.
    Answer(Vec<u8>),
    /// Ask the host agent this (a sign request for a selected key), then pass its answer
    /// through [`checked_sign_answer`].
    Sign(Vec<u8>),
    /// Answer [`FAILURE`] without asking the host agent, for this reason (for the audit
    /// record; never the message's content).
    Refuse(&'static str),
}

/// The name of a message's type, for the log and the audit record (never its content):
/// `list`, `sign`, the protocol's name of another known type, `type_<n>` for an unknown
/// one, `empty`.
pub(crate) fn request_name(message: &[u8]) -> String {
    let known = match message.first() {
        Some(&REQUEST_IDENTITIES) => "list",
        Some(&SIGN_REQUEST) => "sign",
        Some(17) => "add_identity",
        Some(18) => "remove_identity",
        Some(19) => "remove_all_identities",
        Some(20) => "add_smartcard_key",
        Some(21) => "remove_smartcard_key",
        Some(22) => "lock",
        Some(23) => "unlock",
        Some(25) => "add_identity_constrained",
        Some(26) => "add_smartcard_key_constrained",
        Some(27) => "extension",
        Some(n) => return format!("type_{n}"),
        None => "empty",
    };
    known.to_string()
}

/// The key blob a well-formed sign request names (selected or not), else `None`.
pub(crate) fn sign_key(message: &[u8]) -> Option<&[u8]> {
    match message {
        [SIGN_REQUEST, rest @ ..] if message.len() <= SSH_AGENT_MAX_MESSAGE => parse_sign(rest),
        _ => None,
    }
}

/// Decides what message `message` (without its length prefix) from the sandbox gets.
pub(crate) fn decide(message: &[u8], selected: &[Identity]) -> Decision {
    if message.len() > SSH_AGENT_MAX_MESSAGE {
        return Decision::Refuse("the message is longer than the relay takes");
    }
    match message {
        [REQUEST_IDENTITIES] => Decision::Answer(identities_answer(selected)),
        [REQUEST_IDENTITIES, ..] => Decision::Refuse("a malformed list request"),
        [SIGN_REQUEST, rest @ ..] => match parse_sign(rest) {
            Some(key) if selected.iter().any(|i| i.blob == key) => Decision::Sign(message.to_vec()),
            Some(_) => Decision::Refuse("a sign request with a key that was not selected"),
            None => Decision::Refuse("a malformed sign request"),
        },
        // Adding, removing, locking, unlocking, extensions (session binding included),
        // smartcards, anything unknown.
        _ => Decision::Refuse("only lists and signs with a selected key reach the host agent"),
    }
}

/// The answer to a list request: the selected keys, nothing else of the host agent.
pub(crate) fn identities_answer(selected: &[Identity]) -> Vec<u8> {
    let mut out = vec![IDENTITIES_ANSWER];
    out.extend_from_slice(&(selected.len() as u32).to_be_bytes());
    for i in selected {
        put_string(&mut out, &i.blob);
        put_string(&mut out, &i.comment);
    }
    out
}

/// The host agent's answer to a sign request as it may go to the sandbox: a well-formed
/// signature, else a failure (whatever else the host agent said).
pub(crate) fn checked_sign_answer(answer: &[u8]) -> Vec<u8> {
    match answer {
        [SIGN_RESPONSE, rest @ ..] => {
            let mut r = Reader(rest);
            match (r.string(SSH_AGENT_MAX_MESSAGE), r.0.is_empty()) {
                (Some(_), true) => answer.to_vec(),
                _ => vec![FAILURE],
            }
        }
        _ => vec![FAILURE],
    }
}

/// The identities in the host agent's answer to a list request; `None` when it is not a
/// well-formed one.
pub(crate) fn parse_identities(answer: &[u8]) -> Option<Vec<Identity>> {
    let [IDENTITIES_ANSWER, rest @ ..] = answer else {
        return None;
    };
    let mut r = Reader(rest);
    let n = r.u32()? as usize;
    // Every identity takes at least 8 bytes: a count beyond that is a lie.
    if n > rest.len() / 8 {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let blob = r.string(MAX_SSH_KEY_BLOB)?.to_vec();
        let comment = r.string(SSH_AGENT_MAX_MESSAGE)?;
        let comment = comment[..comment.len().min(MAX_COMMENT)].to_vec();
        out.push(Identity { blob, comment });
    }
    r.0.is_empty().then_some(out)
}

/// The key blob of a sign request's body (after the type byte), when it is exactly
/// `string key_blob, string data, uint32 flags`.
fn parse_sign(body: &[u8]) -> Option<&[u8]> {
    let mut r = Reader(body);
    let key = r.string(MAX_SSH_KEY_BLOB)?;
    r.string(SSH_AGENT_MAX_MESSAGE)?;
    r.u32()?;
    r.0.is_empty().then_some(key)
}

fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s);
}

/// SSH wire reads that never index past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn u32(&mut self) -> Option<u32> {
        let (head, rest) = self.0.split_at_checked(4)?;
        self.0 = rest;
        Some(u32::from_be_bytes(head.try_into().ok()?))
    }

    fn string(&mut self, max: usize) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > max {
            return None;
        }
        let (s, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(n: u8) -> Identity {
        let mut blob = Vec::new();
        put_string(&mut blob, b"ssh-ed25519");
        put_string(&mut blob, &[n; 32]);
        Identity {
            blob,
            comment: format!("key{n}").into_bytes(),
        }
    }

    fn sign(blob: &[u8], data: &[u8], flags: u32) -> Vec<u8> {
        let mut m = vec![SIGN_REQUEST];
        put_string(&mut m, blob);
        put_string(&mut m, data);
        m.extend_from_slice(&flags.to_be_bytes());
        m
    }

    #[test]
    fn a_list_answers_exactly_the_selected_keys() {
        let selected = [key(1)];
        let Decision::Answer(a) = decide(&[REQUEST_IDENTITIES], &selected) else {
            panic!("answered here");
        };
        assert_eq!(parse_identities(&a), Some(selected.to_vec()));
        // A list request with trailing bytes is no list request.
        assert!(matches!(
            decide(&[REQUEST_IDENTITIES, 0], &selected),
            Decision::Refuse(_)
        ));
    }

    #[test]
    fn only_a_well_formed_sign_request_for_a_selected_key_is_forwarded() {
        let selected = [key(1)];
        let ok = sign(&key(1).blob, b"data", 0);
        assert_eq!(decide(&ok, &selected), Decision::Sign(ok.clone()));
        let other = sign(&key(2).blob, b"data", 0);
        assert!(matches!(decide(&other, &selected), Decision::Refuse(_)));
        let mut trailing = ok.clone();
        trailing.push(0);
        assert!(matches!(decide(&trailing, &selected), Decision::Refuse(_)));
        let truncated = &ok[..ok.len() - 1];
        assert!(matches!(decide(truncated, &selected), Decision::Refuse(_)));
        // A prefix of a selected key is not that key.
        let prefix = sign(&key(1).blob[..20], b"data", 0);
        assert!(matches!(decide(&prefix, &selected), Decision::Refuse(_)));
    }

    #[test]
    fn every_other_request_fails_without_reaching_the_host_agent() {
        let selected = [key(1)];
        for t in (0u8..=255).filter(|t| ![REQUEST_IDENTITIES, SIGN_REQUEST].contains(t)) {
            assert!(
                matches!(decide(&[t, 0, 0, 0, 0], &selected), Decision::Refuse(_)),
                "type {t} ({})",
                request_name(&[t])
            );
        }
        assert!(matches!(decide(&[], &selected), Decision::Refuse(_)));
        let huge = vec![SIGN_REQUEST; SSH_AGENT_MAX_MESSAGE + 1];
        assert!(matches!(decide(&huge, &selected), Decision::Refuse(_)));
    }

    #[test]
    fn a_request_is_named_by_its_type_and_a_sign_by_its_key_only() {
        assert_eq!(request_name(&[REQUEST_IDENTITIES]), "list");
        assert_eq!(request_name(&sign(&key(1).blob, b"data", 0)), "sign");
        assert_eq!(request_name(&[17, 0]), "add_identity");
        assert_eq!(request_name(&[200]), "type_200");
        assert_eq!(request_name(&[]), "empty");
        let m = sign(&key(2).blob, b"data", 0);
        assert_eq!(sign_key(&m), Some(&key(2).blob[..]));
        assert_eq!(sign_key(&m[..m.len() - 1]), None);
        assert_eq!(sign_key(&[REQUEST_IDENTITIES]), None);
    }

    #[test]
    fn the_host_agents_sign_answer_passes_only_when_well_formed() {
        let mut good = vec![SIGN_RESPONSE];
        put_string(&mut good, b"sig");
        assert_eq!(checked_sign_answer(&good), good);
        assert_eq!(checked_sign_answer(&[FAILURE]), vec![FAILURE]);
        assert_eq!(
            checked_sign_answer(&[IDENTITIES_ANSWER, 0, 0, 0, 0]),
            vec![FAILURE]
        );
        let mut trailing = good.clone();
        trailing.push(1);
        assert_eq!(checked_sign_answer(&trailing), vec![FAILURE]);
    }

    #[test]
    fn an_identities_answer_with_a_lying_count_is_refused() {
        let mut a = vec![IDENTITIES_ANSWER];
        a.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_identities(&a), None);
        assert_eq!(
            parse_identities(&[IDENTITIES_ANSWER, 0, 0, 0, 0]),
            Some(vec![])
        );
    }

    proptest! {
        #[test]
        fn garbage_is_never_forwarded_unless_it_signs_with_a_selected_key(m in proptest::collection::vec(any::<u8>(), 0..512)) {
            let selected = [key(1)];
            match decide(&m, &selected) {
                Decision::Sign(fwd) => {
                    prop_assert_eq!(&fwd, &m);
                    prop_assert_eq!(parse_sign(&m[1..]), Some(&key(1).blob[..]));
                }
                Decision::Answer(_) => prop_assert_eq!(m, vec![REQUEST_IDENTITIES]),
                Decision::Refuse(_) => {}
            }
        }
    }
}

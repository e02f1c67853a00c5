//! The little of the DNS wire format (RFC 1035) the egress resolver needs: read one
//! question, answer it with A/AAAA records, NXDOMAIN, REFUSED or an empty answer.
//!
//! Hand-written because the resolver answers exactly one question per query with records
//! it made itself; a full DNS library would be more code to audit than these functions.
//! Every read is bounds-checked: a malformed query yields `None` (answered FORMERR when
//! its header is readable), never a panic.

use std::net::IpAddr;

/// Record type A (IPv4).
pub(crate) const TYPE_A: u16 = 1;
/// Record type AAAA (IPv6).
pub(crate) const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;

/// Response codes used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rcode {
    NoError = 0,
    FormErr = 1,
    ServFail = 2,
    NxDomain = 3,
    NotImp = 4,
    Refused = 5,
}

/// One parsed query: header id and flags, and its (single) question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Query {
    pub id: u16,
    /// The RD bit, echoed in the answer.
    pub recursion_desired: bool,
    /// The name, lower-cased, without the trailing dot.
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// The raw question section (name + type + class), echoed in the answer.
    question: Vec<u8>,
}

/// The header id of a message, when it has one (to answer FORMERR to garbage).
pub(crate) fn header_id(msg: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*msg.first()?, *msg.get(1)?]))
}

/// Parses a standard query with exactly one question; `None` for anything else.
pub(crate) fn parse_query(msg: &[u8]) -> Option<Query> {
    if msg.len() < 12 {
        return None;
    }
    let id = u16::from_be_bytes([msg[0], msg[1]]);
    let flags = u16::from_be_bytes([msg[2], msg[3]]);
    let is_response = flags & 0x8000 != 0;
    let opcode = (flags >> 11) & 0xf;
    let qdcount = u16::from_be_bytes([msg[4], msg[5]]);
    if is_response || opcode != 0 || qdcount != 1 {
        return None;
    }
    let mut pos = 12;
    let mut labels: Vec<String> = Vec::new();
    let mut total = 0usize;
    loop {
        let len = *msg.get(pos)? as usize;
        pos += 1;
        if len == 0 {
            break;
        }
        // Compression pointers never appear in a question we accept (nothing precedes it).
        if len & 0xc0 != 0 {
            return None;
        }
        let label = msg.get(pos..pos + len)?;
        total += len + 1;
        if total > 255 {
            return None;
        }
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        pos += len;
    }
    let qtype = u16::from_be_bytes([*msg.get(pos)?, *msg.get(pos + 1)?]);
    let qclass = u16::from_be_bytes([*msg.get(pos + 2)?, *msg.get(pos + 3)?]);
    let question = msg.get(12..pos + 4)?.to_vec();
    Some(Query {
        id,
        recursion_desired: flags & 0x0100 != 0,
        name: labels.join("."),
        qtype,
        qclass,
        question,
    })
}

impl Query {
    /// Whether this asks for addresses of class IN.
    pub(crate) fn wants_addresses(&self) -> bool {
        self.qclass == CLASS_IN && (self.qtype == TYPE_A || self.qtype == TYPE_AAAA)
    }
}

fn header(id: u16, rd: bool, rcode: Rcode, qd: u16, an: u16) -> Vec<u8> {
    // QR=1, AA=0, RA=1 (we do resolve), RD echoed.
    let mut flags: u16 = 0x8000 | 0x0080 | rcode as u16;
    if rd {
        flags |= 0x0100;
    }
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&qd.to_be_bytes());
    out.extend_from_slice(&an.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out
}

/// An answer without records (`rcode` says why).
pub(crate) fn reply(q: &Query, rcode: Rcode) -> Vec<u8> {
    let mut out = header(q.id, q.recursion_desired, rcode, 1, 0);
    out.extend_from_slice(&q.question);
    out
}

/// FORMERR for a message whose question could not be read.
pub(crate) fn format_error(id: u16) -> Vec<u8> {
    header(id, false, Rcode::FormErr, 0, 0)
}

/// The answer to `q` with the addresses of its type from `addrs` (others are skipped:
/// an AAAA query for a v4-only name is an empty NOERROR answer, not NXDOMAIN). At most
/// `max_len` bytes (512 for UDP without EDNS): records past it are left out and TC set.
pub(crate) fn answer(q: &Query, addrs: &[IpAddr], ttl: u32, max_len: usize) -> Vec<u8> {
    let records: Vec<&IpAddr> = addrs
        .iter()
        .filter(|a| match q.qtype {
            TYPE_A => a.is_ipv4(),
            TYPE_AAAA => a.is_ipv6(),
            _ => false,
        })
        .collect();
    let mut body = Vec::new();
    let mut count: u16 = 0;
    let mut truncated = false;
    let base = 12 + q.question.len();
    for a in records {
        let mut rr = Vec::with_capacity(28);
        // A pointer to the question's name at offset 12.
        rr.extend_from_slice(&0xc00cu16.to_be_bytes());
        rr.extend_from_slice(&q.qtype.to_be_bytes());
        rr.extend_from_slice(&CLASS_IN.to_be_bytes());
        rr.extend_from_slice(&ttl.to_be_bytes());
        match a {
            IpAddr::V4(v4) => {
                rr.extend_from_slice(&4u16.to_be_bytes());
                rr.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                rr.extend_from_slice(&16u16.to_be_bytes());
                rr.extend_from_slice(&v6.octets());
            }
        }
        if base + body.len() + rr.len() > max_len || count == u16::MAX {
            truncated = true;
            break;
        }
        body.extend_from_slice(&rr);
        count += 1;
    }
    let mut out = header(q.id, q.recursion_desired, Rcode::NoError, 1, count);
    if truncated {
        out[2] |= 0x02;
    }
    out.extend_from_slice(&q.question);
    out.extend_from_slice(&body);
    out
}

/// The response code of an answer (for tests and logs).
#[cfg(test)]
pub(crate) fn rcode_of(msg: &[u8]) -> Option<u8> {
    Some(msg.get(3)? & 0x0f)
}

/// A query for `name` of `qtype` (tests build their own packets with it).
#[cfg(test)]
pub(crate) fn build_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&0x0100u16.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out
}

/// The addresses in an answer (tests).
#[cfg(test)]
pub(crate) fn answer_addrs(msg: &[u8]) -> Vec<IpAddr> {
    let Some(q) = parse_answer_question_end(msg) else {
        return Vec::new();
    };
    let an = u16::from_be_bytes([msg[6], msg[7]]);
    let mut pos = q;
    let mut out = Vec::new();
    for _ in 0..an {
        let Some(rdlen) = msg.get(pos + 10..pos + 12) else {
            break;
        };
        let rdlen = u16::from_be_bytes([rdlen[0], rdlen[1]]) as usize;
        let Some(data) = msg.get(pos + 12..pos + 12 + rdlen) else {
            break;
        };
        match rdlen {
            4 => out.push(IpAddr::from(<[u8; 4]>::try_from(data).unwrap_or_default())),
            16 => out.push(IpAddr::from(<[u8; 16]>::try_from(data).unwrap_or_default())),
            _ => {}
        }
        pos += 12 + rdlen;
    }
    out
}

#[cfg(test)]
fn parse_answer_question_end(msg: &[u8]) -> Option<usize> {
    let mut pos = 12;
    loop {
        let len = *msg.get(pos)? as usize;
        pos += 1;
        if len == 0 {
            return Some(pos + 4);
        }
        pos += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_round_trips_into_an_answer() {
        let msg = build_query(0x1234, "Api.Example.COM", TYPE_A);
        let q = parse_query(&msg).unwrap();
        assert_eq!(q.id, 0x1234);
        assert_eq!(q.name, "api.example.com");
        assert!(q.wants_addresses() && q.recursion_desired);
        let addrs: Vec<IpAddr> = vec!["10.1.2.3".parse().unwrap(), "fd00::1".parse().unwrap()];
        let a = answer(&q, &addrs, 30, 512);
        assert_eq!(rcode_of(&a), Some(0));
        assert_eq!(&a[0..2], &[0x12, 0x34]);
        assert_eq!(
            answer_addrs(&a),
            vec![addrs[0]],
            "only A records for an A query"
        );
        let q6 = parse_query(&build_query(7, "x.org", TYPE_AAAA)).unwrap();
        assert_eq!(answer_addrs(&answer(&q6, &addrs, 30, 512)), vec![addrs[1]]);
    }

    #[test]
    fn refusals_and_garbage() {
        let q = parse_query(&build_query(9, "evil.org", TYPE_A)).unwrap();
        assert_eq!(rcode_of(&reply(&q, Rcode::NxDomain)), Some(3));
        assert_eq!(rcode_of(&reply(&q, Rcode::Refused)), Some(5));
        for bad in [
            &[][..],
            &[1, 2, 3][..],
            &[0, 1, 0x81, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1][..], // a response
            &[0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 63, b'a'][..],         // label past the end
            &[0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1][..], // a pointer
        ] {
            assert!(parse_query(bad).is_none(), "{bad:?}");
        }
        assert_eq!(rcode_of(&format_error(5)), Some(1));
    }

    #[test]
    fn many_records_truncate_instead_of_overflowing() {
        let q = parse_query(&build_query(1, "many.test", TYPE_A)).unwrap();
        let addrs: Vec<IpAddr> = (0..200u8).map(|i| IpAddr::from([10, 0, 0, i])).collect();
        let a = answer(&q, &addrs, 30, 512);
        assert!(a.len() <= 512);
        assert_ne!(a[2] & 0x02, 0, "TC set");
        assert!(!answer_addrs(&a).is_empty());
    }
}

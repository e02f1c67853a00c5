//! The `serde` feature's hand-written representations: what derives cannot express.
//!
//! - Byte fields (`ExecResult::stdout`/`stderr`, `OutputChunk::data`, `RichResult::data`)
//!   serialise as a plain string when they are valid UTF-8 (the common case, readable in a
//!   log) and as `{"base64": "<standard, padded>"}` otherwise, so no byte is lost. Both
//!   forms deserialise.
//! - A [`Secret`] serialises as `"***"`: its value never reaches a log or a wire. It has
//!   no `Deserialize`, so `CreateOptions::secrets` is skipped when deserialising.
//! - Env maps of `CreateOptions` and `RunOptions` serialise as `env_keys` (names only),
//!   as their `Debug` does and as audit records redact them: an env value may be a
//!   credential. They deserialise from `env`, so a serialised options value is a log
//!   record, not a replayable configuration. `RunOptions::stdin` likewise serialises as
//!   `stdin_len` (its length) and deserialises from `stdin` (text or base64).
//! - A [`SandboxError`] serialises as `{code, message, hint, url}`, the same four things
//!   its rendering shows; it is not deserialisable (sources and typed fields are lost).
//! - `Duration`s use serde's `{secs, nanos}` and `SystemTime`s serde's
//!   `{secs_since_epoch, nanos_since_epoch}`.

use serde::ser::SerializeStruct as _;
use serde::{Serialize, Serializer};

use crate::{ErrorCode, SandboxError, Secret};

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("***")
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl Serialize for SandboxError {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("SandboxError", 4)?;
        s.serialize_field("code", &self.code())?;
        s.serialize_field("message", &self.to_string())?;
        s.serialize_field("hint", &self.hint())?;
        s.serialize_field("url", &self.url())?;
        s.end()
    }
}

/// `serialize_with` for maps whose values must not leave the process: the keys only.
pub(crate) fn keys_only<S: Serializer>(
    map: &std::collections::BTreeMap<String, String>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(map.keys())
}

/// `serialize_with` for an optional input whose bytes must not reach a log: its length.
pub(crate) fn len_only<S: Serializer>(
    data: &Option<bytes::Bytes>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    data.as_ref().map(|b| b.len()).serialize(serializer)
}

/// `deserialize_with` for an optional [`bytes_text`] field.
pub(crate) fn opt_bytes_text<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<bytes::Bytes>, D::Error> {
    bytes_text::deserialize(d).map(Some)
}

/// `#[serde(with = …)]` for `Bytes`: UTF-8 text as a string, anything else as base64.
pub(crate) mod bytes_text {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Repr<'a> {
        Text(std::borrow::Cow<'a, str>),
        Base64 { base64: String },
    }

    pub(crate) fn serialize<S: Serializer>(b: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(b) {
            Ok(text) => Repr::Text(text.into()),
            Err(_) => Repr::Base64 {
                base64: STANDARD.encode(b),
            },
        }
        .serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Text(text) => Ok(Bytes::from(text.into_owned())),
            Repr::Base64 { base64 } => STANDARD
                .decode(base64)
                .map(Bytes::from)
                .map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests;

//! The one native exception: a `SandboxError` as Python sees it before the Python half
//! maps it to sandboxio's class for the code (keeping this one as `__cause__`).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use sandbox::SandboxError;

create_exception!(
    _native,
    NativeSandboxError,
    PyException,
    "An error of sandbox-rs: `code` (SBX_E…), `message`, `hint`, and for some codes `env_var` or `capability`."
);

/// The Python exception for `e`. Messages and hints never carry a secret (the Rust error
/// types redact them), so they cross as they are.
pub(crate) fn to_py(e: SandboxError) -> PyErr {
    Python::attach(|py| {
        let message = e.to_string();
        let err = NativeSandboxError::new_err(message.clone());
        let value = err.value(py);
        let attrs: [(&str, Option<String>); 5] = [
            ("code", Some(e.code().as_str().to_string())),
            ("message", Some(message)),
            ("hint", Some(e.hint())),
            (
                "env_var",
                match &e {
                    SandboxError::Auth { env_var, .. } => Some(env_var.clone()),
                    _ => None,
                },
            ),
            (
                "capability",
                match &e {
                    SandboxError::CapabilityNotSupported { capability, .. } => {
                        Some(capability.names())
                    }
                    _ => None,
                },
            ),
        ];
        for (k, v) in attrs {
            // Setting an attribute on a fresh exception instance cannot fail short of
            // memory exhaustion; the error would then carry fewer fields, never a wrong one.
            let _ = value.setattr(k, v);
        }
        err
    })
}

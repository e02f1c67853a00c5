//! Secrets named by an environment variable (`--secret NAME`, `--token-env NAME`): the
//! name is checked without ever echoing what was given, and the value is read from this
//! process's environment, never from the command line. What the secret is for (a
//! command's environment, a bearer token) is left to the callers.

use sandbox::SandboxError;

/// Checks that `flag`'s argument is an environment variable name: letters, digits and
/// `_`, not starting with a digit. Checked here rather than by a clap value parser because
/// clap echoes a rejected value, and a value pasted by mistake is a secret that must not
/// reach the scrollback or a CI log.
pub fn check_name(flag: &str, s: &str) -> sandbox::Result<()> {
    let valid = !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(SandboxError::config(
            format!(
                "{flag} takes the NAME of an environment variable; what was given is not one (not shown: it may be a secret)"
            ),
            format!("export NAME=<value> and pass {flag} NAME"),
        ))
    }
}

/// The value of the caller's environment variable `name`, given with `--secret`; the
/// error names the variable, never a value.
pub fn read(name: &str) -> sandbox::Result<String> {
    check_name("--secret", name)?;
    match std::env::var(name) {
        Ok(v) => Ok(v),
        Err(std::env::VarError::NotPresent) => Err(SandboxError::config(
            format!("--secret {name}: the environment variable {name} is not set"),
            format!(
                "export {name}=… in the calling shell (the value is never passed on the command line)"
            ),
        )),
        Err(std::env::VarError::NotUnicode(_)) => Err(SandboxError::config(
            format!("--secret {name}: the environment variable {name} is not valid UTF-8"),
            "secrets must be UTF-8 text",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_takes_a_name_never_a_value() {
        assert!(check_name("--secret", "API_KEY").is_ok());
        assert!(check_name("--secret", "_X1").is_ok());
        for bad in ["", "A=b", "1X", "sk-live-123", "A B"] {
            let e = check_name("--secret", bad).expect_err(bad);
            assert_eq!(e.code(), sandbox::ErrorCode::Configuration);
            let shown = format!("{} {}", e.render(), e.hint());
            assert!(bad.is_empty() || !shown.contains(bad), "{shown}");
        }
    }
}

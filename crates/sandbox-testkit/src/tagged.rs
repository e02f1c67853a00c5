//! Sandboxes a test creates, tagged with the test's name, and finding them again: a trial
//! proves "nothing was left behind" by asking the backend for its tag.

use std::collections::BTreeMap;
use std::time::Duration;

use sandbox_core::{CreateOptions, ReapableBackend};

/// Options for a test's sandbox: `template`, a 120 s lifetime, and the metadata
/// `test=<test>` that [`managed_ids`] finds it by.
pub fn test_options(template: &str, test: &str) -> CreateOptions {
    CreateOptions::new(template)
        .timeout(Duration::from_secs(120))
        .metadata("test", test)
}

/// The ids of the managed sandboxes the engine still holds for `test` (see
/// [`test_options`]).
pub async fn managed_ids<B: ReapableBackend + ?Sized>(b: &B, test: &str) -> Vec<String> {
    let mut f = BTreeMap::new();
    f.insert("test".to_string(), test.to_string());
    b.list_managed(&f)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect()
}

//! Remote work a flaw deliberately abandons: kept alive, never dropped, so no destructor
//! tears it down and the suite's own leak checks are what must find it.

use std::any::Any;
use std::sync::Mutex;

/// Remote work a flaw deliberately abandons (never killed by a drop), held until the
/// process ends so the suite's leak check, not a destructor, finds it.
static ABANDONED: Mutex<Vec<Box<dyn Any + Send>>> = Mutex::new(Vec::new());

/// Holds `thing` until the process ends.
pub(super) fn abandon(thing: impl Any + Send) {
    if let Ok(mut held) = ABANDONED.lock() {
        held.push(Box::new(thing));
    }
}
